"""offload_scale: `pods` pods (1,000 by default) created at once on one virtual node (issue 18), on a
provider and a consumer of the benchmark's own with their real workers, the consumer's network module and
the local stand-in that runs the virtual kubelet Deployment as a process (as bench/offload_latency.py).

The pods are spread over `namespaces` offloaded namespaces (1 by default: `app`; more: `app-0`, `app-1`, ...,
each with its NamespaceOffloading and so its own remote namespace in the provider, issue 35). Each pod has a
ConfigMap of its own in its namespace (envFrom: the virtual kubelet reflects each one to the provider), and
one Service in each namespace selects its pods. The pods are POSTed over `threads` connections at once, as
bench/resource_compute.py fills. The provider gets kwok nodes enough for every copy and shares 100%, so
that the virtual node (whose capacity is the Advertisement's) has room for `pods`.

- `pods_running_seconds`: from the first POST until every pod is Running in the consumer;
- `pod_running_p50_seconds` / `pod_running_p99_seconds`: per pod, its POST → Running in the consumer;
- `endpoints_ready_seconds`: from the first POST until the Service's EndpointSlices in the consumer list
  every pod as ready (the consumer's EndpointSlice controller builds them from podIP and Ready, which the
  virtual kubelet copies from the provider);
- `pods_missed`: pods not Running by the deadline (TIMEOUT_BASE_SECONDS + `seconds_per_pod` × pods); a
  miss makes the figures it reaches infinite, it is never left out;
- `virtual_kubelet_rss_mib`: the node agent's peak resident memory (VmRSS sampled every SAMPLE_SECONDS);
- `virtual_kubelet_cpu_seconds_per_pod`: the node agent's user + system CPU over the run, per pod.

Baseline, in the same run and under the same names (each line's `baseline`): the same pods, ConfigMaps and
Service on a plain kwok node of the consumer, whose node agent is the consumer's kwok controller (its RSS
and CPU stand for the virtual kubelet's). The baseline pods are deleted before the offloaded ones are
created, so that the Service selects one set at a time.

Times come from watches (kube/informer.py) on the consumer's pods and EndpointSlices, stamped as each
event arrives: no polling, which 10,000 pods would make both inaccurate and a load of its own.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from bench.common import cpu_seconds, emit, local_env, log, percentile, rss_mb
from deploy.localenv.clusters import LocalCluster, wait_for
from deploy.localenv.deployments import DeploymentRunner
from kube.errors import already_exists
from kube.informer import Informer
from kube.objects import drained
from models.names import (
    GROUP,
    LABEL_PROVIDER,
    NAMESPACE_OFFLOADINGS,
    TAINT_VIRTUAL_NODE,
    VERSION,
    virtual_kubelet_name,
    virtual_node_name,
)
from tests.faults import prepare_pair
from tests.kube import apply_cluster_config, create_namespace, create_node, offload_namespace, pod_spec
from tests.running import running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import request_peering

DEFAULTS: dict[str, Any] = {"pods": 1000, "namespaces": 1, "threads": 32, "seconds_per_pod": 0.5}
NAMESPACE = "app"  # made and offloaded by prepare_pair
SERVICE = "offload-scale"
APP_LABEL = "app"
PHASE_LABEL = "offload-scale/phase"
# kwok nodes of the provider, each with this many pod slots: as many as the copies need.
PROVIDER_NODE_PODS = 1000
PLAIN_NODE = "plain-0"
TIMEOUT_BASE_SECONDS = 120
SETUP_TIMEOUT_SECONDS = 180
SAMPLE_SECONDS = 0.5
PROGRESS_SECONDS = 10
CREATE_ATTEMPTS = 3  # an API server answering 409 Conflict/429/5xx under the burst is not what is measured


def _pooled_client(cluster: LocalCluster, connections: int) -> k8s.ApiClient:
    """A client keeping `connections` connections: the default pool (5 per core) would make most of the
    concurrent POSTs open a TLS connection each."""
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return k8s.ApiClient(configuration)


class _ProcessSampler:
    """Peak resident memory and CPU of a node agent, sampled every SAMPLE_SECONDS; `pid_of` is asked each
    time, so that a restarted process (a new pid) is followed and counted (None: not running at the moment).
    A phase whose agent was never sampled, or whose `pid_of` raised, fails at `stop`: its figures would be 0."""

    def __init__(self, pid_of: Callable[[], int | None]) -> None:
        self._pid_of = pid_of
        self.peak_rss_mib = 0.0
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (first, last) CPU seconds seen
        self._error: Exception | None = None  # what the sampling thread's pid_of raised
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="offload-scale-sampler", daemon=True)

    def start(self) -> _ProcessSampler:
        self._sample()  # the CPU already spent is not the run's
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"sampling the node agent failed: {self._error}") from self._error
        self._sample()
        if not self._cpu:
            raise RuntimeError("the node agent was never sampled (no pid found while the phase ran): "
                               "its memory and CPU would be recorded as 0")  # fmt: skip

    @property
    def cpu_seconds(self) -> float:
        return sum(last - first for first, last in self._cpu.values())

    @property
    def restarts(self) -> int:
        return max(0, len(self._cpu) - 1)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                self._sample()
            except Exception as e:  # noqa: BLE001 - raised again by stop(), in the phase's thread
                self._error = e
                return

    def _sample(self) -> None:
        pid = self._pid_of()
        if pid is None:
            return
        try:
            rss, cpu = rss_mb(pid), cpu_seconds(pid)
        except (OSError, RuntimeError):
            return  # exited between the two reads: its restart is sampled next time
        self.peak_rss_mib = max(self.peak_rss_mib, rss)
        self._cpu[pid] = (self._cpu.get(pid, (cpu, cpu))[0], cpu)


def _namespaces(count: int) -> list[str]:
    return [NAMESPACE] if count <= 1 else [f"{NAMESPACE}-{k}" for k in range(count)]


def _namespace_of(i: int, namespaces: list[str]) -> str:
    return namespaces[i % len(namespaces)]


def _offloaded_here(api: k8s.ApiClient, namespaces: list[str], provider_id: str) -> bool:
    """Every namespace's remote namespace Ready in the provider (the virtual kubelet's entry says so)."""
    listed: Any = k8s.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, NAMESPACE_OFFLOADINGS)
    ready = {item["metadata"]["namespace"] for item in listed.get("items") or []
             if any(c.get("clusterId") == provider_id and c.get("phase") == "Ready"
                    for c in (item.get("status") or {}).get("clusters") or [])}  # fmt: skip
    return set(namespaces) <= ready


class _PhaseWatch:
    """One phase's pods and the Service's EndpointSlices in the consumer, followed by informers: when each
    pod was first seen Running, and when the slices first listed every pod as ready."""

    def __init__(self, api: k8s.ApiClient, *, phase: str, names: set[str]) -> None:
        self.names = names
        self.running_at: dict[str, float] = {}
        self.last_phase: dict[str, str] = {}  # what a missed pod was last seen as, for the report
        self.endpoints_ready_at: float | None = None
        self.present: set[str] = set()  # pods that exist now (the cleanup waits for none)
        self._ready_by_slice: dict[str, set[str]] = {}
        self._changed = threading.Condition()
        self._informers: list[Informer[dict[str, Any]]] = [
            # Pod names are unique across the namespaces (their index is in them): watched in all at once.
            Informer(f"offload-scale-pods-{phase}", k8s.CoreV1Api(api).list_pod_for_all_namespaces,
                     label_selector=f"{PHASE_LABEL}={phase}", on_sync=self._pods_listed, on_event=self._pod_event),
            Informer(f"offload-scale-slices-{phase}", k8s.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces,
                     label_selector=f"kubernetes.io/service-name={SERVICE}",
                     on_sync=self._slices_listed, on_event=self._slice_event),
        ]  # fmt: skip

    def __enter__(self) -> _PhaseWatch:
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            if not informer.wait_synced(SETUP_TIMEOUT_SECONDS):
                raise TimeoutError(f"informer {informer.name} not synced")
        return self

    def __exit__(self, *exc: object) -> None:
        for informer in self._informers:
            informer.stop()

    def _pods_listed(self, pods: list[dict[str, Any]]) -> None:
        with self._changed:
            self.present = {p["metadata"]["name"] for p in pods}
            for pod in pods:
                self._record(pod, time.perf_counter())
            self._changed.notify_all()

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        at = time.perf_counter()
        with self._changed:
            if kind == "DELETED":
                self.present.discard(pod["metadata"]["name"])
            else:
                self.present.add(pod["metadata"]["name"])
                self._record(pod, at)
            self._changed.notify_all()

    def _record(self, pod: dict[str, Any], at: float) -> None:
        name, phase = pod["metadata"]["name"], (pod.get("status") or {}).get("phase") or "no phase"
        if name not in self.names:
            return
        self.last_phase[name] = phase if pod["spec"].get("nodeName") else f"{phase}, unscheduled"
        if name not in self.running_at and phase == "Running":
            self.running_at[name] = at

    def _slices_listed(self, slices: list[dict[str, Any]]) -> None:
        with self._changed:
            self._ready_by_slice.clear()
            for endpoint_slice in slices:
                self._ready_by_slice[_slice_key(endpoint_slice)] = self._ready_in(endpoint_slice)
            self._check_endpoints(time.perf_counter())

    def _slice_event(self, kind: str, endpoint_slice: dict[str, Any]) -> None:
        at = time.perf_counter()
        with self._changed:
            name = _slice_key(endpoint_slice)
            if kind == "DELETED":
                self._ready_by_slice.pop(name, None)
            else:
                self._ready_by_slice[name] = self._ready_in(endpoint_slice)
            self._check_endpoints(at)

    def _ready_in(self, endpoint_slice: dict[str, Any]) -> set[str]:
        ready = set()
        for endpoint in endpoint_slice.get("endpoints") or []:
            target = endpoint.get("targetRef") or {}
            if (endpoint.get("conditions") or {}).get("ready") and target.get("name") in self.names:
                ready.add(target["name"])
        return ready

    def _check_endpoints(self, at: float) -> None:
        # The sum first (O(slices) per event); the union only when it could be complete, since the
        # controller may list a pod in two slices while it moves it.
        if self.endpoints_ready_at is None and sum(map(len, self._ready_by_slice.values())) >= len(self.names):
            if len(set().union(*self._ready_by_slice.values())) == len(self.names):
                self.endpoints_ready_at = at
        self._changed.notify_all()

    def ready_endpoints(self) -> int:
        with self._changed:
            return len(set().union(*self._ready_by_slice.values()))

    def wait(self, done: Callable[[], bool], *, deadline: float, what: str) -> bool:
        """Waits until `done()` (read under the lock, re-checked at each event) or the perf_counter
        `deadline`; logs progress every PROGRESS_SECONDS."""
        next_progress = time.perf_counter() + PROGRESS_SECONDS
        with self._changed:
            while not done():
                now = time.perf_counter()
                if now >= deadline:
                    return False
                if now >= next_progress:
                    log(f"{what}: {len(self.running_at)}/{len(self.names)} Running, "
                        f"{len(set().union(*self._ready_by_slice.values()))} endpoints ready")  # fmt: skip
                    next_progress = now + PROGRESS_SECONDS
                self._changed.wait(min(deadline, next_progress) - now)
            return True


@dataclass
class PhaseResult:
    per_pod_seconds: list[float]  # POST → Running, one per pod, infinite for a miss
    running_seconds: float  # first POST → the last pod Running (infinite when any missed)
    endpoints_seconds: float  # first POST → every pod a ready endpoint (infinite when not by the deadline)
    missed: int
    missed_by_phase: dict[str, int]  # the phase each missed pod was last seen in ("absent": never seen)
    missed_names: list[str]  # the first few, to look them up in the virtual kubelet's log
    endpoints_missing: int
    post_seconds: float  # how long the POSTs themselves took
    agent_peak_rss_mib: float
    agent_cpu_seconds: float
    agent_restarts: int


def _slice_key(endpoint_slice: dict[str, Any]) -> str:
    return f"{endpoint_slice['metadata']['namespace']}/{endpoint_slice['metadata']['name']}"


def _config_map(i: int) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap.model_validate({"metadata": {"name": f"cfg-{i}"}, "data": {"INDEX": str(i)}})


def _pod(name: str, i: int, *, phase: str, node_selector: dict[str, str], tolerate: bool) -> k8s.V1Pod:
    tolerations = [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}] if tolerate else None
    spec = pod_spec(node_selector=node_selector, tolerations=tolerations)
    spec["containers"][0]["envFrom"] = [{"configMapRef": {"name": f"cfg-{i}"}}]
    return k8s.V1Pod.model_validate({"metadata": {"name": name, "labels": {APP_LABEL: SERVICE, PHASE_LABEL: phase}},
                                     "spec": spec})  # fmt: skip


def _create(call: Callable[..., Any], namespace: str, body: Any) -> bool:
    for attempt in range(CREATE_ATTEMPTS):
        try:
            drained(call(namespace, body, _preload_content=False))  # its connection back to the pool
            return True
        except ApiException as e:
            if already_exists(e):
                return True
            if e.status not in (409, 429, 500, 502, 503, 504) or attempt == CREATE_ATTEMPTS - 1:
                log(f"cannot create {body.metadata.name}: {e.status} {e.reason}")
                return False
            time.sleep(0.5 * (attempt + 1))
    return False


def _run_phase(api: k8s.ApiClient, *, phase: str, pods: dict[str, tuple[str, k8s.V1Pod]], threads: int,
               timeout: float, agent_pid: Callable[[], int | None]) -> PhaseResult:  # fmt: skip
    """`pods`: name -> (namespace, pod)."""
    core = k8s.CoreV1Api(api)
    names = set(pods)
    posted_at: dict[str, float] = {}

    def post(name: str) -> None:
        posted_at[name] = time.perf_counter()
        _create(core.create_namespaced_pod, *pods[name])

    with _PhaseWatch(api, phase=phase, names=names) as watch:
        sampler = _ProcessSampler(agent_pid).start()
        started = time.perf_counter()
        deadline = started + timeout
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(post, pods))
        posted = time.perf_counter() - started
        log(f"{phase}: {len(pods)} pods POSTed in {posted:.1f} s")
        watch.wait(lambda: len(watch.running_at) == len(names) and watch.endpoints_ready_at is not None,
                   deadline=deadline, what=phase)  # fmt: skip
        sampler.stop()
        per_pod = [watch.running_at[n] - posted_at[n] if n in watch.running_at else math.inf for n in sorted(names)]
        missed = sum(map(math.isinf, per_pod))
        missed_by_phase = Counter(watch.last_phase.get(n, "absent") for n in names if n not in watch.running_at)
        endpoints_missing = len(names) - watch.ready_endpoints()
    log(f"{phase}: {len(names) - missed}/{len(names)} Running, {len(names) - endpoints_missing} endpoints ready"
        + (f"; the missed ones last seen as {dict(missed_by_phase)}" if missed else ""))  # fmt: skip
    return PhaseResult(
        per_pod_seconds=per_pod,
        running_seconds=max(watch.running_at.values()) - started if not missed else math.inf,
        endpoints_seconds=watch.endpoints_ready_at - started if watch.endpoints_ready_at is not None else math.inf,
        missed=missed, missed_by_phase=dict(missed_by_phase),
        missed_names=sorted(names - watch.running_at.keys())[:10], endpoints_missing=endpoints_missing, post_seconds=posted,
        agent_peak_rss_mib=sampler.peak_rss_mib, agent_cpu_seconds=sampler.cpu_seconds, agent_restarts=sampler.restarts,
    )  # fmt: skip


def _delete_phase(api: k8s.ApiClient, phase: str, namespaces: list[str]) -> None:
    """Deletes a phase's pods at once and waits until none is left, so that the next phase starts from an
    idle cluster and the Services select only its pods."""
    with _PhaseWatch(api, phase=phase, names=set()) as watch:
        for namespace in namespaces:
            k8s.CoreV1Api(api).delete_collection_namespaced_pod(namespace, label_selector=f"{PHASE_LABEL}={phase}",
                                                                grace_period_seconds=0)  # fmt: skip
        if not watch.wait(lambda: not watch.present, deadline=time.perf_counter() + SETUP_TIMEOUT_SECONDS,
                          what=f"deleting the {phase} pods"):  # fmt: skip
            raise TimeoutError(f"{len(watch.present)} {phase} pods still there after {SETUP_TIMEOUT_SECONDS} s")


def _node_ready_with_room(core: k8s.CoreV1Api, name: str, pods: int) -> bool:
    try:
        node = core.read_node(name)
    except ApiException:
        return False
    status = node.status
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions if status else None) or [])
    return ready and int(((status.allocatable if status else None) or {}).get("pods", "0")) >= pods


def _kwok_controller_pid(cluster: LocalCluster) -> int:
    """The consumer's kwok controller: the node agent of its plain kwok nodes (the baseline's). Raises when its
    pid file is not there: the baseline's memory and CPU would be recorded as 0, which reads as a figure."""
    # kubeconfigs/ sits beside clusters/ in the kwokctl work directory (deploy/localenv/clusters.py).
    pid_file = cluster.kubeconfig.parent.parent / "clusters" / cluster.name / "pids" / "kwok-controller.pid"
    if not pid_file.exists():
        raise FileNotFoundError(f"no pid file of cluster {cluster.name}'s kwok controller at {pid_file}: the baseline's "
                                "node agent cannot be measured")  # fmt: skip
    return int(pid_file.read_text().strip())


