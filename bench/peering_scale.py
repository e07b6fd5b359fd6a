"""peering_scale: many peerings on one worker process; how late their periodic pushes are, and the
worker's resident memory.

A foreign cluster costs about 500 MB (etcd, API server, controllers), so the benchmark cannot give each
peering its own. It runs `foreign_clusters` of them and spreads the peerings over them, each peering a
consumer id of its own (`scale-0000`, ...) whose PeeringRequest names that cluster's kubeconfig. Every
peering therefore has its own workflow, its own namespace, ServiceAccount, Role and token on the home
cluster, and its own push every period, as with distinct consumers. What differs: the Advertisement and
credentials Secret on a foreign cluster are named after the home cluster (models/names.py), so the
peerings sharing a foreign cluster all write the same two objects there (server-side apply; no
conflicts, the same requests). Once each peering has pushed, the shared Advertisements are marked
Accepted, as a consumer would, so the peerings are in their steady state.

The period is `period` seconds (the ClusterConfig's advertisementPeriodSeconds, 600 as in production by
default; `--period 60` pushes ten times as often) and the window `window` seconds, which starts
`settle` seconds after the acceptance. Lateness, from the histories: the
push activity's completion minus the moment the period's timer was due (its start + its duration), for
every timer-driven push of the window. Baseline: the same figure for a bare TickWorkflow (bench/echo.py)
on the same worker process and server, which pays only Temporal's own delay. Memory: this process's
resident memory (the worker runs in it), at the end and at its peak, against the same process with the
worker running and no peering.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from bench.common import emit, local_env, log, percentile, rss_mb
from bench.echo import EchoActivities, TickWorkflow
from kube.objects import patch_cluster_object_status
from models.names import (
    ADVERTISEMENTS,
    advertisement_name,
    peering_workflow_id,
)
from tests.kube import apply_cluster_config, create_node
from tests.running import running_worker, worker_settings
from workers.cluster import connect
from workers.peer import request_peering

DEFAULTS: dict[str, Any] = {"peerings": 1000, "foreign_clusters": 2, "period": 600, "window": 600, "settle": 60}
PUSH = "push_advertisement"
# The baseline ticks often enough to have samples in any window, whatever the peerings' period.
TICK_SECONDS = 30


async def lateness(client: Client, workflow_id: str, *, since: float, activity: str) -> list[float]:
    """Seconds between each period timer's due time and the completion of the activity it triggered,
    for timers due after `since` (a Unix time), in the current run of the workflow."""
    out: list[float] = []
    # The current run: the window is short next to a continue-as-new (thousands of events).
    events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
    due: dict[int, float] = {}
    fired_due: float | None = None
    scheduled: dict[int, float] = {}
    for e in events:
        at = e.event_time.ToDatetime().timestamp()
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            a = e.timer_started_event_attributes
            due[e.event_id] = at + a.start_to_fire_timeout.ToTimedelta().total_seconds()
        elif e.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            fired_due = due.get(e.timer_fired_event_attributes.started_event_id)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == activity and fired_due is not None:
                scheduled[e.event_id] = fired_due
            fired_due = None
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            when = scheduled.pop(e.activity_task_completed_event_attributes.scheduled_event_id, None)
            if when is not None and when >= since:
                out.append(at - when)
    return out


async def _measure(params: dict[str, Any]) -> None:
    n, f = int(params["peerings"]), int(params["foreign_clusters"])
    period, window, settle = int(params["period"]), int(params["window"]), int(params["settle"])
    foreign_names = [f"foreign{k}" for k in range(f)]
    with local_env(["home", *foreign_names]) as env:
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
        async with (
            running_worker(settings),
            Worker(client, task_queue=tick_queue, workflows=[TickWorkflow],
                   activities=[EchoActivities(lambda v, at: None).echo]),
        ):  # fmt: skip
            rss_idle = rss_mb()
            tick = await client.start_workflow(TickWorkflow.run, TICK_SECONDS, id=f"bench-tick-{uuid.uuid4().hex[:8]}",
                                               task_queue=tick_queue)  # fmt: skip
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: request_peering(home_api, foreign_apis[i % f], provider_id=home_id,
                                                        consumer_id=ids[i]), range(n)))  # fmt: skip
            log(f"{n} PeeringRequests in {time.monotonic() - started:.0f} s; waiting for every first push")
            while True:
                pushed = await _count_pushed(client, home_id, ids)
                log(f"{pushed}/{n} peerings pushed ({time.monotonic() - started:.0f} s)")
                if pushed == n:
                    break
                await asyncio.sleep(10)
            first_pushes = time.monotonic() - started
            for name in foreign_names:
                patch_cluster_object_status(env.cluster(name).api_client(), ADVERTISEMENTS, advertisement_name(home_id),
                                            {"phase": "Accepted"})  # fmt: skip
            since = time.time() + settle  # pushes already under way finish, the decision checks see it
            await asyncio.sleep(settle + window)
            rss_end, rss_peak = rss_mb(), rss_mb(field="VmHWM")
            log("window over; reading histories")
            samples: list[float] = []
            for i in range(0, n, 50):
                batch = await asyncio.gather(*(lateness(client, peering_workflow_id(home_id, x), since=since, activity=PUSH)
                                               for x in ids[i:i + 50]))  # fmt: skip
                samples.extend(s for b in batch for s in b)
            baseline = await lateness(client, tick.id, since=since, activity="echo")
            await tick.terminate("benchmark done")
    common = {"peerings": n, "foreign_clusters": f, "period_seconds": period, "window_seconds": window, "settle_seconds": settle,
              "pushes_measured": len(samples), "first_push_of_all_seconds": round(first_pushes, 1),
              "how": "peerings spread over the foreign clusters as distinct consumer ids; those sharing a "
                     "foreign cluster write the same Advertisement and Secret there"}  # fmt: skip
    for p in (50, 99, 100):
        emit(f"peering_scale.push_lateness.p{p}", percentile(samples, p), "s",
             baseline=percentile(baseline, p) if baseline else None,
             params={**common, "baseline": "a bare TickWorkflow on the same worker process: timer due → activity done",
                     "target": "every push within 10 s"})  # fmt: skip
    emit("peering_scale.worker_rss", rss_end, "MiB", baseline=rss_idle,
         params={**common, "peak_mib": round(rss_peak, 1), "baseline": "the same process, worker running, no peering",
                 "target": "≤ 1 GB"})  # fmt: skip


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
