"""Credentials that rotate, end to end on real clusters: a provider and a consumer with their real workers,
the consumer's kubelet stand-in running the real virtual kubelet, whose pods run in the provider.
A rotation must not disturb them, and a token that is revoked (by rotation or withdrawal) must be refused
by the provider's API server."""

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
from models.credentials import TokenGeneration
from models.names import (
    LABEL_OFFLOADED,
    LABEL_PROVIDER,
    TAINT_VIRTUAL_NODE,
    foreign_namespace,
    remote_namespace_default_name,
    virtual_kubelet_name,
    virtual_node_name,
)
from tests.faults import Pair, new_pair
from tests.kube import apply_cluster_config
from tests.rotation import force_rotation, held_kubeconfig, refused
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import cancel_peering, request_peering

pytestmark = [pytest.mark.env, pytest.mark.steady, pytest.mark.vk]

# The API server caches a successful authentication for about 10 s: a revoked token is refused after that.
REVOKED_WITHIN_SECONDS = 30
PERIOD_SECONDS = 10  # the provider's push period here: each periodic push checks the token


@dataclass
class Running:
    pair: Pair
    runner: DeploymentRunner
    logs: Path

    @property
    def node(self) -> str:
        return virtual_node_name(self.pair.provider_id)

    @property
    def namespace(self) -> str:
        return foreign_namespace(self.pair.consumer_id)


@pytest.fixture
async def running(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path
) -> AsyncIterator[Running]:
    pair = new_pair(make_cluster, unique)
    network = NetworkModule(pair.consumer.api_client(), local_pod_cidr="10.2.0.0/16").start()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(worker_settings(localenv, pair.provider, pair.provider_id)))
        await stack.enter_async_context(running_worker(worker_settings(localenv, pair.consumer, pair.consumer_id)))
        runner = stack.enter_context(DeploymentRunner(pair.consumer.kubeconfig, log_dir=tmp_path))
        stack.callback(network.stop)
        apply_cluster_config(pair.provider.api_client(), outgoing={"advertisementPeriodSeconds": PERIOD_SECONDS})
        request_peering(pair.provider.api_client(), pair.consumer.api_client(), provider_id=pair.provider_id,
                        consumer_id=pair.consumer_id)  # fmt: skip
        yield Running(pair, runner, tmp_path)


def _ready(core: k8s.CoreV1Api, node: str) -> Any:
    condition = next((c for c in core.read_node(node).status.conditions or [] if c.type == "Ready"), None)
    return condition if condition is not None and condition.status == "True" else None


def _held_kubeconfig(run: Running) -> str:
    """The kubeconfig the consumer holds now (the test reads it as the virtual kubelet's volume would)."""
    return held_kubeconfig(run.pair.consumer.api_client(), run.pair.provider_id)


async def _force_rotation(run: Running) -> TokenGeneration:
    return await force_rotation(run.pair.provider.api_client(), run.pair.consumer_id, period_seconds=PERIOD_SECONDS)


def _offloaded_pod(name: str, provider_id: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "busybox"}],
        "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
        "nodeSelector": {LABEL_PROVIDER: provider_id}}}  # fmt: skip


def _copies(run: Running) -> dict[str | None, tuple[str | None, int]]:
    """The provider's copies, in `app`'s remote namespace (new_pair offloads it): name -> (uid, restarts)."""
    pods = k8s.CoreV1Api(run.pair.provider.api_client()).list_namespaced_pod(
        remote_namespace_default_name(run.pair.consumer_id, "app"), label_selector=f"{LABEL_OFFLOADED}=true").items  # fmt: skip
    return {p.metadata.name: (p.metadata.uid, sum(c.restart_count for c in (p.status.container_statuses if p.status else None) or []))
            for p in pods}  # fmt: skip


async def test_rotating_credentials_under_a_virtual_node_with_pods_disturbs_nothing_and_revokes_the_old_token(
    running: Running,
) -> None:
    run, core = running, k8s.CoreV1Api(running.pair.consumer.api_client())
    before = await eventually(lambda: _ready(core, run.node), timeout=90, what="the virtual node Ready")
    for name in ("web", "worker"):
        core.create_namespaced_pod("app", k8s.V1Pod.model_validate(_offloaded_pod(name, run.pair.provider_id)))
    await eventually(lambda: all(core.read_namespaced_pod(n, "app").status.phase == "Running" for n in ("web", "worker")),
                     timeout=60, what="both pods Running through the provider")  # fmt: skip
    uids = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod("app").items}
    copies = _copies(run)
    assert len(copies) == 2
    vk = virtual_kubelet_name(run.pair.provider_id)
    pid = run.runner.pid(vk)
    assert pid is not None
    first = _held_kubeconfig(run)  # what the virtual kubelet started with

    await _force_rotation(run)
    second = _held_kubeconfig(run)
    assert second != first
    assert not refused(first, run.namespace)  # the previous token stays valid: a slow reader keeps working
    await _force_rotation(run)
    third = _held_kubeconfig(run)
    assert third not in (first, second)
    # The token before the previous is revoked (its anchor Secret went); the previous and current work.
    await eventually(lambda: refused(first, run.namespace), timeout=REVOKED_WITHIN_SECONDS,
                     what="the first token refused by the provider's API server")  # fmt: skip
    assert not refused(second, run.namespace) and not refused(third, run.namespace)

    # The virtual kubelet, which started with the now-refused token, works on: a new pod is run in the
    # provider and brought back Running, by the same process, without a restart.
    core.create_namespaced_pod("app", k8s.V1Pod.model_validate(_offloaded_pod("after", run.pair.provider_id)))
    await eventually(lambda: core.read_namespaced_pod("after", "app").status.phase == "Running", timeout=60,
                     what="a pod created after the revocation Running through the provider")  # fmt: skip
    assert run.runner.pid(vk) == pid
    after = _ready(core, run.node)
    assert after is not None and after.last_transition_time == before.last_transition_time  # never NotReady
    assert {n: u for n, u in ((p.metadata.name, p.metadata.uid) for p in core.list_namespaced_pod("app").items)
            if n in uids} == uids  # fmt: skip
    still = _copies(run)
    assert {n: still[n] for n in copies} == copies  # same copies, no restart
    assert "ProviderUnreachable" not in (run.logs / f"{vk}.log").read_text()


async def test_a_withdrawal_revokes_the_last_token_and_the_virtual_kubelet_reports_the_provider_clean(
    running: Running,
) -> None:
    run, core = running, k8s.CoreV1Api(running.pair.consumer.api_client())
    await eventually(lambda: _ready(core, run.node), timeout=90, what="the virtual node Ready")
    held = _held_kubeconfig(run)
    assert not refused(held, run.namespace)
    cancel_peering(run.pair.provider.api_client(), consumer_id=run.pair.consumer_id)
    await eventually(lambda: refused(held, run.namespace), timeout=REVOKED_WITHIN_SECONDS,
                     what="the last token handed out refused after the withdrawal")  # fmt: skip
    # Its 401 is read as "clean" only because the provider marked its Advertisement withdrawn first.
    log = run.logs / f"{virtual_kubelet_name(run.pair.provider_id)}.log"
    await eventually(lambda: "teardown: provider namespace" in log.read_text(), timeout=90,
                     what="the virtual kubelet reporting the provider clean")  # fmt: skip
    assert "did not withdraw" not in log.read_text()
