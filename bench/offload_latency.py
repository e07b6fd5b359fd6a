"""offload_latency: how long offloading takes, end to end, on a provider and a consumer of the
benchmark's own, each with its real worker, the consumer's network module and the local stand-in that
runs the virtual kubelet Deployment (as tests/test_virtual_kubelet.py runs them).

- `node_ready`: the consumer sees the Advertisement Accepted → the virtual node is Ready; one sample per
  peering, `peerings` times (each peering is withdrawn and requested again);
  baseline: a kwok node created on the consumer → Ready.
- `pod_running.consumer` / `.provider`: a pod created in the consumer for the virtual node → Running in
  the consumer / its copy Running in the provider; `pods` samples, one pod at a time;
  baseline: the same pod for a kwok node of the consumer → Running.

Times are taken by polling every 20 ms, so each carries up to that much error.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from typing import Any

from kubernetes import client as k8s

from bench.common import emit, local_env, log, percentile
from deploy.localenv.deployments import DeploymentRunner
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_PROVIDER,
    TAINT_VIRTUAL_NODE,
    advertisement_name,
    remote_namespace_default_name,
    virtual_node_name,
)
from tests.faults import prepare_pair
from tests.kube import create_node, pod_spec
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import cancel_peering, request_peering

DEFAULTS: dict[str, Any] = {"peerings": 3, "pods": 30}
POLL = 0.02
TIMEOUT = 180


async def _until(check: Any, what: str) -> float:
    """Polls `check` (a blocking call, run in a thread) until truthy; returns the perf_counter time at which
    it first was."""
    return float(await eventually(lambda: asyncio.to_thread(lambda: check() and time.perf_counter()),
                                  timeout=TIMEOUT, interval=POLL, what=what))  # fmt: skip


def _ready(core: k8s.CoreV1Api, name: str) -> bool:
    try:
        node = core.read_node(name)
    except k8s.ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions if node.status else None) or [])


def _running(core: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        status = core.read_namespaced_pod(name, namespace).status
        return status is not None and status.phase == "Running"
    except k8s.ApiException:
        return False


def _phase(api: k8s.ApiClient, name: str) -> str | None:
    obj = read_cluster_object(api, ADVERTISEMENTS, name)
    return None if obj is None else (obj.get("status") or {}).get("phase")


def _pod(name: str, *, selector: dict[str, str], tolerate: bool) -> dict[str, Any]:
    tolerations = [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}] if tolerate else None
    return {"metadata": {"name": name},
            "spec": pod_spec(requests={"cpu": "10m"}, node_selector=selector, tolerations=tolerations)}  # fmt: skip


async def _measure(params: dict[str, Any]) -> None:
    peerings, pods = int(params["peerings"]), int(params["pods"])
    samples: dict[str, list[float]] = {k: [] for k in ("node", "node_base", "consumer", "provider", "pod_base")}
    with local_env(["provider", "consumer"]) as env:
        provider, consumer = env.cluster("provider"), env.cluster("consumer")
        p_api, c_api = provider.api_client(), consumer.api_client()
        p_core, c_core = k8s.CoreV1Api(p_api), k8s.CoreV1Api(c_api)
        provider_id, consumer_id = "bench-provider", "bench-consumer"
        prepare_pair(p_api, c_api)
        node, adv = virtual_node_name(provider_id), advertisement_name(provider_id)
        network = NetworkModule(c_api, local_pod_cidr="10.2.0.0/16").start()
        async with AsyncExitStack() as stack:
            stack.callback(network.stop)
            await stack.enter_async_context(running_worker(worker_settings(env, provider, provider_id)))
            await stack.enter_async_context(running_worker(worker_settings(env, consumer, consumer_id)))
            stack.enter_context(DeploymentRunner(consumer.kubeconfig))
            for i in range(peerings):
                started = time.perf_counter()
                create_node(c_api, f"local-{i}", cpu="8", memory="16Gi")
                samples["node_base"].append(
                    await _until(lambda i=i: _ready(c_core, f"local-{i}"), "kwok node") - started
                )

                request_peering(p_api, c_api, provider_id=provider_id, consumer_id=consumer_id)
                accepted = await _until(lambda: _phase(c_api, adv) == "Accepted", "the Advertisement Accepted")
                ready = await _until(lambda: _ready(c_core, node), "the virtual node Ready")
                samples["node"].append(ready - accepted)
                log(f"peering {i + 1}/{peerings}: node Ready {ready - accepted:.2f} s after acceptance")
                if i == peerings - 1:
                    break
                cancel_peering(p_api, consumer_id=consumer_id)
                await _until(lambda: read_cluster_object(c_api, ADVERTISEMENTS, adv) is None, "the Advertisement gone")
                await _until(lambda: not _ready(c_core, node), "the virtual node gone")

            remote = remote_namespace_default_name(consumer_id, "app")  # prepare_pair offloads `app`
            for j in range(pods):
                started = time.perf_counter()
                c_core.create_namespaced_pod("app", k8s.V1Pod.model_validate(_pod(f"local-{j}", selector={"kubernetes.io/hostname": "local-0"},
                                                         tolerate=False)))  # fmt: skip
                samples["pod_base"].append(await _until(lambda j=j: _running(c_core, "app", f"local-{j}"), "kwok pod")
                                           - started)  # fmt: skip

                started = time.perf_counter()
                c_core.create_namespaced_pod(
                    "app", k8s.V1Pod.model_validate(_pod(f"off-{j}", selector={LABEL_PROVIDER: provider_id}, tolerate=True))
                )
                on_provider = asyncio.create_task(
                    _until(lambda j=j: _running(p_core, remote, f"off-{j}"), "provider copy")
                )
                on_consumer = await _until(lambda j=j: _running(c_core, "app", f"off-{j}"), "offloaded pod Running")
                samples["consumer"].append(on_consumer - started)
                samples["provider"].append(await on_provider - started)
            log(f"{pods} pods measured")
    _report(samples, peerings, pods)


def _report(samples: dict[str, list[float]], peerings: int, pods: int) -> None:
    for p in (50, 99):
        emit(f"offload_latency.node_ready.p{p}", percentile(samples["node"], p), "s",
             baseline=percentile(samples["node_base"], p),
             params={"peerings": peerings, "from": "Advertisement Accepted on the consumer",
                     "baseline": "a kwok node created → Ready on the consumer"})  # fmt: skip
        for side in ("consumer", "provider"):
            emit(f"offload_latency.pod_running.{side}.p{p}", percentile(samples[side], p), "s",
                 baseline=percentile(samples["pod_base"], p),
                 params={"pods": pods, "from": "pod created in the consumer",
                         "baseline": "the same pod for a kwok node of the consumer → Running"})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
