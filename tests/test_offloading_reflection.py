"""Namespace offloading as the virtual kubelet does it (issue 35), end to end on real clusters: each offloaded
namespace gets a remote namespace of its own in the provider, where its pods, Secrets and Services keep their
own names; a namespace whose remote namespace is not Ready says so on its pods; unoffloading drains in order;
and copies of the single-namespace layout move without their pod ever going without a running copy."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import cri_log_line
from deploy.localenv.env import EnvState
from kube.objects import ignore_not_found
from models.api.conditions import POD_PROVIDER_CONDITION
from models.names import (
    GROUP,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    REMOTE_NAMESPACES,
    TAINT_VIRTUAL_NODE,
    VERSION,
    virtual_kubelet_name,
)
from models.virtual_kubelet import ORIGIN_NAME, ORIGIN_NAMESPACE, ORIGIN_UID, pod_copy, reflected_name
from tests.kube import create_namespace, offload_namespace
from tests.offload import Peering, offloaded_namespace, offloading_entry_of, own_clusters, peered, ready_node
from tests.running import eventually

pytestmark = [pytest.mark.env, pytest.mark.vk, pytest.mark.offloading]

TOLERATE = [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}]


@pytest.fixture(scope="module")
async def peering(localenv: EnvState, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peering]:
    """One peering for the module's namespaces, on clusters of its own, its virtual node Ready."""
    with own_clusters(localenv) as (make, suffix):
        async with peered(localenv, make, suffix, consumer_pod_cidr="10.2.0.0/16",
                          log_dir=tmp_path_factory.mktemp("vk")) as running:  # fmt: skip
            core = k8s.CoreV1Api(running.consumer.api_client())
            await eventually(lambda: ready_node(core, running.node), timeout=90, what="the virtual node Ready")
            yield running


def _pod(name: str, node: str, *, secret: str | None = None) -> k8s.V1Pod:
    spec: dict[str, Any] = {"nodeName": node, "tolerations": TOLERATE,
                            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}  # fmt: skip
    if secret:
        spec["containers"][0]["volumeMounts"] = [{"name": "db", "mountPath": "/etc/db"}]
        spec["volumes"] = [{"name": "db", "secret": {"secretName": secret}}]
    return k8s.V1Pod.model_validate({"metadata": {"name": name, "labels": {"app": name}}, "spec": spec})


def _kubectl(peering: Peering, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(ensure_binaries().kubectl), "--kubeconfig", str(peering.consumer.kubeconfig), "-n", namespace, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _said(pod: Any) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == POD_PROVIDER_CONDITION), None)


