"""PeeringWorkflow, the real class, against stubbed activities on a Temporal dev server of its own (no
clusters, seconds each): the first push, the periodic re-push, a sharing percentage update and its
refusal of a bad value, who owns the percentage (an override or the ClusterConfig), a foreign decision, an unreachable foreign cluster, withdrawal (forced too: a
foreign cluster that refuses, or stays out of reach) and continue-as-new. The end-to-end behaviour
against real clusters is in tests/test_provider.py and tests/test_force_unpeer.py."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributeKey, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import TimeSkipper, TimeSkippingConfig
from temporalio.worker import Worker

from models.api.common import SecretReference
from models.peering import (
    CleanForeignRequest,
    CleanForeignResult,
    DecisionRequest,
    ForeignDecision,
    PeeringInput,
    PeeringStatus,
    PushRequest,
    PushResult,
    Withdraw,
    WithdrawReason,
    WithdrawRequest,
    WithdrawResult,
)
from models.resources import Resources
from tests.replay import run_histories
from workflows.failures import OTHER_SIDE_RETRY_FIRST
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.workflow, pytest.mark.provider]

PERIOD = timedelta(minutes=10)
CONFIGURED_PERCENT = 40  # the stub ClusterConfig's sharing percentage, until a test edits it
T = TypeVar("T")
FORCED: WithdrawReason = "Forced"  # `tidepool unpeer --force`
FORBIDDEN = ApplicationError("Kubernetes API 403: forbidden", type="KubernetesForbidden", non_retryable=True)


class StubProvider:
    """The provider's three activities, by their real names, answering what a test sets."""

    def __init__(self) -> None:
        self.pushes: list[PushRequest] = []
        self.verified: list[datetime] = []  # each push's access_verified_until
        self.reads: list[DecisionRequest] = []
        self.withdrawals: list[WithdrawRequest] = []
        self.failure: ApplicationError | None = None
        self.withdraw: WithdrawReason | None = None
        self.foreign_phase: str | None = None
        self.time_to_live = 3 * PERIOD  # of each pushed Advertisement
        self.clean_failure: ApplicationError | None = None  # what a forced withdrawal's foreign cleaning meets
        self.cleanings = 0
        self.released: list[SecretReference] = []
        self.configured_percentage, self.config_generation = CONFIGURED_PERCENT, 1  # the ClusterConfig
        self.during_push: Callable[[], Awaitable[None]] | None = None  # what happens while the next push runs

    def edit_cluster_config(self, percentage: int) -> int:
        """The ClusterConfig's percentage edited: its next generation, which the watcher would signal."""
        self.configured_percentage, self.config_generation = percentage, self.config_generation + 1
        return self.config_generation

    @activity.defn(name="push_advertisement")
    async def push_advertisement(self, request: PushRequest) -> PushResult | Withdraw:
        self.pushes.append(request)
        withdraw = self.withdraw
        if self.during_push is not None:
            during, self.during_push = self.during_push, None
            await during()
        if self.failure is not None:
            raise self.failure
        if withdraw is not None:
            return Withdraw(reason=withdraw)
        now = datetime.now(UTC).replace(microsecond=0)
        self.verified.append(now + PERIOD)
        return PushResult(
            advertisement="home-advertisement", advertised=Resources({"cpu": "1"}),
            allocatable=Resources({"cpu": "2"}), used=Resources(), consumer_own=Resources(),
            sharing_percentage=self.configured_percentage if request.sharing_percentage is None
            else request.sharing_percentage,
            configured_percentage=self.configured_percentage,
            config_generation=self.config_generation, period_seconds=int(PERIOD.total_seconds()), capacity_change_threshold_percent=10,
            timestamp=now, time_to_live=now + self.time_to_live, foreign_phase=self.foreign_phase,
            access_verified_until=self.verified[-1],
        )  # fmt: skip

    @activity.defn(name="read_foreign_decision")
    async def read_foreign_decision(self, request: DecisionRequest) -> ForeignDecision:
        self.reads.append(request)
        return ForeignDecision(phase=self.foreign_phase)

    @activity.defn(name="withdraw_peering")
    async def withdraw_peering(self, request: WithdrawRequest) -> WithdrawResult:
        self.withdrawals.append(request)
        return WithdrawResult(foreign_cleaned=True, home_cleaned=True, note=request.reason)

    @activity.defn(name="clean_foreign")
    async def clean_foreign(self, request: CleanForeignRequest) -> CleanForeignResult:
        self.cleanings += 1
        if self.clean_failure is not None:
            raise self.clean_failure
        return CleanForeignResult(cleaned=True)

    @activity.defn(name="release_credentials")
    async def release_credentials(self, ref: SecretReference) -> None:
        self.released.append(ref)


