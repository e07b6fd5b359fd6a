"""The consumer's workflows, run for real on a Temporal dev server against stubbed activities (no
clusters): the stubs keep an in-memory consumer cluster that `observe_advertisement` reads and the step
activities change, and each test asserts the order of the activities in the history, which is what the
Web UI shows."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributeKey, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import TimeSkipper, TimeSkippingConfig
from temporalio.worker import Worker

from models.admission import KeptRefusals, RefusalOnRecord
from models.consumer import (
    PROVIDER_CLEAN_TIMEOUT,
    AdmissionInput,
    AdmissionResult,
    AdvertisementInput,
    AdvertisementObservation,
    AdvertisementState,
    DeleteExpiredInput,
    DeleteVirtualKubeletInput,
    DeleteVirtualNodeInput,
    EnsureFinalizerInput,
    EnsureVirtualKubeletInput,
    ManualDecision,
    MarkDeletingInput,
    ReleaseAdvertisementInput,
    UnreachableTeardowns,
    Verdict,
)
from models.names import admission_workflow_id, advertisement_workflow_id
from workflows.admission import AdmissionWorkflow
from workflows.advertisement import NO_PROGRESS_BACKOFF_MAX, VERDICT_TIMEOUT, AdvertisementWorkflow

pytestmark = pytest.mark.workflow
PROVIDER = "provider-x"
ADVERTISEMENT = f"advertisement-{PROVIDER}"
HOME = "consumer-a"
POD_CIDR_WAIT = timedelta(seconds=300)
# How long a test waits for the workflow to reach a state (polled; a miss fails with what was seen).
REACH_ATTEMPTS = 400
REACH_INTERVAL = 0.05


class ConsumerCluster:
    """The consumer cluster as the stubs see it, and the stubbed ConsumerActivities (same names)."""

    def __init__(self, *, phase: str, time_to_live: datetime | None) -> None:
        self.advertisement: AdvertisementObservation | None = AdvertisementObservation(
            exists=True, phase=phase, time_to_live=time_to_live, resources={"cpu": "4"},
            pod_cidr_wait_timeout_seconds=int(POD_CIDR_WAIT.total_seconds()),
        )  # fmt: skip
        self.virtual_kubelet = False
        self.virtual_node = False
        self.provider_clean = False
        self.failures: dict[str, ApplicationError] = {}  # activity name -> its next failure

    def change(self, **fields: Any) -> None:
        assert self.advertisement is not None
        self.advertisement = self.advertisement.model_copy(update=fields)

    def _fail_if_told(self) -> None:
        failure = self.failures.pop(activity.info().activity_type, None)
        if failure is not None:
            raise failure

    def activities(self) -> list[Callable[..., Any]]:
        return [self.observe_advertisement, self.ensure_finalizer, self.report_pod_cidr_timeout,
                self.ensure_virtual_kubelet, self.mark_deleting, self.delete_virtual_node,
                self.delete_virtual_kubelet, self.release_advertisement, self.delete_expired,
                self.record_manual_decision]  # fmt: skip

    @activity.defn
    async def observe_advertisement(self, name: str) -> AdvertisementObservation:
        self._fail_if_told()
        seen = self.advertisement or AdvertisementObservation(exists=False)
        return seen.model_copy(update={"virtual_kubelet_exists": self.virtual_kubelet,
                                       "virtual_node_exists": self.virtual_node,
                                       "provider_clean": self.provider_clean})  # fmt: skip

    @activity.defn
    async def ensure_finalizer(self, request: EnsureFinalizerInput) -> None:
        self._fail_if_told()
        self.change(has_finalizer=True)

    @activity.defn
    async def report_pod_cidr_timeout(self, name: str) -> None:
        pass

    @activity.defn
    async def ensure_virtual_kubelet(self, request: EnsureVirtualKubeletInput) -> None:
        self.virtual_kubelet = self.virtual_node = True  # the virtual kubelet registers its node

    @activity.defn
    async def mark_deleting(self, request: MarkDeletingInput) -> None:
        self.change(phase="Deleting", reason=request.teardown)

    @activity.defn
    async def delete_virtual_node(self, request: DeleteVirtualNodeInput) -> None:
        self.virtual_node = False
        self.provider_clean = True  # the virtual kubelet cleans the provider namespace up and says so

    @activity.defn
    async def delete_virtual_kubelet(self, request: DeleteVirtualKubeletInput) -> None:
        self.virtual_kubelet = False

    @activity.defn
    async def release_advertisement(self, request: ReleaseAdvertisementInput) -> None:
        self.advertisement = None  # deleted, its finalizer gone: the API server removes it

    @activity.defn
    async def delete_expired(self, request: DeleteExpiredInput) -> bool:
        if self.advertisement is None or self.advertisement.phase not in ("Pending", "Refused"):
            return False
        self.advertisement = None
        return True

    @activity.defn
    async def record_manual_decision(self, decision: ManualDecision) -> None:
        raise AssertionError("the validator must refuse before anything is recorded")


@pytest.fixture
async def skipper(workflow_client: Client) -> TimeSkipper:
    """Time moves only when a test fast-forwards it."""
    return TimeSkipper(workflow_client, config=TimeSkippingConfig(enabled=False))


@pytest.fixture
async def worker_for(workflow_client: Client) -> AsyncIterator[Callable[[list[Callable[..., Any]]], Worker]]:
    workers: list[Worker] = []

    def start(activities: list[Callable[..., Any]]) -> Worker:
        worker = Worker(workflow_client, task_queue=f"consumer-{uuid.uuid4().hex[:8]}",
                        workflows=[AdvertisementWorkflow, AdmissionWorkflow], activities=activities)  # fmt: skip
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        await worker.shutdown()


async def reach(
    skipper: TimeSkipper, handle: WorkflowHandle[Any, Any], what: str, predicate: Callable[[], bool]
) -> None:
    """Waits until the workflow has nothing in flight (no activity, no workflow task: it waits for a signal
    or a timer) and `predicate` holds."""
    for _ in range(REACH_ATTEMPTS):
        description = (await handle.describe()).raw_description
        idle = not description.pending_activities and not description.HasField("pending_workflow_task")
        if idle and predicate():
            return
        await asyncio.sleep(REACH_INTERVAL)
    raise AssertionError(
        f"the workflow never reached: {what}; activities so far: {await activity_names(skipper.client, handle)}"
    )


async def activity_names(client: Client, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Every activity scheduled, in order, across the runs (the test server suggests continue-as-new after
    40 events)."""
    names: list[str] = []
    run_id: str | None = handle.first_execution_run_id
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        run_id = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                names.append(event.activity_task_scheduled_event_attributes.activity_type.name)
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return names


