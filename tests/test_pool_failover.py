"""Failover of the pool end to end (issue 16): a tenant control plane, two super clusters of the test's own,
the real scheduler worker (with its prober) and one syncer per super cluster. A super cluster's control
plane is stopped (deploy/localenv/clusters.stop_cluster) for longer, or shorter, than the grace period;
placements are edited and cleared; the worker is killed in the middle of a move. Moving slices is a saga
(models/pool/moves.py): nothing is removed from a cluster before the replacement runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import apply_cluster_object
from models.api.conditions import POD_SUPER_CLUSTER_CONDITION
from models.names import (
    API_VERSION,
    DRAINING_ANNOTATION,
    MOVED_FROM_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SUPER_CLUSTERS,
    super_cluster_namespace,
)
from tests.pool import Pool, running_pool
from tests.replay import replay_all_runs
from tests.running import eventually
from workers.syncer import Syncer

pytestmark = [pytest.mark.env, pytest.mark.pool, pytest.mark.failover]

# A probe's request timeout is min(5 s, interval): 5 s keeps a slow answer on a loaded machine a success.
PROBE_SECONDS, GRACE_SECONDS = 5, 10


@pytest.fixture
async def pool(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str) -> AsyncIterator[Pool]:
    async with running_pool(localenv, make_cluster, unique, grace_seconds=GRACE_SECONDS,
                            probe_seconds=PROBE_SECONDS) as running:
        yield running


def _namespace(pool: Pool, name: str, *, slices: int, pods: int) -> None:
    pool.core.create_namespace(k8s.V1Namespace.model_validate(
        {"metadata": {"name": name, "annotations": {"pool.tidepool.io/slice": '{"cpu": "1", "memory": "2Gi"}'}}}))
    pool.core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate({"metadata": {"name": "quota"},
        "spec": {"hard": {"cpu": str(slices), "memory": f"{2 * slices}Gi"}}}))  # fmt: skip
    for i in range(pods):
        pool.core.create_namespaced_pod(name, k8s.V1Pod.model_validate({"metadata": {"name": f"web-{i}"}, "spec": {
            "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))


def _annotations(pool: Pool, namespace: str) -> dict[str, str]:
    return dict(pool.core.read_namespace(namespace).metadata.annotations or {})


def _placement(pool: Pool, namespace: str) -> dict[str, int]:
    placement: dict[str, int] = json.loads(_annotations(pool, namespace).get(PLACEMENTS_ANNOTATION) or "{}")
    return placement


def _pods(pool: Pool, namespace: str) -> dict[str, k8s.V1Pod]:
    return {str(p.metadata.name): p for p in pool.core.list_namespaced_pod(namespace).items}


def _where(pod: k8s.V1Pod) -> str | None:
    return (pod.metadata.annotations or {}).get(POD_CLUSTER_ANNOTATION)


def _copies(cluster: LocalCluster, namespace: str) -> dict[str, k8s.V1Pod]:
    core = k8s.CoreV1Api(cluster.api_client())
    if namespace not in {n.metadata.name for n in core.list_namespace().items if not n.metadata.deletion_timestamp}:
        return {}
    return {str(p.metadata.name): p for p in core.list_namespaced_pod(namespace).items
            if not p.metadata.deletion_timestamp}  # fmt: skip


async def _placed_and_running(pool: Pool, namespace: str, pods: int) -> str:
    """The one cluster the namespace's pods run on, once they all do."""

    def running() -> set[str] | None:
        listed = _pods(pool, namespace).values()
        ok = len(listed) == pods and all(p.status.phase == "Running" for p in listed)
        return {_where(p) or "" for p in listed} if ok else None

    clusters: set[str] = await eventually(running, timeout=60, what=f"{namespace}'s pods Running")
    assert len(clusters) == 1, clusters
    return clusters.pop()


def _uids(pool: Pool, namespace: str) -> dict[str, str]:
    """The namespace's pods, name -> uid: what a move must keep (the same pods, not new ones)."""
    return {name: str(p.metadata.uid) for name, p in _pods(pool, namespace).items()}


def _moved_and_running(pool: Pool, namespace: str, new: str, expected: Mapping[str, str]) -> bool:
    """Every one of the `expected` pods (name -> uid) still there, the same pod, on `new` and Running there (the
    tenant's status is the new copy's), the move finished. A pod gone, or made anew, is not moved."""
    pods = _pods(pool, namespace)
    copies = _copies(pool.supers[new], super_cluster_namespace("t1", namespace))
    return (bool(expected) and all(
                name in pods and str((p := pods[name]).metadata.uid) == uid and _where(p) == new
                and p.status.phase == "Running" and MOVED_FROM_ANNOTATION not in (p.metadata.annotations or {})
                and name in copies and copies[name].status.phase == "Running"
                for name, uid in expected.items())
            and DRAINING_ANNOTATION not in _annotations(pool, namespace))  # fmt: skip