@pytest.fixture
async def skipper(workflow_client: Client) -> TimeSkipper:
    # The clock moves only when a test says so: skipping on its own, an idle peering would jump to its next
    # push before the test signals it.
    return TimeSkipper(workflow_client, config=TimeSkippingConfig(enabled=False))


@pytest.fixture
async def stub() -> StubProvider:
    return StubProvider()


@pytest.fixture
async def peering(skipper: TimeSkipper, stub: StubProvider) -> AsyncIterator[PeeringStarter]:
    task_queue = f"peering-{uuid.uuid4().hex[:8]}"
    async with Worker(skipper.client, task_queue=task_queue, workflows=[PeeringWorkflow],
                      activities=[stub.push_advertisement, stub.read_foreign_decision, stub.withdraw_peering,
                                  stub.clean_foreign, stub.release_credentials]):  # fmt: skip
        yield PeeringStarter(skipper, task_queue)


class PeeringStarter:
    def __init__(self, skipper: TimeSkipper, task_queue: str) -> None:
        self._skipper, self._task_queue = skipper, task_queue

    async def start(self, **input: Any) -> WorkflowHandle[PeeringWorkflow, WithdrawResult]:
        foreign = f"b-{uuid.uuid4().hex[:8]}"
        return await self._skipper.client.start_workflow(
            PeeringWorkflow.run,
            PeeringInput(foreign_cluster_id=foreign, home_cluster_id="home",
                         kube_config_ref=SecretReference(name="foreign-credentials", namespace="tidepool-system"),
                         **input),
            id=f"peering-{foreign}", task_queue=self._task_queue,
        )  # fmt: skip


async def until(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """What `read` returns once `done` holds, or after ten seconds; the caller asserts on it."""
    for _ in range(200):
        value = await read()
        if done(value):
            return value
        await asyncio.sleep(0.05)
    return value


async def status_when(
    handle: WorkflowHandle[PeeringWorkflow, WithdrawResult], done: Callable[[PeeringStatus], bool]
) -> PeeringStatus:
    """The workflow's status once `done` holds (a query is answered between workflow tasks, so the timer
    that follows a push is started by then), or after ten seconds; the caller asserts on what it returns."""
    status: PeeringStatus | None = None
    for _ in range(200):
        try:
            status = await handle.query(PeeringWorkflow.status)
        except RPCError:  # a run just begun by continue-as-new answers once its first task ran
            pass
        else:
            if done(status):
                return status
        await asyncio.sleep(0.05)
    assert status is not None, "the workflow never answered its status query"
    return status


async def walk(skipper: TimeSkipper, handle: WorkflowHandle[PeeringWorkflow, WithdrawResult], *, periods: int) -> None:
    """Moves the workflow's clock one period at a time, each time until the push it brought is done (the
    next timer is then started): one jump of several periods would fire one timer and skip the others."""
    for _ in range(periods):
        expected = (await status_when(handle, lambda _: True)).pushes + 1
        assert await skipper.fast_forward(handle, PERIOD)
        status = await status_when(handle, partial(has_pushed, expected))
        assert status.pushes == expected, f"{PERIOD} later, no push {expected}"


def has_pushed(pushes: int, status: PeeringStatus) -> bool:
    return status.pushes >= pushes


async def timer_seconds(client: Client, workflow_id: str) -> list[int]:
    """The durations of the timers the workflow started, across its runs (continue-as-new), in order."""
    seconds = []
    for history in await run_histories(client, workflow_id):
        seconds += [int(e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds())
                    for e in history.events if e.HasField("timer_started_event_attributes")]  # fmt: skip
    return seconds


async def test_the_first_push_adopts_the_cluster_configs_percentage_and_names_the_home_cluster(
    peering: PeeringStarter, stub: StubProvider
) -> None:
    handle = await peering.start()
    status = await status_when(handle, lambda s: s.pushes >= 1)
    assert (status.pushes, status.phase, status.sharing_percentage) == (1, "Advertised", CONFIGURED_PERCENT)
    assert [(p.sharing_percentage, p.phase) for p in stub.pushes] == [(None, "Pending")]
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(SearchAttributeKey.for_keyword("HomeCluster")) == "home"
    assert attributes.get(SearchAttributeKey.for_keyword("PeeringPhase")) == "Advertised"


async def test_the_advertisement_is_pushed_again_every_period(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    await walk(skipper, handle, periods=2)
    status = await status_when(handle, lambda s: s.pushes >= 3)
    assert (status.pushes, len(stub.pushes)) == (3, 3)  # at 0, 10 and 20 minutes


async def test_a_sharing_percentage_update_pushes_at_once_and_a_bad_value_is_refused_readably(
    peering: PeeringStarter, stub: StubProvider
) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    status = await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 70)
    assert (status.sharing_percentage, status.pushes, stub.pushes[-1].sharing_percentage) == (70, 2, 70)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 101)
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidSharingPercentage" and cause.non_retryable
    assert cause.message == "sharing_percentage must be an integer between 0 and 100, got 101 (null follows the ClusterConfig)"
    assert len(stub.pushes) == 2  # the refused value pushed nothing


