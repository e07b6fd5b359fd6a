"""peering_scale: many peerings on one worker process; how late their periodic pushes are, and the
worker's resident memory.

A foreign cluster costs about 500 MB (etcd, API server, controllers), so the benchmark cannot give each
peering its own. It runs `foreign_clusters` of them and spreads the peerings over them, each peering a
consumer id of its own (`scale-0000`, ...) whose PeeringRequest names that cluster's kubeconfig. Every
peering therefore has its own workflow, its own namespace, ServiceAccount, Role and token on the home
cluster, and its own push every period, as with distinct consumers. What differs, and costs more than
production: the Advertisement and credentials Secret on a foreign cluster are named after the home
cluster (models/names.py), so the peerings sharing a foreign cluster all write the same two objects
there. Each push is seen by the decision watches of all of them (one would see it in production), and
finds another peering's token in the Secret, so it issues a new one (`token_renewals_in_window`; in
production a token is renewed every half life).
Once each peering has pushed, the shared Advertisements are marked Accepted, as a consumer would, so the
peerings are in their steady state.

The peerings are served by `workers` worker processes (`python -m workers.cluster`, as deployed) on the
cluster's one task queue. The period is `period` seconds (the ClusterConfig's advertisementPeriodSeconds,
600 as in production by default) and the window `window` seconds, which starts `settle` seconds after the
acceptance. Figures (each with `peerings` and `workers` in params):

- `first_push_all_seconds`: from the first of the PeeringRequests, written at once (8 threads), until
  every peering has completed a push (from the histories); infinite if not all within two periods. Params:
  `steps_p50_p99_seconds`, where a first push's time went (`_breakdown`), and the workers' CPU seconds
  over the first pushes and over the window.
- `push_lateness_p50/p99_seconds`: over EVERY period timer due in the window (`pushes_due`): the push
  activity's completion minus the timer's due time (its start + its duration); a push due and not
  completed when the histories are read counts as late by (read time − due time) (`pushes_measured`
  are those completed). Baseline: the same figure for a bare TickWorkflow (bench/echo.py) on a worker in
  the bench process, on the same server, which pays only Temporal's own delay.
- `worker_rss_mib`: the largest worker process's resident memory at the end (its peak in params),
  against the same before any peering.
"""

from __future__ import annotations

import asyncio
import math
import re
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from bench.common import cpu_seconds, emit, local_env, log, percentile, rss_mb
from bench.echo import EchoActivities, TickWorkflow
from kube.identity import DEFAULT_TOKEN_LIFETIME_SECONDS, mint_provider_identity
from kube.objects import patch_cluster_object_status
from models.names import (
    ADVERTISEMENTS,
    advertisement_name,
    peering_workflow_id,
)
from tests.faults import WorkerProcess
from tests.kube import apply_cluster_config, create_node
from tests.running import worker_settings
from workers.cluster import connect
from workers.peer import write_peering_request

DEFAULTS: dict[str, Any] = {"peerings": 1000, "workers": 1, "foreign_clusters": 2, "period": 600, "window": 600,
                            "settle": 60}
LATE_SECONDS = 10
FIRST_PUSH_DEADLINE_PERIODS = 2
PUSH = "push_advertisement"
# The baseline ticks often enough to have samples in any window, whatever the peerings' period.
TICK_SECONDS = 30


async def lateness(client: Client, workflow_id: str, *, since: float, until: float,
                   activity: str) -> list[tuple[float, bool]]:  # fmt: skip
    """For every period timer of the workflow's current run due in [since, until) (Unix times): the
    seconds from its due time to the completion of the `activity` it triggered; a push due and not
    completed when the history is read counts as late by (read time − due time), marked not completed.
    A timer cancelled before it fired (an early push moved the deadline) was never due."""
    # The current run: the window is short next to a continue-as-new (thousands of events).
    events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
    read_at = time.time()
    due: dict[int, float] = {}  # timer started event id -> due time
    cancelled: set[int] = set()
    completed: dict[int, float] = {}  # timer -> completion of the activity it triggered
    fired: int | None = None
    scheduled: dict[int, int] = {}  # activity scheduled event id -> timer
    for e in events:
        at = e.event_time.ToDatetime().timestamp()
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            due[e.event_id] = at + e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        elif e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
            cancelled.add(e.timer_canceled_event_attributes.started_event_id)
        elif e.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            fired = e.timer_fired_event_attributes.started_event_id
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == activity and fired is not None:
                scheduled[e.event_id] = fired
            fired = None
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            timer = scheduled.pop(e.activity_task_completed_event_attributes.scheduled_event_id, None)
            if timer is not None:
                completed[timer] = at
    return [(completed.get(timer, read_at) - at, timer in completed) for timer, at in due.items()
            if timer not in cancelled and since <= at < until]  # fmt: skip


