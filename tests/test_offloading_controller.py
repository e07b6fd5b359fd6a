"""The consumer's offloading controller (workers/offloading.py) in the real worker, driven by the real CLI:
`tidepool offload namespace` writes the NamespaceOffloading, the controller holds it with its finalizer,
labels the namespace, says Ready from the virtual kubelets' entries, and `tidepool unoffload namespace`
drains: pods on virtual nodes deleted gracefully, the finalizer released only once none is left and
status.clusters is empty, DrainBlocked saying what it waits for meanwhile. The entries of status.clusters are
written here as the cluster's admin, with a virtual kubelet's field manager, standing for it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from models.names import (
    GROUP,
    LABEL_OFFLOADING,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    OFFLOADING_FINALIZER,
    SYSTEM_NAMESPACE,
    VERSION,
)
from tests.kube import create_namespace, create_node
from tests.running import eventually, running_worker, worker_settings
from tests.test_offloading_admission import create_virtual_node, pod

pytestmark = [pytest.mark.env, pytest.mark.offloading]

ROOT = Path(__file__).resolve().parents[1]


async def tidepool(*args: str) -> tuple[int, str, str]:
    """The CLI as a user runs it, without blocking the event loop the worker under test shares."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "workers.cli", *args, cwd=ROOT,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode or 0, out.decode(), err.decode()


def read(custom: k8s.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME)
    assert isinstance(obj, dict)
    return obj


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def report(custom: k8s.CustomObjectsApi, namespace: str, provider: str, **entry: str) -> None:
    """A virtual kubelet's entry of status.clusters (its own field manager; no entry: it removed its own)."""
    clusters = [{"clusterId": provider, **entry}] if entry else []
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NamespaceOffloading",
         "metadata": {"name": NAMESPACE_OFFLOADING_NAME, "namespace": namespace}, "status": {"clusters": clusters}},
        field_manager=f"tidepool-vk-{provider}", force=True, _content_type="application/apply-patch+yaml")  # fmt: skip


async def test_offload_labels_and_readies_the_namespace_and_unoffload_drains_it_before_letting_go(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    cluster = make_cluster("offc")
    api, kubeconfig = cluster.api_client(), str(cluster.kubeconfig)
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    create_node(api, "home", cpu="8", memory="16Gi")
    create_namespace(api, SYSTEM_NAMESPACE)
    provider, other = f"a-{unique}", f"b-{unique}"
    node = create_virtual_node(api, provider)
    create_virtual_node(api, other)
    create_namespace(api, "team")
    async with running_worker(worker_settings(localenv, cluster, f"cons-{unique}")):
        code, out, err = await tidepool("offload", "namespace", "team", "--selector", f"tidepool.io/provider={provider}",
                                        "--pod-strategy", "Remote", "--kubeconfig", kubeconfig)  # fmt: skip
        assert code == 0, err
        assert f"namespace team offloaded (pods Remote, mapping DefaultName, clusters tidepool.io/provider={provider})" in out

        def pending() -> dict[str, Any] | None:
            obj = read(custom, "team")
            return obj if ready(obj).get("reason") == "RemoteNamespacesPending" else None

        obj = await eventually(pending, timeout=30, what="Ready False RemoteNamespacesPending")
        assert OFFLOADING_FINALIZER in obj["metadata"]["finalizers"]
        assert f"{provider} (not reported yet)" in ready(obj)["message"] and other not in ready(obj)["message"]
        assert (core.read_namespace("team").metadata.labels or {})[LABEL_OFFLOADING] == "Remote"

        # The selected provider's virtual kubelet reports its remote namespace Ready, then refused.
        report(custom, "team", provider, remoteNamespace="team-r", phase="Ready")
        await eventually(lambda: ready(read(custom, "team")).get("status") == "True", timeout=20, what="Ready True")
        assert ready(read(custom, "team"))["reason"] == "RemoteNamespacesReady"
        report(custom, "team", provider, remoteNamespace="team-r", phase="Refused", message="namespace team-r is taken")
        await eventually(lambda: ready(read(custom, "team")).get("reason") == "RemoteNamespaceRefused", timeout=20,
                         what="Ready False RemoteNamespaceRefused")  # fmt: skip
        assert ready(read(custom, "team"))["message"] == f"cluster {provider} refused namespace team-r: namespace team-r is taken"
        report(custom, "team", provider, remoteNamespace="team-r", phase="Ready")

        # Changing how pods are placed is an update; the mapping cannot change (the API server says why).
        code, _out, err = await tidepool("offload", "namespace", "team", "--namespace-mapping", "EnforceSameName",
                                         "--kubeconfig", kubeconfig)  # fmt: skip
        assert code == 1 and "namespaceMappingStrategy and remoteNamespaceName are immutable" in err, err

        # A pod on the virtual node, held by a finalizer of the test's: it stays Terminating until let go.
        # (Refused while the API server's informer of the policy's parameter starts: made again, as a controller would.)
        await eventually(lambda: core.create_namespaced_pod("team", pod("web", finalizers=["test.io/hold"])), timeout=20,
                         what="the pod created")  # fmt: skip
        await eventually(lambda: core.read_namespaced_pod("web", "team").spec.node_name == node, timeout=30,
                         what="the pod scheduled on the virtual node")  # fmt: skip
        code, out, err = await tidepool("status", "--cluster", f"cons={kubeconfig}")
        assert code == 0, err
        assert f"cons     team       Remote  tidepool.io/provider={provider}" in out, out
        assert "team-r (Ready)" in out and f"cons     team/web  {node}" in out, out

        code, out, err = await tidepool("unoffload", "namespace", "team", "--kubeconfig", kubeconfig)
        assert code == 0 and "namespace team unoffloading" in out, err
        await eventually(lambda: core.read_namespaced_pod("web", "team").metadata.deletion_timestamp, timeout=30,
                         what="the pod deleted gracefully")  # fmt: skip
        blocked = await eventually(lambda: ready(read(custom, "team")).get("reason") == "DrainBlocked"
                                   and ready(read(custom, "team")), timeout=30, what="DrainBlocked")  # fmt: skip
        assert "1 pod(s) to leave the virtual nodes: web" in blocked["message"], blocked
        assert f"the remote namespace to be deleted in {provider} (team-r: Ready)" in blocked["message"], blocked
        assert LABEL_OFFLOADING not in (core.read_namespace("team").metadata.labels or {})  # removed first
        await asyncio.sleep(2)
        assert read(custom, "team")["metadata"]["finalizers"] == [OFFLOADING_FINALIZER]  # held while anything remains

        core.patch_namespaced_pod("web", "team", {"metadata": {"finalizers": None}})  # the kubelet lets it go
        await eventually(lambda: "pod(s)" not in ready(read(custom, "team")).get("message", "x"), timeout=30,
                         what="DrainBlocked naming only the provider")  # fmt: skip
        assert f"in {provider} (team-r: Ready)" in ready(read(custom, "team"))["message"]
        assert read(custom, "team")["metadata"]["finalizers"] == [OFFLOADING_FINALIZER]

        report(custom, "team", provider)  # its remote namespace gone, the virtual kubelet removes its entry
        code, out, err = await tidepool("unoffload", "namespace", "team", "--wait", "--timeout", "60",
                                        "--kubeconfig", kubeconfig)  # fmt: skip
        assert code == 0, err
        assert "namespace team drained" in out or "namespace team is not offloaded" in out, out
        left = custom.list_namespaced_custom_object(GROUP, VERSION, "team", NAMESPACE_OFFLOADINGS)
        assert isinstance(left, dict) and left["items"] == []