async def _measure(params: dict[str, Any]) -> None:
    count, threads = int(params["pods"]), int(params["threads"])
    namespaces = _namespaces(int(params["namespaces"]))
    timeout = TIMEOUT_BASE_SECONDS + float(params["seconds_per_pod"]) * count
    provider_id, consumer_id = "bench-provider", "bench-consumer"
    vk_logs = Path(tempfile.mkdtemp(prefix="tidepool-offload-scale-"))
    with local_env(["provider", "consumer"]) as env:
        provider, consumer = env.cluster("provider"), env.cluster("consumer")
        p_api, c_api = provider.api_client(), _pooled_client(consumer, threads)
        c_core = k8s.CoreV1Api(c_api)
        prepare_pair(p_api, c_api)
        # Room for every copy in the provider, all of it shared: the virtual node advertises >= count pods.
        apply_cluster_config(p_api, outgoing={"sharingPercentage": 100})
        for k in range(math.ceil(count / PROVIDER_NODE_PODS)):
            create_node(p_api, f"pods-{k}", cpu="64", memory="256Gi", pods=str(PROVIDER_NODE_PODS))
        create_node(c_api, PLAIN_NODE, cpu="64", memory="256Gi", pods=str(count + 110))
        for namespace in namespaces:
            create_namespace(c_api, namespace)
            offload_namespace(c_api, namespace)
            c_core.create_namespaced_service(namespace, k8s.V1Service.model_validate({
                "metadata": {"name": SERVICE},
                "spec": {"selector": {APP_LABEL: SERVICE}, "ports": [{"port": 80, "targetPort": 8080}]}}))  # fmt: skip
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: _create(c_core.create_namespaced_config_map, _namespace_of(i, namespaces),
                                            _config_map(i)), range(count)))  # fmt: skip
        network = NetworkModule(c_api, local_pod_cidr="10.2.0.0/16").start()
        async with AsyncExitStack() as stack:
            stack.callback(network.stop)
            await stack.enter_async_context(running_worker(worker_settings(env, provider, provider_id)))
            await stack.enter_async_context(running_worker(worker_settings(env, consumer, consumer_id)))
            runner = stack.enter_context(DeploymentRunner(consumer.kubeconfig, log_dir=vk_logs))
            request_peering(p_api, c_api, provider_id=provider_id, consumer_id=consumer_id)
            node = virtual_node_name(provider_id)
            for name in (PLAIN_NODE, node):
                await asyncio.to_thread(wait_for, lambda name=name: _node_ready_with_room(c_core, name, count),
                                        timeout=SETUP_TIMEOUT_SECONDS, what=f"node {name} Ready with room for {count} pods")  # fmt: skip
            await asyncio.to_thread(wait_for, lambda: _offloaded_here(c_api, namespaces, provider_id),
                                    timeout=SETUP_TIMEOUT_SECONDS, what=f"{len(namespaces)} remote namespaces Ready")  # fmt: skip
            vk_pid = runner.pid(virtual_kubelet_name(provider_id))
            if vk_pid is None:
                raise RuntimeError("the virtual node is Ready but its virtual kubelet does not run")
            vk_rss_idle = rss_mb(vk_pid)
            log(f"{count} ConfigMaps and {len(namespaces)} Services made; both nodes Ready; {len(namespaces)} namespaces "
                f"offloaded; virtual kubelet at {vk_rss_idle:.0f} MiB")  # fmt: skip

            # The threads block: the workers share this event loop, so the phases run beside it.
            baseline = await asyncio.to_thread(
                _run_phase, c_api, phase="baseline", threads=threads, timeout=timeout,
                pods={f"plain-{i}": (_namespace_of(i, namespaces), _pod(f"plain-{i}", i, phase="baseline", tolerate=False,
                      node_selector={"kubernetes.io/hostname": PLAIN_NODE})) for i in range(count)},
                agent_pid=lambda: _kwok_controller_pid(consumer))  # fmt: skip
            await asyncio.to_thread(_delete_phase, c_api, "baseline", namespaces)
            offloaded = await asyncio.to_thread(
                _run_phase, c_api, phase="offloaded", threads=threads, timeout=timeout,
                pods={f"off-{i}": (_namespace_of(i, namespaces), _pod(f"off-{i}", i, phase="offloaded", tolerate=True,
                      node_selector={LABEL_PROVIDER: provider_id})) for i in range(count)},
                agent_pid=lambda: runner.pid(virtual_kubelet_name(provider_id)))  # fmt: skip
    log(f"virtual kubelet log in {vk_logs}")
    _report(offloaded, baseline, params={**params, "pods": count, "namespaces": len(namespaces), "timeout_seconds": timeout,
                                         "virtual_kubelet_rss_before_pods_mib": round(vk_rss_idle, 1)})  # fmt: skip