async def first_push_steps(client: Client, workflow_id: str) -> dict[str, float] | None:
    """Unix times of a peering's first steps: its workflow started, its first push scheduled, started (an
    activity slot took it) and completed; None if it has not completed a push."""
    steps: dict[str, float] = {}
    scheduled: int | None = None
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        at = e.event_time.ToDatetime().timestamp()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            steps["started"] = at
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and scheduled is None:
            if e.activity_task_scheduled_event_attributes.activity_type.name == PUSH:
                scheduled, steps["scheduled"] = e.event_id, at
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED and scheduled is not None:
            if e.activity_task_started_event_attributes.scheduled_event_id == scheduled:
                steps["taken"] = at  # recorded with the completion: the last attempt's start
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and scheduled is not None:
            if e.activity_task_completed_event_attributes.scheduled_event_id == scheduled:
                steps["completed"] = at
                return steps
    return None


async def _measure(params: dict[str, Any]) -> None:
    n, f, workers = int(params["peerings"]), int(params["foreign_clusters"]), int(params["workers"])
    period, window, settle = int(params["period"]), int(params["window"]), int(params["settle"])
    foreign_names = [f"foreign{k}" for k in range(f)]
    with local_env(["home", *foreign_names]) as env, tempfile.TemporaryDirectory() as logs:
        home = env.cluster("home")
        home_api = home.api_client()
        create_node(home_api, "n1", cpu="64", memory="256Gi", pods="1000")
        apply_cluster_config(home_api, outgoing={"sharingPercentage": 10, "advertisementPeriodSeconds": period,
                                                 "advertisementTimeToLiveSeconds": 3 * period})  # fmt: skip
        home_id = "bench-home"
        settings = worker_settings(env, home, home_id)
        client = await connect(settings.temporal)
        foreign_apis = [env.cluster(name).api_client() for name in foreign_names]
        ids = [f"scale-{i:04d}" for i in range(n)]
        tick_queue = f"bench-tick-{uuid.uuid4().hex[:8]}"
        # The product as deployed: worker processes of their own sharing the cluster's task queue.
        processes = [WorkerProcess(cluster=home, cluster_id=home_id, temporal_address=settings.temporal.address,
                                   namespace=settings.temporal.namespace, log=Path(logs) / f"worker-{k}.log")
                     for k in range(workers)]  # fmt: skip
        try:
            for process in processes:
                process.start()
            await _until(lambda: all(p.ready() for p in processes), "the workers serving their task queue")
            async with Worker(client, task_queue=tick_queue, workflows=[TickWorkflow],
                              activities=[EchoActivities(lambda v, at: None).echo]):  # fmt: skip
                rss_idle = max(rss_mb(p.pid) for p in processes)
                tick = await client.start_workflow(TickWorkflow.run, TICK_SECONDS, id=f"bench-tick-{uuid.uuid4().hex[:8]}",
                                                   task_queue=tick_queue)  # fmt: skip
                # The consumers' half first (`tidepool peer` mints the same identity of this provider on each
                # foreign cluster), so that the clock starts with the PeeringRequests themselves.
                kubeconfigs = [mint_provider_identity(api, provider_id=home_id, lifetime_seconds=DEFAULT_TOKEN_LIFETIME_SECONDS)
                               for api in foreign_apis]  # fmt: skip
                log(f"writing {n} PeeringRequests")
                cpu_start = sum(cpu_seconds(p.pid) for p in processes)
                written: dict[str, float] = {}

                def write(i: int) -> None:
                    write_peering_request(home_api, consumer_id=ids[i], kubeconfig=kubeconfigs[i % f])
                    written[ids[i]] = time.time()

                def write_all() -> None:
                    with ThreadPoolExecutor(8) as pool:
                        list(pool.map(write, range(n)))

                started = time.time()
                await asyncio.to_thread(write_all)  # the event loop serves the baseline's worker meanwhile
                log(f"{n} PeeringRequests in {time.time() - started:.0f} s; waiting for every first push")
                pushed = 0
                while True:
                    try:
                        pushed = await _count_pushed(client, home_id, ids)
                    except RPCError as e:  # a server too busy to answer a list: ask again, the deadline holds
                        log(f"counting the peerings that pushed failed: {e}")
                    log(f"{pushed}/{n} peerings pushed ({time.time() - started:.0f} s)")
                    if pushed == n or time.time() - started > FIRST_PUSH_DEADLINE_PERIODS * period:
                        break
                    await asyncio.sleep(5)
                cpu_first_pushes = sum(cpu_seconds(p.pid) for p in processes) - cpu_start
                steps: list[dict[str, float] | None] = []
                for i in range(0, n, 50):
                    steps.extend(await asyncio.gather(*(first_push_steps(client, peering_workflow_id(home_id, x))
                                                        for x in ids[i:i + 50])))  # fmt: skip
                # From the histories, not the polling above: the last first push's completion.
                first_pushes = (max(s["completed"] for s in steps if s) - started
                                if pushed == n and all(steps) else math.inf)  # a miss, not a sample  # fmt: skip
                first_push_breakdown = _breakdown(written, ids, steps)
                for name in foreign_names:
                    patch_cluster_object_status(env.cluster(name).api_client(), ADVERTISEMENTS,
                                                advertisement_name(home_id), {"phase": "Accepted"})  # fmt: skip
                since = time.time() + settle  # pushes already under way finish, the decision checks see it
                await asyncio.sleep(settle)
                cpu_window_start = sum(cpu_seconds(p.pid) for p in processes)
                await asyncio.sleep(window)
                until = time.time()
                cpu_window = sum(cpu_seconds(p.pid) for p in processes) - cpu_window_start
                renewals = _renewals(Path(logs), since=since, until=until)
                rss_end = max(rss_mb(p.pid) for p in processes)
                rss_peak = max(rss_mb(p.pid, field="VmHWM") for p in processes)
                log("window over; reading histories")
                due: list[tuple[float, bool]] = []
                for i in range(0, n, 50):
                    batch = await asyncio.gather(*(
                        lateness(client, peering_workflow_id(home_id, x), since=since, until=until, activity=PUSH)
                        for x in ids[i:i + 50]))  # fmt: skip
                    due.extend(s for b in batch for s in b)
                baseline = [s for s, _ in await lateness(client, tick.id, since=since, until=until, activity="echo")]
                await tick.terminate("benchmark done")
        finally:
            for process in processes:
                process.stop()
    samples = [s for s, _ in due]
    common = {"peerings": n, "workers": workers, "foreign_clusters": f, "period_seconds": period,
              "window_seconds": window, "settle_seconds": settle, "pushes_due": len(due),
              "pushes_measured": sum(done for _, done in due),
              "pushes_late_over_10s": sum(s > LATE_SECONDS for s in samples),
              "worker_cpu_seconds_first_pushes": round(cpu_first_pushes, 1),
              "worker_cpu_seconds_window": round(cpu_window, 1),
              "token_renewals_in_window": renewals,
              "how": "peerings spread over the foreign clusters as distinct consumer ids; those sharing a "
                     "foreign cluster write the same Advertisement and Secret there"}  # fmt: skip
    emit("peering_scale.first_push_all_seconds", first_pushes, "s", baseline=None,
         params={**common, "steps_p50_p99_seconds": first_push_breakdown, "what": f"from {n} PeeringRequests at once until every peering had pushed once "
                 f"(infinite: not all within {FIRST_PUSH_DEADLINE_PERIODS} periods)"})  # fmt: skip
    for p in (50, 99):
        emit(f"peering_scale.push_lateness_p{p}_seconds", percentile(samples, p) if samples else math.inf, "s",
             baseline=percentile(baseline, p) if baseline else None,
             params={**common, "baseline": "a bare TickWorkflow on a worker in the bench process: timer due → "
                     "activity done", "max_seconds": round(max(samples), 2) if samples else None})  # fmt: skip
    emit("peering_scale.worker_rss_mib", rss_end, "MiB", baseline=rss_idle,
         params={**common, "peak_mib": round(rss_peak, 1), "what": "the largest worker process",
                 "baseline": "the same, before any peering"})  # fmt: skip


