"""The benchmarks' pure helpers (bench/): percentiles, the JSON line of a figure, the billable-action
count of a history and the pool workload generator. The benchmarks themselves are run by hand
(`python -m bench <name>`), never by the test suite: tests do not assert timings."""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import ActivityTaskStartedEventAttributes, HistoryEvent, MarkerRecordedEventAttributes

from bench.actions_per_day import count_actions
from bench.common import figure_line, percentile
from bench.pool_placement import generate


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        pytest.param([5.0], 99, 5.0, id="one value is every percentile"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.5, id="median of an even count interpolates"),
        pytest.param([3.0, 1.0, 2.0], 50, 2.0, id="unsorted input"),
        pytest.param(list(range(1, 101)), 99, 99.01, id="p99 of 1..100 interpolates between 99 and 100"),
        pytest.param([1.0, 9.0], 0, 1.0, id="p0 is the minimum"),
        pytest.param([1.0, 9.0], 100, 9.0, id="p100 is the maximum"),
    ],
)
def test_percentiles_interpolate_between_closest_ranks(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected)


def test_a_percentile_of_nothing_or_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="between 0 and 100, got 101"):
        percentile([1.0], 101)


def test_a_figure_is_one_json_line_with_its_ratio_to_the_baseline() -> None:
    line = figure_line("x.p50", 30.0, "ms", baseline=12.0, params={"changes": 200})
    assert "\n" not in line
    assert json.loads(line) == {"name": "x.p50", "value": 30.0, "unit": "ms", "baseline": 12.0, "ratio": 2.5,
                                "params": {"changes": 200}}  # fmt: skip
    assert json.loads(figure_line("y", 1.0, "s", baseline=None))["ratio"] is None
    assert json.loads(figure_line("y", 1.0, "s", baseline=0))["ratio"] is None


def _event(kind: EventType.ValueType, **attributes: object) -> HistoryEvent:
    return HistoryEvent(event_type=kind, **attributes)  # type: ignore[arg-type]


def test_billable_actions_follow_the_cloud_rules_and_leave_out_the_benchmarks_own_events() -> None:
    events = [
        _event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
        _event(EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),  # workflow tasks are free
        _event(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        _event(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        # Third attempt: the two retries are billed too.
        _event(EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
               activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(attempt=3)),
        _event(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
        _event(EventType.EVENT_TYPE_TIMER_STARTED),
        _event(EventType.EVENT_TYPE_TIMER_FIRED),
        _event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),
        _event(EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES),
        # Two markers in one workflow task are one action.
        _event(EventType.EVENT_TYPE_MARKER_RECORDED,
               marker_recorded_event_attributes=MarkerRecordedEventAttributes(workflow_task_completed_event_id=3)),
        _event(EventType.EVENT_TYPE_MARKER_RECORDED,
               marker_recorded_event_attributes=MarkerRecordedEventAttributes(workflow_task_completed_event_id=3)),
        _event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED),  # the benchmark's fast-forward
        _event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIME_SKIPPING_TRANSITIONED),
    ]  # fmt: skip
    actions, counted, artifacts = count_actions(events)
    assert dict(actions) == {"workflow started": 1, "activity started or retried": 3, "timer started": 1,
                             "signal": 1, "search attributes upserted": 1, "markers (one per workflow task)": 1}  # fmt: skip
    assert (counted, artifacts) == (12, 2)


@pytest.mark.parametrize("load", [0.7, 0.9, 1.0])
def test_generated_pool_workloads_ask_for_close_to_the_load_and_never_more(load: float) -> None:
    workload = generate(seed=1, clusters=6, load=load)
    assert load - 0.05 <= workload.load <= load
    assert workload == generate(seed=1, clusters=6, load=load)  # deterministic per seed


def test_pool_placement_prints_figures_and_no_policy_beats_the_optimal_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.pool_placement import run

    run({"seeds": 2, "clusters": 4, "loads": "90,100", "solver_seconds": 30, "max_slices": 12})
    figures = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {tuple(sorted(f)) for f in figures} == {("baseline", "name", "params", "ratio", "unit", "value")}
    shares = {f["name"]: f for f in figures if ".share." in f["name"]}
    assert len(shares) == 6  # spread, pack and optimal at two loads
    for figure in shares.values():
        assert figure["value"] <= figure["params"]["optimal_percent"] + 0.01, figure  # both rounded for print
        assert figure["params"]["optimal_proven"]
