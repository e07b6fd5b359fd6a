"""Kill -9 of a cluster's worker at random points of a peering, an acceptance and a teardown, with one
worker per cluster, and with two replicas per cluster on one task queue (marker `scaleout`), of which a
random one is killed each time: the leader's watchers move to the other, and in-flight work is retried.

The workers are real separate processes (`python -m workers.cluster`), restarted at once after each
SIGKILL as a supervisor would, under the same Lease identity (a pod's name). The kill points are drawn from a fixed seed, printed (set
TIDEPOOL_FAULT_SEED to replay another sequence). After every phase the pair must converge: exactly one
Advertisement per provider while peered, nothing orphaned on either cluster after teardown and every
workflow of the torn-down peering Completed, and no workflow history with a failed workflow task. The
histories must show that the kills hit work in flight (activities retried or timed out): kills that only
ever land between tasks would prove nothing."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as k8s
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client
from temporalio.service import RPCError

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.deployments import DeploymentRunner
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    admission_workflow_id,
    advertisement_name,
    advertisement_workflow_id,
    peering_workflow_id,
    remote_namespace_default_name,
    worker_lease_name,
)
from tests.faults import (
    Pair,
    WorkerProcess,
    convergence_problems,
    failed_workflow_tasks,
    fault_seed,
    interrupted_work_of,
    new_pair,
    runs_still_open,
)
from tests.kube import delete_quietly
from tests.running import eventually
from workers.network import NetworkModule
from workers.peer import cancel_peering, request_peering

pytestmark = [pytest.mark.env, pytest.mark.faults]

# Each cycle: 2 kills in the peering, 2 in the acceptance, 3 in the teardown; the first cycle's peering and
# acceptance each take one of theirs while an activity runs. One in the suite (minutes each); more cycles, which
# also peer again after a killed teardown, with TIDEPOOL_FAULT_CYCLES (docs/development.md).
CYCLES = int(os.environ.get("TIDEPOOL_FAULT_CYCLES", "1"))
# What each cycle's phases must have killed: how many kills, and whose workers (cluster ids by side).
KILLS_PER_PHASE: dict[str, tuple[int, set[str]]] = {
    "peering": (2, {"provider"}), "acceptance": (2, {"consumer"}), "teardown": (3, {"provider", "consumer"})}  # fmt: skip
# A kill in the middle of an activity loses that attempt: it is retried only once its start-to-close
# timeout has passed (60 s for a push), so every wait allows for one lost attempt.
CONVERGE_TIMEOUT = 150
# How long a targeted kill watches for an activity running (describe polled every 10 ms).
ACTIVITY_WATCH = 30


@dataclass(frozen=True)
class Kill:
    """One kill point: the cycle and phase it was made in, the cluster whose worker died, and when or during what."""

    cycle: int
    phase: str  # peering, acceptance or teardown
    cluster_id: str
    how: str

    def __str__(self) -> str:
        return f"cycle {self.cycle} {self.phase}: {self.cluster_id} killed {self.how}"


def uncovered(points: Sequence[Kill], *, cycles: int, sides: dict[str, str]) -> list[str]:
    """What the kill points miss of KILLS_PER_PHASE in each of `cycles` (`sides`: provider and consumer -> cluster
    id): a phase with another number of kills, a side it should have killed and did not, or one it should not."""
    missing = []
    for cycle in range(cycles):
        for phase, (count, whose) in KILLS_PER_PHASE.items():
            killed = [k.cluster_id for k in points if (k.cycle, k.phase) == (cycle, phase)]
            if len(killed) != count:
                missing.append(f"cycle {cycle} {phase}: {len(killed)} kills, not {count}")
            missing += [f"cycle {cycle} {phase}: no {side} worker killed" for side in sorted(whose)
                        if sides[side] not in killed]  # fmt: skip
            missing += [f"cycle {cycle} {phase}: {c} killed, not one of {sorted(whose)}" for c in killed
                        if c not in {sides[side] for side in whose}]  # fmt: skip
    missing += [f"{k}: not a cycle and phase of the test" for k in points
                if not (0 <= k.cycle < cycles and k.phase in KILLS_PER_PHASE)]  # fmt: skip
    return missing


class Killer:
    """Kills a worker at a random moment (after it has started serving), restarts it, and keeps a log."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.points: list[Kill] = []

    def _record(self, kill: Kill) -> None:
        self.points.append(kill)
        print(f"kill #{len(self.points)}: {kill}", flush=True)

    async def kill_within(self, worker: WorkerProcess, seconds: float, cycle: int, phase: str) -> None:
        await eventually(worker.ready, timeout=60, what=f"worker {worker.cluster_id} serving")
        delay = round(self.rng.uniform(0, seconds), 2)
        await asyncio.sleep(delay)
        assert worker.alive(), f"worker {worker.cluster_id} exited on its own with {worker.exit_code()} (see {worker.log})"
        worker.kill()
        self._record(Kill(cycle, phase, worker.cluster_id, f"{delay} s in"))
        worker.start()

    def pick(self, replicas: list[WorkerProcess]) -> WorkerProcess:
        return self.rng.choice(replicas)

    async def kill_during_activity(self, replicas: list[WorkerProcess], client: Client, workflow_id: str,
                                   cycle: int, phase: str) -> None:  # fmt: skip
        """Kills the replica an activity of `workflow_id` is running on, so that at least these kills surely
        hit work in flight (random moments mostly fall between short activities). If none is seen running
        within ACTIVITY_WATCH seconds, it kills a random one anyway and says so; the test's last assertion
        judges."""
        for replica in replicas:
            await eventually(replica.ready, timeout=60, what=f"worker {replica.cluster_id} serving")
        handle = client.get_workflow_handle(workflow_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACTIVITY_WATCH
        running: list[PendingActivityInfo] = []
        while not running and loop.time() < deadline:
            try:
                pending: Sequence[PendingActivityInfo] = (await handle.describe()).raw_description.pending_activities
            except RPCError:  # not started yet
                pending = []
            running = [a for a in pending if a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED]
            if not running:
                await asyncio.sleep(0.01)
        # The SDK's worker identity is "pid@host": the replica whose pid it names runs the activity.
        runs_it = [r for r in replicas if running and running[0].last_worker_identity.startswith(f"{r.pid}@")]
        worker = runs_it[0] if runs_it else self.pick(replicas)
        assert worker.alive(), f"worker {worker.cluster_id} exited on its own with {worker.exit_code()} (see {worker.log})"
        worker.kill()
        seen = ", ".join(a.activity_type.name for a in running) or "no activity seen"
        self._record(Kill(cycle, phase, worker.cluster_id, f"(pid {worker.pid}) during {seen}"))
        worker.start()


async def _peering_workflows_completed(client: Client, pair: Pair, *, what: str) -> None:
    """Every run of the torn-down peering's workflows, on both sides, closed Completed (or continued as
    new); one that failed or was terminated fails the wait at once."""

    async def open_runs() -> list[str]:
        return [run for workflow_id in (peering_workflow_id(pair.provider_id, pair.consumer_id), advertisement_workflow_id(pair.consumer_id, pair.provider_id))
                for run in await runs_still_open(client, workflow_id)]  # fmt: skip

    last: list[str] = []

    async def all_closed() -> bool:
        last[:] = await open_runs()
        return not last

    try:
        await eventually(all_closed, timeout=CONVERGE_TIMEOUT, interval=1, what=what)
    except TimeoutError as e:
        raise AssertionError(f"{what}: runs still open: {last}") from e


async def _converged(pair: Pair, *, peered: bool, what: str) -> None:
    last: list[str] = []

    def check() -> bool:
        last[:] = convergence_problems(pair, peered=peered)
        return not last

    try:
        await eventually(check, timeout=CONVERGE_TIMEOUT, interval=0.5, what=what)
    except TimeoutError as e:
        raise AssertionError(f"{what}: not converged: {last}") from e


def _offload(pair: Pair, name: str) -> None:
    k8s.CoreV1Api(pair.consumer.api_client()).create_namespaced_pod("app", k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}],
        "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
        "nodeSelector": {LABEL_PROVIDER: pair.provider_id}}}))  # fmt: skip