async def test_two_namespaces_whose_names_collided_run_side_by_side_each_with_its_own_secret(peering: Peering) -> None:
    """Issue 35's collision: `team/a-web` and `team-a/web` were both `team-a-web` in one provider namespace (one
    ran, one stayed Pending, their Secrets `team/a-db`... folded the same way). Each namespace now has its own
    remote namespace: both run under their own names, each mounting its own namespace's Secret."""
    api = peering.consumer.api_client()
    core, remote = k8s.CoreV1Api(api), k8s.CoreV1Api(peering.provider.api_client())
    pods = {"team": "a-web", "team-a": "web"}
    remotes = {ns: await offloaded_namespace(peering, ns) for ns in pods}
    assert len(set(remotes.values())) == 2 and remotes == {ns: peering.remote(ns) for ns in pods}
    for namespace, name in pods.items():
        core.create_namespaced_secret(namespace, k8s.V1Secret.model_validate(
            {"metadata": {"name": "db"}, "stringData": {"password": f"of {namespace}"}}))  # fmt: skip
        core.create_namespaced_pod(namespace, _pod(name, peering.node, secret="db"))
    for namespace, name in pods.items():
        await eventually(lambda ns=namespace, n=name: core.read_namespaced_pod(n, ns).status.phase == "Running",
                         timeout=60, what=f"{namespace}/{name} Running")  # fmt: skip
        copy: Any = remote.read_namespaced_pod(name, remotes[namespace])  # its own name, its namespace's remote one
        assert copy.status.phase == "Running"
        assert copy.metadata.annotations[ORIGIN_NAMESPACE] == namespace
        assert copy.metadata.annotations[ORIGIN_UID] == core.read_namespaced_pod(name, namespace).metadata.uid
        assert [v.secret.secret_name for v in copy.spec.volumes if v.secret] == ["db"]
        secret: Any = remote.read_namespaced_secret("db", remotes[namespace])
        assert base64.b64decode(secret.data["password"]).decode() == f"of {namespace}"
    # Nothing of either was made in the control namespace, the single-namespace layout's place.
    assert not remote.list_namespaced_pod(peering.control_namespace, label_selector="app").items
    # kubectl logs and exec reach each pod's own copy: the kubelet API finds it by the pod's uid (ORIGIN_UID),
    # and refuses any other.
    with open(peering.provider.fake_pods.logs, "a") as log:
        log.write(cri_log_line("served by the provider"))
    for namespace, name in pods.items():
        logs = _kubectl(peering, namespace, "logs", name)
        assert logs.returncode == 0 and "served by the provider" in logs.stdout, logs.stderr
        executed = _kubectl(peering, namespace, "exec", name, "--", "sh", "-c", "echo $TIDEPOOL_FAKE_POD_CLUSTER")
        assert (executed.returncode, executed.stdout) == (0, f"{peering.provider.name}\n"), executed.stderr
    # Each NamespaceOffloading lists this provider with its remote namespace, Ready.
    for namespace in pods:
        entry = offloading_entry_of(api, namespace, peering.provider_id) or {}
        assert (entry["remoteNamespace"], entry["phase"]) == (remotes[namespace], "Ready"), entry


async def test_a_pod_whose_namespace_has_no_ready_remote_namespace_stays_pending_and_says_why(peering: Peering) -> None:
    """Two namespaces asking for one remote name (SelectedName): the first has it; the second is refused, and
    its pods get no copy: Pending, with the condition and one Warning Event naming the namespace and why."""
    api = peering.consumer.api_client()
    core, remote = k8s.CoreV1Api(api), k8s.CoreV1Api(peering.provider.api_client())
    chosen = f"chosen-{uuid.uuid4().hex[:6]}"
    selected = {"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": chosen}
    assert await offloaded_namespace(peering, "first", selected) == chosen
    create_namespace(api, "second")
    offload_namespace(api, "second", selected)
    entry = await eventually(lambda: (e := offloading_entry_of(api, "second", peering.provider_id)) and
                             e["phase"] == "Refused" and e, what="second's entry Refused")  # fmt: skip
    assert entry["remoteNamespace"] == chosen and "already requested for namespace first" in entry["message"]
    core.create_namespaced_pod("second", _pod("web", peering.node))
    pod = await eventually(lambda: _said(p := core.read_namespaced_pod("web", "second")) and p, timeout=30,
                           what="the NamespaceNotReady condition")  # fmt: skip
    said = _said(pod)
    assert (said.status, said.reason) == ("False", "NamespaceNotReady")
    assert said.message == (f"provider {peering.provider_id} refused remote namespace {chosen} for namespace second: "
                            f"{entry['message']}")  # fmt: skip
    assert pod.status.phase == "Pending"
    await asyncio.sleep(3)  # said once: no second Event while nothing changes
    events = [e for e in core.list_namespaced_event("second", field_selector="involvedObject.name=web").items
              if e.reason == "NamespaceNotReady"]  # fmt: skip
    assert len(events) == 1 and events[0].type == "Warning" and (events[0].count or 1) == 1
    assert "web" not in {p.metadata.name for p in remote.list_namespaced_pod(chosen).items}  # first's, not second's


