"""The benchmarks' pure helpers (bench/): percentiles, the JSON line of a figure, the billable-action
count of a history, the pool workload generator and the soak's accounting (RSS slope, window counts,
not-Ready time, lost pods, rotations). The benchmarks are measured by hand (`python -m bench <name>`): tests
do not assert timings. A few run at a tiny size to check their plumbing, not their figures: offload_scale at
20 pods (two clusters of its own, about 2 minutes), and, only when TIDEPOOL_BENCH_SOAK / TIDEPOOL_BENCH_FAILOVER /
TIDEPOOL_BENCH_SYNC_SCALE is set, a 2-minute soak, a small failover run and a small pool_sync_scale run."""

from __future__ import annotations

import base64
import json
import math
import os
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import ActivityTaskStartedEventAttributes, HistoryEvent, MarkerRecordedEventAttributes

from bench.actions_per_day import count_actions
from bench.common import figure_line, percentile
from bench.pool_failover import Tracked, duplicated, failover_figure, lost, samples, tail_percentile
from bench.pool_placement import generate
from bench.soak import (
    LossLedger,
    NotReadyClock,
    OffloadedPod,
    QuotaLedger,
    RotationCounter,
    per_day,
    rss_slope_mib_per_hour,
    token_hash,
    window_counts,
)


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


def test_a_miss_makes_the_percentiles_it_reaches_infinite_never_nan() -> None:
    inf = float("inf")
    assert [percentile([1.0, 2.0, inf, inf], p) for p in (0, 50, 99, 100)] == [1.0, inf, inf, inf]
    assert percentile([1.0, 3.0, inf], 50) == 3.0


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
    assert json.loads(figure_line("y", 1.0, "s", baseline=math.inf))["ratio"] is None  # a missed baseline


def test_a_figure_is_never_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        figure_line("y", math.nan, "s", baseline=1.0)
    with pytest.raises(ValueError, match="NaN"):
        figure_line("y", 1.0, "s", baseline=math.nan)
    assert json.loads(figure_line("y", math.inf, "s", baseline=math.inf))["ratio"] is None  # both missed: no ratio


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
    assert len(shares) == 8  # spread, pack, whole-quota first fit and optimal at two loads
    for figure in shares.values():
        assert figure["value"] <= figure["params"]["optimal_percent"] + 0.01, figure  # both rounded for print
        assert figure["params"]["optimal_proven"]


# The soak's pure pieces (bench/soak.py) ----------------------------------------------------------------


def _at(kind: EventType.ValueType, when: datetime, **attributes: object) -> HistoryEvent:
    event = _event(kind, **attributes)
    event.event_time.FromDatetime(when)
    return event


@pytest.mark.steady
@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([(0.0, 100.0), (60.0, 101.0), (120.0, 102.0)], 60.0, id="1 MiB a minute is 60 MiB an hour"),
        pytest.param([(0.0, 50.0), (60.0, 50.0), (120.0, 50.0)], 0.0, id="flat memory does not grow"),
        pytest.param([(0.0, 10.0), (3600.0, 12.0), (7200.0, 11.0), (10800.0, 13.0)], 0.8, id="noise is fitted"),
        pytest.param([(5.0, 10.0)], 0.0, id="one sample has no slope"),
        pytest.param([(5.0, 10.0), (5.0, 20.0)], 0.0, id="samples at one instant have no slope"),
    ],
)
def test_the_rss_slope_is_a_least_squares_fit_in_mib_per_hour(
    samples: list[tuple[float, float]], expected: float
) -> None:
    assert rss_slope_mib_per_hour(samples) == pytest.approx(expected)


@pytest.mark.steady
def test_the_window_counts_only_events_written_inside_it_across_continued_runs() -> None:
    start = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    end = start + timedelta(minutes=10)
    first_run = [
        _at(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, start - timedelta(minutes=5)),  # warm-up: left out
        _at(EventType.EVENT_TYPE_TIMER_STARTED, start),  # the window's first instant counts
        _at(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, start + timedelta(minutes=1)),
    ]
    second_run = [
        _at(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, start + timedelta(minutes=1)),
        _at(EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, start + timedelta(minutes=2),
            activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(attempt=2)),
        _at(EventType.EVENT_TYPE_TIMER_STARTED, end),  # the window's end is outside it
    ]  # fmt: skip
    actions, events = window_counts([first_run, second_run], start, end)
    assert dict(actions) == {"timer started": 1, "workflow started": 1, "activity started or retried": 2}
    assert events == 4
    assert per_day(4, 600) == 576