def _reflected(pair: Pair) -> list[str]:
    """The copies in the provider, as namespace/name: `app`'s are in its remote namespace, under their own names."""
    pods = k8s.CoreV1Api(pair.provider.api_client()).list_pod_for_all_namespaces(
        label_selector=f"{LABEL_CONSUMER}={pair.consumer_id}").items  # fmt: skip
    return sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.metadata.name)


@pytest.mark.timeout(720)
@pytest.mark.parametrize(
    "replicas",
    [pytest.param(1, id="one worker per cluster"),
     pytest.param(2, id="two replicas per cluster", marks=pytest.mark.scaleout)],
)  # fmt: skip
async def test_workers_killed_at_random_points_converge_with_one_advertisement_and_nothing_orphaned(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str,
    tmp_path: Path, replicas: int,
) -> None:
    seed = fault_seed()
    print(f"kill points drawn with seed {seed} (TIDEPOOL_FAULT_SEED)", flush=True)
    killer = Killer(seed)
    pair = new_pair(make_cluster, unique)
    provider, consumer = pair.provider.api_client(), pair.consumer.api_client()
    workers = {
        "provider": [WorkerProcess(cluster=pair.provider, cluster_id=pair.provider_id, pod_cidr="10.1.0.0/16",
                                   temporal_address=localenv.temporal_address, identity=f"provider-{i}",
                                   log=tmp_path / f"provider-worker-{i}.log") for i in range(replicas)],
        "consumer": [WorkerProcess(cluster=pair.consumer, cluster_id=pair.consumer_id, pod_cidr="10.2.0.0/16",
                                   temporal_address=localenv.temporal_address, identity=f"consumer-{i}",
                                   log=tmp_path / f"consumer-worker-{i}.log") for i in range(replicas)],
    }  # fmt: skip
    every_worker = [w for side in workers.values() for w in side]
    network = NetworkModule(consumer, local_pod_cidr="10.2.0.0/16").start()
    try:
        for worker in every_worker:
            worker.start()
        remote = remote_namespace_default_name(pair.consumer_id, "app")  # `app` is offloaded (new_pair)
        with DeploymentRunner(pair.consumer.kubeconfig, log_dir=tmp_path):
            for cycle in range(CYCLES):
                # The peering: the provider's worker dies while it starts the workflow and pushes.
                request_peering(provider, pair.consumer.api_client(), provider_id=pair.provider_id,
                                consumer_id=pair.consumer_id)  # fmt: skip
                # The first cycle kills once while an activity runs (an attempt lost costs its timeout: once is enough).
                if cycle == 0:
                    await killer.kill_during_activity(workers["provider"], temporal_client,
                                                      peering_workflow_id(pair.provider_id, pair.consumer_id), cycle, "peering")
                else:
                    await killer.kill_within(killer.pick(workers["provider"]), 3, cycle, "peering")
                await killer.kill_within(killer.pick(workers["provider"]), 3, cycle, "peering")
                await eventually(lambda: read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(pair.provider_id)),
                                 timeout=CONVERGE_TIMEOUT, what="the Advertisement on the consumer")  # fmt: skip

                # The acceptance: the consumer's worker dies while it admits and builds the virtual kubelet.
                if cycle == 0:
                    await killer.kill_during_activity(workers["consumer"], temporal_client,
                                                      advertisement_workflow_id(pair.consumer_id, pair.provider_id), cycle, "acceptance")
                else:
                    await killer.kill_within(killer.pick(workers["consumer"]), 3, cycle, "acceptance")
                await killer.kill_within(killer.pick(workers["consumer"]), 3, cycle, "acceptance")
                await _converged(pair, peered=True, what=f"cycle {cycle}: accepted with its virtual kubelet and node")
                _offload(pair, f"job-{cycle}")
                await eventually(lambda c=cycle: _reflected(pair) == [f"{remote}/job-{c}"], timeout=CONVERGE_TIMEOUT,
                                 what="the offloaded pod reflected in the provider, once")  # fmt: skip

                # The teardown: both workers die while the provider withdraws and the consumer tears down.
                cancel_peering(provider, consumer_id=pair.consumer_id)
                await killer.kill_within(killer.pick(workers["provider"]), 2, cycle, "teardown")
                await killer.kill_within(killer.pick(workers["consumer"]), 3, cycle, "teardown")
                await killer.kill_within(killer.pick(workers[killer.rng.choice(["provider", "consumer"])]), 4,
                                         cycle, "teardown")  # fmt: skip
                await _converged(pair, peered=False, what=f"cycle {cycle}: torn down, nothing orphaned")
                await _peering_workflows_completed(temporal_client, pair, what=f"cycle {cycle}: workflows Completed")
                # The consumer's pod was bound to the deleted virtual node: gone with it, as far as we care.
                delete_quietly(k8s.CoreV1Api(consumer).delete_namespaced_pod, f"job-{cycle}", "app", grace_period_seconds=0)
            assert all(w.alive() for w in every_worker), "a worker exited on its own"
            # One replica per cluster holds its Lease (the watchers run there), a live one.
            for side, cluster in (("provider", pair.provider), ("consumer", pair.consumer)):
                side_id = pair.provider_id if side == "provider" else pair.consumer_id
                holder = k8s.CoordinationV1Api(cluster.api_client()).read_namespaced_lease(
                    worker_lease_name(side_id), SYSTEM_NAMESPACE).spec.holder_identity  # fmt: skip
                assert holder in {f"{side}-{i}" for i in range(replicas)}, f"{side}'s Lease held by {holder}"
    finally:
        for worker in every_worker:
            worker.stop()
        network.stop()
    print("\n".join(map(str, killer.points)))
    # Every cycle's phases killed as many times as planned, and the workers of the sides at work in each.
    sides = {"provider": pair.provider_id, "consumer": pair.consumer_id}
    assert uncovered(killer.points, cycles=CYCLES, sides=sides) == []
    stuck = []
    for workflow_id in (peering_workflow_id(pair.provider_id, pair.consumer_id), advertisement_workflow_id(pair.consumer_id, pair.provider_id),
                        admission_workflow_id(pair.consumer_id)):  # fmt: skip
        stuck += await failed_workflow_tasks(temporal_client, workflow_id)
    assert stuck == []
    hit = await interrupted_work_of(temporal_client, (peering_workflow_id(pair.provider_id, pair.consumer_id),
                                                      advertisement_workflow_id(pair.consumer_id, pair.provider_id),
                                                      admission_workflow_id(pair.consumer_id)))  # fmt: skip
    print(f"work the kills interrupted: {hit}")
    assert hit.activities_hit > 0, f"no kill hit an activity in flight (no retry, timeout or failure): {hit}"
