"""The consumer's admission policies for namespace offloading (deploy/base/consumer-offloading.yaml), on a real
API server and scheduler: pods of a namespace not offloaded never reach a virtual node, whatever they
tolerate; pods of an offloaded one get the toleration and the node affinity of its NamespaceOffloading, ANDed
with their own. The namespace label the binding policy reads is written by the real offloading controller
(workers/offloading.py), run here in-process. Virtual nodes are kwok nodes with a virtual node's labels and taint."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from deploy.localenv.clusters import LocalCluster, fake_node
from models.names import (
    API_VERSION,
    GROUP,
    LABEL_NODE_TYPE,
    LABEL_OFFLOADING,
    LABEL_PROVIDER,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    TAINT_VIRTUAL_NODE,
    VERSION,
    VIRTUAL_NODE_TYPE,
    virtual_node_name,
)
from tests.kube import create_namespace, create_node
from tests.running import eventually
from workers.offloading import OffloadingController

pytestmark = [pytest.mark.env, pytest.mark.offloading]

TOLERATION = {"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}
_names = itertools.count()


def create_virtual_node(api: k8s.ApiClient, provider: str, **labels: str) -> str:
    """A kwok node (kept Ready, its pods run) dressed as provider's virtual node: name, labels, taint."""
    name = virtual_node_name(provider)
    node = fake_node(name, cpu="8", memory="16Gi", labels={LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE, LABEL_PROVIDER: provider,
                                                          **labels})  # fmt: skip
    node["spec"] = {"taints": [{"key": TAINT_VIRTUAL_NODE, "value": "true", "effect": "NoExecute"}]}
    k8s.CoreV1Api(api).create_node(k8s.V1Node.model_validate(node))
    return name


def offload(api: k8s.ApiClient, namespace: str, **spec: Any) -> None:
    """The NamespaceOffloading `tidepool offload namespace` writes (server-side apply), as the cluster's admin."""
    body = {"apiVersion": API_VERSION, "kind": "NamespaceOffloading",
            "metadata": {"name": NAMESPACE_OFFLOADING_NAME, "namespace": namespace}, "spec": spec}  # fmt: skip
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME, body,
        field_manager="test", force=True, _content_type="application/apply-patch+yaml")  # fmt: skip