@pytest.mark.steady
def test_not_ready_time_counts_from_the_first_ready_and_a_missing_node_is_not_ready() -> None:
    clock = NotReadyClock()
    clock.sample(0, {"n1": False})  # not Ready yet: not counted
    clock.sample(5, {"n1": True})
    clock.sample(10, {"n1": False, "n2": True})
    clock.sample(15, {"n2": True})  # n1 was not Ready from 10 to 15, and is gone
    clock.sample(20, {"n1": True, "n2": True})  # missing from 15 to 20
    clock.sample(25, {"n1": True, "n2": True})
    assert clock.seconds() == 10
    assert clock.seconds(12, 100) == 8  # the part inside a window


@pytest.mark.steady
def test_offloaded_pods_are_lost_when_deleted_restarted_or_recreated_but_not_when_the_churn_deletes_them() -> None:
    def pod(uid: str, *, restarts: int = 0, copy: str | None = "c-" , copy_restarts: int = 0) -> OffloadedPod:
        return OffloadedPod(uid=uid, name=f"app/{uid}", restarts=restarts,
                            copy_uid=None if copy is None else copy + uid, copy_restarts=copy_restarts)  # fmt: skip

    ledger = LossLedger()
    kept, deleted, restarted, recopied, uncopied, copy_restarted, churned = "kept deleted restarted recopied uncopied copy-restarted churned".split()  # fmt: skip
    for uid in (kept, deleted, restarted, recopied, uncopied, copy_restarted, churned):
        ledger.track(pod(uid))
    ledger.track(pod("not-yet-copied", copy=None))  # followed only once its copy runs
    ledger.forget(churned)
    new = ledger.observe({kept: pod(kept), restarted: pod(restarted, restarts=1), recopied: pod(recopied, copy="d-"),
                          uncopied: pod(uncopied, copy=None), copy_restarted: pod(copy_restarted, copy_restarts=2)})  # fmt: skip
    assert sorted(new) == sorted(ledger.lost.values())
    assert ledger.lost == {deleted: "app/deleted: deleted in the consumer",
                           restarted: "app/restarted: restarted in the consumer",
                           recopied: "app/recopied: provider copy recreated",
                           uncopied: "app/uncopied: provider copy deleted",
                           copy_restarted: "app/copy-restarted: provider copy restarted"}  # fmt: skip
    assert ledger.observe({}) == ["app/kept: deleted in the consumer"]  # each loss is new once, and counted once
    assert len(ledger.lost) == 6


@pytest.mark.steady
def test_rotations_are_changes_of_the_token_hash_and_the_token_is_never_kept() -> None:
    def secret(token: str, server: str = "https://a") -> dict[str, str]:
        kubeconfig = f"users: [{{name: vk, user: {{token: {token}}}}}]\nclusters: [{{cluster: {{server: '{server}'}}}}]\n"
        return {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}

    first = token_hash(secret("t0ken-one"))
    assert first is not None and "t0ken-one" not in first
    assert token_hash(secret("t0ken-one", server="https://b")) == first  # only the token counts
    assert token_hash({"other": base64.b64encode(b"no token here").decode()}) is None
    counter = RotationCounter()
    for at, token in ((0, "one"), (10, "one"), (20, "two"), (30, "two"), (40, "three")):
        counter.sample(at, {"s": token_hash(secret(token)), "gone": None})
    assert counter.between(0, 100) == 2
    assert counter.between(25, 100) == 1
    assert "one" not in repr(counter)


def test_a_quota_mismatch_counts_only_when_the_next_sample_still_sees_it() -> None:
    quota = {"requests.cpu": "1.6", "requests.memory": "2048Mi", "pods": "44", "count/secrets": "108",
             "count/configmaps": "108", "services": "108", "services.nodeports": "0", "services.loadbalancers": "0"}  # fmt: skip
    ledger = QuotaLedger()
    ledger.observe("p", offered={"cpu": "1600m", "memory": "2Gi", "pods": "44"}, quota=quota)  # equal, other units
    ledger.observe("p", offered={"cpu": "2", "memory": "2Gi", "pods": "44"}, quota=quota)  # a push between writes
    ledger.observe("p", offered={"cpu": "2", "memory": "2Gi", "pods": "44"}, quota={**quota, "requests.cpu": "2"})
    ledger.observe("q", offered=None, quota=None)  # nothing offered: nothing to keep equal
    assert (ledger.samples, ledger.persistent) == (3, [])
    ledger.observe("p", offered={"cpu": "3", "memory": "2Gi", "pods": "44"}, quota=None)
    ledger.observe("p", offered={"cpu": "3", "memory": "2Gi", "pods": "44"}, quota=None)
    assert len(ledger.persistent) == 1 and ledger.persistent[0].startswith("p: offer")


