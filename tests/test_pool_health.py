"""A super cluster's health (models/pool/health.py): the verdict after each probe, read back from the
status the prober writes, as the prober runs it (workers/pool_health.py: the status is its only memory);
then the real pool worker's prober against real super clusters whose control plane is stopped and started
(kwokctl, data kept), with a 2 s probe interval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, join_pool, start_cluster, stop_cluster
from deploy.localenv.env import EnvState
from deploy.localenv.temporal import free_port
from kube.metrics import SUPER_CLUSTER_HEALTH
from kube.objects import read_cluster_object
from kube.status import write_status
from models.api.conditions import condition
from models.names import LABEL_NODE_TYPE, SUPER_CLUSTERS, SYSTEM_NAMESPACE, VIRTUAL_NODE_TYPE
from models.pool.health import (
    NO_PHYSICAL_NODE,
    UNKNOWN,
    Health,
    ProbeOutcome,
    health_from_status,
    next_health,
    probe_of_nodes,
)
from models.resources import Resources
from models.settings import MetricsSettings
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.running import eventually, worker_settings
from tests.scraping import scrape, value
from tests.statuses import RecordingServer
from workers.pool import run

pytestmark = [pytest.mark.pool, pytest.mark.failover]

START = datetime(2026, 11, 23, 12, 0, 0, 250000, tzinfo=UTC)  # not on a second: the status keeps seconds
GRACE = timedelta(seconds=60)
CAPACITY = Resources({"cpu": "8", "memory": "16Gi"})
OK = ProbeOutcome(CAPACITY)
DOWN = ProbeOutcome(Resources(), failure="the API server did not answer (MaxRetryError)")
NO_NODE = ProbeOutcome(Resources(), failure=NO_PHYSICAL_NODE, no_ready_node=True)


@dataclass(frozen=True)
class Step:
    health: Health
    written: bool  # whether the prober patched the status at this probe


def _write(health: Health, status: dict[str, Any]) -> dict[str, Any]:
    """The status after the prober's write (workers/pool_health.py: _write), as the API server applies it."""
    value = health.condition()
    assert value is not None
    server = RecordingServer({"metadata": {"name": "super-a"}, "status": status})
    write_status(server, server.read(), fields=health.status(), conditions=[value])
    return dict(server.obj["status"])


def _probe(outcomes: list[tuple[int, ProbeOutcome]], status: dict[str, Any] | None = None,
           ) -> tuple[list[Step], dict[str, Any]]:  # fmt: skip
    """Probes at START + each offset (seconds), the previous health read from the status each time."""
    status = dict(status or {})
    steps = []
    for offset, outcome in outcomes:
        previous = health_from_status(status)
        health = next_health(previous, outcome, now=START + timedelta(seconds=offset), grace=GRACE)
        written = health != previous
        if written:
            status = _write(health, status)
        steps.append(Step(health, written))
    return steps, status


def test_a_cluster_never_probed_is_unknown_keeps_its_slices_and_takes_no_new_ones() -> None:
    assert health_from_status(None) == UNKNOWN == health_from_status({})
    assert (UNKNOWN.accepts_slices, UNKNOWN.drains, UNKNOWN.condition()) == (False, False, None)


def test_a_successful_probe_is_ready_with_the_allocatable_of_its_ready_nodes_and_written_once() -> None:
    steps, status = _probe([(0, OK), (10, OK), (20, OK)])
    assert [s.written for s in steps] == [True, False, False]
    health = steps[-1].health
    assert (health.state, health.reason, health.allocatable, health.failing_since) == ("Ready", "ProbeSucceeded",
                                                                                      CAPACITY, None)  # fmt: skip
    assert (health.accepts_slices, health.drains) == (True, False)
    assert status["allocatable"] == {"cpu": "8", "memory": "16Gi"}
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "True", "ProbeSucceeded")
    ]


