"""A super cluster's health (models/pool/health.py): the verdict after each probe, read back from the
status the prober writes, as the prober runs it (workers/pool_health.py: the status is its only memory).
Pure: no cluster."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kube.objects import with_condition
from models.api.conditions import condition
from models.pool.health import UNKNOWN, Health, ProbeOutcome, health_from_status, next_health
from models.resources import Resources

pytestmark = [pytest.mark.pool, pytest.mark.failover]

START = datetime(2026, 11, 23, 12, 0, 0, 250000, tzinfo=UTC)  # not on a second: the status keeps seconds
GRACE = timedelta(seconds=60)
CAPACITY = Resources({"cpu": "8", "memory": "16Gi"})
OK = ProbeOutcome(CAPACITY)
DOWN = ProbeOutcome(Resources(), failure="the API server did not answer (MaxRetryError)")
NO_NODE = ProbeOutcome(Resources(), failure="no Ready, schedulable node", no_ready_node=True)


@dataclass(frozen=True)
class Step:
    health: Health
    written: bool  # whether the prober patched the status at this probe


def _write(health: Health, status: dict[str, Any]) -> dict[str, Any]:
    """The status after the prober's merge patch (workers/pool_health.py: _write)."""
    value = health.condition()
    assert value is not None
    conditions = with_condition(value, status.get("conditions") or [])
    return {key: v for key, v in {**status, **health.status(), "conditions": conditions}.items() if v is not None}


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
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [("Ready", "True", "ProbeSucceeded")]


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
        ("Ready", "ProbeSucceeded"), ("Suspect", "ProbeFailing"), ("Unreachable", "NoReadyNode")]
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
    foreign = {"conditions": [{"type": "Ready", "status": "True", "reason": "SomethingElse", "message": "",
                               "lastTransitionTime": "2026-11-23T11:00:00Z"}]}
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
