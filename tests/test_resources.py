"""ResourceList arithmetic: exact, per resource, absent counting as zero."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.resources import Resources

pytestmark = pytest.mark.api


def test_adding_and_subtracting_works_per_resource_with_absent_as_zero() -> None:
    a = Resources(cpu="1500m", memory="1Gi")
    b = Resources(cpu="500m", pods="3")
    assert (a + b).to_kubernetes() == {"cpu": "2", "memory": "1Gi", "pods": "3"}
    assert (a - b).to_kubernetes() == {"cpu": "1", "memory": "1Gi", "pods": "-3"}


def test_clamping_happens_after_subtracting_so_memory_is_never_negative() -> None:
    """Liqo clamped before subtracting and advertised negative memory."""
    allocatable, used = Resources(cpu="4", memory="4Gi"), Resources(cpu="1", memory="6Gi")
    assert (allocatable - used).clamp_at_zero().to_kubernetes() == {"cpu": "3", "memory": "0"}


@pytest.mark.parametrize(
    ("resources", "percent", "expected"),
    [
        pytest.param({"cpu": "3"}, 30, {"cpu": "900m"}, id="cpu keeps milli precision"),
        pytest.param({"cpu": "1"}, 33, {"cpu": "330m"}, id="a third of a core"),
        pytest.param({"cpu": "1m"}, 50, {"cpu": "0"}, id="below one milli-CPU floors to zero"),
        pytest.param({"memory": "1001Mi"}, 30, {"memory": "300Mi"}, id="memory floors to whole mebibytes"),
        pytest.param({"nvidia.com/gpu": "3"}, 50, {"nvidia.com/gpu": "1"}, id="extended resources are whole"),
        pytest.param({"pods": "110"}, 50, {"pods": "55"}, id="pods are whole"),
        pytest.param({"cpu": "7", "memory": "1Gi"}, 100, {"cpu": "7", "memory": "1Gi"}, id="100 percent is all"),
        pytest.param({"cpu": "7"}, 0, {"cpu": "0"}, id="0 percent is nothing"),
        pytest.param({"hugepages-2Mi": "507Mi"}, 50, {"hugepages-2Mi": "252Mi"},
                     id="hugepages of 2Mi floor to whole pages, not whole mebibytes"),
        pytest.param({"hugepages-1Gi": "3Gi"}, 50, {"hugepages-1Gi": "1Gi"}, id="hugepages of 1Gi floor to whole pages"),
        pytest.param({"hugepages-1Gi": "1Gi"}, 99, {"hugepages-1Gi": "0"}, id="less than one page shares none"),
        pytest.param({"hugepages-64Ki": "1Mi"}, 10, {"hugepages-64Ki": "64Ki"}, id="pages smaller than a mebibyte"),
        pytest.param({"ephemeral-storage": "10Gi"}, 33, {"ephemeral-storage": "3379Mi"},
                     id="ephemeral storage floors to whole mebibytes"),
    ],
)
def test_scaling_by_a_percentage_rounds_down_to_the_resource_unit(
    resources: dict[str, str], percent: int, expected: dict[str, str]
) -> None:
    assert Resources(resources).scale(percent).to_kubernetes() == expected


def test_fits_and_shortfall_compare_per_resource() -> None:
    need, capacity = Resources(cpu="2", memory="1Gi"), Resources(cpu="1500m", memory="2Gi")
    assert not need.fits_in(capacity)
    assert need.shortfall(capacity).to_kubernetes() == {"cpu": "500m"}
    assert Resources(cpu="1").fits_in(capacity)


quantities = st.integers(min_value=0, max_value=10**15).map(lambda n: Decimal(n) / 1000)
resource_lists = st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]), quantities)


@given(resource_lists, resource_lists)
def test_adding_then_subtracting_gives_back_the_original(a: dict[str, Decimal], b: dict[str, Decimal]) -> None:
    assert (Resources(a) + Resources(b)) - Resources(b) == Resources(a)


@given(resource_lists, st.integers(min_value=0, max_value=100))
def test_scaling_never_exceeds_the_original(a: dict[str, Decimal], percent: int) -> None:
    scaled = Resources(a).scale(percent)
    assert scaled.fits_in(Resources(a))
    assert all(v >= 0 for v in scaled.values())


@given(resource_lists, resource_lists)
def test_clamping_is_per_resource(a: dict[str, Decimal], b: dict[str, Decimal]) -> None:
    difference = (Resources(a) - Resources(b)).clamp_at_zero()
    for name in set(a) | set(b):
        assert difference.get_or_zero(name) == max(Decimal(0), Resources(a).get_or_zero(name) - Resources(b).get_or_zero(name))