def test_a_blip_shorter_than_the_grace_period_is_suspect_then_ready_again_with_failing_since_cleared() -> None:
    steps, status = _probe([(0, OK), (10, DOWN), (20, DOWN), (60, DOWN), (69, OK)])
    assert [s.health.state for s in steps] == ["Ready", "Suspect", "Suspect", "Suspect", "Ready"]
    assert [s.written for s in steps] == [True, True, False, False, True]
    suspect = steps[1].health
    assert (suspect.reason, suspect.accepts_slices, suspect.drains) == ("ProbeFailing", False, False)
    assert suspect.allocatable == CAPACITY  # its slices are still held there
    assert suspect.condition() == condition("Ready", True, "ProbeFailing", suspect.message)
    assert "failingSince" not in status and steps[-1].health.failing_since is None
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert [(c["status"], c["reason"]) for c in ready] == [("True", "ProbeSucceeded")]


def test_failing_for_the_grace_period_is_unreachable_with_failing_since_kept() -> None:
    steps, status = _probe([(0, OK), (10, DOWN), (69, DOWN), (70, DOWN), (80, DOWN), (300, DOWN)])
    assert [s.health.state for s in steps] == ["Ready", "Suspect", "Suspect", "Unreachable", "Unreachable",
                                               "Unreachable"]  # fmt: skip
    # A failure that goes on writes nothing: only entering Suspect and crossing the grace period do.
    assert [s.written for s in steps] == [True, True, False, True, False, False]
    unreachable = steps[-1].health
    assert (unreachable.reason, unreachable.accepts_slices, unreachable.drains) == ("Unreachable", False, True)
    assert unreachable.failing_since == datetime(2026, 11, 23, 12, 0, 10, tzinfo=UTC)
    assert status["failingSince"] == "2026-11-23T12:00:10Z"
    assert unreachable.allocatable == CAPACITY
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Unreachable")
    assert "2026-11-23T12:00:10Z" in ready["message"] and "MaxRetryError" in ready["message"]


def test_an_unreachable_cluster_that_answers_again_is_ready_at_once() -> None:
    steps, status = _probe([(0, DOWN), (70, DOWN), (80, OK)])
    assert [s.health.state for s in steps] == ["Suspect", "Unreachable", "Ready"]
    assert "failingSince" not in status and steps[-1].health.allocatable == CAPACITY


def test_no_ready_node_past_the_grace_period_is_no_ready_node() -> None:
    steps, status = _probe([(0, OK), (10, NO_NODE), (70, NO_NODE)])
    assert [(s.health.state, s.health.reason) for s in steps] == [
        ("Ready", "ProbeSucceeded"),
        ("Suspect", "ProbeFailing"),
        ("Unreachable", "NoReadyNode"),
    ]
    assert steps[-1].health.drains
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["reason"] == "NoReadyNode"


def test_a_restarted_prober_resumes_the_grace_period_from_the_status() -> None:
    _, status = _probe([(0, OK), (10, DOWN), (40, DOWN)])
    # A new process: nothing in memory, only the status. 50 s after the first failure it is still
    # within the grace period; 60 s after it, it is not (the clock did not restart).
    resumed, _ = _probe([(50, DOWN), (70, DOWN)], status)
    assert [(s.health.state, s.written) for s in resumed] == [("Suspect", False), ("Unreachable", True)]
    # Restarted after the grace period: Unreachable at its first probe, nothing new to write.
    _, unreachable = _probe([(0, DOWN), (70, DOWN)])
    again, _ = _probe([(500, DOWN)], unreachable)
    assert [(s.health.state, s.written) for s in again] == [("Unreachable", False)]


def test_a_status_of_another_writer_or_a_recreated_cluster_reads_unknown_and_is_written_again() -> None:
    foreign = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "SomethingElse",
                "message": "",
                "lastTransitionTime": "2026-11-23T11:00:00Z",
            }
        ]
    }
    assert health_from_status(foreign) == UNKNOWN
    steps, _ = _probe([(0, OK)], foreign)
    assert steps[0].written