def _state(pool: Pool, namespace: str) -> str:
    """What a failed wait shows: the namespace's annotations, its pods and every cluster's copies."""
    pods = {n: ((p.metadata.annotations or {}), p.status.phase, p.status.reason) for n, p in _pods(pool, namespace).items()}
    copies: dict[str, Any] = {}
    for name, cluster in pool.supers.items():
        try:
            copies[name] = {n: p.status.phase for n, p in _copies(cluster, super_cluster_namespace("t1", namespace)).items()}
        except Exception as e:  # noqa: BLE001 - a stopped cluster: said, not raised
            copies[name] = type(e).__name__
    return f"annotations {_annotations(pool, namespace)}; pods {pods}; copies {copies}"


async def _until(pool: Pool, namespace: str, check: Callable[[], bool], *, timeout: float, what: str) -> None:
    try:
        await eventually(check, timeout=timeout, what=what)
    except TimeoutError as e:
        raise AssertionError(f"{e}: {_state(pool, namespace)}") from e


def _condition(pod: k8s.V1Pod, type_: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == type_), None)


async def test_a_cluster_stopped_past_the_grace_period_moves_its_pods_and_runs_none_twice_when_back(
    pool: Pool, temporal_client: Client, unique: str
) -> None:
    _namespace(pool, "shop", slices=1, pods=2)  # one slice: one cluster
    old = await _placed_and_running(pool, "shop", 2)
    new = next(n for n in pool.supers if n != old)
    before = _uids(pool, "shop")
    assert len(before) == 2, before

    pool.stop_cluster(pool.supers[old])
    try:
        await eventually(lambda: pool.health(old).reason == "Unreachable", timeout=GRACE_SECONDS + 30,
                         what=f"{old} Unreachable")  # fmt: skip
        await _until(pool, "shop", lambda: _moved_and_running(pool, "shop", new, before), timeout=120,
                     what=f"the pods Running on {new}")  # fmt: skip
        pods = _pods(pool, "shop")
        assert _uids(pool, "shop") == before  # the same pods, and no other: nothing lost
        assert _placement(pool, "shop") == {new: 1}
        for pod in pods.values():
            assert not pod.status.reason, pod.status  # the new copy's status: no stale Recreating
            assert _condition(pod, POD_SUPER_CLUSTER_CONDITION).status == "True"
    finally:
        pool.start_cluster(pool.supers[old])
    # Back: its syncer deletes the namespace there (its move finished); nothing of it runs twice.
    await eventually(lambda: not _copies(pool.supers[old], super_cluster_namespace("t1", "shop")), timeout=60, what=f"{old}'s copies gone")
    copies = _copies(pool.supers[new], super_cluster_namespace("t1", "shop"))
    assert _uids(pool, "shop") == before
    for name, pod in _pods(pool, "shop").items():  # no stale status pushed up by the cluster that came back
        assert _where(pod) == new and pod.status.phase == "Running" and pod.status.pod_ip == copies[name].status.pod_ip
    await replay_all_runs(temporal_client, f"pool-scheduler-{unique}")


async def test_a_stop_shorter_than_the_grace_period_moves_nothing(pool: Pool) -> None:
    pool.configure(unreachableGracePeriodSeconds=60)
    _namespace(pool, "shop", slices=1, pods=1)
    old = await _placed_and_running(pool, "shop", 1)
    pool.stop_cluster(pool.supers[old])
    try:
        await eventually(lambda: pool.health(old).reason == "ProbeFailing", timeout=30,
                         what=f"{old} Suspect: the prober saw the stop")  # fmt: skip
    finally:
        pool.start_cluster(pool.supers[old])
    await eventually(lambda: pool.health(old).reason == "ProbeSucceeded", timeout=30, what=f"{old} Ready again")
    assert _placement(pool, "shop") == {old: 1}
    assert DRAINING_ANNOTATION not in _annotations(pool, "shop")
    pod = _pods(pool, "shop")["web-0"]
    assert _where(pod) == old and pod.status.phase == "Running" and not pod.status.reason
    assert "web-0" in _copies(pool.supers[old], super_cluster_namespace("t1", "shop"))


async def _watch_no_delete_before_run(pool: Pool, namespace: str, old: str, new: str, pods: Mapping[str, str],
                                      stop: asyncio.Event) -> list[str]:  # fmt: skip
    """Until `stop`: every moment one of `pods` (name -> uid, as before the move) had neither its old copy nor a
    Running new one, or was gone from the tenant or made anew there (the saga forbids each). The old copies are
    read first: a copy deleted between the two reads was deleted after the new one ran, or is seen missing."""
    gaps: list[str] = []
    while not stop.is_set():
        old_copies, new_copies = _copies(pool.supers[old], super_cluster_namespace("t1", namespace)), _copies(pool.supers[new], super_cluster_namespace("t1", namespace))
        tenant = _uids(pool, namespace)
        for name, uid in pods.items():
            if name not in old_copies and (name not in new_copies or new_copies[name].status.phase != "Running"):
                gaps.append(f"{name}: no copy running")
            if tenant.get(name) != uid:
                gaps.append(f"{name}: {'made anew' if name in tenant else 'gone'} in the tenant")
        await asyncio.sleep(0.2)
    return gaps