SOAK_FIGURES = {
    "offloaded_pods_lost", "virtual_node_not_ready_seconds", "actions_per_peering_day_provider",
    "actions_per_peering_day_consumer", "actions_per_day_pool", "history_events_per_workflow_day",
    "worker_rss_growth_mib_per_hour", "virtual_kubelet_rss_growth_mib_per_hour", "token_rotations_seen",
    "quota_mismatches",
}  # fmt: skip


@pytest.mark.env
@pytest.mark.steady
@pytest.mark.timeout(900)
@pytest.mark.skipif(not os.environ.get("TIDEPOOL_BENCH_SOAK"),
                    reason="about 5 minutes of four clusters of its own: set TIDEPOOL_BENCH_SOAK=1 to run it")  # fmt: skip
def test_a_short_soak_prints_every_figure_loses_no_pod_and_leaves_nothing_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.soak import run

    before = _soak_state_dirs()
    run({"minutes": 2.0, "warmup_minutes": 0.5, "churn_per_minute": 6.0, "sample_seconds": 5.0})
    figures = {f["name"]: f for line in capsys.readouterr().out.splitlines() if line.startswith("{")
               for f in [json.loads(line)]}  # fmt: skip
    assert set(figures) == SOAK_FIGURES
    assert figures["offloaded_pods_lost"]["value"] == 0, figures["offloaded_pods_lost"]["params"]["lost"]
    assert figures["offloaded_pods_lost"]["baseline"] > 0  # some offloaded pods were followed
    assert figures["actions_per_peering_day_consumer"]["params"]["accepted_peerings"] == 2
    assert figures["quota_mismatches"]["value"] == 0, figures["quota_mismatches"]["params"]["mismatches"]
    assert figures["quota_mismatches"]["baseline"] > 0  # the quotas were sampled
    assert _soak_state_dirs() == before  # torn down, state removed (the processes' logs are kept on purpose)


def _soak_state_dirs() -> set[Path]:
    temp = Path(tempfile.gettempdir())
    return set(temp.glob("tidepool-soak-*")) - set(temp.glob("tidepool-soak-logs-*"))


def test_a_failover_miss_is_an_infinite_sample_that_makes_the_tail_infinite_but_not_the_median() -> None:
    tracked = [Tracked("a", f"p{i}", f"u{i}", since=10.0) for i in range(4)]
    measured = samples(tracked, {("a", "p0"): 12.0, ("a", "p1"): 14.0, ("a", "p2"): 16.0})
    assert measured == [2.0, 4.0, 6.0, math.inf]  # one sample per pod: a miss is never left out
    assert tail_percentile(measured, 50) == pytest.approx(5.0)
    assert tail_percentile(measured, 99) == math.inf
    assert tail_percentile(measured[:3], 99) == pytest.approx(5.96)
    assert json.loads(figure_line("failover_seconds_p99", math.inf, "s", baseline=6.0))["value"] == math.inf


def test_a_failover_with_nothing_stranded_is_a_miss_not_nan() -> None:
    for p in (50, 99):
        assert failover_figure([], p) == math.inf
        assert json.loads(figure_line(f"failover_seconds_p{p}", failover_figure([], p), "s",
                                      baseline=failover_figure([3.0], p)))["value"] == math.inf  # fmt: skip
    assert failover_figure([2.0, 4.0], 50) == pytest.approx(3.0)


def test_a_pod_is_lost_when_it_never_ran_elsewhere_or_another_uid_is_served_under_its_name() -> None:
    tracked = [Tracked("a", f"p{i}", f"u{i}", since=0.0) for i in range(4)]
    ran_at = {("a", "p0"): 1.0, ("a", "p1"): 1.0, ("a", "p2"): 1.0}
    served = {("a", "p0"): "u0", ("a", "p1"): "recreated", ("a", "p3"): "u3"}
    # p0 moved (same uid); p1 recreated (the baseline's way: a new pod); p2 gone; p3 never ran again.
    assert lost(tracked, ran_at, served) == ["a/p1", "a/p2", "a/p3"]


def test_a_pod_is_duplicated_when_copies_run_on_two_clusters() -> None:
    assert duplicated({"s1": {("a", "p0"), ("a", "p1")}, "s2": {("a", "p1")}, "s3": {("b", "p1")}}) == {("a", "p1")}
    assert duplicated({"s1": set(), "s2": {("a", "p0")}}) == set()