def test_the_summary_names_state_reason_and_message() -> None:
    steps, _ = _probe([(0, DOWN)])
    assert steps[0].health.summary == ("Suspect (ProbeFailing): probe failing, within the grace period of 60 s: "
                                       "the API server did not answer (MaxRetryError)")  # fmt: skip
    assert UNKNOWN.summary == "Unknown: not probed yet"


@pytest.mark.parametrize(
    ("allocatable", "changed"),
    [
        pytest.param({"cpu": "8", "memory": "16Gi"}, False, id="the same allocatable writes nothing"),
        pytest.param({"cpu": "8000m", "memory": "16384Mi"}, False, id="the same quantities spelled otherwise"),
        pytest.param({"cpu": "12", "memory": "16Gi"}, True, id="a node added is written"),
    ],
)  # fmt: skip
def test_a_ready_cluster_is_written_again_only_when_its_allocatable_changes(allocatable: dict[str, str],
                                                                           changed: bool) -> None:  # fmt: skip
    steps, _ = _probe([(0, OK), (10, ProbeOutcome(Resources(allocatable)))])
    assert steps[1].written == changed


def _node(cpu: str, *, ready: bool = True, unschedulable: bool = False, taint: str | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    taints = [{"key": taint, "effect": "NoSchedule"}] if taint else []
    return {"metadata": {"name": "n", "labels": labels or {}}, "spec": {"unschedulable": unschedulable, "taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}  # fmt: skip


VIRTUAL = {LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE}


@pytest.mark.parametrize(
    ("nodes", "allocatable"),
    [
        pytest.param([_node("4")], {"cpu": "4", "memory": "8Gi"}, id="a physical node counts cpu and memory"),
        pytest.param([_node("4"), _node("16", labels=VIRTUAL)], {"cpu": "4", "memory": "8Gi"},
                     id="a virtual node of a peering is another cluster's capacity"),
        pytest.param([_node("4"), _node("16", labels={"type": VIRTUAL_NODE_TYPE})], {"cpu": "4", "memory": "8Gi"},
                     id="nor is a Liqo virtual node"),
        pytest.param([_node("4"), _node("2", ready=False), _node("2", unschedulable=True)],
                     {"cpu": "4", "memory": "8Gi"}, id="a node not Ready or cordoned runs nothing new"),
        pytest.param([_node("4"), _node("2")], {"cpu": "6", "memory": "16Gi"}, id="physical nodes add up"),
        pytest.param([_node("4"), _node("8", taint="node-role.kubernetes.io/control-plane")], {"cpu": "4", "memory": "8Gi"},
                     id="a node its owner keeps apart with a taint takes no tenant pod"),
        pytest.param([_node("4"), _node("8", taint="nvidia.com/gpu")], {"cpu": "12", "memory": "16Gi"},
                     id="unless the SuperCluster lets tenant pods tolerate it"),
    ],
)  # fmt: skip
def test_a_probe_counts_the_ready_schedulable_physical_nodes_only(nodes: list[dict[str, Any]],
                                                                  allocatable: dict[str, str]) -> None:  # fmt: skip
    assert probe_of_nodes(nodes, tolerated=["nvidia.com/gpu"]) == ProbeOutcome(Resources(allocatable))


def test_a_cluster_with_only_virtual_nodes_has_no_physical_node_and_fails_its_probe() -> None:
    outcome = probe_of_nodes([_node("16", labels=VIRTUAL), _node("4", ready=False)])
    assert outcome == NO_NODE and "physical" in (outcome.failure or "")


# --- The prober against real clusters ---------------------------------------------------------------------
PROBE_SECONDS = 2


@dataclass
class Prober:
    tenant: LocalCluster
    supers: dict[str, LocalCluster]
    metrics_port: int
    client: Client
    workflow_id: str
    workdir: Path

    def status(self, name: str) -> dict[str, Any]:
        obj = read_cluster_object(self.tenant.api_client(), SUPER_CLUSTERS, name)
        assert obj is not None, f"SuperCluster {name} is gone"
        return dict(obj.get("status") or {})

    def reason(self, name: str) -> str | None:
        ready = next((c for c in self.status(name).get("conditions") or [] if c["type"] == "Ready"), None)
        return ready["reason"] if ready else None

    def health_metric(self, name: str) -> str | None:
        """The state the metric says is 1 (a state set: exactly one)."""
        samples = scrape(self.metrics_port)
        states = [s for s in ("Unknown", "Ready", "Suspect", "Unreachable")
                  if value(samples, SUPER_CLUSTER_HEALTH, super_cluster=name, state=s) == 1]  # fmt: skip
        assert len(states) <= 1, f"{name} is in several states at once: {states}"
        return states[0] if states else None

    async def details(self) -> str:
        """The pool scheduler's current details, as the Web UI reads them."""
        handle = self.client.get_workflow_handle(self.workflow_id)
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        return str(metadata.current_details)

    def stop(self, name: str) -> None:
        stop_cluster(self.supers[name].name, binaries=ensure_binaries(), workdir=self.workdir)

    def start(self, name: str) -> None:
        start_cluster(self.supers[name], binaries=ensure_binaries(), workdir=self.workdir, timeout=300)


@pytest.fixture
async def prober(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client,
                 unique: str) -> AsyncIterator[Prober]:  # fmt: skip
    """The real pool worker (its prober, watchers and scheduler) over two super clusters: s1, which the
    tests stop, and s2, always healthy, which is the tenant's own API server (a probe only lists nodes:
    any cluster answers it), so that a test makes two clusters, not three."""
    tenant = make_cluster("tenant")
    supers = {"s1": make_cluster("s1"), "s2": tenant}
    api = tenant.api_client()
    create_namespace(api, SYSTEM_NAMESPACE)
    for name, cluster in supers.items():
        create_node(cluster.api_client(), f"{name}-node", cpu="4", memory="8Gi")
        join_pool(api, name, cluster.kubeconfig)
    # A peering's virtual node in s1, Ready like any kwok node: another cluster's capacity, never s1's.
    create_node(supers["s1"].api_client(), "s1-virtual", cpu="16", memory="64Gi", labels=VIRTUAL)
    port = free_port()
    settings = worker_settings(localenv, tenant, f"pool-{unique}").model_copy(
        update={"metrics": MetricsSettings(port=port)}
    )
    stop = asyncio.Event()
    task = asyncio.create_task(
        run(settings, stop=stop, task_queue=f"pool-{unique}", workflow_id=f"pool-scheduler-{unique}")
    )
    running = Prober(
        tenant, supers, port, temporal_client, f"pool-scheduler-{unique}", Path(localenv.state_dir) / "kwok"
    )
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def _never_unreachable_until(prober: Prober, name: str, reason: str, *, timeout: float) -> None:
    """Waits for `name`'s Ready reason to be `reason`, failing at once if it is ever Unreachable meanwhile."""

    def check() -> bool:
        seen = prober.reason(name)
        assert seen not in ("Unreachable", "NoReadyNode"), f"{name} went {seen} within the grace period"
        return seen == reason

    await eventually(check, timeout=timeout, what=f"{name} {reason}")


@pytest.mark.env
async def test_a_stopped_super_cluster_is_suspect_then_unreachable_past_the_grace_and_ready_when_started(
    prober: Prober,
) -> None:
    grace = 8
    apply_cluster_config(prober.tenant.api_client(), pool={"probeIntervalSeconds": PROBE_SECONDS,
                                                           "unreachableGracePeriodSeconds": grace})  # fmt: skip
    await eventually(lambda: prober.reason("s1") == prober.reason("s2") == "ProbeSucceeded", timeout=60,
                     what="both super clusters probed")  # fmt: skip
    assert prober.status("s1")["allocatable"] == {"cpu": "4", "memory": "8Gi"}  # its virtual node not counted
    assert await eventually(lambda: prober.health_metric("s1") == "Ready", what="the metric of s1 Ready")

    # Steady state: a healthy cluster's status is written once, not at every probe.
    def version() -> str:
        obj = read_cluster_object(prober.tenant.api_client(), SUPER_CLUSTERS, "s1")
        assert obj is not None
        return str(obj["metadata"]["resourceVersion"])

    versions = {version()}
    for _ in range(4 * PROBE_SECONDS * 2):  # four probe intervals
        await asyncio.sleep(0.5)
        versions.add(version())
    assert len(versions) == 1, f"s1 written {len(versions) - 1} times while nothing changed"

    stopped = datetime.now(UTC).replace(microsecond=0)  # before: the stop returns once its processes have ended
    prober.stop("s1")
    # Suspect first: failing, within the grace period, its slices kept (Ready stays True).
    await _never_unreachable_until(prober, "s1", "ProbeFailing", timeout=30)
    suspect = prober.status("s1")
    failing_since = datetime.fromisoformat(suspect["failingSince"].replace("Z", "+00:00"))
    assert failing_since >= stopped - timedelta(seconds=1)
    assert [c["status"] for c in suspect["conditions"] if c["type"] == "Ready"] == ["True"]
    await eventually(lambda: prober.reason("s1") == "Unreachable", timeout=grace + 30, what="s1 Unreachable")
    unreachable = prober.status("s1")
    assert unreachable["failingSince"] == suspect["failingSince"]  # the grace counts from the first failure
    assert [c["status"] for c in unreachable["conditions"] if c["type"] == "Ready"] == ["False"]
    assert await eventually(lambda: prober.health_metric("s1") == "Unreachable", what="the metric of s1 Unreachable")
    assert prober.health_metric("s2") == "Ready" and prober.reason("s2") == "ProbeSucceeded"
    # The scheduler's details name each cluster's state and reason (the watcher woke it on the change).
    details = await eventually(lambda: _both_in(prober, "| s1 | Unreachable (Unreachable)", "| s2 | Ready (ProbeSucceeded)"),
                               timeout=30, what="the scheduler's details")  # fmt: skip
    assert "probes failing since" in details

    prober.start("s1")
    await eventually(lambda: prober.reason("s1") == "ProbeSucceeded", timeout=30, what="s1 Ready again")
    assert "failingSince" not in prober.status("s1")
    assert await eventually(lambda: prober.health_metric("s1") == "Ready", what="the metric of s1 Ready again")


async def _both_in(prober: Prober, *lines: str) -> str | None:
    details = await prober.details()
    return details if all(line in details for line in lines) else None


@pytest.mark.env
async def test_a_stop_shorter_than_the_grace_period_is_suspect_and_never_unreachable(prober: Prober) -> None:
    # A grace period well beyond what a stop and a start of a kwok control plane take on a busy machine.
    grace = 40
    apply_cluster_config(prober.tenant.api_client(), pool={"probeIntervalSeconds": PROBE_SECONDS,
                                                           "unreachableGracePeriodSeconds": grace})  # fmt: skip
    await eventually(lambda: prober.reason("s1") == "ProbeSucceeded", timeout=60, what="s1 probed")
    prober.stop("s1")
    await _never_unreachable_until(prober, "s1", "ProbeFailing", timeout=30)
    assert prober.health_metric("s1") in ("Ready", "Suspect")  # scraped at most one probe behind
    await eventually(lambda: prober.health_metric("s1") == "Suspect", what="the metric of s1 Suspect")
    prober.start("s1")
    await _never_unreachable_until(prober, "s1", "ProbeSucceeded", timeout=30)
    assert "failingSince" not in prober.status("s1")