async def test_unoffloading_deletes_the_copies_then_the_remote_namespace_then_the_status_entry(peering: Peering) -> None:
    """The NamespaceOffloading is held (a finalizer of this test's, as the consumer's drain holds it) so that its
    status can be watched while the virtual kubelet drains, in order, never a step before the previous one."""
    api = peering.consumer.api_client()
    core, remote = k8s.CoreV1Api(api), k8s.CoreV1Api(peering.provider.api_client())
    custom, provider_custom = k8s.CustomObjectsApi(api), k8s.CustomObjectsApi(peering.provider.api_client())
    namespace, hold = "drained", "tidepool.io/test-hold"
    remote_namespace = await offloaded_namespace(peering, namespace)
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME,
                                          {"metadata": {"finalizers": [hold]}})  # fmt: skip
    core.create_namespaced_secret(namespace, k8s.V1Secret.model_validate({"metadata": {"name": "db"}, "stringData": {"a": "b"}}))
    for name in ("one", "two"):
        core.create_namespaced_pod(namespace, _pod(name, peering.node, secret="db"))
    await eventually(lambda: len([p for p in remote.list_namespaced_pod(remote_namespace).items
                                  if p.status.phase == "Running"]) == 2, timeout=60, what="both copies Running")  # fmt: skip

    def state() -> tuple[int, bool, str | None]:
        """(copies left, RemoteNamespace there, the entry's phase or None), read in the order they go: the
        entry, the RemoteNamespace, the copies. Each only goes, so a later read may show less but never more:
        read the other way round, a copy listed just before it went beside a RemoteNamespace that went
        just after it would look like the wrong order."""
        entry = offloading_entry_of(api, namespace, peering.provider_id)
        request: Any = ignore_not_found(provider_custom.get_namespaced_custom_object, GROUP, VERSION,
                                        peering.control_namespace, REMOTE_NAMESPACES, remote_namespace)  # fmt: skip
        copies = len(remote.list_namespaced_pod(remote_namespace).items)
        requested = request is not None and not request["metadata"].get("deletionTimestamp")
        return copies, requested, None if entry is None else str(entry["phase"])

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME)
    seen = [state()]
    while seen[-1][2] is not None:  # the provider's namespace controller takes its time
        assert len(seen) < 1200, f"not drained in time: {seen[-5:]}"
        await asyncio.sleep(0.1)
        seen.append(state())
    for copies, requested, phase in seen:
        assert not (copies and not requested), f"the RemoteNamespace went before the copies: {seen}"
        assert not (requested and phase is None), f"the entry went before the RemoteNamespace: {seen}"
    assert any(phase == "Deleting" for _, _, phase in seen), seen  # the entry said it was draining
    await eventually(lambda: ignore_not_found(remote.read_namespace, remote_namespace) is None, timeout=60,
                     what="the remote namespace deleted by the provider")  # fmt: skip
    # The consumer's drain deleted the pods bound to the virtual node (their controllers make them again at home).
    await eventually(lambda: not core.list_namespaced_pod(namespace).items, timeout=120, what="the drained pods gone")
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME,
                                          {"metadata": {"finalizers": None}})  # fmt: skip