def _breakdown(written: dict[str, float], ids: list[str], steps: list[dict[str, float] | None]) -> dict[str, Any]:
    """Where a first push's time went, p50 and p99 over the peerings that pushed: the PeeringRequest
    written → its workflow started (the watcher), → the push scheduled (a workflow task), → taken by a
    worker's activity slot, → completed (the activity itself)."""
    spans: dict[str, list[float]] = {"request_to_workflow": [], "workflow_to_scheduled": [],
                                     "scheduled_to_taken": [], "taken_to_completed": []}  # fmt: skip
    for consumer, s in zip(ids, steps, strict=True):
        if s is None or consumer not in written:
            continue
        spans["request_to_workflow"].append(s["started"] - written[consumer])
        spans["workflow_to_scheduled"].append(s["scheduled"] - s["started"])
        spans["scheduled_to_taken"].append(s["taken"] - s["scheduled"])
        spans["taken_to_completed"].append(s["completed"] - s["taken"])
    return {k: [round(percentile(v, 50), 2), round(percentile(v, 99), 2)] if v else None for k, v in spans.items()}


def _renewals(logs: Path, *, since: float, until: float) -> dict[str, int]:
    """Tokens the workers issued in the window, by reason (their log lines: activities/peering.py). Peerings
    sharing a foreign cluster share its credentials Secret, so each push finds another's token there
    (SecretChanged) and issues one: more than production, where a token is renewed every half life."""
    reasons: Counter[str] = Counter()
    for log_file in logs.glob("worker-*.log"):
        for line in log_file.read_text(errors="replace").splitlines():
            found = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) .* generation \d+ issued \((\w+)\)", line)
            if found and since <= datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() < until:
                reasons[found[2]] += 1
    return dict(reasons)


async def _until(check: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.5)


async def _count_pushed(client: Client, home_id: str, ids: list[str]) -> int:
    """Peerings whose workflow has completed a push (their PeeringPhase search attribute left the start)."""
    wanted, count = {peering_workflow_id(home_id, i) for i in ids}, 0
    async for w in client.list_workflows(
        "WorkflowType = 'PeeringWorkflow' AND PeeringPhase IN ('Advertised', 'Accepted')"
    ):
        count += w.id in wanted
    return count


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