def pod(name: str, *, finalizers: list[str] | None = None, **spec: Any) -> k8s.V1Pod:
    return k8s.V1Pod.model_validate({"metadata": {"name": name, "finalizers": finalizers or []},
                                     "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}})


def bind(core: k8s.CoreV1Api, namespace: str, name: str, node: str, **options: Any) -> bool:
    """What the scheduler does: a Binding (pods/binding). Read raw: the client cannot parse its Status answer."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    core.create_namespaced_pod_binding(name, namespace, k8s.V1Binding.model_validate(body), _preload_content=False,
                                       **options)  # fmt: skip
    return True


def refused(call: Callable[[], Any]) -> bool:
    try:
        call()
    except ApiException as e:
        return e.status in (403, 422) and "ValidatingAdmissionPolicy" in str(e.body)
    return False


async def in_force(*dry_runs: Callable[[], Any]) -> None:
    """Waits until each dry run is refused: a policy the cluster's set-up just created takes effect once the
    API server's informer has seen it, a moment later, and a real call made before would be let through."""
    for dry_run in dry_runs:
        await eventually(lambda dry_run=dry_run: refused(dry_run), timeout=30, what="the admission policies in force")


def refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status in (403, 422), refused.value
    return str(refused.value.body)


async def labelled(core: k8s.CoreV1Api, namespace: str, value: str | None) -> None:
    await eventually(lambda: (core.read_namespace(namespace).metadata.labels or {}).get(LABEL_OFFLOADING) == value,
                     timeout=20, what=f"namespace {namespace} labelled {value}")  # fmt: skip


async def created_as(core: k8s.CoreV1Api, namespace: str, body: k8s.V1Pod,
                     done: Callable[[k8s.V1Pod], bool]) -> k8s.V1Pod:  # fmt: skip
    """Creates the pod until admission made it as `done` says: the policy reads its parameter through an
    informer, which may not have seen a NamespaceOffloading written a moment ago (a pod made before is
    deleted and made again under a new name)."""

    def attempt() -> k8s.V1Pod | None:
        named = body.model_copy(deep=True)
        named.metadata.name = f"{body.metadata.name}-{next(_names)}"
        made = core.create_namespaced_pod(namespace, named)
        if done(made):
            return made
        core.delete_namespaced_pod(str(made.metadata.name), namespace, grace_period_seconds=0)
        return None

    made: k8s.V1Pod = await eventually(attempt, timeout=20, interval=0.5, what=f"a pod of {namespace} mutated")
    return made


def tolerates(made: k8s.V1Pod) -> bool:
    return any(t.key == TAINT_VIRTUAL_NODE and t.operator == "Exists" for t in made.spec.tolerations or [])


def terms(made: k8s.V1Pod) -> list[dict[str, Any]]:
    affinity = made.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution if affinity and \
        affinity.node_affinity else None  # fmt: skip
    if required is None:
        return []
    return [{"expressions": [(e.key, e.operator, e.values or []) for e in t.match_expressions or []],
             "fields": [(f.key, f.operator, f.values or []) for f in t.match_fields or []]}
            for t in required.node_selector_terms]  # fmt: skip


VIRTUAL = (LABEL_NODE_TYPE, "In", [VIRTUAL_NODE_TYPE])
HOME = (LABEL_NODE_TYPE, "NotIn", [VIRTUAL_NODE_TYPE])


@pytest.fixture
def consumer(make_cluster: Callable[[str], LocalCluster]) -> Iterator[k8s.ApiClient]:
    """A consumer cluster of the test's own (its policies installed as deploy/base installs them), one node of
    its own, and the offloading controller running."""
    api = make_cluster("offl").api_client()
    create_node(api, "home", cpu="8", memory="16Gi")
    controller = OffloadingController(api).start()
    try:
        yield api
    finally:
        controller.stop()


async def test_a_namespace_not_offloaded_keeps_its_pods_off_virtual_nodes_whatever_they_tolerate(
    consumer: k8s.ApiClient, unique: str
) -> None:
    core = k8s.CoreV1Api(consumer)
    node = create_virtual_node(consumer, f"p-{unique}")
    create_namespace(consumer, "team")
    # Tolerating the taint, and out of the scheduler's hands: only this test binds it.
    core.create_namespaced_pod("team", pod("web", tolerations=[TOLERATION], schedulerName="nobody"))
    await in_force(lambda: bind(core, "team", "web", node, dry_run="All"),
                   lambda: core.create_namespaced_pod("team", pod("direct", nodeName=node, tolerations=[TOLERATION]),
                                                      dry_run="All"))  # fmt: skip
    said = refusal(lambda: bind(core, "team", "web", node))
    assert f"namespace team is not offloaded: run `tidepool offload namespace team` before placing its pods on " \
           f"virtual node {node}" in said  # fmt: skip
    said = refusal(lambda: core.create_namespaced_pod("team", pod("direct", nodeName=node, tolerations=[TOLERATION])))
    assert "namespace team is not offloaded: run `tidepool offload namespace team`" in said
    core.create_namespaced_pod("team", pod("at-home", nodeName="home"))  # a node of its own: allowed

    offload(consumer, "team", podOffloadingStrategy="LocalAndRemote")
    await labelled(core, "team", "LocalAndRemote")
    await eventually(lambda: bind(core, "team", "web", node), timeout=10, what="the binding allowed")
    assert core.read_namespaced_pod("web", "team").spec.node_name == node


async def test_remote_pods_tolerate_and_go_only_to_the_selected_virtual_node_with_their_own_affinity_anded(
    consumer: k8s.ApiClient, unique: str
) -> None:
    core = k8s.CoreV1Api(consumer)
    chosen, other = f"a-{unique}", f"b-{unique}"
    chosen_node, other_node = create_virtual_node(consumer, chosen), create_virtual_node(consumer, other)
    create_namespace(consumer, "shop")
    offload(consumer, "shop", podOffloadingStrategy="Remote", clusterSelector={"matchLabels": {LABEL_PROVIDER: chosen}})
    await labelled(core, "shop", "Remote")
    selected = [VIRTUAL, (LABEL_PROVIDER, "In", [chosen])]

    plain = await created_as(core, "shop", pod("web"), tolerates)
    assert terms(plain) == [{"expressions": selected, "fields": []}]
    # The scheduler, with a home node free, places it on the selected virtual node only.
    for _ in range(3):
        placed = await created_as(core, "shop", pod("web"), tolerates)
        await eventually(lambda name=str(placed.metadata.name): core.read_namespaced_pod(name, "shop").spec.node_name,
                         timeout=30, what="the pod scheduled")  # fmt: skip
        assert core.read_namespaced_pod(str(placed.metadata.name), "shop").spec.node_name == chosen_node

    # Its own required terms are kept and ANDed with ours: each of its terms gains ours.
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [other_node]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["home"]}]}]}}}  # fmt: skip
    pinned = await created_as(core, "shop", pod("pinned", affinity=own), tolerates)
    assert terms(pinned) == [
        {"expressions": [("kubernetes.io/hostname", "In", [other_node]), *selected], "fields": []},
        {"expressions": selected, "fields": [("metadata.name", "In", ["home"])]},
    ]
    # Neither the other virtual node nor home is a selected virtual node: it stays unscheduled.
    await eventually(lambda: any(c.type == "PodScheduled" and c.status == "False" for c in
                                 core.read_namespaced_pod(str(pinned.metadata.name), "shop").status.conditions or []),
                     timeout=30, what="the pinned pod unschedulable")  # fmt: skip
    assert core.read_namespaced_pod(str(pinned.metadata.name), "shop").spec.node_name is None


