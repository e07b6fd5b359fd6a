"""A provider and a consumer of a test's own, peered, each with its real worker, the consumer's network
module and the stand-in that runs the real virtual kubelet: what the virtual kubelet's end-to-end tests
(tests/test_virtual_kubelet.py, tests/test_reflection.py) start from. A pod reaches a virtual node only in
a namespace offloaded first (`offload_namespace`, as the cluster's admin runs `tidepool offload namespace`);
its copy is then in the namespace's remote namespace (`Peering.remote`), under its own name."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster
from deploy.localenv.deployments import DeploymentRunner
from deploy.localenv.env import EnvState
from models.api.offloading import NamespaceOffloadingSpec
from models.names import (
    GROUP,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    SYSTEM_NAMESPACE,
    VERSION,
    foreign_namespace,
    virtual_node_name,
)
from models.offloading import remote_namespace_name
from models.settings import VirtualKubeletSettings
from tests.kube import apply_cluster_config, create_namespace, create_node, offload_namespace
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import request_peering


@dataclass
class Peering:
    provider: LocalCluster
    consumer: LocalCluster
    provider_id: str
    consumer_id: str
    runner: DeploymentRunner

    @property
    def node(self) -> str:
        return virtual_node_name(self.provider_id)

    @property
    def control_namespace(self) -> str:
        """The consumer's namespace in the provider: its quota, keepalive, RemoteNamespaces, and the copies of
        the single-namespace layout."""
        return foreign_namespace(self.consumer_id)

    def remote(self, namespace: str, spec: NamespaceOffloadingSpec | None = None) -> str:
        """The remote namespace in the provider of a consumer namespace offloaded with `spec` (the default)."""
        return remote_namespace_name(spec or NamespaceOffloadingSpec(), consumer_cluster_id=self.consumer_id,
                                     namespace=namespace)  # fmt: skip


@contextmanager
def own_clusters(localenv: EnvState) -> Iterator[tuple[Callable[[str], LocalCluster], str]]:
    """`make_cluster` for a module-scoped fixture (which cannot use that function-scoped one): a maker of
    clusters named <role>-<suffix>, and the suffix; the clusters it made are deleted at the end."""
    binaries, workdir, made = ensure_binaries(), Path(localenv.state_dir) / "kwok", []
    suffix = uuid.uuid4().hex[:8]

    def make(role: str) -> LocalCluster:
        made.append(f"{role}-{suffix}")
        return create_cluster(made[-1], binaries=binaries, workdir=workdir)

    try:
        yield make, suffix
    finally:
        for name in made:
            delete_cluster(name, binaries=binaries, workdir=workdir)


@asynccontextmanager
async def peered(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, *,
                 consumer_pod_cidr: str, consumer_nodes: tuple[str, ...] = (), provider_pod_cidr: str | None = None,
                 provider_node_pod_cidr: str | None = None, log_dir: Path | None = None,
                 provider: LocalCluster | None = None,
                 virtual_kubelet: VirtualKubeletSettings | None = None) -> AsyncIterator[Peering]:  # fmt: skip
    """The provider has one 8-CPU kwok node and shares half of it; the consumer has `consumer_nodes` of
    its own and its network module remaps the provider's PodCIDR if it overlaps `consumer_pod_cidr`. The
    virtual kubelet writes its log to `log_dir`/<its name>.log. The provider advertises `provider_pod_cidr`, or
    its worker's default; its node's pods get IPs from `provider_node_pod_cidr`, or from kwok's default block.
    `provider`: a cluster with nodes of its own (a real node) to be the provider instead, as it is.
    `virtual_kubelet`: the consumer worker's settings for its virtual kubelets."""
    if provider is None:
        provider = make_cluster("prov")
        create_node(provider.api_client(), "big", cpu="8", memory="16Gi", pod_cidr=provider_node_pod_cidr)
    consumer = make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    for node in consumer_nodes:
        create_node(consumer.api_client(), node, cpu="8", memory="16Gi")
    apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 50})
    create_namespace(consumer.api_client(), SYSTEM_NAMESPACE)
    network = NetworkModule(consumer.api_client(), local_pod_cidr=consumer_pod_cidr).start()
    async with AsyncExitStack() as stack:
        settings = worker_settings(localenv, provider, provider_id)
        if provider_pod_cidr:
            settings = settings.model_copy(update={"cluster": settings.cluster.model_copy(
                update={"pod_cidr": provider_pod_cidr})})  # fmt: skip
        await stack.enter_async_context(running_worker(settings))
        consumer_settings = worker_settings(localenv, consumer, consumer_id)
        if virtual_kubelet is not None:  # the virtual kubelets' settings, as the consumer's worker hands them down
            consumer_settings = consumer_settings.model_copy(update={"virtual_kubelet": virtual_kubelet})
        await stack.enter_async_context(running_worker(consumer_settings))
        runner = stack.enter_context(DeploymentRunner(consumer.kubeconfig, log_dir=log_dir))
        stack.callback(network.stop)
        request_peering(provider.api_client(), consumer.api_client(), provider_id=provider_id, consumer_id=consumer_id)
        yield Peering(provider, consumer, provider_id, consumer_id, runner)


def ready_node(core: k8s.CoreV1Api, name: str) -> Any:
    """The node if it is Ready, else None."""
    node = core.read_node(name)
    return node if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) else None


def offloading_entry_of(api: k8s.ApiClient, namespace: str, provider_id: str) -> dict[str, Any] | None:
    """A provider's entry in the namespace's NamespaceOffloading's status.clusters, None without one."""
    offloading: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME)  # fmt: skip
    clusters = (offloading.get("status") or {}).get("clusters") or []
    return next((c for c in clusters if c.get("clusterId") == provider_id), None)


async def offloaded_namespace(peering: Peering, namespace: str, spec: dict[str, Any] | None = None, *,
                    timeout: float = 60) -> str:  # fmt: skip
    """The namespace created if need be and offloaded, and its remote namespace Ready in the provider (the
    virtual kubelet's entry says so): its name there."""
    api = peering.consumer.api_client()
    create_namespace(api, namespace)
    offload_namespace(api, namespace, spec)
    entry = await eventually(lambda: (e := offloading_entry_of(api, namespace, peering.provider_id)) and e["phase"] == "Ready" and e,
                             timeout=timeout, what=f"namespace {namespace}'s remote namespace Ready")  # fmt: skip
    return str(entry["remoteNamespace"])
