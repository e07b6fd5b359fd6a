"""A provider and a consumer of a test's own, peered, each with its real worker, the consumer's network
module and the stand-in that runs the real virtual kubelet: what the virtual kubelet's end-to-end tests
(tests/test_virtual_kubelet.py, tests/test_reflection.py) start from."""

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
from models.names import SYSTEM_NAMESPACE, foreign_namespace, virtual_node_name
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.running import running_worker, worker_settings
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
    def remote_namespace(self) -> str:
        return foreign_namespace(self.consumer_id)


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
                 provider_node_pod_cidr: str | None = None, log_dir: Path | None = None) -> AsyncIterator[Peering]:  # fmt: skip
    """The provider has one 8-CPU kwok node and shares half of it; the consumer has `consumer_nodes` of
    its own and its network module remaps the provider's PodCIDR if it overlaps `consumer_pod_cidr`. The
    virtual kubelet writes its log to `log_dir`/<its name>.log. The provider advertises `provider_pod_cidr`, or
    its worker's default; its node's pods get IPs from `provider_node_pod_cidr`, or from kwok's default block."""
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    create_node(provider.api_client(), "big", cpu="8", memory="16Gi", pod_cidr=provider_node_pod_cidr)
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
        await stack.enter_async_context(running_worker(worker_settings(localenv, consumer, consumer_id)))
        runner = stack.enter_context(DeploymentRunner(consumer.kubeconfig, log_dir=log_dir))
        stack.callback(network.stop)
        request_peering(provider.api_client(), consumer.api_client(), provider_id=provider_id, consumer_id=consumer_id)
        yield Peering(provider, consumer, provider_id, consumer_id, runner)


def ready_node(core: k8s.CoreV1Api, name: str) -> Any:
    """The node if it is Ready, else None."""
    node = core.read_node(name)
    return node if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) else None
