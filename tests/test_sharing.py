"""What a provider shares, computed from pods and nodes as the API server serves them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.resources import Resources
from models.sharing import (
    CapacityAggregate,
    capacity_changed,
    counts_against_capacity,
    pod_requests,
    shared_resources,
)

pytestmark = pytest.mark.provider


def pod(*containers: dict[str, str], init: list[dict[str, Any]] | None = None, overhead: dict[str, str] | None = None,
        node: str | None = "n1", phase: str = "Running", labels: dict[str, str] | None = None, uid: str = "u1") -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"resources": {"requests": c}} for c in containers]}
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = overhead
    if node:
        spec["nodeName"] = node
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns", "labels": labels or {}}, "spec": spec,
            "status": {"phase": phase}}  # fmt: skip


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        pytest.param(pod({"cpu": "500m"}, {"cpu": "250m", "memory": "1Gi"}), {"cpu": "750m", "memory": "1Gi"},
                     id="containers are summed"),
        pytest.param(pod({"cpu": "500m"}, init=[{"resources": {"requests": {"cpu": "2"}}}]), {"cpu": "2"},
                     id="an init container larger than the containers sets the floor"),
        pytest.param(pod({"cpu": "500m"}, init=[{"resources": {"requests": {"cpu": "100m"}}}]), {"cpu": "500m"},
                     id="a smaller init container changes nothing"),
        pytest.param(pod({"cpu": "500m"}, init=[{"restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}]),
                     {"cpu": "600m"}, id="a sidecar runs alongside and adds"),
        pytest.param(pod({"cpu": "1"}, overhead={"cpu": "100m", "memory": "64Mi"}), {"cpu": "1100m", "memory": "64Mi"},
                     id="the pod overhead adds"),
    ],
)  # fmt: skip
def test_pod_requests_follow_the_schedulers_rule(p: dict[str, Any], expected: dict[str, str]) -> None:
    assert pod_requests(p) == Resources(expected)


@pytest.mark.parametrize(
    ("p", "counts"),
    [
        pytest.param(pod({"cpu": "1"}), True, id="a running pod counts"),
        pytest.param(pod({"cpu": "1"}, phase="Pending"), True, id="a bound pod not yet running counts"),
        pytest.param(pod({"cpu": "1"}, phase="Succeeded"), False, id="a completed pod does not"),
        pytest.param(pod({"cpu": "1"}, phase="Failed"), False, id="a failed pod does not"),
        pytest.param(pod({"cpu": "1"}, node=None), False, id="an unscheduled pod holds nothing yet"),
        pytest.param(pod({"cpu": "1"}, node="virtual"), False, id="a pod on a virtual node runs elsewhere"),
        pytest.param(pod({"cpu": "1"}, labels={"tidepool.io/offloaded": "true"}), False,
                     id="a pod offloaded into this cluster is counted by nobody"),
    ],
)
def test_which_pods_hold_capacity(p: dict[str, Any], counts: bool) -> None:
    assert counts_against_capacity(p, {"virtual"}) is counts


def test_shared_resources_are_clamped_after_subtracting_then_scaled() -> None:
    shared = shared_resources(allocatable=Resources(cpu="4", memory="4Gi"), used=Resources(cpu="1", memory="6Gi"),
                              percent=50)  # fmt: skip
    assert shared.to_kubernetes() == {"cpu": "1500m", "memory": "0"}


@pytest.mark.parametrize(
    ("before", "after", "moved"),
    [
        pytest.param({"cpu": "10"}, {"cpu": "10500m"}, False, id="five percent is within a ten percent threshold"),
        pytest.param({"cpu": "10"}, {"cpu": "12"}, True, id="twenty percent is not"),
        pytest.param({"cpu": "10"}, {"cpu": "10", "nvidia.com/gpu": "1"}, True, id="a new resource is a change"),
    ],
)
def test_capacity_changed_compares_with_the_threshold(before: dict[str, str], after: dict[str, str], moved: bool) -> None:
    assert capacity_changed(Resources(before), Resources(after), 10) is moved


def node(name: str, cpu: str, virtual: bool = False) -> dict[str, Any]:
    labels = {"tidepool.io/type": "virtual-node"} if virtual else {}
    return {"metadata": {"uid": f"node-{name}", "name": name, "labels": labels}, "status": {"allocatable": {"cpu": cpu}}}


events = st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.integers(0, 5),
                            st.sampled_from(["Running", "Succeeded"]), st.sampled_from(["n1", "virtual", None]),
                            st.integers(1, 4)), max_size=40)  # fmt: skip


@settings(max_examples=60)
@given(events)
def test_the_aggregate_equals_recomputing_from_scratch_after_any_events(sequence: list[Any]) -> None:
    nodes = [node("n1", "8"), node("virtual", "100", virtual=True)]
    aggregate = CapacityAggregate.from_lists(nodes, [])
    live: dict[str, dict[str, Any]] = {}
    for kind, i, phase, where, cpu in sequence:
        p = pod({"cpu": str(cpu)}, node=where, phase=phase, uid=f"p{i}")
        aggregate.apply_pod(kind, p)
        if kind == "DELETED":
            live.pop(f"p{i}", None)
        else:
            live[f"p{i}"] = p
    fresh = CapacityAggregate.from_lists(nodes, list(live.values()))
    assert aggregate.used() == fresh.used()
    assert aggregate.allocatable() == fresh.allocatable() == Resources(cpu="8")


def test_a_node_that_becomes_virtual_stops_counting_and_so_do_its_pods() -> None:
    aggregate = CapacityAggregate.from_lists([node("n2", "4")], [pod({"cpu": "1"}, node="n2")])
    assert aggregate.used() == Resources(cpu="1", pods="1")
    aggregate.apply_node("MODIFIED", node("n2", "4", virtual=True))
    assert aggregate.allocatable() == Resources() and aggregate.used() == Resources()