async def test_only_the_periods_pushes_check_access_and_a_signalled_one_carries_the_last_check(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 70)
    await walk(skipper, handle, periods=1)
    await status_when(handle, lambda s: s.pushes >= 3)
    first, signalled, periodic = stub.pushes[:3]
    assert (first.periodic, first.access_verified_until) == (True, None)  # nothing checked yet: credentials first
    assert (signalled.periodic, signalled.access_verified_until) == (False, stub.verified[0])
    assert (periodic.periodic, periodic.access_verified_until) == (True, stub.verified[1])


async def test_a_foreign_decision_signal_is_read_once_and_moves_the_phase(
    peering: PeeringStarter, stub: StubProvider
) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    stub.foreign_phase = "Accepted"
    await handle.signal(PeeringWorkflow.foreign_changed)
    status = await status_when(handle, lambda s: s.phase == "Accepted")
    assert (status.phase, status.foreign_phase, len(stub.reads), len(stub.pushes)) == ("Accepted", "Accepted", 1, 1)


async def test_an_unreachable_foreign_cluster_shows_the_error_type_and_is_retried_within_the_inputs_backoff(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    stub.failure = FORBIDDEN
    handle = await peering.start(unreachable_backoff_max_seconds=20)
    status = await status_when(handle, lambda s: s.phase == "Unreachable")
    assert status.phase == "Unreachable"
    assert status.last_error == "KubernetesForbidden: Kubernetes API 403: forbidden"  # the type, to search for
    assert await skipper.fast_forward(handle, timedelta(seconds=60))  # retries at 5, 15, 35 and 55 s
    retries = await until(lambda: timer_seconds(skipper.client, handle.id), lambda timers: len(timers) >= 5)
    # Doubling, then never above the input's 20 s (the real clock runs too: a retry more may have happened).
    assert retries[:3] == [5, 10, 20] and set(retries[2:]) == {20}, retries
    stub.failure = None
    assert await skipper.fast_forward(handle, timedelta(seconds=20))
    latest: WorkflowHandle[PeeringWorkflow, WithdrawResult] = skipper.client.get_workflow_handle_for(PeeringWorkflow.run, handle.id)  # it continued as new meanwhile
    status = await status_when(latest, lambda s: s.pushes >= 1)
    assert (status.phase, status.last_error, status.pushes) == ("Advertised", None, 1)


async def test_a_push_that_answers_withdraw_withdraws_the_peering(peering: PeeringStarter, stub: StubProvider) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    stub.withdraw = "BroadcasterDisabled"
    await handle.signal(PeeringWorkflow.capacity_changed)
    result = await handle.result()
    assert result == WithdrawResult(foreign_cleaned=True, home_cleaned=True, note="BroadcasterDisabled")
    assert [w.reason for w in stub.withdrawals] == ["BroadcasterDisabled"]


async def start_as_the_worker(skipper: TimeSkipper, handle: WorkflowHandle[PeeringWorkflow, WithdrawResult],
                              request: PeeringInput) -> None:
    """The provider worker's start: signal-with-start, finding a running peering rather than doubling it."""
    info = await handle.describe()
    await skipper.client.start_workflow(
        PeeringWorkflow.run, request, id=handle.id, task_queue=info.task_queue, start_signal="peering_requested",
        start_signal_args=[request], id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )  # fmt: skip


def request_for(handle: WorkflowHandle[PeeringWorkflow, WithdrawResult], uid: str) -> PeeringInput:
    return PeeringInput(foreign_cluster_id=handle.id.removeprefix("peering-"), home_cluster_id="home",
                        kube_config_ref=SecretReference(name="foreign-credentials", namespace="tidepool-system"),
                        peering_request="b", peering_request_uid=uid)  # fmt: skip


async def test_a_peering_started_again_while_its_push_reads_the_broadcaster_disabled_resumes_once_withdrawn(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    """Issue 37: the worker, seeing the broadcaster enabled again, waited outside any workflow (up to 5 minutes) for
    a run withdrawing from the disabling to end, since its start would find that run and be lost. Now the run
    continues as new for that start once withdrawn. Here the start comes while the push that reads the broadcaster
    disabled runs: the narrowest case."""
    handle = await peering.start(peering_request_uid="uid-1")
    await status_when(handle, lambda s: s.pushes >= 1)
    first_run = (await handle.describe()).run_id

    async def enabled_again() -> None:
        stub.withdraw = None  # the next push reads it enabled
        await start_as_the_worker(skipper, handle, request_for(handle, "uid-1"))

    stub.withdraw, stub.during_push = "BroadcasterDisabled", enabled_again
    await handle.signal(PeeringWorkflow.capacity_changed)
    latest: WorkflowHandle[PeeringWorkflow, WithdrawResult] = skipper.client.get_workflow_handle_for(PeeringWorkflow.run, handle.id)
    await until(lambda: asyncio.sleep(0, len(stub.pushes)), lambda pushes: pushes >= 3)
    status = await status_when(latest, lambda s: s.pushes >= 1 and s.phase == "Advertised")
    description = await latest.describe()
    assert (description.status, status.pushes) == (WorkflowExecutionStatus.RUNNING, 1), "resumed: a fresh run pushes"
    assert description.run_id != first_run
    assert [w.reason for w in stub.withdrawals] == ["BroadcasterDisabled"]
    assert [p.peering_request for p in stub.pushes] == [None, None, "b"]
    history = await skipper.client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
    assert any(e.HasField("workflow_execution_continued_as_new_event_attributes") for e in history.events)
    await latest.terminate("test over")


async def test_a_start_of_the_served_request_before_the_push_that_reads_the_broadcaster_disabled_is_no_news(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    """The worker's start as the peering began (or after a worker restart) said nothing of a disabling after it:
    the run withdraws and completes, and the worker starts it again when it sees the broadcaster enabled."""
    handle = await peering.start(peering_request_uid="uid-1")
    await start_as_the_worker(skipper, handle, request_for(handle, "uid-1"))
    await status_when(handle, lambda s: s.pushes >= 1)
    stub.withdraw = "BroadcasterDisabled"
    await handle.signal(PeeringWorkflow.capacity_changed)
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.note == "BroadcasterDisabled" and len(stub.pushes) == 2
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_a_withdraw_signal_withdraws_without_another_push(peering: PeeringStarter, stub: StubProvider) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    await handle.signal(PeeringWorkflow.withdraw)
    result = await handle.result()
    assert result.note == "Requested" and [w.reason for w in stub.withdrawals] == ["Requested"]
    assert len(stub.pushes) == 1


@pytest.mark.parametrize("refused_again", [pytest.param(True, id="refused twice: believed"),
                                           pytest.param(False, id="refused once, by an API server just started")])  # fmt: skip
async def test_a_forced_withdrawal_refused_by_the_foreign_cluster_tries_once_more_and_believes_a_second_refusal(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider, refused_again: bool
) -> None:
    # A kube-apiserver back from an outage answers 403 until its RBAC cache has synced: one refusal is not
    # the consumer's word.
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    stub.clean_failure = FORBIDDEN
    await handle.signal(PeeringWorkflow.withdraw, FORCED)
    await until(lambda: asyncio.sleep(0, stub.cleanings), lambda cleanings: cleanings >= 1)
    stub.clean_failure = FORBIDDEN if refused_again else None
    assert await skipper.fast_forward(handle, OTHER_SIDE_RETRY_FIRST)
    result = await asyncio.wait_for(handle.result(), 30)  # a refusal retried on would wait out the 30-minute TTL
    assert stub.cleanings == 2, "a refusal is tried once more, then believed"
    assert result == WithdrawResult(foreign_cleaned=not refused_again, home_cleaned=True, note=(
        "not cleaned: it refuses our credentials (clean_foreign: KubernetesForbidden: Kubernetes API 403: "
        "forbidden); its TTL and keepalive clean it" if refused_again
        else "cleaned (its Advertisement and credentials Secret deleted)"))  # fmt: skip
    assert [(w.reason, w.skip_foreign, w.hold_credentials) for w in stub.withdrawals] == [("Forced", True, True)]
    assert [r.name for r in stub.released] == ["foreign-credentials"]


async def test_a_forced_withdrawal_gives_up_on_an_unreachable_foreign_cluster_once_its_advertisement_expired(
    peering: PeeringStarter, stub: StubProvider
) -> None:
    stub.time_to_live = timedelta(seconds=2)
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    stub.clean_failure = ApplicationError("connection refused", type="ForeignUnreachable")
    await handle.signal(PeeringWorkflow.withdraw, FORCED)
    result = await asyncio.wait_for(handle.result(), 30)
    assert not result.foreign_cleaned and result.home_cleaned
    assert re.fullmatch(r"not reached before its Advertisement expired \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC; last "
                        r"failure: clean_foreign: ForeignUnreachable: connection refused\): its TTL and keepalive clean it",
                        result.note), result.note  # fmt: skip
    assert stub.cleanings >= 2, "tried again until the Advertisement's time to live, then given up"
    assert [r.name for r in stub.released] == ["foreign-credentials"]


async def test_a_cluster_config_edit_read_by_an_overdue_push_before_its_signal_is_used_and_stays(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    # After a worker restart, the overdue push reads the edited ClusterConfig before the watcher signals it:
    # the signal is then no news, and nothing may hold on to the old percentage.
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    generation = stub.edit_cluster_config(60)
    await walk(skipper, handle, periods=1)
    await handle.signal(PeeringWorkflow.cluster_config_changed, generation)
    await walk(skipper, handle, periods=1)
    status = await status_when(handle, lambda s: s.pushes >= 3)
    assert [p.sharing_percentage for p in stub.pushes] == [None, None, None]  # the generation read: no extra push
    assert (status.sharing_percentage, status.sharing_percentage_override) == (60, None)
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(SearchAttributeKey.for_int("SharingPercentage")) == 60


async def test_an_input_percentage_is_the_peerings_override(peering: PeeringStarter, stub: StubProvider) -> None:
    handle = await peering.start(sharing_percentage=55)
    status = await status_when(handle, lambda s: s.pushes >= 1)
    assert (status.sharing_percentage, status.sharing_percentage_override, stub.pushes[0].sharing_percentage) == (
        55, 55, 55,
    )  # fmt: skip


async def test_dropping_the_override_with_null_returns_to_the_cluster_configs_percentage(
    peering: PeeringStarter, stub: StubProvider
) -> None:
    handle = await peering.start()
    await status_when(handle, lambda s: s.pushes >= 1)
    overridden = await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 70)
    assert (overridden.sharing_percentage, overridden.sharing_percentage_override) == (70, 70)
    stub.edit_cluster_config(60)  # not signalled: the push reads it anyway
    followed = await handle.execute_update(PeeringWorkflow.update_sharing_percentage, None)
    assert (followed.sharing_percentage, followed.sharing_percentage_override, followed.pushes) == (60, None, 3)
    assert [p.sharing_percentage for p in stub.pushes] == [None, 70, None]


async def test_an_override_set_by_signal_survives_pushes_a_cluster_config_edit_and_continue_as_new(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    handle = await peering.start()
    first_run = (await handle.describe()).run_id
    await status_when(handle, lambda s: s.pushes >= 1)
    await handle.signal(PeeringWorkflow.set_sharing_percentage, 55)
    await status_when(handle, lambda s: s.pushes >= 2)
    await handle.signal(PeeringWorkflow.cluster_config_changed, stub.edit_cluster_config(60))
    await status_when(handle, lambda s: s.pushes >= 3)
    latest: WorkflowHandle[PeeringWorkflow, WithdrawResult] = skipper.client.get_workflow_handle_for(PeeringWorkflow.run, handle.id)  # follows continue-as-new
    await walk(skipper, latest, periods=10)
    status = await status_when(latest, lambda s: s.pushes >= 13)
    assert (await latest.describe()).run_id != first_run  # it did continue as new
    assert (status.pushes, status.sharing_percentage, status.sharing_percentage_override) == (13, 55, 55)
    assert [p.sharing_percentage for p in stub.pushes] == [None] + [55] * 12  # 0, 0, 0, 10, ..., 100 minutes


async def test_a_peering_requested_again_during_a_forced_withdrawal_stops_cleaning_and_continues_as_a_new_peering(
    peering: PeeringStarter, skipper: TimeSkipper, stub: StubProvider
) -> None:
    """`tidepool unpeer --force` then `tidepool peer` at once: the watcher's start (signal-with-start, as the
    worker's) finds the run still trying the foreign side. Issue 34: that start was lost (USE_EXISTING found the
    withdrawing run, which then completed: no peering any more) and the old run's cleaning went on after the new
    request; now the run stops cleaning there, lets the credentials go (release_credentials keeps a Secret a live
    request names), and continues as new for the new request, which pushes at once."""
    handle = await peering.start(peering_request_uid="uid-1")
    await status_when(handle, lambda s: s.pushes >= 1)
    stub.clean_failure = ApplicationError("connection refused", type="ForeignUnreachable")  # retried till its TTL
    await handle.signal(PeeringWorkflow.withdraw, args=[FORCED, "uid-1"])
    await until(lambda: asyncio.sleep(0, stub.cleanings), lambda cleanings: cleanings >= 1)
    stub.clean_failure = None
    again = PeeringInput(foreign_cluster_id=handle.id.removeprefix("peering-"), home_cluster_id="home",
                         kube_config_ref=SecretReference(name="foreign-credentials", namespace="tidepool-system"),
                         peering_request="b", peering_request_uid="uid-2")  # fmt: skip
    info = await handle.describe()
    await skipper.client.start_workflow(
        PeeringWorkflow.run, again, id=handle.id, task_queue=info.task_queue, start_signal="peering_requested",
        start_signal_args=[again], id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )  # fmt: skip
    latest: WorkflowHandle[PeeringWorkflow, WithdrawResult] = skipper.client.get_workflow_handle_for(PeeringWorkflow.run, handle.id)
    status = await status_when(latest, lambda s: s.pushes >= 1 and s.phase == "Advertised")
    assert (status.phase, status.pushes) == ("Advertised", 1), "the new request is peered at once"
    assert (await latest.describe()).run_id != info.run_id, "continued as new"
    assert stub.cleanings == 1, "no cleaning of the foreign side after the new request"
    assert [r.name for r in stub.released] == ["foreign-credentials"]
    assert [p.peering_request for p in stub.pushes] == [None, "b"]
    history = await skipper.client.get_workflow_handle(handle.id, run_id=info.run_id).fetch_history()
    assert any(e.HasField("workflow_execution_continued_as_new_event_attributes") for e in history.events)

    # The withdrawal of the request replaced is stale for the new run: it goes on.
    await latest.signal(PeeringWorkflow.withdraw, args=[FORCED, "uid-1"])
    await latest.signal(PeeringWorkflow.capacity_changed)
    status = await status_when(latest, lambda s: s.pushes >= 2)
    assert (status.phase, status.pushes, len(stub.withdrawals)) == ("Advertised", 2, 1)
    await latest.terminate("test over")
