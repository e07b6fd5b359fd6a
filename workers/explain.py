"""`tidepool explain peering|advertisement|namespace|pod` and `tidepool simulate peering|admission`: reads the workflows' histories (every run, continued as new
or ended, as far back as the namespace's retention) and hands their decisions to models/explain.py.

It only reads Temporal: no cluster is touched, so it works after the objects are gone, and on either side
with nothing but that side's Temporal namespace. The one exception is `explain pod` on a consumer: the pod,
its node and its Events are read from the consumer's API server (with the user's kubeconfig), beside the
history of the Advertisement behind its virtual node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from models.explain import (
    Fact,
    PlacedPod,
    Story,
    advertisement_story,
    namespace_story,
    offloaded_pod_story,
    peering_story,
    pod_story,
    pool_namespace,
    virtual_node_provider,
)
from models.names import (
    POD_CLUSTER_ANNOTATION,
    POOL_SCHEDULER_WORKFLOW_ID,
    admission_workflow_id,
    advertisement_name,
    advertisement_workflow_id,
    peering_workflow_id,
)
from models.pool.placement import Policy
from models.simulate import (
    AdmissionSimulation,
    PoolSimulation,
    Simulation,
    simulate_admission,
    simulate_peering,
    simulate_pool,
)
from models.times import format_micro_time

# A tenant's control plane, read for `explain pod`: a story is still told when it does not answer.
TENANT_READ_SECONDS = 10

# A history is read whole; these many runs of one workflow id at most, the newest (the admission workflow
# continues as new often): what is older is left out, and the story says so.
MAX_RUNS = 200

# Activity results that are decisions, and the fact each becomes.
_RESULTS = {
    "push_advertisement": "push",
    "read_foreign_decision": "decision",
    "admit_advertisements": "admission",
    "observe_advertisement": "observed",
    "schedule_pool": "pool",
    "move_pods": "move",
    "finish_move": "move",
}
_STEPS = {"ensure_finalizer", "ensure_virtual_kubelet", "mark_deleting", "refuse_not_ready", "delete_virtual_node",
          "delete_virtual_kubelet", "release_advertisement", "delete_expired", "clean_provider",
          "delete_provider_credentials"}  # fmt: skip


async def explain_peering(client: Client, *, home: str, foreign: str, at: datetime | None = None) -> Story:
    """The provider's story of its peering with `foreign`."""
    workflow_id = peering_workflow_id(home, foreign)
    history = await _facts(client, [workflow_id], until=at)
    story = peering_story(f"peering with {foreign}", home, [workflow_id], history.facts)
    return await _finish(client, story, at, truncated=history.truncated)


async def simulate_peering_history(client: Client, *, home: str, foreign: str, percent: int,
                                   since: datetime | None = None) -> Simulation:  # fmt: skip
    """`tidepool simulate peering`: the recorded pushes of the peering with `foreign`, at `percent`."""
    history = await _facts(client, [peering_workflow_id(home, foreign)], until=None)
    return simulate_peering(f"peering with {foreign}", history.facts, percent=percent, since=since)


async def simulate_admission_history(client: Client, *, home: str, maximum: int,
                                     since: datetime | None = None) -> AdmissionSimulation:  # fmt: skip
    """`tidepool simulate admission`: the recorded admission passes of this consumer, at `maximum`."""
    workflow_id = admission_workflow_id(home)
    history = await _facts(client, [workflow_id], until=None)
    return simulate_admission(f"admission on {home}", history.facts, maximum=maximum, since=since)


async def simulate_pool_history(client: Client, *, policy: Policy, since: datetime | None = None,
                                workflow_id: str = POOL_SCHEDULER_WORKFLOW_ID) -> PoolSimulation:  # fmt: skip
    """`tidepool simulate pool`: the recorded passes of the pool's scheduler, under `policy`."""
    history = await _facts(client, [workflow_id], until=None)
    return simulate_pool(f"pool ({workflow_id})", history.facts, policy=policy, since=since)


async def explain_advertisement(client: Client, *, home: str, provider: str, at: datetime | None = None) -> Story:
    """The consumer's story of the Advertisement `provider` put on it."""
    workflow_ids = [admission_workflow_id(home), advertisement_workflow_id(home, provider)]
    history = await _facts(client, workflow_ids, until=at)
    story = advertisement_story(f"Advertisement from {provider}", home, advertisement_name(provider), workflow_ids,
                                history.facts)  # fmt: skip
    return await _finish(client, story, at, truncated=history.truncated)


async def explain_namespace(client: Client, *, namespace: str, tenant: str | None = None, at: datetime | None = None,
                            workflow_id: str = POOL_SCHEDULER_WORKFLOW_ID) -> Story:  # fmt: skip
    """The pool's story of a tenant namespace: where its quota slices went and why, and its pods. Without
    `tenant`, the one tenant whose records have `namespace` (AmbiguousNamespace when several do)."""
    history = await _facts(client, [workflow_id], until=at)
    found = pool_namespace(history.facts, namespace, tenant=tenant)
    story = namespace_story(f"namespace {found.subject}", found, [workflow_id], history.facts)
    return await _finish(client, story, at, truncated=history.truncated)