FAILOVER_FIGURES = {"failover_seconds_p50", "failover_seconds_p99", "baseline_failover_seconds_p50",
                    "baseline_failover_seconds_p99", "pods_lost", "pods_duplicated_after_return"}  # fmt: skip


@pytest.mark.env
@pytest.mark.failover
@pytest.mark.timeout(900)
@pytest.mark.skipif(not os.environ.get("TIDEPOOL_BENCH_FAILOVER"),
                    reason="four clusters of its own for minutes: set TIDEPOOL_BENCH_FAILOVER=1 to run it")  # fmt: skip
def test_a_small_failover_run_prints_every_figure_and_loses_and_duplicates_no_pod(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.pool_failover import run

    run({"namespaces": 3, "pods": 2, "grace_seconds": 10, "probe_seconds": 2, "deadline_seconds": 180,
         "settle_seconds": 90})  # fmt: skip
    figures = {f["name"]: f for line in capsys.readouterr().out.splitlines() if line.startswith("{")
               for f in [json.loads(line)]}  # fmt: skip
    assert set(figures) == FAILOVER_FIGURES
    assert figures["failover_seconds_p99"]["params"]["affected"] > 0  # the stopped cluster ran some pool pods
    assert figures["pods_lost"]["value"] == 0, figures["pods_lost"]["params"]["lost"]
    assert figures["pods_duplicated_after_return"]["value"] == 0, figures["pods_duplicated_after_return"]["params"]


def test_offload_scale_refuses_to_record_a_node_agent_it_never_sampled(tmp_path: Path) -> None:
    from bench.offload_scale import _kwok_controller_pid, _ProcessSampler
    from deploy.localenv.clusters import LocalCluster

    consumer = LocalCluster(name="consumer", kubeconfig=tmp_path / "kubeconfigs" / "consumer.yaml")
    with pytest.raises(FileNotFoundError, match="kwok controller"):  # the baseline's RSS would be 0
        _kwok_controller_pid(consumer)
    with pytest.raises(FileNotFoundError):
        _ProcessSampler(lambda: _kwok_controller_pid(consumer)).start()
    with pytest.raises(RuntimeError, match="never sampled"):
        _ProcessSampler(lambda: None).start().stop()

    pid_file = tmp_path / "clusters" / "consumer" / "pids" / "kwok-controller.pid"
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{os.getpid()}\n")
    assert _kwok_controller_pid(consumer) == os.getpid()
    sampler = _ProcessSampler(lambda: _kwok_controller_pid(consumer)).start()
    sampler.stop()
    assert sampler.peak_rss_mib > 0


def test_offload_scale_fails_when_the_node_agent_cannot_be_found_while_it_samples() -> None:
    from bench.offload_scale import SAMPLE_SECONDS, _ProcessSampler

    found = iter([os.getpid()])

    def pid_of() -> int:
        pid = next(found, None)
        if pid is None:
            raise FileNotFoundError("the pid file went away")
        return pid

    sampler = _ProcessSampler(pid_of).start()
    time.sleep(SAMPLE_SECONDS * 1.5)  # the loop's first sample
    with pytest.raises(RuntimeError, match="pid file went away"):
        sampler.stop()


OFFLOAD_SCALE_FIGURES = {"pods_running_seconds", "pod_running_p50_seconds", "pod_running_p99_seconds",
                         "endpoints_ready_seconds", "pods_missed", "virtual_kubelet_rss_mib",
                         "virtual_kubelet_cpu_seconds_per_pod"}  # fmt: skip


@pytest.mark.env
@pytest.mark.vk
@pytest.mark.timeout(600)
def test_a_small_offload_scale_run_prints_every_figure_and_misses_no_pod(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.offload_scale import run

    run({"pods": 20, "namespaces": 4, "threads": 8, "seconds_per_pod": 3.0})  # spread over offloaded namespaces
    figures = {f["name"]: f for line in capsys.readouterr().out.splitlines() if line.startswith("{")
               for f in [json.loads(line)]}  # fmt: skip
    assert set(figures) == OFFLOAD_SCALE_FIGURES
    assert figures["pods_missed"]["value"] == 0, figures["pods_missed"]["params"]["missed_by_phase"]
    assert figures["pods_missed"]["baseline"] == 0, figures["pods_missed"]["params"]["baseline_missed_by_phase"]
    for name in ("pods_running_seconds", "pod_running_p99_seconds", "endpoints_ready_seconds"):
        assert 0 < figures[name]["value"] < math.inf and 0 < figures[name]["baseline"] < math.inf, figures[name]
    assert figures["virtual_kubelet_rss_mib"]["value"] > 0
    assert figures["virtual_kubelet_cpu_seconds_per_pod"]["value"] > 0
    assert figures["pods_running_seconds"]["params"]["pods"] == 20
    assert figures["pods_running_seconds"]["params"]["namespaces"] == 4


# pool_sync_scale (bench/pool_sync_scale.py) --------------------------------------------------------------


def test_sync_scale_interleaves_the_tenants_creates_so_that_every_tenant_starts_at_once() -> None:
    from bench.pool_sync_scale import interleaved

    a, b = [("a", "app", "p0"), ("a", "app", "p1"), ("a", "app", "p2")], [("b", "app", "p0")]
    assert interleaved([a, b]) == [("a", "app", "p0"), ("b", "app", "p0"), ("a", "app", "p1"), ("a", "app", "p2")]


def test_sync_scale_times_a_pod_to_the_last_side_that_ran_it_and_a_side_that_never_did_is_a_miss() -> None:
    from bench.pool_sync_scale import done_at, since

    keys = [("t0", "app", "p0"), ("t0", "app", "p1")]
    on_super, on_tenant = {keys[0]: 3.0, keys[1]: 4.0}, {keys[0]: 5.0}
    done = done_at(keys, on_super, on_tenant)
    assert done == [5.0, math.inf]  # p1 Running in the super cluster but never shown so in its tenant
    assert since(keys, done, {keys[0]: 1.0, keys[1]: 1.0}) == [4.0, math.inf]


def test_sync_scale_counts_the_lists_of_its_flow_schema_and_of_every_client_from_an_api_servers_metrics() -> None:
    from bench.pool_sync_scale import FLOW_SCHEMA, list_calls

    text = "\n".join([
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        'apiserver_request_total{code="200",component="apiserver",resource="pods",verb="LIST",version="v1"} 7',
        'apiserver_request_total{code="200",component="apiserver",resource="pods",verb="WATCH",version="v1"} 9',
        'apiserver_request_total{code="200",component="apiserver",resource="secrets",verb="LIST",version="v1"} 2',
        f'apiserver_flowcontrol_dispatched_requests_total{{flow_schema="{FLOW_SCHEMA}",priority_level="workload-high"}} 3',
        'apiserver_flowcontrol_dispatched_requests_total{flow_schema="global-default",priority_level="global-default"} 40',
    ])  # fmt: skip
    assert list_calls(text, flow_schema=FLOW_SCHEMA) == (3.0, 9.0)
    assert list_calls("", flow_schema=FLOW_SCHEMA) == (0.0, 0.0)  # a schema that counted nothing yet


def test_sync_scale_quota_fits_its_pods() -> None:
    from bench.pool_sync_scale import quota_of

    assert quota_of(500) == {"cpu": "5000m", "memory": "8000Mi"}


SYNC_SCALE_FIGURES = {"pods_running_seconds", "syncer_rss_kib_per_pod", "other_tenant_pod_seconds_p99",
                      "syncer_list_calls_per_minute_idle"}  # fmt: skip


@pytest.mark.env
@pytest.mark.tenants
@pytest.mark.timeout(600)
@pytest.mark.skipif(not os.environ.get("TIDEPOOL_BENCH_SYNC_SCALE"),
                    reason="three clusters of its own, 1 to 4 minutes: set TIDEPOOL_BENCH_SYNC_SCALE=1 to run it")  # fmt: skip
def test_a_small_sync_scale_run_prints_every_figure_finite_and_misses_no_pod(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.pool_sync_scale import run

    run({"tenants": 2, "pods": 10, "supers": 1, "quiet_pods": 3, "threads": 8, "idle_seconds": 10,
         "deadline_seconds": 180})  # fmt: skip
    figures = {f["name"]: f for line in capsys.readouterr().out.splitlines() if line.startswith("{")
               for f in [json.loads(line)]}  # fmt: skip
    assert set(figures) == SYNC_SCALE_FIGURES
    for figure in figures.values():
        assert 0 <= figure["value"] < math.inf, figure
        assert figure["baseline"] is None or 0 < figure["baseline"] < math.inf, figure
    assert figures["pods_running_seconds"]["params"]["pods_total"] == 20
    assert figures["syncer_rss_kib_per_pod"]["params"]["copies"] == {"s1": 20}  # measured after the tenants' burst
    lists = figures["syncer_list_calls_per_minute_idle"]["params"]
    assert lists["counted_before_idle"] > 0 and lists["every_client_lists_before_idle"] > 0  # both counts count
