"""pool_failover: how long the pool takes to run a failed super cluster's pods elsewhere (issue 16), on a
tenant control plane and three super clusters of the benchmark's own, with the real pool worker (scheduler
and prober) and one syncer per super cluster. Every namespace takes one slice, so each runs on one cluster.

Half the namespaces are left to the pool; the other half are the baseline, recovered the way virtualcluster
offers: it places a namespace once and never moves it, so as soon as the cluster stops the user clears the
namespace's placement by hand and deletes and recreates its stranded pods (as a Deployment would after
their deletion), and the scheduler places them anew.

- `failover_seconds_p50` / `_p99`: from the stop to each affected pod (one the stopped cluster ran) annotated
  to another cluster and Running there (its copy there Running too); baseline: from the user's clear to the
  recreated pod so. A pod not there by the deadline is a miss: its sample is infinite, so a p99 over a miss
  is infinite (printed `Infinity`, with the misses counted in the params), never a missing sample. When the
  stopped cluster ran none of one kind's pods, nothing was measured: its figures are a miss too (`affected`
  or `baseline_affected` 0 in the params), never NaN.
- `pods_lost`: affected pods that are gone (their uid no longer served) or never ran again, measured the same
  way for both: a pod the baseline recreates is another pod (a new uid), so each one counts as lost.
- `pods_duplicated_after_return`: once the stopped cluster is started again and the syncers have settled
  (or `settle_seconds` passed), pods whose copies run on more than one super cluster.

The target, printed beside the figures: p99 ≤ grace period + 30 s. Times are taken by polling every
POLL seconds, so each carries up to that much error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from bench.common import emit, local_env, log, percentile
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import join_pool, start_cluster, stop_cluster
from kube.objects import apply_cluster_object
from kube.tenant_identity import add_tenant
from models.names import (
    API_VERSION,
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    LABEL_MANAGED_BY,
    LABEL_TENANT_NAMESPACE,
    MANAGED_BY,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SLICE_ANNOTATION,
)
from tests.kube import create_namespace, create_node
from tests.pool import WorkerTasks
from tests.running import eventually, worker_settings
from workers.pool import run as run_pool_worker
from workers.syncer import Syncer

DEFAULTS: dict[str, Any] = {"namespaces": 20, "pods": 10, "grace_seconds": 60, "probe_seconds": 5,
                            "deadline_seconds": 300, "settle_seconds": 120}  # fmt: skip
SUPERS = ("s1", "s2", "s3")
TENANT_NAME = "t1"
POLL = 0.5
SETUP_TIMEOUT = 300
RESTART_TIMEOUT = 300  # a loaded 2-core machine takes minutes to start an API server again
SLICE = '{"cpu": "1", "memory": "2Gi"}'


@dataclass(frozen=True)
class Tracked:
    """An affected pod: the one the stopped cluster ran (its uid then), measured from `since`."""

    namespace: str
    name: str
    uid: str
    since: float


@dataclass
class Outcome:
    """When each tracked pod ran elsewhere (perf_counter), and which ones are gone."""

    ran_at: dict[tuple[str, str], float] = field(default_factory=dict)
    gone: set[tuple[str, str]] = field(default_factory=set)


def samples(tracked: Sequence[Tracked], ran_at: Mapping[tuple[str, str], float]) -> list[float]:
    """Seconds from `since` to running elsewhere, one per tracked pod; a miss is infinite."""
    return [ran_at[(t.namespace, t.name)] - t.since if (t.namespace, t.name) in ran_at else math.inf for t in tracked]


def failover_figure(values: Sequence[float], p: float) -> float:
    """`tail_percentile` of the samples; of none (the stopped cluster ran no pod of the kind) a miss, infinite:
    a run that measured nothing has not met the target."""
    return tail_percentile(values, p) if values else math.inf


def tail_percentile(values: Sequence[float], p: float) -> float:
    """`percentile`, except that a percentile whose closest ranks reach a miss (infinite) is infinite."""
    ordered = sorted(values)
    if math.isinf(ordered[math.ceil((len(ordered) - 1) * p / 100)]):
        return math.inf
    return percentile(ordered, p)


def duplicated(copies: Mapping[str, set[tuple[str, str]]]) -> set[tuple[str, str]]:
    """Pods (namespace, name) whose copies run on more than one super cluster."""
    seen: dict[tuple[str, str], int] = {}
    for running in copies.values():
        for pod in running:
            seen[pod] = seen.get(pod, 0) + 1
    return {pod for pod, count in seen.items() if count > 1}


def _meta(obj: Any) -> k8s.V1ObjectMeta:
    """Metadata of a served object: always there."""
    meta: k8s.V1ObjectMeta = obj.metadata
    return meta


def _pod(name: str) -> k8s.V1Pod:
    return k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "app", "image": "app", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}})  # fmt: skip


def _running_copies(core: k8s.CoreV1Api) -> set[tuple[str, str]]:
    """(tenant namespace, pod) of every copy Running on a super cluster."""
    pods = core.list_pod_for_all_namespaces(label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}").items
    return {((_meta(p).labels or {}).get(LABEL_TENANT_NAMESPACE, ""), str(_meta(p).name)) for p in pods
            if p.status and p.status.phase == "Running" and not _meta(p).deletion_timestamp}  # fmt: skip


def _tenant_pods(core: k8s.CoreV1Api, namespaces: Sequence[str]) -> dict[tuple[str, str], k8s.V1Pod]:
    wanted = set(namespaces)
    return {(str(_meta(p).namespace), str(_meta(p).name)): p for p in core.list_pod_for_all_namespaces().items
            if _meta(p).namespace in wanted}  # fmt: skip


def _where(pod: k8s.V1Pod) -> str | None:
    return (_meta(pod).annotations or {}).get(POD_CLUSTER_ANNOTATION)


def _setup(tenant: k8s.ApiClient, supers: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    create_namespace(tenant, "tidepool-system")
    apply_cluster_object(tenant, CLUSTER_CONFIGS, {"apiVersion": API_VERSION, "kind": "ClusterConfig",
        "metadata": {"name": CLUSTER_CONFIG_NAME}, "spec": {"pool": {"probeIntervalSeconds": params["probe_seconds"],
                                                                     "unreachableGracePeriodSeconds": params["grace_seconds"]}}})  # fmt: skip
    slices = 2 * params["namespaces"]  # every cluster can take every namespace: room for the failed one's
    for name, cluster in supers.items():
        create_node(cluster.api_client(), f"{name}-node", cpu=str(slices), memory=f"{2 * slices}Gi", pods="1000")
        join_pool(tenant, name, cluster.kubeconfig)


def _workload(core: k8s.CoreV1Api, namespaces: Sequence[str], pods: int) -> None:
    for ns in namespaces:
        core.create_namespace(
            k8s.V1Namespace.model_validate({"metadata": {"name": ns, "annotations": {SLICE_ANNOTATION: SLICE}}})
        )
        core.create_namespaced_resource_quota(ns, k8s.V1ResourceQuota.model_validate(
            {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": "1", "memory": "2Gi"}}}))  # fmt: skip
        for i in range(pods):
            core.create_namespaced_pod(ns, _pod(f"app-{i}"))


async def _follow(core: k8s.CoreV1Api, supers: Mapping[str, k8s.CoreV1Api], victim: str,
                  tracked: Sequence[Tracked], deadline: float) -> Outcome:  # fmt: skip
    """Polls until every tracked pod runs elsewhere or the deadline passes. A pool pod keeps its uid; a
    recreated baseline pod has a new one, and the old one is not it."""
    outcome = Outcome()
    namespaces = sorted({t.namespace for t in tracked})
    while time.monotonic() < deadline and len(outcome.ran_at) < len(tracked):
        pods = await asyncio.to_thread(_tenant_pods, core, namespaces)
        copies = {n: await asyncio.to_thread(_running_copies, c) for n, c in supers.items() if n != victim}
        now = time.perf_counter()
        for t in tracked:
            key = (t.namespace, t.name)
            pod = pods.get(key)
            if key in outcome.ran_at or pod is None:
                continue
            where = _where(pod)
            if (where and where != victim and pod.status and pod.status.phase == "Running"
                    and key in copies.get(where, set())):  # fmt: skip
                outcome.ran_at[key] = now
        await asyncio.sleep(POLL)
    return outcome


def _lost(core: k8s.CoreV1Api, tracked: Sequence[Tracked], outcome: Outcome) -> list[str]:
    """Pods that existed before the stop and are gone (their uid no longer served) or never ran again."""
    pods = _tenant_pods(core, sorted({t.namespace for t in tracked}))
    return lost(tracked, outcome.ran_at, {key: str(_meta(pod).uid) for key, pod in pods.items()})


def lost(tracked: Sequence[Tracked], ran_at: Mapping[tuple[str, str], float],
         served: Mapping[tuple[str, str], str]) -> list[str]:  # fmt: skip
    """`namespace/name` of each tracked pod that never ran elsewhere or whose uid is no longer the one served
    under its name (`served`: (namespace, name) -> uid): gone, or made anew."""
    return sorted(f"{t.namespace}/{t.name}" for t in tracked
                  if (t.namespace, t.name) not in ran_at or served.get((t.namespace, t.name)) != t.uid)  # fmt: skip


def _clear_and_recreate(core: k8s.CoreV1Api, namespace: str, stranded: Sequence[str]) -> float:
    """What a virtualcluster user does: clear the namespace's placement, delete the stranded pods, create them
    anew. Returns when the clear was made (perf_counter)."""
    cleared = time.perf_counter()
    core.patch_namespace(namespace, {"metadata": {"annotations": {PLACEMENTS_ANNOTATION: None}}})
    for name in stranded:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    for name in stranded:
        for _ in range(100):  # the delete of a pod no node runs is immediate; a racing create sees 409 once
            try:
                core.create_namespaced_pod(namespace, _pod(name))
                break
            except k8s.ApiException as e:
                if e.status != 409:
                    raise
                time.sleep(0.1)
    return cleared


async def _measure(params: dict[str, Any]) -> None:
    n, pods = int(params["namespaces"]), int(params["pods"])
    pool_ns = [f"pool-{i}" for i in range(n)]
    base_ns = [f"base-{i}" for i in range(n)]
    with local_env(["tenant", *SUPERS]) as env:
        binaries, workdir = ensure_binaries(), Path(env.state_dir) / "kwok"
        tenant_cluster = env.cluster("tenant")
        tenant = tenant_cluster.api_client()
        core = k8s.CoreV1Api(tenant)
        clusters = {name: env.cluster(name) for name in SUPERS}
        supers = {name: k8s.CoreV1Api(c.api_client()) for name, c in clusters.items()}
        _setup(tenant, clusters, params)
        add_tenant(tenant, tenant, TENANT_NAME)  # the tenant's control plane is the pool's management cluster too
        syncers = [Syncer(management=tenant, super_cluster=c.api_client(), cluster=name).start()
                   for name, c in clusters.items()]  # fmt: skip
        worker = WorkerTasks()  # a worker that died with an error fails the run: its figures would be a dead one's
        worker.start(lambda stop: run_pool_worker(worker_settings(env, tenant_cluster, "pool-bench"), stop=stop,
                                                  task_queue="pool-bench", workflow_id="pool-scheduler-bench"))  # fmt: skip
        try:
            _workload(core, [*pool_ns, *base_ns], pods)
            everything = [*pool_ns, *base_ns]

            def all_running() -> dict[tuple[str, str], k8s.V1Pod] | None:
                listed = _tenant_pods(core, everything)
                placed = [p for p in listed.values() if _where(p) and p.status and p.status.phase == "Running"]
                return listed if len(placed) == len(everything) * pods else None

            before = await eventually(lambda: asyncio.to_thread(all_running), timeout=SETUP_TIMEOUT, interval=1,
                                      what="every pod placed and Running")  # fmt: skip
            # The victim strands pool and baseline pods alike: the cluster with most of the scarcer kind.
            per_cluster = {c: (sum(1 for (ns, _), p in before.items() if _where(p) == c and ns in pool_ns),
                               sum(1 for (ns, _), p in before.items() if _where(p) == c and ns in base_ns)) for c in SUPERS}  # fmt: skip
            victim = max(SUPERS, key=lambda c: (min(per_cluster[c]), sum(per_cluster[c]), -SUPERS.index(c)))
            log(f"{len(before)} pods Running ({per_cluster}); stopping {victim}")
            stranded = {k: p for k, p in before.items() if _where(p) == victim}
            stop_cluster(victim, binaries=binaries, workdir=workdir)
            stopped = time.perf_counter()
            pool_tracked = [Tracked(ns, name, str(_meta(p).uid), stopped)
                            for (ns, name), p in stranded.items() if ns in pool_ns]  # fmt: skip
            base_tracked: list[Tracked] = []
            for ns in base_ns:
                names = sorted(name for (pns, name) in stranded if pns == ns)
                if names:
                    cleared = await asyncio.to_thread(_clear_and_recreate, core, ns, names)
                    base_tracked += [Tracked(ns, name, str(_meta(stranded[(ns, name)]).uid), cleared) for name in names]
            log(f"{len(pool_tracked)} pool pods and {len(base_tracked)} baseline pods stranded on {victim}")
            deadline = time.monotonic() + float(params["deadline_seconds"])
            pool_outcome, base_outcome = await asyncio.gather(
                _follow(core, supers, victim, pool_tracked, deadline),
                _follow(core, supers, victim, base_tracked, deadline))  # fmt: skip
            pool_lost = _lost(core, pool_tracked, pool_outcome)
            base_lost = _lost(core, base_tracked, base_outcome)  # measured as the pool's: recreated is a new uid

            start_cluster(clusters[victim], binaries=binaries, workdir=workdir, timeout=RESTART_TIMEOUT)
            log(f"{victim} started again; waiting for the syncers to settle")

            def copies_now() -> dict[str, set[tuple[str, str]]]:
                return {name: _running_copies(c) for name, c in supers.items()}

            settle = time.monotonic() + float(params["settle_seconds"])
            while True:
                dups = duplicated(await asyncio.to_thread(copies_now))
                if not dups or time.monotonic() > settle:
                    break
                await asyncio.sleep(1)
        finally:
            try:
                await worker.stop()
            finally:
                for syncer in syncers:
                    syncer.stop()
    _report(params, victim, pool_tracked, pool_outcome, pool_lost, base_tracked, base_outcome, base_lost, dups)


def _report(params: Mapping[str, Any], victim: str, pool_tracked: Sequence[Tracked], pool_outcome: Outcome,
            pool_lost: Sequence[str], base_tracked: Sequence[Tracked], base_outcome: Outcome, base_lost: Sequence[str],
            dups: set[tuple[str, str]]) -> None:  # fmt: skip
    grace = int(params["grace_seconds"])
    common = {
        **params,
        "stopped": victim,
        "target": f"p99 <= grace + 30 s = {grace + 30} s",
        "baseline": "virtualcluster: the user clears the placement at the stop and recreates the stranded pods",
    }
    pool_samples = samples(pool_tracked, pool_outcome.ran_at)
    base_samples = samples(base_tracked, base_outcome.ran_at)
    misses = {"misses": sum(map(math.isinf, pool_samples)), "baseline_misses": sum(map(math.isinf, base_samples)),
              "affected": len(pool_samples), "baseline_affected": len(base_samples)}  # fmt: skip
    for p in (50, 99):
        value, base = failover_figure(pool_samples, p), failover_figure(base_samples, p)
        emit(f"failover_seconds_p{p}", value, "s", baseline=base, params={**common, **misses})
        # The baseline also under its own name, as the issue names it.
        emit(f"baseline_failover_seconds_p{p}", base, "s", baseline=None, params={**common, **misses})
    emit("pods_lost", len(pool_lost), "pods", baseline=len(base_lost),
         params={**common, "lost": list(pool_lost)[:20], "baseline_lost": list(base_lost)[:20]})  # fmt: skip
    emit("pods_duplicated_after_return", sum(1 for ns, _ in dups if ns.startswith("pool-")), "pods",
         baseline=sum(1 for ns, _ in dups if ns.startswith("base-")),
         params={**common, "duplicated": sorted(f"{ns}/{name}" for ns, name in dups)[:20]})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