async def explain_pod(client: Client, *, namespace: str, pod: str, tenant: str | None = None,
                      at: datetime | None = None, workflow_id: str = POOL_SCHEDULER_WORKFLOW_ID,
                      control_plane: Callable[[str], k8s.ApiClient | None] | None = None) -> Story:  # fmt: skip
    """The pool's story of one tenant pod: the clusters its namespace was given, and which one it went to.
    With `control_plane` (a tenant's name → a client of its control plane, when one can be had), a pod the
    pod placer placed is told from the pod itself."""
    history = await _facts(client, [workflow_id], until=at)
    found = pool_namespace(history.facts, namespace, tenant=tenant)
    api = await asyncio.to_thread(control_plane, found.tenant) if control_plane is not None and found.tenant else None
    placed = await asyncio.to_thread(_placed_pod, api, namespace, pod) if api is not None else None
    story = pod_story(f"pod {found.subject}/{pod}", found, pod, [workflow_id], history.facts, placed=placed)
    return await _finish(client, story, at, truncated=history.truncated)


def _placed_pod(api: k8s.ApiClient, namespace: str, pod: str) -> PlacedPod | None:
    """The pod's super cluster and the pod placer's Scheduled Event; None when it is not placed (or not read:
    the story is then the history's alone)."""
    core = k8s.CoreV1Api(api)
    try:
        obj = core.read_namespaced_pod(pod, namespace, _request_timeout=TENANT_READ_SECONDS)
        cluster = ((obj.metadata.annotations if obj.metadata else None) or {}).get(POD_CLUSTER_ANNOTATION)
        if not cluster:
            return None
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod},reason=Scheduled",
                                            _request_timeout=TENANT_READ_SECONDS).items  # fmt: skip
    except (ApiException, urllib3.exceptions.HTTPError, OSError):
        return None
    uid = obj.metadata.uid if obj.metadata else None
    ours = [e for e in events if e.involved_object.uid == uid and (e.source.component if e.source else None) == "tidepool"]
    last = max(ours, key=lambda e: e.last_timestamp or e.event_time or datetime.min.replace(tzinfo=UTC), default=None)
    if last is None:
        return PlacedPod(cluster=cluster, at=None, message="")
    return PlacedPod(cluster=cluster, at=last.last_timestamp or last.event_time, message=str(last.message or ""))


async def explain_consumer_pod(client: Client, api: k8s.ApiClient, *, home: str, namespace: str, pod: str,
                               at: datetime | None = None) -> Story:  # fmt: skip
    """A consumer's pod (read with `api`, the consumer's kubeconfig): its node and, on a virtual node, the
    story of the provider's Advertisement from this cluster's history and the Events its copy met there."""
    core = k8s.CoreV1Api(api)
    try:
        obj = api.sanitize_for_serialization(await asyncio.to_thread(core.read_namespaced_pod, pod, namespace))
    except ApiException as e:
        if e.status == 404:
            raise LookupError(f"no pod {namespace}/{pod} in this cluster") from None
        raise RuntimeError(f"reading pod {namespace}/{pod}: {e.status} {e.reason}") from None
    node_name = (obj.get("spec") or {}).get("nodeName")
    node: dict[str, Any] | None = None
    if node_name:
        try:
            node = api.sanitize_for_serialization(await asyncio.to_thread(core.read_node, node_name))
        except ApiException as e:
            if e.status != 404:  # a node deleted since: told from the pod alone
                raise RuntimeError(f"reading node {node_name}: {e.status} {e.reason}") from None
    provider = virtual_node_provider(node)
    listed = await asyncio.to_thread(core.list_namespaced_event, namespace, field_selector=f"involvedObject.name={pod}")
    uid = obj["metadata"].get("uid")
    events = [e for e in api.sanitize_for_serialization(listed.items) if (e.get("involvedObject") or {}).get("uid") == uid]
    offer: Story | None = None
    if provider:
        try:
            offer = await explain_advertisement(client, home=home, provider=provider, at=at)
        except LookupError:
            offer = None  # another cluster's history, or past retention: the pod's own part is still told
    story = offloaded_pod_story(f"pod {namespace}/{pod}", home, obj, events, offer, provider=provider, at=at)
    if offer is None:
        return await _finish(client, story, at, truncated=False)
    return story.model_copy(update={"at": at, "retention_days": offer.retention_days, "truncated": offer.truncated})