def _report(offloaded: PhaseResult, baseline: PhaseResult, *, params: dict[str, Any]) -> None:
    count = len(offloaded.per_pod_seconds)
    common = {**params, "pods_missed": offloaded.missed, "baseline_pods_missed": baseline.missed,
              "missed_by_phase": offloaded.missed_by_phase, "baseline_missed_by_phase": baseline.missed_by_phase,
              "missed_names": offloaded.missed_names,
              "post_seconds": round(offloaded.post_seconds, 2), "baseline_post_seconds": round(baseline.post_seconds, 2),
              "baseline": "the same pods, ConfigMaps and Services on a plain kwok node of the consumer"}  # fmt: skip
    emit("pods_running_seconds", offloaded.running_seconds, "s", baseline=baseline.running_seconds,
         params={**common, "from": "first POST", "to": "every pod Running in the consumer"})  # fmt: skip
    for p in (50, 99):
        emit(f"pod_running_p{p}_seconds", percentile(offloaded.per_pod_seconds, p), "s",
             baseline=percentile(baseline.per_pod_seconds, p),
             params={**common, "from": "the pod's POST", "to": "Running in the consumer"})  # fmt: skip
    emit("endpoints_ready_seconds", offloaded.endpoints_seconds, "s", baseline=baseline.endpoints_seconds,
         params={**common, "endpoints_missing": offloaded.endpoints_missing,
                 "baseline_endpoints_missing": baseline.endpoints_missing,
                 "to": "the Service's EndpointSlices in the consumer list every pod as ready"})  # fmt: skip
    emit("pods_missed", offloaded.missed, "pods", baseline=baseline.missed, params=common)
    agent = {**common, "baseline": "the consumer's kwok controller (the plain node's agent) over the baseline run",
             "virtual_kubelet_restarts": offloaded.agent_restarts}  # fmt: skip
    emit("virtual_kubelet_rss_mib", offloaded.agent_peak_rss_mib, "MiB", baseline=baseline.agent_peak_rss_mib,
         params={**agent, "what": f"peak VmRSS, sampled every {SAMPLE_SECONDS} s"})  # fmt: skip
    emit("virtual_kubelet_cpu_seconds_per_pod", offloaded.agent_cpu_seconds / count, "s/pod",
         baseline=baseline.agent_cpu_seconds / count,
         params={**agent, "cpu_seconds": round(offloaded.agent_cpu_seconds, 2),
                 "baseline_cpu_seconds": round(baseline.agent_cpu_seconds, 2)})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
