"""actions_per_day: what one peering costs on Temporal Cloud per simulated day, from its real histories.

A home and a foreign cluster, the home cluster's real worker, and a PeeringWorkflow started with
per-workflow time skipping (as tests/test_provider.py does). Once its first Advertisement is on the
foreign cluster, the benchmark marks it Accepted there (what the consumer does), so the peering is in
its steady state; then it fast-forwards `days` of virtual time and reads the histories of every run of
the chain (following continue-as-new), counting only events written during the fast-forward.

Billable actions are estimated from the history by Temporal Cloud's published rules (docs.temporal.io,
"Temporal Cloud Actions"): one action per workflow started (client start, continue-as-new, child),
timer started (explicit, or implicit in a wait with a timeout), activity started or retried (the
attempt number of its ActivityTaskStarted event), signal received, accepted update, search-attribute
upsert, side-effect/marker (one per workflow task); Workflow Execution Options updated events also
count on Cloud, but here they are the benchmark's own fast-forward requests and are left out (counted in
the params). Queries are billed as well but never appear in a history; the steady state issues none.
Workflow tasks, activity completion and timer fired events are not billed.

Baseline, in the same run and the same way: TickWorkflow (bench/echo.py), the least a periodic push can
cost, one activity and one timer per period (2 actions per cycle).
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import TimeSkipper
from temporalio.worker import Worker

from bench.common import AdvertisementWatch, emit, local_env, log
from bench.echo import EchoActivities, TickWorkflow
from deploy.localenv.temporal import TEST_DYNAMIC_CONFIG
from kube.identity import mint_provider_identity
from kube.objects import patch_cluster_object_status
from models.api.common import SecretReference
from models.names import ADVERTISEMENTS, SYSTEM_NAMESPACE, advertisement_name, peering_workflow_id
from models.peering import PeeringInput
from tests.kube import create_namespace, create_node
from tests.running import eventually, running_worker, worker_settings
from workers.cluster import connect
from workflows.peering import PeeringWorkflow

DEFAULTS: dict[str, Any] = {"days": 1, "continue_as_new_events": 0}
PERIOD_SECONDS = 600  # the ClusterConfig's default advertisementPeriodSeconds
TARGET_PER_CYCLE = 3

ONE_EACH = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "workflow started",
    EventType.EVENT_TYPE_TIMER_STARTED: "timer started",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signal",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "update",
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "search attributes upserted",
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child workflow",
    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED: "signal",
}
ARTIFACTS = (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIME_SKIPPING_TRANSITIONED,
)


async def _chain(client: Client, workflow_id: str, first_run: str) -> list[list[Any]]:
    """The events of every run of a workflow, first run first, following continue-as-new."""
    runs, run_id = [], first_run
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        runs.append(list(history.events))
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW else "")  # fmt: skip
    return runs


def count_actions(events: list[Any]) -> tuple[Counter[str], int, int]:
    """(billable actions by kind, history events without the benchmark's artifacts, artifacts)."""
    actions: Counter[str] = Counter()
    marker_tasks: set[int] = set()
    events_counted = artifacts = 0
    for event in events:
        if event.event_type in ARTIFACTS:
            artifacts += 1
            continue
        events_counted += 1
        if event.event_type in ONE_EACH:
            actions[ONE_EACH[event.event_type]] += 1
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            actions["activity started or retried"] += event.activity_task_started_event_attributes.attempt
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker_tasks.add(event.marker_recorded_event_attributes.workflow_task_completed_event_id)
    if marker_tasks:
        actions["markers (one per workflow task)"] = len(marker_tasks)
    return actions, events_counted, artifacts


async def _timers(client: Client, workflow_id: str, first_run: str) -> int:
    runs = await _chain(client, workflow_id, first_run)
    return sum(1 for run in runs for e in run if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


async def _day(client: Client, skipper: TimeSkipper, handle: WorkflowHandle[Any, Any], first_run: str,
               duration: timedelta) -> tuple[Counter[str], int, int]:  # fmt: skip
    """Steps virtual time forward one period at a time for `duration` and counts what was written
    meanwhile, across the runs. A fast-forward is a jump of the workflow's clock, not a walk through its
    timers: one longer than the period would fire one timer and skip the cycles in between."""
    cut = [len(run) for run in await _chain(client, handle.id, first_run)]
    for _ in range(int(duration.total_seconds() // PERIOD_SECONDS)):
        timers = await _timers(client, handle.id, first_run)
        if not await skipper.fast_forward(handle, timedelta(seconds=PERIOD_SECONDS)):
            raise RuntimeError(f"workflow {handle.id} ended during the fast-forward")
        await eventually(lambda t=timers: _more_timers(client, handle.id, first_run, t), timeout=60,
                         what=f"{handle.id} to start its next timer")  # fmt: skip
    runs = await _chain(client, handle.id, first_run)
    new_events = [e for i, run in enumerate(runs) for e in run[(cut[i] if i < len(cut) else 0) :]]
    return count_actions(new_events)


async def _more_timers(client: Client, workflow_id: str, first_run: str, than: int) -> bool:
    return await _timers(client, workflow_id, first_run) > than


async def _measure(params: dict[str, Any]) -> None:
    days = int(params["days"])
    dynamic = {"frontend.WorkflowTimeSkippingEnabled": TEST_DYNAMIC_CONFIG["frontend.WorkflowTimeSkippingEnabled"]}
    if int(params["continue_as_new_events"]):
        dynamic["limit.historyCount.suggestContinueAsNew"] = str(int(params["continue_as_new_events"]))
    with local_env(["home", "foreign"], dynamic_config=dynamic) as env:
        home, foreign = env.cluster("home"), env.cluster("foreign")
        home_api, foreign_api = home.api_client(), foreign.api_client()
        create_node(home_api, "n1", cpu="8", memory="16Gi")
        create_namespace(home_api, SYSTEM_NAMESPACE)
        home_id, foreign_id = "bench-home", "bench-foreign"
        handed = mint_provider_identity(foreign_api, provider_id=home_id, lifetime_seconds=3600)  # as `tidepool peer`
        k8s.CoreV1Api(home_api).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({
            "metadata": {"name": "foreign-credentials"},
            "data": {"kubeconfig": base64.b64encode(handed.encode()).decode()},
        }))  # fmt: skip
        settings = worker_settings(env, home, home_id)
        client = await connect(settings.temporal)
        skipper = TimeSkipper(client)
        tick_queue = f"bench-tick-{uuid.uuid4().hex[:8]}"
        with AdvertisementWatch(foreign_api, advertisement_name(home_id)) as watch:
            async with (
                running_worker(settings),
                Worker(client, task_queue=tick_queue, workflows=[TickWorkflow],
                       activities=[EchoActivities(lambda v, at: None).echo]),
            ):  # fmt: skip
                peering = await skipper.client.start_workflow(
                    PeeringWorkflow.run,
                    PeeringInput(foreign_cluster_id=foreign_id,
                                 kube_config_ref=SecretReference(name="foreign-credentials", namespace=SYSTEM_NAMESPACE)),
                    id=peering_workflow_id(settings.cluster.cluster_id, foreign_id), task_queue=settings.task_queue,
                )  # fmt: skip
                tick = await skipper.client.start_workflow(TickWorkflow.run, PERIOD_SECONDS,
                                                           id=f"bench-tick-{uuid.uuid4().hex[:8]}", task_queue=tick_queue)  # fmt: skip
                peering_run, tick_run = (await peering.describe()).run_id, (await tick.describe()).run_id
                await eventually(lambda: watch.seen, timeout=120, what="the first Advertisement")
                # The consumer's decision, as its AdmissionWorkflow would write it: the peering's steady state.
                patch_cluster_object_status(
                    foreign_api, ADVERTISEMENTS, advertisement_name(home_id), {"phase": "Accepted"}
                )
                # Started without a PeeringRequest, the peering has no watch on b: say what the watch would.
                await peering.signal(PeeringWorkflow.foreign_changed)

                async def accepted() -> bool:
                    return (await peering.query(PeeringWorkflow.status)).phase == "Accepted"

                await eventually(accepted, timeout=120, what="the peering to see the acceptance")
                log(f"peering accepted; fast-forwarding {days} day(s)")
                duration = timedelta(days=days)
                (p_actions, p_events, p_artifacts), (t_actions, t_events, _) = await asyncio.gather(
                    _day(client, skipper, peering, peering_run, duration), _day(client, skipper, tick, tick_run, duration)
                )  # fmt: skip
                pushes = (await peering.query(PeeringWorkflow.status)).pushes
                await peering.signal(PeeringWorkflow.withdraw)
                await peering.result()
                await tick.terminate("benchmark done")
    cycles = duration.total_seconds() / PERIOD_SECONDS
    common = {"days": days, "period_seconds": PERIOD_SECONDS, "cycles": cycles, "pushes_total": pushes,
              "continue_as_new_events": int(params["continue_as_new_events"]) or "server default",
              "baseline": "TickWorkflow: one activity + one timer per period", "target": f"≤ {TARGET_PER_CYCLE} per cycle"}  # fmt: skip
    p_total, t_total = sum(p_actions.values()), sum(t_actions.values())
    emit("actions_per_day.actions_per_cycle", p_total / cycles, "actions/cycle", baseline=t_total / cycles,
         params={**common, "by_kind": dict(p_actions), "baseline_by_kind": dict(t_actions)})  # fmt: skip
    emit("actions_per_day.actions_per_day", p_total / days, "actions/day", baseline=t_total / days, params=common)
    emit("actions_per_day.history_events_per_day", p_events / days, "events/day", baseline=t_events / days,
         params={**common, "time_skipping_events_left_out": p_artifacts})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