def _fill(pool: Pool, cluster: str) -> None:
    """Headroom of its whole node: the cluster takes no slice, so the scheduler places elsewhere."""
    apply_cluster_object(pool.tenant.api_client(), SUPER_CLUSTERS, {"apiVersion": API_VERSION, "kind": "SuperCluster",
        "metadata": {"name": cluster}, "spec": {"kubeConfigRef": {"name": f"super-{cluster}", "namespace": "tidepool-system"},
                                                "headroom": {"cpu": "4", "memory": "8Gi"}}})  # fmt: skip


@pytest.mark.parametrize("change", ["edit", "clear", "shrink"])
async def test_a_changed_placement_moves_pods_running_elsewhere_before_the_old_copy_goes(pool: Pool, change: str) -> None:
    _namespace(pool, "shop", slices=2 if change == "shrink" else 1, pods=1)
    await eventually(lambda: _pods(pool, "shop")["web-0"].status.phase == "Running", timeout=60, what="Running")
    old = _where(_pods(pool, "shop")["web-0"]) or ""
    new = next(n for n in pool.supers if n != old)
    before = _uids(pool, "shop")
    assert list(before) == ["web-0"], before
    if change == "shrink":
        assert _placement(pool, "shop") == {"s1": 1, "s2": 1}  # spread: the shrink takes one cluster away
    done = asyncio.Event()
    watch = asyncio.create_task(_watch_no_delete_before_run(pool, "shop", old, new, before, done))
    try:
        if change == "edit":
            pool.core.patch_namespace("shop", {"metadata": {"annotations": {PLACEMENTS_ANNOTATION: json.dumps({new: 1})}}})
        elif change == "clear":
            _fill(pool, old)
            pool.core.patch_namespace("shop", {"metadata": {"annotations": {PLACEMENTS_ANNOTATION: None}}})
        else:
            _fill(pool, old)
            pool.core.patch_namespaced_resource_quota("quota", "shop", {"spec": {"hard": {"cpu": "1", "memory": "2Gi"}}})
        await _until(pool, "shop", lambda: _moved_and_running(pool, "shop", new, before), timeout=120,
                     what=f"the pod Running on {new}")  # fmt: skip
        await eventually(lambda: not _copies(pool.supers[old], super_cluster_namespace("t1", "shop")), timeout=60, what=f"{old}'s copy gone")
    finally:
        done.set()
    assert _placement(pool, "shop") == {new: 1}
    assert await watch == []


async def test_a_worker_killed_in_the_middle_of_a_move_converges(pool: Pool) -> None:
    _namespace(pool, "shop", slices=1, pods=1)
    old = await _placed_and_running(pool, "shop", 1)
    new = next(n for n in pool.supers if n != old)
    before = _uids(pool, "shop")
    assert list(before) == ["web-0"], before
    done = asyncio.Event()
    watch = asyncio.create_task(_watch_no_delete_before_run(pool, "shop", old, new, before, done))
    try:
        pool.syncers[new].stop()  # the new copy cannot start: the move stays in the middle
        pool.core.patch_namespace("shop", {"metadata": {"annotations": {PLACEMENTS_ANNOTATION: json.dumps({new: 1})}}})
        pod = await eventually(lambda: (p := _pods(pool, "shop")["web-0"]).metadata.annotations.get(MOVED_FROM_ANNOTATION) == old
                               and p, timeout=60, what="the pod moved")  # fmt: skip
        assert pod.status.phase == "Pending" and pod.status.reason == "Recreating"
        assert json.loads(_annotations(pool, "shop")[DRAINING_ANNOTATION]) == {old: 1}
        assert "web-0" in _copies(pool.supers[old], super_cluster_namespace("t1", "shop"))  # the old copy runs on meanwhile
        pool.stop_worker()
        await asyncio.sleep(1)
        pool.syncers[new] = Syncer(management=pool.tenant.api_client(), super_cluster=pool.supers[new].api_client(),
                                   cluster=new).start()  # fmt: skip
        pool.start_worker()
        await _until(pool, "shop", lambda: _moved_and_running(pool, "shop", new, before), timeout=120,
                     what="the move finished")  # fmt: skip
        await eventually(lambda: not _copies(pool.supers[old], super_cluster_namespace("t1", "shop")), timeout=60, what=f"{old}'s copy gone")
    finally:
        done.set()
    assert await watch == []
