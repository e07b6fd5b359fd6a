"""Namespace offloading across two providers, end to end (issue 35): a consumer peered with `left` and `right`,
their real workers and virtual kubelets, the consumer's admission policies and offloading controller.

`EnforceSameName` asks both providers for the consumer's own name: `left` already has a namespace of that name
of its own, so it refuses (and nothing of its namespace changes), while `right` makes it. A selector then keeps
the namespace to `right` alone, and `Remote` pods go there only, under their own names, in a namespace of the
same name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.deployments import DeploymentRunner
from deploy.localenv.env import EnvState
from kube.objects import ignore_not_found
from models.names import (
    GROUP,
    LABEL_PROVIDER,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    SYSTEM_NAMESPACE,
    VERSION,
    virtual_node_name,
)
from tests.kube import apply_cluster_config, create_namespace, create_node, offload_namespace
from tests.offload import offloading_entry_of, ready_node
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import request_peering

pytestmark = [pytest.mark.env, pytest.mark.offloading]

NAMESPACE = "team"


@dataclass(frozen=True)
class TwoProviders:
    consumer: LocalCluster
    providers: dict[str, LocalCluster]  # by provider id: left's first


@pytest.fixture
async def two(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str,
              tmp_path: Path) -> AsyncIterator[TwoProviders]:  # fmt: skip
    consumer = make_cluster("cons")
    providers = {f"left-{unique}": make_cluster("left"), f"right-{unique}": make_cluster("right")}
    create_namespace(consumer.api_client(), SYSTEM_NAMESPACE)
    network = NetworkModule(consumer.api_client(), local_pod_cidr="10.2.0.0/16").start()
    async with AsyncExitStack() as stack:
        stack.callback(network.stop)
        for provider_id, provider in providers.items():
            create_node(provider.api_client(), "big", cpu="8", memory="16Gi")
            apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 50})
            await stack.enter_async_context(running_worker(worker_settings(localenv, provider, provider_id)))
        await stack.enter_async_context(running_worker(worker_settings(localenv, consumer, f"cons-{unique}")))
        stack.enter_context(DeploymentRunner(consumer.kubeconfig, log_dir=tmp_path))
        for provider_id, provider in providers.items():
            request_peering(provider.api_client(), consumer.api_client(), provider_id=provider_id,
                            consumer_id=f"cons-{unique}")  # fmt: skip
        core = k8s.CoreV1Api(consumer.api_client())
        for provider_id in providers:
            await eventually(lambda p=provider_id: ready_node(core, virtual_node_name(p)), timeout=120,
                             what=f"{provider_id}'s virtual node Ready")  # fmt: skip
        yield TwoProviders(consumer, providers)


def _ready(api: k8s.ApiClient) -> dict[str, Any]:
    offloading: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME)  # fmt: skip
    conditions = (offloading.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def _pod(name: str) -> k8s.V1Pod:
    """No toleration, no affinity: the namespace's NamespaceOffloading gives them at admission."""
    return k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}})  # fmt: skip


async def test_same_name_is_refused_where_taken_and_a_selector_keeps_remote_pods_to_the_other_provider(
    two: TwoProviders,
) -> None:
    api = two.consumer.api_client()
    core = k8s.CoreV1Api(api)
    (left_id, left), (right_id, right) = two.providers.items()
    left_core, right_core = k8s.CoreV1Api(left.api_client()), k8s.CoreV1Api(right.api_client())
    create_namespace(left.api_client(), NAMESPACE)  # left's own `team`, with a pod of its own
    left_core.patch_namespace(NAMESPACE, {"metadata": {"labels": {"owner": "left"}}})
    before = left_core.read_namespace(NAMESPACE).metadata.labels

    create_namespace(api, NAMESPACE)
    same_name = {"namespaceMappingStrategy": "EnforceSameName", "podOffloadingStrategy": "Remote"}
    offload_namespace(api, NAMESPACE, same_name)
    refused = await eventually(lambda: (e := offloading_entry_of(api, NAMESPACE, left_id)) and e["phase"] == "Refused" and e,
                               timeout=60, what="left's entry Refused")  # fmt: skip
    assert refused["remoteNamespace"] == NAMESPACE and NAMESPACE in refused["message"], refused
    await eventually(lambda: (e := offloading_entry_of(api, NAMESPACE, right_id)) and e["phase"] == "Ready",
                     timeout=60, what="right's entry Ready")  # fmt: skip
    ready = await eventually(lambda: (r := _ready(api)).get("reason") == "RemoteNamespaceRefused" and r, timeout=30,
                             what="Ready False RemoteNamespaceRefused")  # fmt: skip
    assert ready["status"] == "False" and left_id in ready["message"], ready
    assert left_core.read_namespace(NAMESPACE).metadata.labels == before  # left's namespace untouched

    # The selector keeps the namespace to right: left is no longer asked, and its entry goes.
    offload_namespace(api, NAMESPACE, {**same_name, "clusterSelector": {"matchLabels": {LABEL_PROVIDER: right_id}}})
    await eventually(lambda: offloading_entry_of(api, NAMESPACE, left_id) is None, timeout=60, what="left's entry gone")
    await eventually(lambda: _ready(api).get("status") == "True", timeout=30, what="the NamespaceOffloading Ready")

    names = [f"web-{i}" for i in range(4)]
    for name in names:
        core.create_namespaced_pod(NAMESPACE, _pod(name))
    await eventually(lambda: all(core.read_namespaced_pod(n, NAMESPACE).status.phase == "Running" for n in names),
                     timeout=90, what="the Remote pods Running")  # fmt: skip
    for name in names:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        assert pod.spec.node_name == virtual_node_name(right_id), (name, pod.spec.node_name)
        copy = ignore_not_found(right_core.read_namespaced_pod, name, NAMESPACE)  # its own name, the same namespace
        assert copy is not None and copy.status.phase == "Running", name
    assert {p.metadata.name for p in left_core.list_namespaced_pod(NAMESPACE).items}.isdisjoint(names)
    assert left_core.read_namespace(NAMESPACE).metadata.labels == before
