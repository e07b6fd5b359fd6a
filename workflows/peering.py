"""PeeringWorkflow: the provider's side of one peering, one workflow per foreign cluster, ever
(id `peering-<foreign cluster id>`). It reads like seed 001:

1. compute what the home cluster shares and push the Advertisement and fresh credentials to the
   foreign cluster (one activity, so a cycle costs one activity and one timer);
2. follow the foreign cluster's decision: the worker watches the Advertisement there and signals
   `foreign_changed` when the decision moves, and the workflow reads it once;
3. wait for the period, or less when the sharing percentage, the ClusterConfig or the capacity changes;
4. withdraw when the broadcaster is disabled or the PeeringRequest is deleted, then complete; or, when the
   worker asked for the peering again meanwhile (a request made again, the broadcaster enabled again),
   continue as new for it once the withdrawal is done.

The percentage has one owner: the peering's override when the input, the signal `set_sharing_percentage`
or the update `update_sharing_percentage` set one (null drops it), the ClusterConfig's otherwise, as each
push reads it; what a push used is shown, never fed back.

An unreachable foreign cluster is retried with backoff for ever; the reason shows in the current
details and in the PeeringPhase search attribute.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, get_args

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributePair,
)
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.failures import ONE_ATTEMPT, OTHER_SIDE_TIMEOUT, GaveUp, describe_failure, until_expired
from workflows.search_attributes import FOREIGN_CLUSTER, HOME_CLUSTER, PEERING_PHASE, SHARING_PERCENTAGE

with workflow.unsafe.imports_passed_through():
    from activities.peering import PeeringActivities
    from models.peering import (
        CleanForeignRequest,
        DecisionRequest,
        ForeignDecision,
        PeeringInput,
        PeeringState,
        PeeringStatus,
        PushRequest,
        Withdraw,
        WithdrawReason,
        WithdrawRequest,
        WithdrawResult,
        jittered_period,
        next_wait,
        phase_after_push,
        render_details,
        sharing_percentage_problem,
    )
    from models.settings import ProviderSettings


# A push talks to two API servers; a minute is ample. Three quick attempts, then the workflow's own
# backoff takes over so that the Web UI shows the failure instead of a silent retry loop.
PUSH_TIMEOUT = timedelta(seconds=60)
PUSH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2, maximum_attempts=3)
CHECK_TIMEOUT = timedelta(seconds=20)
CHECK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
# Withdrawal keeps trying for as long as an Advertisement could live (3 periods by default): after that
# the foreign cluster expires it on its own.
WITHDRAW_TIMEOUT = timedelta(seconds=60)
WITHDRAW_SCHEDULE_TIMEOUT = timedelta(minutes=30)
WITHDRAW_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=60))
# A forced withdrawal leaves the foreign side alone once the consumer asked again: the new peering's first push
# replaces the Advertisement and the credentials Secret there, and cleaning after it would delete them.
PEERED_AGAIN = ("not cleaned: peered again meanwhile; the new peering's pushes replace its Advertisement and "
                "credentials Secret there")
# A home-side withdrawal that failed for good is tried again, ever less often.
HOME_WITHDRAW_BACKOFF_INITIAL = timedelta(seconds=30)
HOME_WITHDRAW_BACKOFF_MAX = timedelta(minutes=10)
# Patch: a run withdrawing because the broadcaster was disabled continues as new for its request when the
# worker, seeing it enabled again, starts it meanwhile (0.1.0's worker waited outside for the run to end).
RESUMED_AFTER_DISABLING = "resumed-after-disabling"

PROVIDER = ProviderSettings()


# An input that does not validate (the `temporal` CLI sends anything) fails the workflow with pydantic's
# message naming the field, instead of failing its first task again and again. Every model the workflow
# itself builds or receives from its activities was validated where it was made, so nothing else raises it.
@workflow.defn(failure_exception_types=[ValidationError])
class PeeringWorkflow:
    @workflow.init
    def __init__(self, input: PeeringInput) -> None:
        self._input = input
        self._state = (input.state if input.state is not None
                       else PeeringState(sharing_percentage_override=input.sharing_percentage))  # fmt: skip
        self._withdraw: WithdrawReason | None = None
        self._requested_again: PeeringInput | None = None
        # The request this run serves, started again by the worker since the last push began: it does so when it
        # sees the broadcaster enabled again, which is news only if that push read it disabled.
        self._served_again: PeeringInput | None = None
        # The one timer of the loop, kept across wakes that do not move its deadline (a decision read), so
        # that such a wake costs no new timer.
        self._timer: asyncio.Future[None] | None = None
        self._timer_deadline: datetime | None = None

    @workflow.run
    async def run(self, input: PeeringInput) -> WithdrawResult:
        self._publish()
        while self._withdraw is None:
            due = self._state.push_requested or self._state.next_push is None or workflow.now() >= self._state.next_push
            if due or self._state.consecutive_failures:
                await self._push()
            elif self._state.foreign_changed:
                await self._check_decision()
            if self._withdraw is not None:
                break
            # Updates wait for the loop's next pass, so never block on them: continue-as-new only
            # between them (a suggestion is not a deadline).
            if workflow.info().is_continue_as_new_suggested() and workflow.all_handlers_finished():
                workflow.continue_as_new(self._input.model_copy(update={"state": self._state}))
            await self._sleep()
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()  # no wake during the withdrawal
        result = await self._withdraw_peering(self._withdraw)
        again = self._requested_again
        if again is not None:
            # Peered again while this one withdrew: the same workflow id, so no start would be taken while this
            # run lives; the new request is served by a fresh run instead of being lost.
            workflow.logger.info("%s peered again: a new peering begins", self._input.foreign_cluster_id)
        elif (self._served_again is not None and self._withdraw == "BroadcasterDisabled"
              and workflow.patched(RESUMED_AFTER_DISABLING)):  # fmt: skip
            # Enabled again while this run withdrew for the disabling: likewise, the worker's start found this run.
            workflow.logger.info("%s: the broadcaster is enabled again: the peering resumes", self._input.foreign_cluster_id)
            again = self._served_again
        if again is not None:
            workflow.continue_as_new(again.model_copy(update={"state": None}))
        return result

    async def _push(self) -> None:
        # Asked for by a signal (before the period was due and with no failure to retry): the Advertisement
        # alone while the last push's access check holds.
        periodic = (self._state.next_push is None or workflow.now() >= self._state.next_push
                    or self._state.consecutive_failures > 0)  # fmt: skip
        self._state.push_requested = False
        self._state.foreign_changed = False  # the push reads the decision too
        self._served_again = None  # this push reads the ClusterConfig after that start
        self._state.pushes_started += 1
        request = PushRequest(
            foreign_cluster_id=self._input.foreign_cluster_id,
            kube_config_ref=self._input.kube_config_ref,
            peering_request=self._input.peering_request,
            sharing_percentage=self._state.sharing_percentage_override,
            phase=self._state.phase,
            periodic=periodic,
            access_verified_until=self._state.last_push.access_verified_until if self._state.last_push else None,
            config_generation=self._state.config_generation,
        )
        try:
            result = await workflow.execute_activity_method(
                PeeringActivities.push_advertisement, request,
                start_to_close_timeout=PUSH_TIMEOUT, retry_policy=PUSH_RETRY,
                summary=f"push Advertisement to {self._input.foreign_cluster_id}",
            )  # fmt: skip
        except ActivityError as e:
            self._failed(e)
            return
        finally:
            self._state.pushes_finished = self._state.pushes_started
        state = self._state
        if isinstance(result, Withdraw):
            self._withdraw = result.reason
            return
        state.last_push, state.pushes, state.last_error, state.consecutive_failures = result, state.pushes + 1, None, 0
        state.config_generation = max(state.config_generation, result.config_generation)
        foreign = ForeignDecision(phase=result.foreign_phase, remote_remapped_pod_cidr=result.remote_remapped_pod_cidr)
        state.foreign, state.phase = foreign, phase_after_push(foreign)
        state.next_push = workflow.now() + jittered_period(result.period_seconds, workflow.random().random())
        self._publish()

    async def _check_decision(self) -> None:
        self._state.foreign_changed = False
        request = DecisionRequest(
            foreign_cluster_id=self._input.foreign_cluster_id,
            kube_config_ref=self._input.kube_config_ref,
            peering_request=self._input.peering_request,
            phase=self._state.phase,
        )
        try:
            decision = await workflow.execute_activity_method(
                PeeringActivities.read_foreign_decision, request,
                start_to_close_timeout=CHECK_TIMEOUT, retry_policy=CHECK_RETRY,
                summary=f"read decision of {self._input.foreign_cluster_id}",
            )  # fmt: skip
        except ActivityError:
            return  # the next push will tell; a check is only a shortcut
        self._state.foreign = decision
        if not decision.exists:
            self._state.push_requested = True  # gone on the foreign side (expired or deleted): put it back
        self._state.phase = phase_after_push(decision) if decision.exists else self._state.phase
        self._publish()

    def _failed(self, error: ActivityError) -> None:
        cause = error.cause or error
        self._state.consecutive_failures += 1
        self._state.last_error = str(cause)  # an ApplicationError's starts with its type, which users search for
        self._state.phase = "Unreachable"
        workflow.logger.warning("push to %s failed: %s", self._input.foreign_cluster_id, cause)
        self._publish()

    async def _sleep(self) -> None:
        wait = next_wait(
            state=self._state,
            now=workflow.now(),
            next_push=self._state.next_push or workflow.now(),
            unreachable_max_seconds=self._input.unreachable_backoff_max_seconds or PROVIDER.unreachable_backoff_max_seconds,
        )
        if wait <= timedelta(0):
            return
        await self._wait(wait, "retry" if self._state.consecutive_failures else "next push")

    async def _wait(self, wait: timedelta, summary: str) -> None:
        """Sleep until the deadline, a push asked for, a withdrawal or a moved foreign decision. The timer
        is started only when the deadline moves: a decision read leaves it running."""
        deadline = workflow.now() + wait
        if self._timer is None or self._timer.done() or self._timer_deadline != deadline:
            if self._timer is not None and not self._timer.done():
                self._timer.cancel()
            self._timer, self._timer_deadline = asyncio.ensure_future(workflow.sleep(wait, summary=summary)), deadline
        timer = self._timer
        await workflow.wait_condition(
            lambda: timer.done() or self._state.push_requested or self._state.foreign_changed or self._withdraw is not None
        )

    async def _withdraw_peering(self, reason: WithdrawReason) -> WithdrawResult:
        self._state.phase = "Withdrawn"
        self._publish()
        request = WithdrawRequest(
            foreign_cluster_id=self._input.foreign_cluster_id,
            kube_config_ref=self._input.kube_config_ref,
            peering_request=self._input.peering_request,
            reason=reason,
            peering_request_uid=self._input.peering_request_uid,
        )
        if reason == "Forced":
            return await self._force_withdraw(request)
        try:
            return await self._execute_withdraw(request, WITHDRAW_SCHEDULE_TIMEOUT)
        except ActivityError as e:
            # The foreign cluster stayed out of reach: clean at home and let the Advertisement expire there.
            workflow.logger.warning("withdrawal from %s incomplete: %s", self._input.foreign_cluster_id, e.cause or e)
        return await self._withdraw_at_home(request.model_copy(update={"skip_foreign": True}))

    async def _force_withdraw(self, request: WithdrawRequest) -> WithdrawResult:
        """`tidepool unpeer --force`: the home side at once (access revoked, the PeeringRequest released, its
        credentials Secret held), then the foreign side, tried again while the Advertisement pushed there
        could live; past that, the consumer's TTL and keepalive clean it. The Secret goes at the end."""
        await self._withdraw_at_home(request.model_copy(update={"skip_foreign": True, "hold_credentials": True}))
        push = self._state.last_push
        until = push.time_to_live if push is not None else workflow.now()
        self._state.foreign_cleanup_until = until
        self._publish()
        outcome, cleaned = self._state.foreign_cleanup_outcome, False
        if outcome is None and self._requested_again is not None:
            outcome = PEERED_AGAIN
        if outcome is None:
            outcome, cleaned = await self._clean_foreign(request, until)
        self._state.foreign_cleanup_outcome = outcome
        self._state.last_error = None
        self._publish()
        await workflow.execute_activity_method(
            PeeringActivities.release_credentials, request.kube_config_ref,
            start_to_close_timeout=WITHDRAW_TIMEOUT, retry_policy=WITHDRAW_RETRY, summary="release the credentials",
        )  # fmt: skip
        return WithdrawResult(foreign_cleaned=cleaned, home_cleaned=True, note=outcome)

    async def _clean_foreign(self, request: WithdrawRequest, until: datetime) -> tuple[str, bool]:
        """The foreign half of a forced withdrawal, tried until `until`: what the details and the result say
        of it, and whether it was cleaned."""
        foreign = request.foreign_cluster_id
        result = await until_expired(
            lambda: workflow.execute_activity_method(
                PeeringActivities.clean_foreign,
                CleanForeignRequest(foreign_cluster_id=foreign, kube_config_ref=request.kube_config_ref),
                start_to_close_timeout=OTHER_SIDE_TIMEOUT, retry_policy=ONE_ATTEMPT,
                summary=f"clean on {foreign} after a forced unpeer",
            ),
            until=until, retrying=self._retrying, summary=f"{foreign} unreachable: retry",
            stop=lambda: self._requested_again is not None,
        )  # fmt: skip
        if not isinstance(result, GaveUp):
            return ("cleaned (its Advertisement and credentials Secret deleted)" if result.cleaned
                    else f"not cleaned: {result.note}; its TTL and keepalive clean it"), result.cleaned  # fmt: skip
        if result.stopped:
            return PEERED_AGAIN, False
        if result.non_retryable:
            return f"not cleaned: it refuses our credentials ({result.failure}); its TTL and keepalive clean it", False
        return f"{result.not_reached()}: its TTL and keepalive clean it", False

    def _retrying(self, failure: str) -> None:
        self._state.last_error = failure
        self._publish()

    async def _withdraw_at_home(self, home_only: WithdrawRequest) -> WithdrawResult:
        backoff = HOME_WITHDRAW_BACKOFF_INITIAL
        while True:
            try:
                return await self._execute_withdraw(home_only, None)
            except ActivityError as e:
                # A permanent error at home (a 403 after an RBAC change): the PeeringRequest's finalizer waits
                # on this run, so say why and try again once someone mends it; never fail the workflow.
                self._state.last_error = describe_failure(e)
                self._publish()
                await workflow.sleep(backoff, summary="withdraw at home: retry")
                backoff = min(backoff * 2, HOME_WITHDRAW_BACKOFF_MAX)

    async def _execute_withdraw(self, request: WithdrawRequest, schedule_timeout: timedelta | None) -> WithdrawResult:
        return await workflow.execute_activity_method(
            PeeringActivities.withdraw_peering, request,
            start_to_close_timeout=WITHDRAW_TIMEOUT, schedule_to_close_timeout=schedule_timeout,
            retry_policy=WITHDRAW_RETRY, summary=f"withdraw from {self._input.foreign_cluster_id} ({request.reason})",
        )  # fmt: skip

    def _publish(self) -> None:
        """Search attributes (only when they change: each upsert is a history event) and live details."""
        wanted: list[SearchAttributePair[Any]] = [
            SearchAttributePair(FOREIGN_CLUSTER, self._input.foreign_cluster_id),
            SearchAttributePair(PEERING_PHASE, self._state.phase),
        ]
        if self._input.home_cluster_id is not None:  # the worker sets it; a start by hand may not
            wanted.append(SearchAttributePair(HOME_CLUSTER, self._input.home_cluster_id))
        push = self._state.last_push
        if push is not None:
            wanted.append(SearchAttributePair(SHARING_PERCENTAGE, push.sharing_percentage))
        current = workflow.info().typed_search_attributes
        changes = [pair.key.value_set(pair.value) for pair in wanted if current.get(pair.key) != pair.value]
        if changes:
            workflow.upsert_search_attributes(changes)
        workflow.set_current_details(
            render_details(self._state, foreign_cluster_id=self._input.foreign_cluster_id)
        )

    # Handlers -----------------------------------------------------------------------------------------
    def _set_override(self, value: int | None) -> None:
        self._state.sharing_percentage_override = value
        self._state.push_requested = True

    @workflow.signal
    def set_sharing_percentage(self, value: Any) -> None:
        """Override the ClusterConfig's share for this peering at once, or follow it again with null.
        Out-of-range values are ignored with a warning (a signal cannot be refused: use the update
        `update_sharing_percentage` to get an error back)."""
        problem = sharing_percentage_problem(value)
        if problem is not None:
            workflow.logger.warning("ignored signal set_sharing_percentage: %s", problem)
            return
        self._set_override(value)

    @workflow.update
    async def update_sharing_percentage(self, value: Any) -> PeeringStatus:
        """Override the share (null: follow the ClusterConfig again) and return the status once the new
        Advertisement is on the foreign cluster."""
        # A push already under way started with the old value: wait for the one after it.
        ours = self._state.pushes_started + 1
        self._set_override(value)
        await workflow.wait_condition(
            lambda: (self._state.pushes_started >= ours and self._state.pushes_finished >= ours)
            or self._withdraw is not None
        )
        return self.status()

    @update_sharing_percentage.validator
    def _validate_sharing_percentage(self, value: Any) -> None:
        # Refusals the CLI shows as they are: non-retryable, with a type to search for.
        problem = sharing_percentage_problem(value)
        if problem is not None:
            raise ApplicationError(problem, type="InvalidSharingPercentage", non_retryable=True)
        if self._withdraw is not None:
            raise ApplicationError("the peering is being withdrawn", type="PeeringWithdrawn", non_retryable=True)

    @workflow.signal
    def cluster_config_changed(self, generation: int) -> None:
        """From the worker's ClusterConfig watcher: push now if this generation is news to us. The push
        re-reads the ClusterConfig (level-triggered); a generation a push already read is dropped."""
        if generation > self._state.config_generation:  # an override is left alone
            self._state.push_requested = True

    @workflow.signal
    def capacity_changed(self) -> None:
        """From the worker's capacity watcher: allocatable moved by more than the threshold."""
        self._state.push_requested = True

    @workflow.signal
    def foreign_changed(self) -> None:
        """From the worker's watch on our Advertisement in the foreign cluster: its existence, phase or
        remapped PodCIDR moved. Identity only: the workflow reads the decision itself (level-triggered)."""
        self._state.foreign_changed = True

    @workflow.signal
    def withdraw(self, reason: WithdrawReason = "Requested", peering_request_uid: str | None = None) -> None:
        """`peering_request_uid`: the deleted PeeringRequest's, from the watcher; a withdrawal for another request
        than the one this run serves is stale (that one went before it ever held it) and ignored.

        Checked here, not by the converter: a signal sent with fewer arguments than the handler takes (the
        `temporal` CLI's one reason) is decoded without the type hints, so a reason outside WithdrawReason
        would otherwise reach the state."""
        if reason not in get_args(WithdrawReason) or not isinstance(peering_request_uid, str | None):
            workflow.logger.warning("ignored withdraw: the reason must be one of %s", ", ".join(get_args(WithdrawReason)))
            return
        serving = self._input.peering_request_uid
        if peering_request_uid is not None and serving is not None and peering_request_uid != serving:
            workflow.logger.warning("ignored withdraw for PeeringRequest %s: this peering serves %s",
                                    peering_request_uid, serving)  # fmt: skip
            return
        self._withdraw = reason

    @workflow.signal
    def peering_requested(self, input: PeeringInput) -> None:
        """From the worker's PeeringRequest watcher with each start (signal-with-start): the request it saw live,
        as it would start the peering. The request this run serves is news only to a run that withdraws because
        its push read the broadcaster disabled (kept in `_served_again`): the worker starts it again when it sees
        the broadcaster enabled again. Another one (deleted and made again under the same name) while this run
        withdraws is peered again once the withdrawal is done: the run continues as new with it. Before any
        withdrawal the old request went without our finalizer: serve the new one."""
        uid = input.peering_request_uid
        if uid is None:
            return
        if uid == self._input.peering_request_uid:
            self._served_again = input
            return
        if self._withdraw is None:
            self._input = input.model_copy(update={"state": self._input.state})
            return
        self._requested_again, self._state.requested_again = input, uid

    @workflow.query
    def status(self) -> PeeringStatus:
        push = self._state.last_push
        foreign = self._state.foreign
        return PeeringStatus(
            foreign_cluster_id=self._input.foreign_cluster_id,
            phase=self._state.phase,
            sharing_percentage=push.sharing_percentage if push else None,
            sharing_percentage_override=self._state.sharing_percentage_override,
            pushes=self._state.pushes,
            advertised=push.advertised if push else None,
            last_push=push.timestamp if push else None,
            next_push=self._state.next_push,
            foreign_phase=foreign.phase if foreign else None,
            remote_remapped_pod_cidr=foreign.remote_remapped_pod_cidr if foreign else None,
            last_error=self._state.last_error,
        )
