"""resource_compute: the capacity aggregate (kube/capacity.py) of a real API server holding 5,000 nodes and
100,000 pods (`--scale 0.1` for a tenth).

Fill: concurrent POSTs over `threads` connections, responses not deserialised; pods are created bound
(spec.nodeName: no scheduler) on nodes that no kubelet or kwok keeps Ready: the bench takes off the
not-ready taint the API server's admission gives every new node, and the cluster's controller manager runs
no node lifecycle controller, which would taint them again (withholding them from the offer, as a dead
node is) and evict their pods. Neither kwok nor a kubelet writes anything back: the aggregate reads
only what the pods ask and where they are bound, and 5,000 kwok-managed nodes would cost the API server
some 125 lease renewals a second on this 2-core machine without changing what is measured.

- cold (`cold_seconds`): the product's aggregate starts, lists nodes and pods (paginated, each object
  reduced as its page is parsed) until the first computation returns. Baseline: the cheapest list a
  client can make, the same paginated lists of nodes and pods fetched raw and parsed with `json.loads`
  (in two threads, as the aggregate lists them), the faster of one run before and one after.
- memory (`rss_mib`): this process's resident memory with the aggregate synced; baseline: the same
  process before it started.
- steady (`steady_convergence_p50/p99_seconds`): `bursts` times, `burst` pods are replaced (deleted, and
  as many created asking 100m more CPU each); from the moment the last write was answered to the moment
  the aggregate shows all of them, polled every 5 ms. CPU per event: the aggregate's watch thread's CPU
  over the bursts' 2 × `burst` events each. Baseline, on the same kind of bursts after the product's
  aggregate is stopped: what a user would write instead, a watch cache of the pods (the same informer,
  keeping every pod whole) that re-sums its cached pods at each push with the same rule
  (CapacityAggregate.from_lists); converged when a re-sum shows every change.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from functools import partial
from typing import Any

from kubernetes import client as k8s

from bench.common import cpu_seconds, emit, local_env, log, percentile, rss_mb, watching_cpu_seconds
from deploy.localenv.clusters import fake_node
from kube.capacity import HomeCapacity
from kube.informer import Informer
from kube.objects import drained
from kube.streams import PAGE_SIZE
from models.resources import Resources
from models.sharing import CapacityAggregate, shared_resources
from tests.kube import pod_spec

DEFAULTS: dict[str, Any] = {"scale": 1.0, "burst": 1000, "bursts": 10, "threads": 32}
NODES, PODS, NAMESPACES = 5000, 100_000, 100
CHUNK = 2000
# The consumer whose offer is computed: it has offloaded nothing here, so its offer subtracts every pod.
CONSUMER = "bench-consumer"
POLL_SECONDS = 0.005
CONVERGENCE_TIMEOUT_SECONDS = 300


class _Cluster:
    def __init__(self, api: k8s.ApiClient, *, nodes: int, pods: int, threads: int) -> None:
        self.api, self.core = api, k8s.CoreV1Api(api)
        self.nodes, self.threads = nodes, threads
        self.namespaces = [f"load-{i}" for i in range(max(1, min(NAMESPACES, pods // 100)))]
        self.live: list[tuple[str, str]] = []  # (namespace, name) of the pods there, oldest first
        self.created = 0

    def _node(self, i: int) -> None:
        body = fake_node(f"node-{i}", cpu="32", memory="64Gi", pods="110")
        body["metadata"]["annotations"] = {}  # no kwok: nothing but the bench writes to this cluster
        drained(self.core.create_node(k8s.V1Node.model_validate(body), _preload_content=False))
        # The API server's admission taints every new node not-ready until its controller sees it Ready,
        # which nothing here will: taken off once, as a node that came up.
        drained(self.core.patch_node(body["metadata"]["name"], {"spec": {"taints": None}}, _preload_content=False))

    def _create_pod(self, cpu: str) -> Callable[[int], tuple[str, str]]:
        def create(i: int) -> tuple[str, str]:
            namespace, name = self.namespaces[i % len(self.namespaces)], f"pod-{i}"
            body = {"metadata": {"name": name}, "spec": pod_spec(
                requests={"cpu": cpu, "memory": "128Mi"}, node_name=f"node-{i % self.nodes}")}  # fmt: skip
            drained(self.core.create_namespaced_pod(namespace, k8s.V1Pod.model_validate(body), _preload_content=False))
            return namespace, name

        return create

    def _delete_pod(self, pod: tuple[str, str]) -> None:
        drained(self.core.delete_namespaced_pod(pod[1], pod[0], grace_period_seconds=0, _preload_content=False))

    def fill(self, pods: int) -> None:
        for ns in self.namespaces:
            self.core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": ns}}))
        started = time.monotonic()
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(self._node, range(self.nodes)))
            log(f"{self.nodes} nodes in {time.monotonic() - started:.0f} s")
            # In chunks, so that an interrupted run does not first drain 100,000 queued requests.
            for chunk in range(0, pods, CHUNK):
                self.live.extend(pool.map(self._create_pod("100m"), range(chunk, min(pods, chunk + CHUNK))))
                if (chunk + CHUNK) % 10_000 == 0:
                    elapsed = time.monotonic() - started
                    log(f"{chunk + CHUNK} pods in {elapsed:.0f} s ({(chunk + CHUNK) / elapsed:.0f} objects/s)")
        self.created = pods
        self.fill_seconds = time.monotonic() - started

    def replace(self, count: int) -> float:
        """Deletes the `count` oldest pods and creates as many asking 100m more CPU each (200m instead of
        100m); returns when the last write was answered (time.monotonic())."""
        gone, self.live = self.live[:count], self.live[count:]
        start = self.created
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(self._delete_pod, gone))
            self.live.extend(pool.map(self._create_pod("200m"), range(start, start + count)))
        self.created += count
        return time.monotonic()

    def raw_lists(self) -> float:
        """The cheapest list of everything the aggregate lists: raw pages, `json.loads`, nothing kept."""

        def listing(call: Callable[..., Any]) -> None:
            token: str | None = None
            while True:
                page = json.loads(call(limit=PAGE_SIZE, _preload_content=False, **({"_continue": token} if token else {})).data)
                token = page["metadata"].get("continue")
                del page
                if not token:
                    return

        started = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(listing, (self.core.list_node, self.core.list_pod_for_all_namespaces)))
        return time.perf_counter() - started


def _wait(converged: Callable[[], bool], since: float, what: str) -> float:
    """Seconds from `since` until `converged()`; infinite (a miss) after CONVERGENCE_TIMEOUT_SECONDS."""
    while not converged():
        if time.monotonic() - since > CONVERGENCE_TIMEOUT_SECONDS:
            log(f"{what}: not converged within {CONVERGENCE_TIMEOUT_SECONDS} s")
            return float("inf")  # a miss: counted, never dropped
        time.sleep(POLL_SECONDS)
    return time.monotonic() - since


class _WatchCache:
    """The baseline: every pod and node kept whole by the same informer; each push re-sums them all."""

    def __init__(self, api: k8s.ApiClient) -> None:
        core = k8s.CoreV1Api(api)
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}
        self.node_informer: Informer[dict[str, Any]] = Informer(
            "cache-nodes", core.list_node, on_sync=lambda objs: self._sync(self._nodes, objs),
            on_event=lambda kind, obj: self._event(self._nodes, kind, obj))  # fmt: skip
        self.pod_informer: Informer[dict[str, Any]] = Informer(
            "cache-pods", core.list_pod_for_all_namespaces, on_sync=lambda objs: self._sync(self._pods, objs),
            on_event=lambda kind, obj: self._event(self._pods, kind, obj))  # fmt: skip

    def _sync(self, into: dict[str, dict[str, Any]], objects: list[dict[str, Any]]) -> None:
        with self._lock:
            into.clear()
            into.update((o["metadata"]["uid"], o) for o in objects)

    def _event(self, into: dict[str, dict[str, Any]], kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            if kind == "DELETED":
                into.pop(obj["metadata"]["uid"], None)
            else:
                into[obj["metadata"]["uid"]] = obj

    def start(self) -> _WatchCache:
        for informer in (self.node_informer, self.pod_informer):
            informer.start()
        for informer in (self.node_informer, self.pod_informer):
            informer.wait_synced()
        return self

    def stop(self) -> None:
        for informer in (self.node_informer, self.pod_informer):
            informer.stop()

    def used(self) -> Resources:
        with self._lock:
            nodes, pods = list(self._nodes.values()), list(self._pods.values())
        return CapacityAggregate.from_lists(nodes, pods).used_for(CONSUMER)


def _shows(used_now: Callable[[], Resources], cpu: Decimal) -> bool:
    return used_now()["cpu"] == cpu


def _bursts(cluster: _Cluster, used_now: Callable[[], Resources], bursts: int, burst: int,
            cpu: Callable[[], float]) -> tuple[list[float], float]:  # fmt: skip
    """Convergence time of each burst, and CPU seconds per event of what `cpu` measures."""
    times: list[float] = []
    cpu_before = cpu()
    for i in range(bursts):
        want = used_now()["cpu"] + Decimal("0.1") * burst
        written = cluster.replace(burst)
        times.append(_wait(partial(_shows, used_now, want), written, f"burst {i}"))
        log(f"burst {i}: {times[-1]:.3f} s")
    return times, (cpu() - cpu_before) / (2 * burst * bursts)


def _measure(params: dict[str, Any]) -> None:
    scale = float(params["scale"])
    nodes, pods = max(1, int(NODES * scale)), max(1, int(PODS * scale))
    burst, bursts = min(int(params["burst"]), pods // 2), int(params["bursts"])
    # Nothing keeps its nodes Ready: without the node lifecycle controller none is tainted NotReady, which
    # would withhold it from the offer (models/sharing.py takes_foreign_pods) as it would a dead node.
    with local_env(["big"], without_node_lifecycle=["big"]) as env:
        api = env.cluster("big").api_client()
        cluster = _Cluster(api, nodes=nodes, pods=pods, threads=int(params["threads"]))
        cluster.fill(pods)
        raw_before = cluster.raw_lists()
        gc.collect()
        rss_before = rss_mb()

        started = time.perf_counter()
        capacity = HomeCapacity(api).start()
        allocatable, used, _ = capacity.snapshot(CONSUMER)
        shared_resources(allocatable=allocatable, used=used, percent=50)
        cold = time.perf_counter() - started
        gc.collect()
        rss_synced = rss_mb()
        log(f"cold {cold:.2f} s; rss {rss_before:.0f} → {rss_synced:.0f} MiB")

        product, product_cpu = _bursts(cluster, lambda: capacity.snapshot(CONSUMER).used, bursts, burst,
                                       watching_cpu_seconds)  # fmt: skip
        capacity.stop()
        raw_after = cluster.raw_lists()
        raw = min(raw_before, raw_after)
        log(f"raw list + json.loads: {raw_before:.2f} s before, {raw_after:.2f} s after")

        cache = _WatchCache(api).start()
        main = threading.current_thread()
        cpu_before = cpu_seconds(thread=main) + watching_cpu_seconds()
        baseline, _ = _bursts(cluster, cache.used, bursts, burst, watching_cpu_seconds)
        baseline_cpu = (cpu_seconds(thread=main) + watching_cpu_seconds() - cpu_before) / (
            2 * burst * bursts)
        cache.stop()

    common = {"nodes": nodes, "pods": pods, "scale": scale, "fill_objects_per_second": round((nodes + pods) / cluster.fill_seconds)}
    emit("resource_compute.cold_seconds", cold, "s", baseline=raw, params={
        **common, "baseline": "paginated raw list of nodes and pods + json.loads, nothing kept (faster of before/after)",
        "target": "≤ 1.2× baseline"})  # fmt: skip
    emit("resource_compute.rss_mib", rss_synced, "MiB", baseline=rss_before, params={
        **common, "what": "resident memory of the process holding the synced aggregate; baseline: before it started",
        "target": "≤ 300 MiB"})  # fmt: skip
    burst_params = {**common, "burst": burst, "bursts": bursts, "what": "last write of a burst of replaced pods answered "
                    "→ the aggregate shows all of them; baseline: a watch cache re-summing its pods at each push"}  # fmt: skip
    emit("resource_compute.steady_convergence_p50_seconds", percentile(product, 50), "s",
         baseline=percentile(baseline, 50), params=burst_params)  # fmt: skip
    emit("resource_compute.steady_convergence_p99_seconds", percentile(product, 99), "s",
         baseline=percentile(baseline, 99), params={**burst_params, "target": "≤ 1 s"})  # fmt: skip
    emit("resource_compute.cpu_per_event_microseconds", product_cpu * 1e6, "µs", baseline=baseline_cpu * 1e6,
         params={**common, "what": "CPU of the aggregate's pod watch thread per pod event; baseline: the cache's "
                 "watch thread and its re-sums, per event"})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    _measure(params)