def steps(names: list[str]) -> list[str]:
    return [n for n in names if n != "observe_advertisement"]


async def start_advertisement(skipper: TimeSkipper, worker: Worker) -> WorkflowHandle[Any, AdvertisementState]:
    return await skipper.client.start_workflow(
        AdvertisementWorkflow.run,
        AdvertisementInput(provider_id=PROVIDER, advertisement=ADVERTISEMENT, home_cluster_id=HOME),
        id=f"advertisement-{PROVIDER}-{uuid.uuid4().hex[:8]}", task_queue=worker.task_queue,
    )  # fmt: skip


async def test_an_accepted_advertisement_is_built_then_torn_down_in_order(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    # No expiry: a fast-forward may run on past its target to the next timer, and the expiry would be it.
    cluster = ConsumerCluster(phase="Pending", time_to_live=None)
    worker = worker_for(cluster.activities())
    async with worker:
        handle = await start_advertisement(skipper, worker)
        await reach(skipper, handle, "waiting for the decision", lambda: True)
        assert steps(await activity_names(skipper.client, handle)) == []

        cluster.change(phase="Accepted")
        await handle.signal(AdvertisementWorkflow.changed)
        await reach(skipper, handle, "waiting for the PodCIDR", lambda: cluster.advertisement is not None
                    and cluster.advertisement.has_finalizer)  # fmt: skip
        assert steps(await activity_names(skipper.client, handle)) == ["ensure_finalizer"]

        assert await skipper.fast_forward(handle, POD_CIDR_WAIT + timedelta(seconds=1))
        await reach(skipper, handle, "the PodCIDR timeout reported", lambda: True)
        assert steps(await activity_names(skipper.client, handle)) == ["ensure_finalizer", "report_pod_cidr_timeout"]
        assert (await handle.query(AdvertisementWorkflow.status)).pod_cidr_timed_out

        cluster.change(remote_remapped_pod_cidr="10.200.0.0/16")
        await handle.signal(AdvertisementWorkflow.changed)
        await reach(skipper, handle, "steady", lambda: cluster.virtual_kubelet)

        cluster.change(deleting=True)
        await handle.signal(AdvertisementWorkflow.changed)
        state = await handle.result()

    assert steps(await activity_names(skipper.client, handle)) == [
        "ensure_finalizer", "report_pod_cidr_timeout", "ensure_virtual_kubelet",
        "mark_deleting", "delete_virtual_node", "delete_virtual_kubelet", "release_advertisement",
    ]  # fmt: skip
    assert state.teardown == "Deleted" and state.virtual_kubelet_created == 1
    assert list(state.deleted) == ["virtual-node", "virtual-kubelet", "advertisement"]
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(SearchAttributeKey.for_keyword("HomeCluster")) == HOME


async def test_a_teardown_without_a_virtual_node_waits_for_the_provider_clean_report_at_most_its_bound(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    """A virtual kubelet whose node never registered (a crash loop, an image that does not pull) never says
    the provider is clean: the teardown waits PROVIDER_CLEAN_TIMEOUT, then goes on (it waited for ever)."""
    cluster = ConsumerCluster(phase="Accepted", time_to_live=None)
    cluster.change(has_finalizer=True, remote_remapped_pod_cidr="10.200.0.0/16")
    worker = worker_for(cluster.activities())
    async with worker:
        handle = await start_advertisement(skipper, worker)
        await reach(skipper, handle, "steady", lambda: cluster.virtual_kubelet)
        cluster.virtual_node = False  # it never registered
        cluster.change(deleting=True)
        await handle.signal(AdvertisementWorkflow.changed)
        await reach(skipper, handle, "waiting for the provider-clean report",
                    lambda: cluster.advertisement is not None and cluster.advertisement.phase == "Deleting")  # fmt: skip
        assert "delete_virtual_kubelet" not in await activity_names(skipper.client, handle)
        await skipper.fast_forward(handle, PROVIDER_CLEAN_TIMEOUT + timedelta(seconds=1))
        state = await asyncio.wait_for(handle.result(), timeout=30)
    assert steps(await activity_names(skipper.client, handle)) == [
        "ensure_virtual_kubelet", "mark_deleting", "delete_virtual_kubelet", "release_advertisement"]
    assert state.deleted["virtual-kubelet"] - state.clean_wait_started >= PROVIDER_CLEAN_TIMEOUT  # type: ignore[operator]


async def test_an_advertisement_that_expires_unaccepted_is_deleted_and_the_run_ends(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    cluster = ConsumerCluster(phase="Refused", time_to_live=datetime.now(UTC) + timedelta(hours=1))
    worker = worker_for(cluster.activities())
    async with worker:
        handle = await start_advertisement(skipper, worker)
        await reach(skipper, handle, "waiting for the expiry", lambda: True)
        assert not await skipper.fast_forward(handle, timedelta(hours=2))  # the run completes first
        state = await handle.result()
    assert await activity_names(skipper.client, handle) == [
        "observe_advertisement",
        "observe_advertisement",
        "delete_expired",
    ]
    assert state.teardown == "Expired" and list(state.deleted) == ["advertisement"]
    assert cluster.advertisement is None


async def test_a_manual_accept_of_an_accepted_advertisement_is_refused_with_a_readable_error(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    cluster = ConsumerCluster(phase="Accepted", time_to_live=datetime.now(UTC) + timedelta(days=30))
    worker = worker_for(cluster.activities())
    async with worker:
        handle = await start_advertisement(skipper, worker)
        await reach(skipper, handle, "waiting for the PodCIDR", lambda: True)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AdvertisementWorkflow.accept, "looks fine")
        await handle.terminate("test over")
    error = refused.value.cause
    assert isinstance(error, ApplicationError)
    assert (error.type, error.non_retryable) == ("InvalidDecision", True)
    assert error.message == (f"cannot decide by hand: {ADVERTISEMENT} is already Accepted; "
                             "only a Pending one, or one refused as DecisionTimedOut or VirtualNodeNotReady "
                             "(or by hand, to accept it), is decided by hand")  # fmt: skip


class RefusedByHand(ConsumerCluster):
    """An Advertisement refused by hand (here, or kept from an earlier one of its provider). The stubs do what the
    watcher and the pass would: a decision recorded wakes admission (signal-with-start), whose pass writes it and
    says so, unless `admission_decides` is False (a pass that has not got to it)."""

    def __init__(self, client: Client, home: str) -> None:
        super().__init__(phase="Refused", time_to_live=datetime.now(UTC) + timedelta(days=30))
        self.change(reason="ManuallyRefused")
        self.client, self.home, self.task_queue = client, home, ""
        self.recorded: list[ManualDecision] = []
        self.admission_decides = True

    def activities(self) -> list[Callable[..., Any]]:
        return [*super().activities(), self.admit_advertisements]

    @activity.defn(name="record_manual_decision")
    async def record_manual_decision(self, decision: ManualDecision) -> None:
        self.recorded.append(decision)
        await self.client.start_workflow(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=self.home), id=admission_workflow_id(self.home),
            task_queue=self.task_queue, start_signal="changed", id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )  # fmt: skip

    @activity.defn(name="admit_advertisements")
    async def admit_advertisements(self, cluster_id: str, now: datetime | None = None,
                                   unreachable: dict[str, UnreachableTeardowns] | None = None,
                                   refusals: dict[str, KeptRefusals] | None = None) -> AdmissionResult:  # fmt: skip
        if not self.recorded or not self.admission_decides:
            return AdmissionResult(policy="Manual")
        self.change(phase="Accepted", reason="ManuallyAccepted")
        return AdmissionResult(accepted=[ADVERTISEMENT], total_accepted=1, policy="Manual", verdicts=[
            Verdict(advertisement=ADVERTISEMENT, provider=PROVIDER, decision="accept", phase="Accepted",
                    reason="ManuallyAccepted")])  # fmt: skip


async def start_refused_by_hand(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> tuple[RefusedByHand, Worker]:
    """The stub cluster and its worker; the Advertisement's workflow under the id the admission workflow signals."""
    cluster = RefusedByHand(skipper.client, f"consumer-{uuid.uuid4().hex[:8]}")
    worker = worker_for(cluster.activities())
    cluster.task_queue = worker.task_queue
    return cluster, worker


async def activity_summaries(client: Client, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The summary of every activity the run scheduled, in order (what the Web UI shows beside each)."""
    history = await client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id).fetch_history()
    return [json.loads(e.user_metadata.summary.data) for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]  # fmt: skip


async def test_the_accept_update_lifts_a_refusal_by_hand_and_answers_with_the_admission_workflow_s_verdict(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    """Issue 34: the message of a refusal kept from an earlier Advertisement says the accept update lifts it.
    Issue 37: the update looked at the Advertisement once a second, up to 30 times, until admission had decided;
    now the admission workflow signals its verdict once written, and the update answers with it."""
    cluster, worker = await start_refused_by_hand(skipper, worker_for)
    async with worker:
        handle = await skipper.client.start_workflow(
            AdvertisementWorkflow.run,
            AdvertisementInput(provider_id=PROVIDER, advertisement=ADVERTISEMENT, home_cluster_id=cluster.home),
            id=advertisement_workflow_id(cluster.home, PROVIDER), task_queue=worker.task_queue,
        )  # fmt: skip
        await reach(skipper, handle, "refused, waiting", lambda: True)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AdvertisementWorkflow.refuse, "again")
        answer = await asyncio.wait_for(handle.execute_update(AdvertisementWorkflow.accept, "lifted"), timeout=20)
        await reach(skipper, handle, "accepted, holding it", lambda: cluster.advertisement is not None
                    and cluster.advertisement.has_finalizer)  # fmt: skip
        summaries = await activity_summaries(skipper.client, handle)
        await handle.terminate("test over")
        await skipper.client.get_workflow_handle(admission_workflow_id(cluster.home)).terminate("test over")
    assert isinstance(refused.value.cause, ApplicationError) and refused.value.cause.type == "InvalidDecision"
    assert answer == "Accepted"
    assert [(d.decision, d.reason) for d in cluster.recorded] == [("accept", "lifted")]
    assert "decided?" not in summaries, f"the update polled: {summaries}"
    assert summaries[summaries.index("manual accept") + 1:] == ["observe", "EnsureFinalizer", "observe"]


async def test_a_manual_decision_admission_has_not_decided_within_the_bound_answers_pending(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    cluster, worker = await start_refused_by_hand(skipper, worker_for)
    cluster.admission_decides = False
    async with worker:
        handle = await skipper.client.start_workflow(
            AdvertisementWorkflow.run,
            AdvertisementInput(provider_id=PROVIDER, advertisement=ADVERTISEMENT, home_cluster_id=cluster.home),
            id=advertisement_workflow_id(cluster.home, PROVIDER), task_queue=worker.task_queue,
        )  # fmt: skip
        await reach(skipper, handle, "refused, waiting", lambda: True)
        update = asyncio.create_task(handle.execute_update(AdvertisementWorkflow.accept, "lifted"))
        await reach(skipper, handle, "the update waiting for a verdict", lambda: bool(cluster.recorded))
        assert not update.done()
        assert await skipper.fast_forward(handle, VERDICT_TIMEOUT)
        answer = await asyncio.wait_for(update, timeout=20)
        summaries = await activity_summaries(skipper.client, handle)
        await handle.terminate("test over")
        await skipper.client.get_workflow_handle(admission_workflow_id(cluster.home)).terminate("test over")
    assert answer == "Pending"
    assert summaries[summaries.index("manual accept") + 1:] == [], f"the update polled: {summaries}"


async def test_an_admission_pass_s_verdict_for_a_workflow_not_running_is_dropped_and_admission_goes_on(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    """Decided by kubectl alone, or after the Advertisement's workflow ended: nobody waits for the verdict."""
    passes: list[str] = []

    @activity.defn(name="admit_advertisements")
    async def admit_advertisements(cluster_id: str, now: datetime | None = None,
                                   unreachable: dict[str, UnreachableTeardowns] | None = None,
                                   refusals: dict[str, KeptRefusals] | None = None) -> AdmissionResult:  # fmt: skip
        passes.append(cluster_id)
        return AdmissionResult(policy="Manual", refused={ADVERTISEMENT: "ManuallyRefused"}, verdicts=[
            Verdict(advertisement=ADVERTISEMENT, provider="nobody-runs", decision="refuse", phase="Refused",
                    reason="ManuallyRefused")])  # fmt: skip

    worker = worker_for([admit_advertisements])
    async with worker:
        handle = await skipper.client.start_workflow(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=HOME), id=f"admission-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )  # fmt: skip
        await reach(skipper, handle, "the first pass done", lambda: len(passes) == 1)
        await handle.signal(AdmissionWorkflow.changed)
        await reach(skipper, handle, "the second pass done", lambda: len(passes) == 2)
        description = await handle.describe()
        await handle.terminate("test over")
    assert description.status == WorkflowExecutionStatus.RUNNING


async def test_a_forbidden_step_is_shown_and_waited_out_without_failing_the_run(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    cluster = ConsumerCluster(phase="Accepted", time_to_live=datetime.now(UTC) + timedelta(days=30))
    cluster.failures["ensure_finalizer"] = ApplicationError(
        "Kubernetes API 403: forbidden", type="KubernetesForbidden", non_retryable=True
    )
    worker = worker_for(cluster.activities())
    async with worker:
        handle = await start_advertisement(skipper, worker)
        await reach(skipper, handle, "waiting after the failure", lambda: not cluster.failures)
        state = await handle.query(AdvertisementWorkflow.status)
        assert state.last_error == "ensure_finalizer: KubernetesForbidden: Kubernetes API 403: forbidden"

        await handle.signal(AdvertisementWorkflow.changed)  # e.g. RBAC mended: the next change tries again
        await reach(skipper, handle, "waiting for the PodCIDR", lambda: cluster.advertisement is not None
                    and cluster.advertisement.has_finalizer)  # fmt: skip
        assert (await handle.query(AdvertisementWorkflow.status)).last_error is None
        await handle.terminate("test over")
    assert steps(await activity_names(skipper.client, handle)) == ["ensure_finalizer", "ensure_finalizer"]


async def test_the_admission_workflow_runs_one_pass_per_signal(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    passes: list[str] = []

    @activity.defn(name="admit_advertisements")
    async def admit_advertisements(cluster_id: str, now: datetime | None = None,
                                   unreachable: dict[str, UnreachableTeardowns] | None = None,
                                   refusals: dict[str, KeptRefusals] | None = None) -> AdmissionResult:  # fmt: skip
        passes.append(cluster_id)
        return AdmissionResult(accepted=[ADVERTISEMENT] if len(passes) == 2 else [], total_accepted=len(passes) - 1,
                               maximum=3, policy="AutoAcceptMax")  # fmt: skip

    worker = worker_for([admit_advertisements])
    async with worker:
        handle = await skipper.client.start_workflow(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=HOME), id=f"admission-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )  # fmt: skip
        await reach(skipper, handle, "the first pass done", lambda: len(passes) == 1)
        await handle.signal(AdmissionWorkflow.changed)
        await reach(skipper, handle, "the second pass done", lambda: len(passes) == 2)
        last = await handle.query(AdmissionWorkflow.last_pass)
        attributes = (await handle.describe()).typed_search_attributes
        await handle.terminate("test over")
    assert passes == [HOME, HOME]
    assert last is not None and last.accepted == [ADVERTISEMENT]
    assert attributes.get(SearchAttributeKey.for_keyword("HomeCluster")) == HOME


async def test_the_admission_workflow_keeps_the_refusals_each_pass_returns_for_the_next(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    """Issue 34: a refusal by hand lives on the Advertisement, which the provider may delete and push again; the
    workflow keeps what each pass says to keep and hands it to the next."""
    kept = {PROVIDER: KeptRefusals(by_hand=RefusalOnRecord(uid="uid-1", detail="no"),
                                   changed=datetime(2026, 11, 26, tzinfo=UTC))}  # fmt: skip
    returns: list[dict[str, KeptRefusals]] = [kept, kept, {}, {}]
    given: list[dict[str, KeptRefusals] | None] = []

    @activity.defn(name="admit_advertisements")
    async def admit_advertisements(cluster_id: str, now: datetime | None = None,
                                   unreachable: dict[str, UnreachableTeardowns] | None = None,
                                   refusals: dict[str, KeptRefusals] | None = None) -> AdmissionResult:  # fmt: skip
        given.append(refusals)
        return AdmissionResult(policy="AutoAcceptMax", kept_refusals=returns[len(given) - 1])

    worker = worker_for([admit_advertisements])
    async with worker:
        handle = await skipper.client.start_workflow(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=HOME), id=f"admission-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )  # fmt: skip
        def passed(count: int) -> Callable[[], bool]:
            return lambda: len(given) == count

        for done in (1, 2, 3):
            await reach(skipper, handle, f"pass {done} done", passed(done))
            if done == 2:
                metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
                assert f"refusals kept past their Advertisements (1): {PROVIDER}" in metadata.current_details
            await handle.signal(AdmissionWorkflow.changed)
        await reach(skipper, handle, "pass 4 done", passed(4))
        await handle.terminate("test over")
    assert given == [{}, kept, kept, {}]


async def status_of(handle: WorkflowHandle[Any, Any]) -> AdvertisementState:
    """The status query's answer, once the current run answers (one just continued as new may not yet)."""
    for _ in range(REACH_ATTEMPTS):
        try:
            return await handle.query(AdvertisementWorkflow.status)
        except RPCError:
            await asyncio.sleep(REACH_INTERVAL)
    raise AssertionError(f"{handle.id} never answered its status query")


async def timer_seconds(client: Client, handle: WorkflowHandle[Any, Any]) -> list[float]:
    """The durations of the timers started, in order, across the runs (as `activity_names`)."""
    seconds: list[float] = []
    run_id: str | None = handle.first_execution_run_id
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        run_id = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
                seconds.append(event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds())
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return seconds


async def test_a_virtual_kubelet_held_terminating_is_applied_again_with_a_backoff_and_the_run_continues_as_new(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    """Someone else's finalizer holds the virtual kubelet's Deployment terminating: it is absent for the
    workflow however often it applies it. Issue 34: the step ran again at once, for ever, with no timer and
    no continue-as-new (thousands of activities a minute); now each time it is due again without progress
    the run waits 1 s, doubling to 5 min (or the next change), says why, and continues as new."""
    cluster = ConsumerCluster(phase="Accepted", time_to_live=None)
    cluster.change(has_finalizer=True, remote_remapped_pod_cidr="10.200.0.0/16")
    applied: list[EnsureVirtualKubeletInput] = []

    @activity.defn(name="ensure_virtual_kubelet")
    async def held_terminating(request: EnsureVirtualKubeletInput) -> None:
        applied.append(request)  # an apply to a Deployment being deleted changes nothing

    worker = worker_for([held_terminating] + [a for a in cluster.activities() if a != cluster.ensure_virtual_kubelet])
    async with worker:
        handle = await start_advertisement(skipper, worker)
        await reach(skipper, handle, "waiting after the first apply made no progress", lambda: len(applied) == 1)
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        details = metadata.current_details
        assert "no progress" in details and "held by a finalizer" in details, details
        while len(applied) < 12:  # the first timers may fire on the real clock too
            applies = len(applied)
            assert await skipper.fast_forward(handle, NO_PROGRESS_BACKOFF_MAX)
            await reach(skipper, handle, "applied again, waiting again", lambda n=applies: len(applied) > n)  # type: ignore[misc]
        timers = await timer_seconds(skipper.client, handle)
        assert timers == [min(300, 2**n) for n in range(len(applied))], "one apply per backoff, never a burst"
        latest = skipper.client.get_workflow_handle(handle.id)
        await reach(skipper, latest, "the current run waiting", lambda: True)  # its first task done: it answers
        assert (await latest.describe()).run_id != handle.first_execution_run_id, "it continued as new"
        state = await status_of(latest)
        assert (state.last_acted, state.stalls) == ("EnsureVirtualKubelet", len(applied))  # kept across runs

        cluster.virtual_kubelet = cluster.virtual_node = True  # the finalizer went: the next apply makes it
        await latest.signal(AdvertisementWorkflow.changed)
        for _ in range(REACH_ATTEMPTS):  # a run just continued as new answers with the state it was handed
            state = await status_of(latest)
            if state.stalls == 0:
                break
            await asyncio.sleep(REACH_INTERVAL)
        assert (state.last_acted, state.stalls, state.stalled_until, cluster.virtual_kubelet) == (None, 0, None, True)
        await latest.terminate("test over")


class UnreachableProvider(ConsumerCluster):
    """A provider that reaches this cluster while this cluster's virtual kubelet never reaches it: its virtual
    node says ProviderUnreachable as soon as it registers, and the provider re-pushes its Advertisement as soon as
    it is deleted. The stubs do what the watchers would (signal-with-start), and admission's stub applies the
    rule the real pass applies (accept, unless the provider is backing off)."""

    def __init__(self, client: Client, home: str) -> None:
        super().__init__(phase="Accepted", time_to_live=None)
        self.change(has_finalizer=True, remote_remapped_pod_cidr="10.200.0.0/16")
        self.client, self.home, self.task_queue = client, home, ""
        self.created = 0  # virtual kubelets created
        self.backoffs: list[dict[str, UnreachableTeardowns]] = []  # what each admission pass was handed

    def activities(self) -> list[Callable[..., Any]]:
        return [*super().activities(), self.admit_advertisements]

    @activity.defn
    async def observe_advertisement(self, name: str) -> AdvertisementObservation:
        seen = await super().observe_advertisement(name)
        if seen.virtual_node_exists:
            return seen.model_copy(update={"provider_unreachable_since": datetime(2000, 1, 1, tzinfo=UTC)})
        return seen

    @activity.defn
    async def ensure_virtual_kubelet(self, request: EnsureVirtualKubeletInput) -> None:
        self.created += 1
        self.virtual_kubelet = self.virtual_node = True

    @activity.defn
    async def release_advertisement(self, request: ReleaseAdvertisementInput) -> None:
        # Deleted; the provider's decision watch sees it and pushes again at once: a new arrival for admission.
        self.advertisement = AdvertisementObservation(exists=True, resources={"cpu": "4"},
                                                      remote_remapped_pod_cidr="10.200.0.0/16")  # fmt: skip
        self.provider_clean = False
        await self.client.start_workflow(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=self.home), id=admission_workflow_id(self.home),
            task_queue=self.task_queue, start_signal="changed", id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )  # fmt: skip

    @activity.defn(name="admit_advertisements")
    async def admit_advertisements(self, cluster_id: str, now: datetime | None = None,
                                   unreachable: dict[str, UnreachableTeardowns] | None = None,
                                   refusals: dict[str, KeptRefusals] | None = None) -> AdmissionResult:  # fmt: skip
        self.backoffs.append(dict(unreachable or {}))
        if self.advertisement is None or self.advertisement.phase == "Accepted":
            return AdmissionResult(policy="AutoAcceptMax")
        backoff = (unreachable or {}).get(PROVIDER)
        if backoff is not None and now is not None and backoff.until > now:
            self.change(phase="Refused", reason="UnreachableBackoff")
            return AdmissionResult(refused={ADVERTISEMENT: "UnreachableBackoff"}, policy="AutoAcceptMax")
        self.change(phase="Accepted", reason="WithinMaximum")
        await self.client.start_workflow(
            AdvertisementWorkflow.run, AdvertisementInput(provider_id=PROVIDER, advertisement=ADVERTISEMENT,
                                                          home_cluster_id=self.home),
            id=advertisement_workflow_id(self.home, PROVIDER), task_queue=self.task_queue, start_signal="changed",
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )  # fmt: skip
        return AdmissionResult(accepted=[ADVERTISEMENT], total_accepted=1, policy="AutoAcceptMax")


async def test_a_provider_torn_down_as_unreachable_again_and_again_is_accepted_again_only_after_a_doubling_backoff(
    skipper: TimeSkipper, worker_for: Callable[[list[Callable[..., Any]]], Worker]
) -> None:
    """Issue 34: this cluster's pods cannot reach the provider, the provider reaches it. ProviderUnreachable
    teardown → Advertisement deleted → re-pushed at once → accepted → a new virtual kubelet → unreachable
    again, for ever, at full speed. Now each such teardown tells admission, which refuses the re-push
    (UnreachableBackoff) for 1 min, then 2, 4, ... (up to 1 h), across the Advertisement's deletions."""
    home = f"consumer-{uuid.uuid4().hex[:8]}"
    cluster = UnreachableProvider(skipper.client, home)
    worker = worker_for(cluster.activities())
    cluster.task_queue = worker.task_queue
    async with worker:
        await skipper.client.start_workflow(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=home), id=admission_workflow_id(home),
            task_queue=worker.task_queue,
        )  # fmt: skip
        admission = skipper.client.get_workflow_handle(admission_workflow_id(home))
        await skipper.client.start_workflow(
            AdvertisementWorkflow.run,
            AdvertisementInput(provider_id=PROVIDER, advertisement=ADVERTISEMENT, home_cluster_id=home),
            id=advertisement_workflow_id(home, PROVIDER), task_queue=worker.task_queue,
        )  # fmt: skip

        def refused_after(teardowns: int) -> bool:
            record = cluster.backoffs[-1].get(PROVIDER) if cluster.backoffs else None
            return (cluster.advertisement is not None and cluster.advertisement.reason == "UnreachableBackoff"
                    and record is not None and record.count == teardowns)  # fmt: skip

        for teardowns, backoff in enumerate([timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=4)], 1):
            for _ in range(REACH_ATTEMPTS):
                if refused_after(teardowns):
                    break
                await asyncio.sleep(REACH_INTERVAL)
            assert refused_after(teardowns), (f"teardown {teardowns}: the re-push was not refused (created "
                                              f"{cluster.created}×, {cluster.advertisement}, {cluster.backoffs[-1:]})")
            await asyncio.sleep(0.5)  # a loop would build again at once: give it the time to show
            assert cluster.created == teardowns, "one virtual kubelet per back-off, never a burst"
            record = cluster.backoffs[-1][PROVIDER]
            assert (record.count, record.until - record.last) == (teardowns, backoff)
            await reach(skipper, admission, "admission waiting for the back-off", lambda: True)
            metadata = await admission.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            assert f"| {PROVIDER} | {teardowns} |" in metadata.current_details, metadata.current_details
            assert await skipper.fast_forward(admission, backoff)  # the back-off ends: accepted again, torn down again
        await admission.terminate("test over")