async def test_a_copy_of_the_single_namespace_layout_keeps_running_until_its_pods_new_copy_runs(peering: Peering) -> None:
    """The upgrade in place: a pod whose copy an earlier release made in the control namespace (`shop-web`, as
    models.virtual_kubelet.reflected_name and pod_copy made it) keeps it, and shows its status, while its
    namespace is not offloaded to this provider; once it is, the pod gets a copy in its remote namespace, and
    the old one is deleted only after the new one runs. The pod never stops Running nor restarts."""
    api = peering.consumer.api_client()
    core, remote = k8s.CoreV1Api(api), k8s.CoreV1Api(peering.provider.api_client())
    namespace = "shop"
    create_namespace(api, namespace)
    # Offloaded elsewhere for now (its selector selects no provider): the pod may be bound to a virtual node
    # (the consumer's admission reads the namespace's label), and this provider is not asked for a namespace.
    offload_namespace(api, namespace, {"clusterSelector": {"matchLabels": {"nowhere": "true"}}})
    # The pod as the earlier release left it, bound to the virtual node with its copy in the control namespace,
    # made while no virtual kubelet runs (stopped, then killed: the one the stand-in starts again is the new one).
    vk = virtual_kubelet_name(peering.provider_id)
    stopped = await eventually(lambda: peering.runner.pid(vk), what="the virtual kubelet's pid")
    os.kill(stopped, signal.SIGSTOP)
    core.create_namespaced_pod(namespace, k8s.V1Pod.model_validate({"metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"schedulerName": "nobody", "tolerations": TOLERATE,
                 "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}))  # fmt: skip
    pod: Any = core.read_namespaced_pod("web", namespace)
    old = pod_copy({"metadata": pod.to_dict()["metadata"] | {"uid": pod.metadata.uid, "namespace": namespace},
                    "spec": k8s.ApiClient().sanitize_for_serialization(pod.spec)},
                   consumer_id=peering.consumer_id, legacy=True)  # fmt: skip
    assert old["metadata"]["name"] == reflected_name(namespace, "web") == "shop-web"
    remote.create_namespaced_pod(peering.control_namespace, k8s.V1Pod.model_validate(old))
    core.create_namespaced_pod_binding("web", namespace, k8s.V1Binding.model_validate({  # it answers a Status
        "metadata": {"name": "web"}, "target": {"apiVersion": "v1", "kind": "Node", "name": peering.node}}),
        _preload_content=False)  # fmt: skip
    await eventually(lambda: remote.read_namespaced_pod("shop-web", peering.control_namespace).status.phase == "Running",
                     timeout=60, what="the old layout's copy Running")  # fmt: skip
    os.kill(stopped, signal.SIGKILL)
    await eventually(lambda: (p := peering.runner.pid(vk)) and p != stopped, timeout=60, what="the new virtual kubelet")
    await eventually(lambda: core.read_namespaced_pod("web", namespace).status.phase == "Running", timeout=60,
                     what="the pod Running on its old copy")  # fmt: skip
    await asyncio.sleep(3)  # not offloaded here: the old copy stays, and no copy is made elsewhere
    assert remote.read_namespaced_pod("shop-web", peering.control_namespace).metadata.deletion_timestamp is None
    assert _said(core.read_namespaced_pod("web", namespace)) is None

    offload_namespace(api, namespace)  # its selector gone: every provider
    remote_namespace = peering.remote(namespace)
    seen: list[tuple[str | None, str | None, str, int]] = []

    def observe() -> bool:
        """(the old copy's phase or None once deleted, the new copy's, the pod's phase, its restarts)."""
        old_copy: Any = ignore_not_found(remote.read_namespaced_pod, "shop-web", peering.control_namespace)
        new_copy: Any = ignore_not_found(remote.read_namespaced_pod, "web", remote_namespace)
        current: Any = core.read_namespaced_pod("web", namespace)
        restarts = sum(s.restart_count for s in current.status.container_statuses or [])
        seen.append((old_copy and ("Terminating" if old_copy.metadata.deletion_timestamp else old_copy.status.phase),
                     new_copy and new_copy.status.phase, current.status.phase, restarts))  # fmt: skip
        assert current.status.phase == "Running" and restarts == 0, seen[-3:]
        return old_copy is None

    while not observe():
        assert len(seen) < 900, f"the old copy not moved in time: {seen[-3:]}"
        await asyncio.sleep(0.1)
    before_deletion = [s for s in seen if s[0] not in (None, "Terminating")]
    first_gone = seen[len(before_deletion)]
    assert first_gone[1] == "Running", f"the old copy went before the new one ran: {seen}"
    moved: Any = remote.read_namespaced_pod("web", remote_namespace)
    assert moved.metadata.annotations[ORIGIN_NAME] == "web" and moved.metadata.annotations[ORIGIN_UID] == pod.metadata.uid
    # The pod's status is the new copy's now, and kubectl reaches it there.
    logs = _kubectl(peering, namespace, "logs", "web")
    assert logs.returncode == 0, logs.stderr