async def _finish(client: Client, story: Story, at: datetime | None, *, truncated: bool) -> Story:
    days: float | None = None
    try:  # a role that may read histories but not describe the namespace: the retention is left unsaid
        described = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=client.namespace))
        retention = described.config.workflow_execution_retention_ttl
        days = (retention.seconds + retention.nanos / 1e9) / 86400 if retention.seconds or retention.nanos else None
    except RPCError:
        pass
    return story.model_copy(update={"at": at, "retention_days": days, "truncated": truncated})


class NoHistory(LookupError):
    """No run of the workflows asked for in the client's namespace: a mistyped id, or another namespace."""


class _History(NamedTuple):
    facts: list[Fact]
    truncated: bool  # some workflow had more than MAX_RUNS runs before `until`: the oldest were not read


async def _facts(client: Client, workflow_ids: Sequence[str], *, until: datetime | None) -> _History:
    """The facts of every run of `workflow_ids` (up to `until`), in time order. NoHistory when none has a run
    in the namespace: a mistyped id, or the other side's cluster."""
    facts: list[Fact] = []
    truncated, found = False, False
    for workflow_id in workflow_ids:
        query = f"WorkflowId = '{workflow_id}'" + (f" AND StartTime <= '{format_micro_time(until)}'" if until else "")
        runs = {run.run_id: run.start_time async for run in client.list_workflows(query, limit=MAX_RUNS + 1)}
        truncated |= len(runs) > MAX_RUNS
        runs = dict(sorted(runs.items(), key=lambda run: run[1])[-MAX_RUNS:])
        try:  # visibility lags a little: the latest run, continued as new a moment ago, may not be listed yet
            latest = await client.get_workflow_handle(workflow_id).describe()
            runs.setdefault(latest.run_id, latest.start_time)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
        found |= bool(runs)
        for run_id, started in sorted(runs.items(), key=lambda run: run[1]):
            if until is not None and started > until:
                continue
            history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
            facts += [f for f in await _decode(client, workflow_id, history.events) if until is None or f.at <= until]
    if not found:
        raise NoHistory(f"no workflow {' or '.join(workflow_ids)} in Temporal namespace {client.namespace!r} "
                          "(run on the cluster that owns it, within the namespace's retention)")  # fmt: skip
    return _History(sorted(facts, key=lambda f: f.at), truncated)


async def _decode(client: Client, workflow_id: str, events: Iterable[HistoryEvent]) -> list[Fact]:
    """The facts of one run's events: its start and end, signals, accepted updates, the decision activities'
    results, the steps it took and the activities that failed for good."""
    facts: list[Fact] = []
    scheduled: dict[int, str] = {}  # event id -> activity type
    workflow_type = ""

    def fact(event: HistoryEvent, kind: str, name: str = "", value: Any = None) -> None:
        at = event.event_time.ToDatetime(tzinfo=UTC)
        facts.append(Fact(at=at, kind=kind, name=name, value=value, workflow_id=workflow_id))  # type: ignore[arg-type]

    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            started = event.workflow_execution_started_event_attributes
            workflow_type = started.workflow_type.name
            fact(event, "started", workflow_type, await _first(client, started.input.payloads))
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signaled = event.workflow_execution_signaled_event_attributes
            fact(event, "signal", signaled.signal_name, await _first(client, signaled.input.payloads))
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            update = event.workflow_execution_update_accepted_event_attributes.accepted_request.input
            fact(event, "update", update.name, await _first(client, update.args.payloads))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activity = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = activity.activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:  # a step is told once done, not when asked
            completed = event.activity_task_completed_event_attributes
            name = scheduled.get(completed.scheduled_event_id, "")
            result = await _first(client, completed.result.payloads)
            if name in _RESULTS:
                fact(event, _RESULTS[name], name, result)
            elif name in _STEPS and result is not False:  # False: nothing to do
                fact(event, "step", _camel(name))
        elif kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            ended = (event.activity_task_failed_event_attributes if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
                     else event.activity_task_timed_out_event_attributes)  # fmt: skip
            if scheduled.get(ended.scheduled_event_id) == "push_advertisement":  # the retry policy gave up
                fact(event, "push_failed", "push_advertisement", _failure(ended.failure))
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            result = event.workflow_execution_completed_event_attributes.result
            fact(event, "completed", workflow_type, await _first(client, result.payloads))
    return facts


def _failure(failure: Failure) -> str:
    """As the Web UI and workflows/failures.describe_failure say it: the error's type, then its message."""
    parts = [failure.application_failure_info.type] if failure.HasField("application_failure_info") else []
    parts.append(failure.message)
    if failure.HasField("cause"):  # a timeout's cause is the last attempt's failure
        parts.append(failure.cause.message)
    return ": ".join(p for p in parts if p)


async def _first(client: Client, payloads: Any) -> Any:
    """The first payload as JSON (dicts, lists, strings, numbers), through the client's codec if it has one."""
    if not payloads:
        return None
    return (await client.data_converter.decode([payloads[0]]))[0]


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))