async def test_local_and_remote_pods_tolerate_and_may_go_home_or_to_a_selected_virtual_node(
    consumer: k8s.ApiClient, unique: str
) -> None:
    core = k8s.CoreV1Api(consumer)
    create_virtual_node(consumer, f"a-{unique}", zone="eu")
    for namespace in ("mixed", "anywhere"):
        create_namespace(consumer, namespace)
    offload(consumer, "mixed", clusterSelector={"matchExpressions": [{"key": "zone", "operator": "In", "values": ["eu"]}]})
    offload(consumer, "anywhere")  # LocalAndRemote by default, every provider
    await labelled(core, "mixed", "LocalAndRemote")
    mixed = await created_as(core, "mixed", pod("web"), tolerates)
    assert terms(mixed) == [{"expressions": [HOME], "fields": []},
                            {"expressions": [VIRTUAL, ("zone", "In", ["eu"])], "fields": []}]  # fmt: skip
    anywhere = await created_as(core, "anywhere", pod("web"), tolerates)
    assert terms(anywhere) == []  # any node will do: no affinity added
    assert [t.key for t in anywhere.spec.tolerations].count(TAINT_VIRTUAL_NODE) == 1
    # A pod that already tolerates the taint gets no second toleration.
    again = await created_as(core, "anywhere", pod("own", tolerations=[TOLERATION]), tolerates)
    assert [t.key for t in again.spec.tolerations].count(TAINT_VIRTUAL_NODE) == 1


async def test_local_pods_get_nothing_and_may_not_be_bound_to_a_virtual_node(consumer: k8s.ApiClient, unique: str) -> None:
    core = k8s.CoreV1Api(consumer)
    node = create_virtual_node(consumer, f"a-{unique}")
    create_namespace(consumer, "home-only")
    offload(consumer, "home-only", podOffloadingStrategy="Local")
    await labelled(core, "home-only", "Local")
    made = core.create_namespaced_pod("home-only", pod("web", schedulerName="nobody"))
    assert not tolerates(made) and terms(made) == []
    await in_force(lambda: bind(core, "home-only", "web", node, dry_run="All"))
    said = refusal(lambda: bind(core, "home-only", "web", node))
    assert f"namespace home-only is offloaded with pod strategy Local: its pods stay home, not on virtual node {node}" \
        in said  # fmt: skip
