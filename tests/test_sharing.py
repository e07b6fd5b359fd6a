"""What a provider shares, computed from pods and nodes as the API server serves them (JSON dicts)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.early_push import EarlyPushes, plan_early_pushes
from models.names import LABEL_CONSUMER, LABEL_NODE_TYPE, LABEL_OFFLOADED, VIRTUAL_NODE_TYPE, foreign_namespace
from models.resources import Resources
from models.sharing import (
    POD_SLOT,
    CapacityAggregate,
    CapacitySnapshot,
    capacity_changed,
    counts_against_capacity,
    is_physical_node,
    node_allocatable,
    node_fields,
    offloaded_by,
    pod_requests,
    shared_resources,
)

pytestmark = pytest.mark.provider


def container(name: str = "c", restart: str | None = None, **requests: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": {"requests": requests}}
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, overhead: dict[str, str] | None = None,
        node: str | None = "n1", phase: str = "Running", labels: dict[str, str] | None = None, uid: str = "u1",
        pod_level: dict[str, str] | None = None, status: dict[str, Any] | None = None,
        deleting: bool = False, namespace: str = "ns") -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = overhead
    if pod_level:
        spec["resources"] = {"requests": pod_level}
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"uid": uid, "name": uid, "namespace": namespace, "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, **(status or {})}}


def node(name: str, labels: dict[str, str] | None = None, **allocatable: str) -> dict[str, Any]:
    return {"metadata": {"uid": f"uid-{name}", "name": name, "labels": labels or {}},
            "status": {"allocatable": allocatable}}  # fmt: skip


VIRTUAL = {LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE}


# pod_requests ---------------------------------------------------------------------------------------


def resized(requests: dict[str, str], allocated: dict[str, str], *, infeasible: bool = False) -> dict[str, Any]:
    """The status of a pod whose only container "c" is being resized in place."""
    status: dict[str, Any] = {"containerStatuses": [{"name": "c", "resources": {"requests": requests},
                                                     "allocatedResources": allocated}]}  # fmt: skip
    if infeasible:
        status["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
    return status


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        pytest.param(pod(container(cpu="500m"), container("d", cpu="250m", memory="1Gi")),
                     {"cpu": "750m", "memory": "1Gi"}, id="the regular containers are summed"),
        pytest.param(pod(container(cpu="500m"), {"name": "d"}), {"cpu": "500m"},
                     id="a container without requests adds nothing"),
        pytest.param({"metadata": {"name": "empty"}}, {}, id="a pod without a spec requests nothing"),
        pytest.param(pod(container(cpu="500m"), init=[container("i", cpu="2")]), {"cpu": "2"},
                     id="an init container larger than the containers sets the floor"),
        pytest.param(pod(container(cpu="500m"), init=[container("i", cpu="100m")]), {"cpu": "500m"},
                     id="a smaller init container changes nothing"),
        pytest.param(pod(container(cpu="1", memory="1Gi"), init=[container("i", cpu="2", memory="512Mi")]),
                     {"cpu": "2", "memory": "1Gi"}, id="the init floor applies per resource"),
        pytest.param(pod(container(cpu="1"), init=[container("i", cpu="3"), container("j", cpu="2")]), {"cpu": "3"},
                     id="init containers run one after another so only the largest counts"),
        pytest.param(pod(container(cpu="500m"), init=[container("s", "Always", cpu="100m")]), {"cpu": "600m"},
                     id="a sidecar runs alongside the containers and adds like one of them"),
        pytest.param(pod(container(cpu="1"), init=[container("s", "Always", cpu="1"), container("i", cpu="3")]),
                     {"cpu": "4"}, id="an init container after a sidecar needs itself plus that sidecar"),
        pytest.param(pod(container(cpu="1"), init=[container("i", cpu="5"), container("s", "Always", cpu="1")]),
                     {"cpu": "5"}, id="an init container before a sidecar runs without it"),
        pytest.param(pod(container(cpu="1"), init=[container("i", "OnFailure", cpu="2")]), {"cpu": "2"},
                     id="only restartPolicy Always makes a sidecar"),
        pytest.param(pod(container(cpu="1"), overhead={"cpu": "100m", "memory": "64Mi"}),
                     {"cpu": "1100m", "memory": "64Mi"}, id="the pod overhead adds"),
        pytest.param(pod(container(cpu="1"), init=[container("i", cpu="2")], overhead={"cpu": "100m"}),
                     {"cpu": "2100m"}, id="the overhead adds on top of the init floor"),
        pytest.param(pod(container(cpu="1", memory="1Gi", **{"ephemeral-storage": "1Gi"}),
                         pod_level={"cpu": "3", "memory": "2Gi"}),
                     {"cpu": "3", "memory": "2Gi", "ephemeral-storage": "1Gi"},
                     id="pod-level requests replace the containers for cpu and memory only"),
        pytest.param(pod(container(cpu="1"), pod_level={"cpu": "2"}, overhead={"cpu": "100m"}), {"cpu": "2100m"},
                     id="the overhead adds to pod-level requests too"),
        pytest.param(pod(container(cpu="1"), status=resized({"cpu": "1"}, {"cpu": "2"})), {"cpu": "2"},
                     id="a resize the kubelet allocated counts before the spec catches up"),
        pytest.param(pod(container(cpu="2"), status=resized({"cpu": "1"}, {"cpu": "1"})), {"cpu": "2"},
                     id="a resize asked for in the spec counts before it is actuated"),
        pytest.param(pod(container(cpu="4"), status=resized({"cpu": "1"}, {"cpu": "1"}, infeasible=True)),
                     {"cpu": "1"}, id="an infeasible resize counts what runs not what was asked"),
    ],
)  # fmt: skip
def test_pod_requests_follow_the_kubernetes_rule(p: dict[str, Any], expected: dict[str, str]) -> None:
    assert pod_requests(p) == Resources(expected)


def test_pod_requests_are_exact_decimal_sums() -> None:
    many = pod(*(container(f"c{i}", cpu="1m", memory="1Ki") for i in range(1000)))
    assert pod_requests(many).to_kubernetes() == {"cpu": "1", "memory": "1000Ki"}


# Nodes and pods that count ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "physical"),
    [
        pytest.param({}, True, id="a node without labels is physical"),
        pytest.param(VIRTUAL, False, id="a tidepool virtual node is not"),
        pytest.param({"type": "virtual-node"}, False, id="a Liqo virtual node is not"),
        pytest.param({LABEL_NODE_TYPE: "worker", "type": "gpu"}, True, id="other values of the labels do not matter"),
    ],
)
def test_virtual_nodes_are_not_physical(labels: dict[str, str], physical: bool) -> None:
    assert is_physical_node(node("n", labels, cpu="1")) is physical
    assert is_physical_node(node_fields(node("n", {**labels, "zone": "a"}, cpu="1"))) is physical  # what is kept


def test_a_node_without_allocatable_offers_its_capacity() -> None:
    listed = {"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "2"}, "images": [{"names": ["x"]}]}}
    assert node_allocatable(listed) == node_allocatable(node_fields(listed)) == Resources(cpu="2")


@pytest.mark.parametrize(
    ("p", "counts"),
    [
        pytest.param(pod(container(cpu="1")), True, id="a running pod counts"),
        pytest.param(pod(container(cpu="1"), phase="Pending"), True, id="a bound pod not yet running counts"),
        pytest.param(pod(container(cpu="1"), phase="Unknown"), True, id="a pod of an unreachable node still counts"),
        pytest.param(pod(container(cpu="1"), phase="Succeeded"), False, id="a completed pod does not count"),
        pytest.param(pod(container(cpu="1"), phase="Failed"), False, id="a failed pod does not count"),
        pytest.param(
            pod(container(cpu="1"), node=None, phase="Pending"), False, id="an unscheduled pod holds nothing yet"
        ),
        pytest.param(pod(container(cpu="1"), node="virtual"), False, id="a pod on a virtual node runs elsewhere"),
        pytest.param(
            pod(container(cpu="1"), namespace=foreign_namespace("b")),
            True,
            id="a pod offloaded into this cluster holds its node like any other",
        ),
        pytest.param(
            pod(container(cpu="1"), deleting=True), True, id="a terminating pod holds its resources until it is gone"
        ),
    ],
)
def test_which_pods_hold_capacity(p: dict[str, Any], counts: bool) -> None:
    assert counts_against_capacity(p, {"virtual"}) is counts


def offloaded(consumer: str | None) -> str:
    """The namespace of a pod `consumer` offloaded here (None: an ordinary namespace of the provider)."""
    return foreign_namespace(consumer) if consumer else "ns"


def copy_labels_of(consumer: str) -> dict[str, str]:
    return {LABEL_OFFLOADED: "true", LABEL_CONSUMER: consumer}


@pytest.mark.parametrize(
    ("namespace", "labels", "consumer"),
    [
        pytest.param(foreign_namespace("b"), copy_labels_of("b"), "b", id="a copy belongs to the consumer whose namespace it runs in"),
        pytest.param(foreign_namespace("b"), {}, "b", id="a pod in a consumer's namespace is that consumer's, labelled or not"),
        pytest.param(foreign_namespace("a"), copy_labels_of("b"), "a",
                     id="a consumer's copy labelled with another consumer stays the labeller's"),
        pytest.param("team", copy_labels_of("b"), None, id="a pod labelled as a copy outside any foreign namespace is nobody's"),
        pytest.param("tidepool-foreign-", {}, None, id="the bare prefix names no consumer"),
        pytest.param("ns", {}, None, id="an ordinary pod belongs to nobody"),
    ],
)  # fmt: skip
def test_which_consumer_a_pod_was_offloaded_by(namespace: str, labels: dict[str, str], consumer: str | None) -> None:
    assert offloaded_by(pod(container(cpu="1"), namespace=namespace, labels=labels)) == consumer


# The formula ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocatable", "used", "percent", "expected"),
    [
        pytest.param({"cpu": "4", "memory": "4Gi"}, {"cpu": "1", "memory": "6Gi"}, 50, {"cpu": "1500m", "memory": "0"},
                     id="memory used beyond allocatable shares zero and never a negative amount"),
        pytest.param({"cpu": "4", "memory": "4Gi"}, {"cpu": "1", "memory": "1Gi"}, 100, {"cpu": "3", "memory": "3Gi"},
                     id="one hundred percent shares everything free"),
        pytest.param({"cpu": "4", "memory": "4Gi"}, {"cpu": "1"}, 0, {"cpu": "0", "memory": "0"},
                     id="zero percent shares nothing"),
        pytest.param({"cpu": "1", "memory": "1Gi", "pods": "110"}, {}, 33, {"cpu": "330m", "memory": "337Mi", "pods": "36"},
                     id="shares round down to a millicore a mebibyte and a whole pod"),
        pytest.param({"cpu": "4"}, {"cpu": "1", "nvidia.com/gpu": "1"}, 100, {"cpu": "3"},
                     id="a request for a resource no node offers is not shared as a negative amount"),
    ],
)  # fmt: skip
def test_shared_resources_subtract_then_clamp_then_scale(allocatable: dict[str, str], used: dict[str, str],
                                                         percent: int, expected: dict[str, str]) -> None:  # fmt: skip
    shared = shared_resources(allocatable=Resources(allocatable), used=Resources(used), percent=percent)
    assert shared.to_kubernetes() == expected


@pytest.mark.parametrize("percent", [pytest.param(-1, id="below zero"), pytest.param(101, id="above one hundred")])
def test_a_percentage_outside_zero_to_one_hundred_is_refused(percent: int) -> None:
    with pytest.raises(ValueError, match="percent must be between 0 and 100"):
        shared_resources(allocatable=Resources(cpu="1"), used=Resources(), percent=percent)


@pytest.mark.parametrize(
    ("before", "after", "moved"),
    [
        pytest.param({"cpu": "10"}, {"cpu": "10500m"}, False, id="five percent is within a ten percent threshold"),
        pytest.param({"cpu": "10"}, {"cpu": "11"}, False, id="exactly the threshold is not more than it"),
        pytest.param({"cpu": "10"}, {"cpu": "11001m"}, True, id="just above the threshold is a change"),
        pytest.param({"cpu": "10"}, {"cpu": "8"}, True, id="a fall counts like a rise"),
        pytest.param(
            {"cpu": "10", "memory": "1Gi"}, {"cpu": "10", "memory": "2Gi"}, True, id="one resource moving is enough"
        ),
        pytest.param({"cpu": "10"}, {"cpu": "10", "nvidia.com/gpu": "1"}, True, id="a new resource is a change"),
        pytest.param({"cpu": "10", "nvidia.com/gpu": "1"}, {"cpu": "10"}, True, id="a vanished resource is a change"),
        pytest.param({"cpu": "10", "hugepages-2Mi": "0"}, {"cpu": "10"}, False, id="a zero amount is like none"),
        pytest.param({}, {}, False, id="nothing before and after is no change"),
    ],
)
def test_capacity_changed_compares_each_resource_with_the_threshold(before: dict[str, str], after: dict[str, str],
                                                                    moved: bool) -> None:  # fmt: skip
    assert capacity_changed(Resources(before), Resources(after), 10) is moved


# The aggregate ------------------------------------------------------------------------------------------------


def used_by(*pods: dict[str, Any]) -> Resources:
    return Resources.total(pod_requests(p) + POD_SLOT for p in pods)


KEPT_APART = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]


def test_a_node_its_owner_keeps_apart_is_not_shared_nor_are_its_pods_counted() -> None:
    """A copy tolerates none of the provider's taints (its admission policy refuses them): a cordoned node, or
    one tainted NoSchedule or NoExecute, is no capacity to offer; a PreferNoSchedule taint only prefers."""
    def shaped(name: str, cpu: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        return node_fields({**node(name, cpu=cpu, memory="4Gi", pods="110"), "spec": spec or {}})  # as listed

    nodes = [shaped("n1", "4"), shaped("cp", "8", {"taints": KEPT_APART}), shaped("cordoned", "2", {"unschedulable": True}),
             shaped("soft", "2", {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]})]  # fmt: skip
    aggregate = CapacityAggregate.from_lists(nodes, [pod(container(cpu="1"), uid="a"),
                                                     pod(container(cpu="3"), uid="b", node="cp")])  # fmt: skip
    snapshot = aggregate.snapshot()
    assert snapshot.allocatable == Resources(cpu="6", memory="8Gi", pods="220")  # n1 and soft
    assert snapshot.used == Resources(cpu="1", pods="1")  # not what runs on the control plane
    assert (snapshot.physical_nodes, snapshot.virtual_nodes, snapshot.withheld_nodes) == (2, 0, 2)
    aggregate.apply_node("MODIFIED", shaped("cordoned", "2"))  # uncordoned: offered again
    assert aggregate.allocatable() == Resources(cpu="8", memory="12Gi", pods="330")
    aggregate.apply_node("MODIFIED", shaped("n1", "4", {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}))
    assert aggregate.allocatable() == Resources(cpu="4", memory="8Gi", pods="220")
    assert aggregate.used() == Resources()  # the pod on n1 went out with it
    assert aggregate.snapshot().withheld_nodes == 2


def test_from_lists_sums_physical_nodes_and_the_pods_that_hold_them() -> None:
    nodes = [node("n1", cpu="4", memory="8Gi", pods="110"), node("n2", cpu="2", memory="4Gi", pods="110"),
             node("virtual", VIRTUAL, cpu="100", memory="1Ti", pods="1000")]  # fmt: skip
    running = pod(container(cpu="1", memory="1Gi"), uid="a")
    pods = [running, pod(container(cpu="1"), uid="b", node="virtual"), pod(container(cpu="1"), uid="c", phase="Succeeded"),
            pod(container(cpu="1"), uid="d", node=None), pod(container(cpu="1"), uid="e", namespace=offloaded("b")),
            pod(container(cpu="2"), uid="f", namespace=offloaded(None))]  # fmt: skip
    aggregate = CapacityAggregate.from_lists(nodes, pods)
    snapshot = aggregate.snapshot()
    assert snapshot.allocatable == Resources(cpu="6", memory="12Gi", pods="220")
    assert snapshot.used == Resources(cpu="4", memory="1Gi", pods="3")
    assert snapshot.offloaded == {"b": Resources(cpu="1", pods="1")}
    assert (snapshot.physical_nodes, snapshot.virtual_nodes, snapshot.counted_pods) == (2, 1, 3)
    assert aggregate.used_for("b") == Resources(cpu="3", memory="1Gi", pods="2")
    assert aggregate.used_for("c") == snapshot.used


def test_the_offer_to_each_consumer_leaves_out_only_its_own_offloaded_pods() -> None:
    """The issue's figures: consumer b's offloaded pods hold 3 CPU / 6Gi of a 4 CPU / 8Gi node."""
    aggregate = CapacityAggregate.from_lists(
        [node("n1", cpu="4", memory="8Gi", pods="110")],
        [pod(container(cpu="2", memory="4Gi"), uid="b1", namespace=offloaded("b")),
         pod(container(cpu="1", memory="2Gi"), uid="b2", namespace=offloaded("b"))],
    )  # fmt: skip
    allocatable = aggregate.allocatable()

    def offer(consumer: str) -> dict[str, str]:
        return shared_resources(allocatable=allocatable, used=aggregate.used_for(consumer), percent=100).to_kubernetes()

    assert offer("b") == {"cpu": "4", "memory": "8Gi", "pods": "110"}  # its own pods do not shrink its offer
    assert offer("c") == {"cpu": "1", "memory": "2Gi", "pods": "108"}  # b's pods hold two of the pod slots


Step = tuple[str, str, dict[str, Any]]  # ("node" | "pod", event type, object)


@pytest.mark.parametrize(
    ("steps", "used", "allocatable"),
    [
        pytest.param([("pod", "ADDED", pod(container(cpu="1"))), ("pod", "MODIFIED", pod(container(cpu="1"), phase="Succeeded"))],
                     {}, {"cpu": "8"}, id="a pod that completes gives its resources back"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"), phase="Succeeded")), ("pod", "MODIFIED", pod(container(cpu="1")))],
                     {"cpu": "1", "pods": "1"}, {"cpu": "8"}, id="a pod that starts counting again is added once"),
        pytest.param([("pod", "MODIFIED", pod(container(cpu="1")))] * 3, {"cpu": "1", "pods": "1"}, {"cpu": "8"},
                     id="a repeated MODIFIED event is counted once"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"))), ("pod", "DELETED", pod(container(cpu="1"))),
                      ("pod", "DELETED", pod(container(cpu="1")))], {}, {"cpu": "8"},
                     id="a pod deleted twice is subtracted once"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"), node=None, phase="Pending")),
                      ("pod", "MODIFIED", pod(container(cpu="1"), phase="Pending"))],
                     {"cpu": "1", "pods": "1"}, {"cpu": "8"}, id="a pod counts once it is bound"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"), deleting=True))], {"cpu": "1", "pods": "1"}, {"cpu": "8"},
                     id="a terminating pod counts until its DELETED event"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"))), ("pod", "MODIFIED", pod(container(cpu="3")))],
                     {"cpu": "3", "pods": "1"}, {"cpu": "8"}, id="a resized pod replaces what it held"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"))), ("node", "MODIFIED", node("n1", VIRTUAL, cpu="8"))],
                     {}, {}, id="a node that becomes virtual stops counting and so do its pods"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"))), ("node", "MODIFIED", node("n1", VIRTUAL, cpu="8")),
                      ("node", "MODIFIED", node("n1", cpu="8"))],
                     {"cpu": "1", "pods": "1"}, {"cpu": "8"}, id="a node that becomes physical again counts its pods again"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"))), ("node", "DELETED", node("n1", cpu="8"))], {}, {},
                     id="a deleted node takes its pods out of the count"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"), node="n2")), ("node", "ADDED", node("n2", cpu="2"))],
                     {"cpu": "1", "pods": "1"}, {"cpu": "10"}, id="a pod listed before its node counts once the node is"),
        pytest.param([("node", "MODIFIED", node("n1", cpu="6"))], {}, {"cpu": "6"},
                     id="a node whose allocatable changes replaces what it offered"),
        pytest.param([("node", "ADDED", node("gpu", None, **{"nvidia.com/gpu": "2"})), ("node", "DELETED", node("gpu"))],
                     {}, {"cpu": "8"}, id="a resource whose last node leaves is dropped from the totals"),
    ],
)  # fmt: skip
def test_the_aggregate_follows_watch_events(
    steps: list[Step], used: dict[str, str], allocatable: dict[str, str]
) -> None:
    aggregate = CapacityAggregate.from_lists([node("n1", cpu="8")], [])
    for kind, event, obj in steps:
        (aggregate.apply_node if kind == "node" else aggregate.apply_pod)(event, obj)
    assert aggregate.used().to_kubernetes() == Resources(used).to_kubernetes()
    assert aggregate.allocatable().to_kubernetes() == Resources(allocatable).to_kubernetes()


B_POD = pod(container(cpu="1"), uid="b1", namespace=offloaded("b"))


@pytest.mark.parametrize(
    ("steps", "used_for_b", "used_for_c"),
    [
        pytest.param([("pod", "ADDED", B_POD)], {}, {"cpu": "1", "pods": "1"},
                     id="an offloaded pod added counts for every consumer but its own"),
        pytest.param([("pod", "ADDED", B_POD), ("pod", "MODIFIED", pod(container(cpu="3"), uid="b1", namespace=offloaded("b")))],
                     {}, {"cpu": "3", "pods": "1"}, id="an offloaded pod resized replaces what it held for the others"),
        pytest.param([("pod", "ADDED", B_POD), ("pod", "MODIFIED", pod(container(cpu="1"), uid="b1",
                                                                       namespace=offloaded("b")))],
                     {}, {"cpu": "1", "pods": "1"}, id="a copy that loses its labels is still its consumer's"),
        pytest.param([("pod", "ADDED", B_POD), ("pod", "MODIFIED", pod(container(cpu="1"), uid="b1", namespace=offloaded("b"),
                                                                       labels=copy_labels_of("c")))],
                     {}, {"cpu": "1", "pods": "1"}, id="a copy relabelled with another consumer changes no offer"),
        pytest.param([("pod", "ADDED", B_POD), ("pod", "DELETED", B_POD), ("pod", "DELETED", B_POD)], {}, {},
                     id="an offloaded pod deleted twice is subtracted once from every sum"),
        pytest.param([("pod", "ADDED", B_POD), ("pod", "MODIFIED", pod(container(cpu="1"), uid="b1", phase="Succeeded",
                                                                       namespace=offloaded("b")))],
                     {}, {}, id="an offloaded pod that completes gives its resources back"),
        pytest.param([("pod", "ADDED", B_POD), ("node", "MODIFIED", node("n1", VIRTUAL, cpu="8"))], {}, {},
                     id="a node that becomes virtual takes the offloaded pods out too"),
        pytest.param([("pod", "ADDED", B_POD), ("node", "MODIFIED", node("n1", VIRTUAL, cpu="8")),
                      ("node", "MODIFIED", node("n1", cpu="8"))], {}, {"cpu": "1", "pods": "1"},
                     id="a node that becomes physical again brings its offloaded pods back"),
        pytest.param([("pod", "ADDED", B_POD), ("node", "DELETED", node("n1", cpu="8"))], {}, {},
                     id="a deleted node takes its offloaded pods out of every sum"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"), uid="b1", node="n2", namespace=offloaded("b"))),
                      ("node", "ADDED", node("n2", cpu="2"))], {}, {"cpu": "1", "pods": "1"},
                     id="an offloaded pod listed before its node counts once the node is"),
        pytest.param([("pod", "ADDED", pod(container(cpu="1"), uid="x", namespace=offloaded(None)))],
                     {"cpu": "1", "pods": "1"}, {"cpu": "1", "pods": "1"},
                     id="a pod outside every foreign namespace counts for everyone"),
    ],
)  # fmt: skip
def test_the_per_consumer_sums_follow_watch_events(
    steps: list[Step], used_for_b: dict[str, str], used_for_c: dict[str, str]
) -> None:
    aggregate = CapacityAggregate.from_lists([node("n1", cpu="8")], [])
    for kind, event, obj in steps:
        (aggregate.apply_node if kind == "node" else aggregate.apply_pod)(event, obj)
    assert aggregate.used_for("b").to_kubernetes() == Resources(used_for_b).to_kubernetes()
    assert aggregate.used_for("c").to_kubernetes() == Resources(used_for_c).to_kubernetes()


def test_a_relist_replaces_the_per_consumer_sums() -> None:
    aggregate = CapacityAggregate.from_lists([node("n1", cpu="8"), node("n2", cpu="8")],
                                             [B_POD, pod(container(cpu="2"), uid="c1", node="n2", namespace=offloaded("c"))])  # fmt: skip
    aggregate.reset_pods([pod(container(cpu="1"), uid="b1", namespace=offloaded("b"))])
    assert aggregate.snapshot().offloaded == {"b": Resources(cpu="1", pods="1")}
    assert (aggregate.used_for("b"), aggregate.used_for("c")) == (Resources(), Resources(cpu="1", pods="1"))
    aggregate.reset_nodes([node("n2", cpu="8")])  # b's pod is on n1, which the relist no longer has
    assert aggregate.snapshot().offloaded == {}
    assert (aggregate.used_for("b"), aggregate.used_for("c")) == (Resources(), Resources())


@pytest.mark.parametrize("event", [pytest.param("BOOKMARK", id="a bookmark"), pytest.param("added", id="lower case")])
def test_an_unknown_event_type_is_refused_by_name(event: str) -> None:
    with pytest.raises(ValueError, match="event_type must be ADDED, MODIFIED or DELETED"):
        CapacityAggregate().apply_pod(event, pod(container(cpu="1")))


def test_reset_replaces_everything_a_relist_no_longer_has() -> None:
    aggregate = CapacityAggregate.from_lists([node("n1", cpu="8"), node("n2", cpu="8")],
                                             [pod(container(cpu="1"), uid="a"), pod(container(cpu="2"), uid="b")])  # fmt: skip
    aggregate.reset_nodes([node("n1", cpu="8")])
    aggregate.reset_pods([pod(container(cpu="1"), uid="a")])
    assert (aggregate.allocatable(), aggregate.used()) == (Resources(cpu="8"), Resources(cpu="1", pods="1"))


NODE_NAMES = ["n1", "n2", "n3"]
node_events = st.tuples(st.just("node"), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.sampled_from(NODE_NAMES),
                        st.booleans(), st.integers(0, 8), st.sampled_from(["", "nvidia.com/gpu"]))  # fmt: skip
pod_events = st.tuples(st.just("pod"), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.integers(0, 6),
                       st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
                       st.sampled_from([*NODE_NAMES, "gone", None]), st.sampled_from([False, None, "b", "c"]),
                       st.integers(0, 4), st.booleans())  # fmt: skip


def make_node(name: str, virtual: bool, cpu: int, extra: str) -> dict[str, Any]:
    allocatable = {"cpu": str(cpu), "memory": f"{cpu}Gi", "pods": "110", **({extra: "1"} if extra else {})}
    return node(name, VIRTUAL if virtual else None, **allocatable)


def make_pod(i: int, phase: str, where: str | None, consumer: str | bool | None, cpu: int, sidecar: bool) -> dict[str, Any]:
    """`consumer`: False for an ordinary pod, else the consumer whose namespace it runs in (None: labelled as
    b's copy, in an ordinary namespace)."""
    init = [container("s", "Always", cpu="100m")] if sidecar else [container("i", cpu="3", memory="1Mi")]
    return pod(container(cpu=f"{cpu}00m", memory=f"{cpu}Mi"), init=init, node=where, phase=phase, uid=f"p{i}",
               namespace=offloaded(consumer if isinstance(consumer, str) else None),
               labels=copy_labels_of("b") if consumer is None else None)  # fmt: skip


def from_scratch(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> CapacitySnapshot:
    """The definition, computed directly: physical nodes' allocatable; requests of the pods that count
    and are bound to one of those nodes."""
    physical = [n for n in nodes if is_physical_node(n)]
    physical_names = {n["metadata"]["name"] for n in physical}
    virtual_names = {n["metadata"]["name"] for n in nodes} - physical_names
    counted = [p for p in pods if counts_against_capacity(p, virtual_names) and p["spec"]["nodeName"] in physical_names]
    consumers = {c for p in counted if (c := offloaded_by(p)) is not None}
    return CapacitySnapshot(
        allocatable=Resources.total(node_allocatable(n) for n in physical),
        used=used_by(*counted),
        physical_nodes=len(physical),
        virtual_nodes=len(virtual_names),
        counted_pods=len(counted),
        offloaded={c: used_by(*(p for p in counted if offloaded_by(p) == c)) for c in consumers},
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(node_events, pod_events), max_size=60))
def test_the_aggregate_equals_recomputing_from_scratch_after_any_events(sequence: list[Any]) -> None:
    nodes = {"n1": make_node("n1", False, 8, "")}
    pods: dict[str, dict[str, Any]] = {}
    aggregate = CapacityAggregate.from_lists(nodes.values(), [])
    for kind, event, *args in sequence:
        if kind == "node":
            obj = make_node(*args)
            aggregate.apply_node(event, obj)
            live = nodes
        else:
            obj = make_pod(*args)
            aggregate.apply_pod(event, obj)
            live = pods
        if event == "DELETED":
            live.pop(obj["metadata"]["name"], None)
        else:
            live[obj["metadata"]["name"]] = obj
    expected = from_scratch(list(nodes.values()), list(pods.values()))
    assert aggregate.snapshot() == expected
    assert (aggregate.allocatable(), aggregate.used()) == (expected.allocatable, expected.used)
    for consumer in ("b", "c"):
        assert aggregate.used_for(consumer) == expected.used - expected.offloaded.get(consumer, Resources())
    assert CapacityAggregate.from_lists(nodes.values(), pods.values()).snapshot() == expected


# Early pushes ------------------------------------------------------------------------------------------------

INTERVAL = 60.0
SPARE = Resources(cpu="4", memory="8Gi", pods="110")
SHRUNK = Resources(cpu="1", memory="2Gi", pods="108")


def plan(*, spares: dict[str, Resources], baselines: dict[str, Resources] | None = None,
         last_signals: dict[str, float] | None = None, now: float = 1000.0) -> EarlyPushes:  # fmt: skip
    return plan_early_pushes(
        baselines={"b": SPARE, "c": SPARE} if baselines is None else baselines, spares=spares,
        last_signals=last_signals or {}, now=now, threshold_percent=10, min_interval_seconds=INTERVAL,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"spares": {"b": SPARE, "c": SPARE}}, EarlyPushes(), id="an offer that did not move signals nobody"),
        pytest.param({"spares": {"b": SPARE, "c": SHRUNK}}, EarlyPushes(signal=("c",)),
                     id="only the peering whose offer moved past the threshold is signalled"),
        pytest.param({"spares": {"b": SHRUNK, "c": SHRUNK}}, EarlyPushes(signal=("b", "c")),
                     id="every peering whose offer moved is signalled"),
        pytest.param({"spares": {"b": Resources(cpu="3700m", memory="8Gi", pods="110")}}, EarlyPushes(),
                     id="a move within the threshold signals nobody"),
        pytest.param({"spares": {"c": SHRUNK}, "baselines": {}}, EarlyPushes(),
                     id="without a push seen by this process there is nothing to compare"),
        pytest.param({"spares": {}}, EarlyPushes(), id="a consumer without a live peering is not signalled"),
        pytest.param({"spares": {"c": SHRUNK}, "last_signals": {"c": 970.0}}, EarlyPushes(look_again_at=1030.0),
                     id="a peering signalled within the interval waits and is looked at again when it ends"),
        pytest.param({"spares": {"c": SHRUNK}, "last_signals": {"c": 940.0}}, EarlyPushes(signal=("c",)),
                     id="a peering signalled exactly one interval ago is signalled again"),
        pytest.param({"spares": {"b": SHRUNK, "c": SHRUNK}, "last_signals": {"b": 990.0, "c": 950.0}},
                     EarlyPushes(look_again_at=1010.0), id="the next look is at the earliest end of an interval"),
        pytest.param({"spares": {"b": SPARE, "c": SPARE}, "last_signals": {"c": 990.0}}, EarlyPushes(),
                     id="a peering pushed since its signal needs no second look"),
    ],
)  # fmt: skip
def test_which_peerings_are_pushed_early(kwargs: dict[str, Any], expected: EarlyPushes) -> None:
    assert plan(**kwargs) == expected


def test_a_storm_of_moves_signals_each_peering_once_per_interval_and_keeps_the_last_move() -> None:
    """A clock runs through five minutes of churn evaluated every second; the offer to c keeps moving
    but its push never lands (the baseline stays): c is signalled at 0, 60, 120, 180 and 240 s; b's
    offer does not move and b is never signalled."""
    last_signals: dict[str, float] = {}
    signalled: list[tuple[float, str]] = []
    looks: list[float] = []
    for second in range(300):
        now = float(second)
        churned = Resources(cpu=f"{1 + second % 2}", memory="2Gi", pods="108")
        result = plan(spares={"b": SPARE, "c": churned}, last_signals=last_signals, now=now)
        for consumer in result.signal:
            last_signals[consumer] = now
            signalled.append((now, consumer))
        if result.look_again_at is not None:
            looks.append(result.look_again_at)
    assert signalled == [(0.0, "c"), (60.0, "c"), (120.0, "c"), (180.0, "c"), (240.0, "c")]
    assert set(looks) == {60.0, 120.0, 180.0, 240.0, 300.0}  # the trailing look after the last move
