"""PodCIDR remapping: no remapping when nothing overlaps, the first free block when something does."""

from __future__ import annotations

import pytest

from models.network import NO_REMAPPING, RemapError, remap_pod_cidr

pytestmark = pytest.mark.consumer


@pytest.mark.parametrize(
    ("advertised", "local", "taken", "expected"),
    [
        pytest.param("10.1.0.0/16", ["10.0.0.0/16"], [], NO_REMAPPING, id="a disjoint PodCIDR is kept"),
        pytest.param("10.0.0.0/16", ["10.0.0.0/16"], [], "100.64.0.0/16", id="an overlapping one gets the first free block"),
        pytest.param("10.0.0.0/16", ["10.0.0.0/16"], ["100.64.0.0/16", NO_REMAPPING], "100.65.0.0/16",
                     id="blocks already handed out are skipped"),
        pytest.param("10.0.0.0/24", ["10.0.0.0/8"], [], "100.64.0.0/24", id="the block has the advertised size"),
    ],
)  # fmt: skip
def test_remapping(advertised: str, local: list[str], taken: list[str], expected: str) -> None:
    assert remap_pod_cidr(advertised, local=local, taken=taken) == expected


@pytest.mark.parametrize(
    ("advertised", "message"),
    [
        pytest.param("10.0.0.1/16", "is not a CIDR", id="host bits set is refused"),
        pytest.param("banana", "is not a CIDR", id="garbage is refused"),
        pytest.param("0.0.0.0/0", "cannot be remapped", id="a block larger than the pool cannot move"),
    ],
)
def test_unusable_cidrs_are_refused_with_a_reason(advertised: str, message: str) -> None:
    with pytest.raises(RemapError, match=message):
        remap_pod_cidr(advertised, local=["0.0.0.0/0"], taken=[])
