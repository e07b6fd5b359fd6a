"""AdvertisementWorkflow: the consumer's side of one provider's Advertisement, id
`advertisement-<provider cluster id>`, started (or signalled) by the consumer worker's watchers.

Seed 000's steps, each a visible stage (current details and the AdvertisementPhase search attribute):
1. the admission workflow decides (this one only waits, or carries a manual accept/refuse update, which the
   admission workflow answers with a `verdict` signal once its pass has written the decision);
2. accepted: hold the Advertisement with a finalizer, wait for the PodCIDR remapping;
3. create the virtual kubelet Deployment (again, if anyone deletes it);
4. teardown, when the Advertisement is deleted, expires or its provider stays unreachable: virtual node
   first, then (once the provider namespace is clean) the virtual kubelet, then the Advertisement.

Every wake re-reads the cluster and derives the next step (models/consumer.py), so a crash at any step
resumes at that step. The deadline timer is held across wakes and replaced only by an earlier one, so a
wake that changes nothing starts no timer; the expiry timer re-reads the Advertisement when it fires (a
push renewing timeToLive wakes nobody); an Advertisement that expires unaccepted is deleted (step
DeleteExpired) and the workflow completes. Each acting step is its own activity (ensure_finalizer, ...,
release_advertisement), and an activity failure the retry policy gives up on (a 403) is shown in the
current details and waited out, never failing the run. An Advertisement marked by
`tidepool unpeer --force` is torn down without waiting for the provider namespace to be reported clean;
then the run cleans the copies there itself while the last Advertisement could live, and deletes the
provider's credentials.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from workflows.failures import ONE_ATTEMPT, OTHER_SIDE_TIMEOUT, GaveUp, describe_failure, until_expired
from workflows.search_attributes import ADVERTISEMENT_PHASE, HOME_CLUSTER, PROVIDER_CLUSTER

with workflow.unsafe.imports_passed_through():
    from activities.consumer import ConsumerActivities
    from models.consumer import (
        AdvertisementInput,
        AdvertisementObservation,
        AdvertisementState,
        CleanProviderInput,
        DeleteExpiredInput,
        DeleteVirtualKubeletInput,
        DeleteVirtualNodeInput,
        EnsureFinalizerInput,
        EnsureVirtualKubeletInput,
        ManualDecision,
        MarkDeletingInput,
        RefuseNotReadyInput,
        ReleaseAdvertisementInput,
        Step,
        TeardownCause,
        Verdict,
        after_step,
        next_step,
        render_details,
        wake_after,
    )
    from models.names import admission_workflow_id


# Reads and writes on the consumer's own API server: quick, retried without end (the API server will be
# back), each attempt bounded.
KUBE_TIMEOUT = timedelta(seconds=30)
KUBE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
# DeleteExpired refused by the activity (by its clock, the Advertisement has not expired yet): look again after.
EXPIRY_CLOCK_SKEW_RECHECK = timedelta(seconds=10)
# How long a manual decision waits for the admission workflow's verdict (an annotation, a watcher's wake and a
# pass): past it, the update answers "Pending" and the decision is still made when admission gets to it.
VERDICT_TIMEOUT = timedelta(seconds=30)
# Patch: the manual decision waits for the verdict signal; updates that 0.1.0 began poll as they did then.
VERDICT_SIGNALLED = "verdict-signalled"
# How 0.1.0's manual decisions looked for the admission workflow's verdict.
DECISION_CHECKS = 30
DECISION_CHECK_INTERVAL = timedelta(seconds=1)
# Steps that change nothing but the observation: no action is needed, so go round again at once.
ACTING_STEPS: frozenset[Step] = frozenset(
    {"EnsureFinalizer", "EnsureVirtualKubelet", "MarkDeleting", "DeleteVirtualNode", "DeleteVirtualKubelet",
     "ReleaseAdvertisement", "DeleteExpired", "RefuseNotReady"}
)  # fmt: skip
# After an activity failure the retry policy gave up on (a permanent one: a forbidden call, an invalid
# write), wait for the next change, or this long, doubling from the first, before looking again.
FAILURE_BACKOFF_FIRST = timedelta(seconds=10)
FAILURE_BACKOFF_MAX = timedelta(minutes=5)
# An acting step decided again right after it ran made no progress (a virtual kubelet Deployment held
# terminating by someone else's finalizer stays absent however often it is applied): act again only at the
# next change or after this backoff, doubling from the first, so that the loop neither spins nor grows the
# history faster than continue-as-new trims it.
NO_PROGRESS_BACKOFF_FIRST = timedelta(seconds=1)
NO_PROGRESS_BACKOFF_MAX = timedelta(minutes=5)
# After a forced unpeer, the provider's copies are cleaned as workflows.failures.until_expired tries the other
# side; past the last Advertisement's life, the provider cleans them once our keepalive has lapsed.
PROVIDER_CLEANS_ITSELF = "the provider deletes them itself once this cluster's keepalive there has lapsed"
# Refusals a person may overturn by hand (issue 20): the accept/refuse updates take them like a Pending one.
AWAITING_A_PERSON = frozenset({("Refused", "DecisionTimedOut"), ("Refused", "VirtualNodeNotReady")})
# A refusal by hand, on this Advertisement or kept from an earlier one of its provider (issue 34), is lifted by
# the accept update as by the annotation; the answer waits until admission has decided again.
LIFTED_BY_ACCEPT = frozenset({("Refused", "ManuallyRefused")})


@workflow.defn
class AdvertisementWorkflow:
    @workflow.init
    def __init__(self, input: AdvertisementInput) -> None:
        self._input = input
        self._state = input.state or AdvertisementState()
        self._changed = True
        self._observation: AdvertisementObservation | None = None
        self._step: Step | None = None
        self._observed_at: datetime | None = None  # when the observation was read: the details say it
        self._decided: str | None = None
        self._verdict: Verdict | None = None  # the admission workflow's last, for a decision by hand
        self._failures = 0  # consecutive passes that ended in an activity failure
        self._deadline_timer: asyncio.Task[None] | None = None
        self._deadline: datetime | None = None

    @workflow.run
    async def run(self, input: AdvertisementInput) -> AdvertisementState:
        # HomeCluster only when the worker said it (a start by hand may not).
        attributes = [PROVIDER_CLUSTER.value_set(input.provider_id)]
        if input.home_cluster_id:
            attributes.append(HOME_CLUSTER.value_set(input.home_cluster_id))
        workflow.upsert_search_attributes(attributes)
        while True:
            self._changed = False
            try:
                if await self._pass():
                    self._disarm()
                    # A new Advertisement of the provider (its next push, or peered again) signalled to this run
                    # as it ended: a fresh run follows it, where the watcher's start found this one and was lost.
                    if (self._state.forced and await self._clean_provider()) or await self._arrived_meanwhile():
                        workflow.continue_as_new(self._input.model_copy(update={"state": None}))
                    return self._state
            except ActivityError as failure:  # the retry policy gave up: permanent, or not retried
                await self._wait_out(failure)

    async def _pass(self) -> bool:
        """One wake: observe, decide, act or wait. True when the run is over."""
        obs = await self._activity(ConsumerActivities.observe_advertisement, self._input.advertisement,
                                   summary="observe")  # fmt: skip
        now = workflow.now()
        decided = next_step(obs, self._state, now)
        step = decided.step
        if step != self._state.last_acted:  # progress: what the last step did shows
            self._state.last_acted, self._state.stalls = None, 0
        self._state.teardown = decided.teardown
        if obs.forced and not self._state.forced:
            self._state.forced = True
            self._state.provider_cleanup_until = obs.time_to_live or now
        if step == "AwaitProviderClean" and self._state.clean_wait_started is None:
            # A teardown that found the virtual kubelet but no virtual node (it never registered one, or someone
            # deleted it): the bounded wait for the provider-clean report starts now.
            self._state.clean_wait_started = now
        self._observation, self._step, self._observed_at = obs, step, now
        self._state.observed_phase = obs.phase
        if obs.phase == "Accepted" and self._state.accepted_at is None:
            self._state.accepted_at = now
        if obs.virtual_node_ready and self._state.ready_wait_started is not None:
            self._state.node_was_ready = True
        self._publish(obs, step)
        if step == "Done":
            return True
        if step in ACTING_STEPS:
            if self._state.last_acted == step and self._state.stalled_until is None:
                await self._wait_for_progress(obs, step)  # then the next pass looks again, and acts
                return False
            self._state.stalled_until = None
            if step == "ReleaseAdvertisement" and self._state.teardown == "ProviderUnreachable":
                await self._tell_admission_unreachable()
            done = await self._act(step)
            self._state = after_step(self._state, step, done=done, now=workflow.now())
            if step != "DeleteExpired":  # which waits on its own
                self._state.last_acted = step  # forgotten by the next pass that decides another step
            self._succeeded()
            if step == "DeleteExpired":
                if done:  # gone: a push that brings it back is a new arrival, for a new run
                    return True
                # Expired by the workflow's clock, not yet by the worker's (their clocks differ): not a
                # tight loop of reads, a short wait.
                await workflow.sleep(EXPIRY_CLOCK_SKEW_RECHECK, summary="expired here, not yet for the worker")
            return False
        self._succeeded()
        self._state.last_acted, self._state.stalls, self._state.stalled_until = None, 0, None
        await self._wait_for_change_or_deadline(obs, step)
        self._continue_as_new_if_suggested()
        return False

    async def _arrived_meanwhile(self) -> bool:
        """Whether, of the changes signalled since the last look, one is a new Advertisement (looked at again
        until no signal comes in between)."""
        while self._changed:
            self._changed = False
            obs = await self._activity(ConsumerActivities.observe_advertisement, self._input.advertisement,
                                       summary="observe: a new arrival?")  # fmt: skip
            if obs.exists and not obs.deleting:
                return True
        return False

    async def _tell_admission_unreachable(self) -> None:
        """Just before the teardown releases the Advertisement (the provider re-pushes at once): admission backs off
        from this provider (workflows/admission.py), since the virtual kubelet it would build could not reach
        it either. A run started without the home cluster (by hand) cannot name the admission workflow."""
        if not self._input.home_cluster_id or self._state.admission_told:
            return
        admission = workflow.get_external_workflow_handle(admission_workflow_id(self._input.home_cluster_id))
        try:
            await admission.signal("provider_unreachable", self._input.provider_id)
        except FailureError as e:  # no admission workflow running: nothing accepts it again either
            workflow.logger.warning("admission not told of %s's unreachable teardown: %s", self._input.provider_id, e)
        self._state.admission_told = True  # once: a release retried after a failure is the same teardown

    async def _wait_for_progress(self, obs: AdvertisementObservation, step: Step) -> None:
        """`step` ran and is due again: nothing it did shows. Say so, wait for a change or the backoff
        (NO_PROGRESS_BACKOFF_FIRST doubling to NO_PROGRESS_BACKOFF_MAX), then let the next pass act again."""
        self._state.stalls += 1
        backoff = min(NO_PROGRESS_BACKOFF_MAX, NO_PROGRESS_BACKOFF_FIRST * 2 ** min(self._state.stalls - 1, 16))
        self._state.stalled_until = workflow.now() + backoff
        self._publish(obs, step)
        try:
            await workflow.wait_condition(lambda: self._changed, timeout=backoff,
                                          timeout_summary=f"{step} made no progress: again in {backoff}")  # fmt: skip
        except TimeoutError:
            pass
        self._continue_as_new_if_suggested()  # a stall that lasts days must not grow the history without end

    async def _clean_provider(self) -> bool:
        """`tidepool unpeer --force`, once everything here is gone: the copies of our pods in the provider,
        tried again while the last Advertisement could live; then the credentials it gave us. True when they
        were kept for a new Advertisement of the same provider (peered again)."""
        provider = self._input.provider_id
        request = CleanProviderInput(provider_id=provider)
        until = self._state.provider_cleanup_until or workflow.now()
        if self._state.provider_cleanup_outcome is None:
            result = await until_expired(
                lambda: workflow.execute_activity_method(
                    ConsumerActivities.clean_provider, request, start_to_close_timeout=OTHER_SIDE_TIMEOUT,
                    retry_policy=ONE_ATTEMPT, summary=f"clean in {provider} after a forced unpeer",
                ),
                until=until, retrying=self._retrying, summary=f"{provider} unreachable: retry",
                # A time to live of days means thousands of retries: the state carries the deadline over.
                between=self._continue_as_new_if_suggested,
            )  # fmt: skip
            if not isinstance(result, GaveUp):
                outcome = (f"cleaned ({result.note})" if result.cleaned
                           else f"not cleaned: {result.note}; {PROVIDER_CLEANS_ITSELF}")  # fmt: skip
            elif result.non_retryable:
                outcome = f"not cleaned: {result.failure}; {PROVIDER_CLEANS_ITSELF}"
            else:
                outcome = f"{result.not_reached()}: {PROVIDER_CLEANS_ITSELF}"
            self._state.provider_cleanup_outcome = outcome
        self._state.last_error = None
        self._publish_last()
        kept = await self._activity(ConsumerActivities.delete_provider_credentials, request,
                                    summary="delete the credentials")  # fmt: skip
        return bool(kept)

    def _retrying(self, failure: str) -> None:
        self._state.last_error = failure
        self._publish_last()

    def _publish_last(self) -> None:
        if self._observation is not None and self._step is not None:
            self._publish(self._observation, self._step)

    def _continue_as_new_if_suggested(self) -> None:
        # Updates wait for the loop's next pass, so never block on them: continue-as-new only
        # between them (a suggestion is not a deadline).
        if workflow.info().is_continue_as_new_suggested() and workflow.all_handlers_finished():
            self._disarm()
            workflow.continue_as_new(self._input.model_copy(update={"state": self._state}))

    async def _act(self, step: Step) -> bool:
        """Runs one acting step; False only when DeleteExpired found nothing to delete."""
        provider, name = self._input.provider_id, self._input.advertisement
        if step == "DeleteExpired":
            return bool(await self._activity(ConsumerActivities.delete_expired,
                                             DeleteExpiredInput(advertisement=name), summary=step))  # fmt: skip
        if step == "EnsureFinalizer":
            await self._activity(ConsumerActivities.ensure_finalizer, EnsureFinalizerInput(advertisement=name),
                                 summary=step)  # fmt: skip
        elif step == "EnsureVirtualKubelet":
            await self._activity(ConsumerActivities.ensure_virtual_kubelet,
                                 EnsureVirtualKubeletInput(provider_id=provider, advertisement=name), summary=step)
        elif step == "MarkDeleting":
            await self._activity(ConsumerActivities.mark_deleting,
                                 MarkDeletingInput(advertisement=name, teardown=self._teardown()), summary=step)
        elif step == "DeleteVirtualNode":
            await self._activity(ConsumerActivities.delete_virtual_node, DeleteVirtualNodeInput(provider_id=provider),
                                 summary=step)  # fmt: skip
        elif step == "DeleteVirtualKubelet":
            await self._activity(ConsumerActivities.delete_virtual_kubelet,
                                 DeleteVirtualKubeletInput(provider_id=provider), summary=step)
        elif step == "RefuseNotReady":
            await self._activity(ConsumerActivities.refuse_not_ready, RefuseNotReadyInput(advertisement=name),
                                 summary=step)  # fmt: skip
        elif step == "ReleaseAdvertisement":
            await self._activity(ConsumerActivities.release_advertisement,
                                 ReleaseAdvertisementInput(advertisement=name, teardown=self._teardown()), summary=step)
        return True

    def _teardown(self) -> TeardownCause:
        # next_step returns a teardown step only with a cause, latched in the state.
        assert self._state.teardown is not None, "a teardown step without a teardown cause"
        return self._state.teardown

    def _succeeded(self) -> None:
        self._failures = 0
        self._state.last_error = None

    async def _wait_out(self, failure: ActivityError) -> None:
        """Records an activity failure where the Web UI shows it (current details, status query) and waits
        for the next change or a backoff that doubles up to FAILURE_BACKOFF_MAX: a long-running workflow
        does not fail on a forbidden call; someone fixes the RBAC, and it carries on."""
        self._state.last_error = describe_failure(failure)
        self._failures += 1
        backoff = min(FAILURE_BACKOFF_MAX, FAILURE_BACKOFF_FIRST * 2 ** (self._failures - 1))
        if self._observation is not None and self._step is not None:
            self._publish(self._observation, self._step)
        else:  # the first look failed: nothing observed to show yet
            workflow.set_current_details(f"**Advertisement from `{self._input.provider_id}`**\n\n"
                                         f"- last failure: {self._state.last_error}")  # fmt: skip
        try:
            await workflow.wait_condition(lambda: self._changed, timeout=backoff,
                                          timeout_summary=f"after a failure: retry in {backoff}")  # fmt: skip
        except TimeoutError:
            pass
        self._continue_as_new_if_suggested()  # a failure that lasts days must not grow the history without end

    async def _wait_for_change_or_deadline(self, obs: AdvertisementObservation, step: Step) -> None:
        """Waits for a signal or the armed deadline. The timer outlives the wake: only an earlier deadline
        replaces it, so a wake that changes nothing starts none. A timer that fires for a deadline no
        longer current (a renewed TTL, a provider reachable again) only makes the next pass re-read."""
        now = workflow.now()
        if self._deadline_timer is not None and self._deadline_timer.done():  # fired while acting
            self._deadline_timer, self._deadline = None, None
        delay = wake_after(obs, self._state, step, now)
        if delay is not None and (self._deadline is None or now + delay < self._deadline):
            self._disarm()
            self._deadline = now + delay
            self._deadline_timer = asyncio.create_task(workflow.sleep(delay, summary=f"{step}: deadline"))
        timer = self._deadline_timer
        await workflow.wait_condition(lambda: self._changed or (timer is not None and timer.done()))
        if timer is None or not timer.done():
            return
        self._deadline_timer, self._deadline = None, None
        accepted_at = self._state.accepted_at
        if (step == "AwaitPodCIDR" and accepted_at is not None and not self._state.pod_cidr_timed_out
                and workflow.now() >= accepted_at + timedelta(seconds=obs.pod_cidr_wait_timeout_seconds)):  # fmt: skip
            self._state.pod_cidr_timed_out = True
            await self._activity(ConsumerActivities.report_pod_cidr_timeout, self._input.advertisement,
                                 summary="PodCIDR wait timed out")  # fmt: skip

    def _disarm(self) -> None:
        if self._deadline_timer is not None and not self._deadline_timer.done():
            self._deadline_timer.cancel()
        self._deadline_timer, self._deadline = None, None

    async def _activity(self, method: Callable[..., Any], arg: Any, *, summary: str) -> Any:
        return await workflow.execute_activity_method(
            method, arg, start_to_close_timeout=KUBE_TIMEOUT, retry_policy=KUBE_RETRY, summary=summary
        )

    def _publish(self, obs: AdvertisementObservation, step: Step) -> None:
        phase = obs.phase or "Pending"
        if workflow.info().typed_search_attributes.get(ADVERTISEMENT_PHASE) != phase:
            workflow.upsert_search_attributes([ADVERTISEMENT_PHASE.value_set(phase)])
        workflow.set_current_details(render_details(self._input.provider_id, obs, self._state, step,
                                                   read_at=self._observed_at or workflow.now()))  # fmt: skip

    # Handlers -----------------------------------------------------------------------------------------
    @workflow.signal
    def changed(self) -> None:
        """From the watchers: the Advertisement, its Deployment or its node changed; look again."""
        self._changed = True

    @workflow.signal
    def verdict(self, verdict: Verdict) -> None:
        """From the admission workflow: its pass wrote this decision on an Advertisement decided by hand."""
        if verdict.advertisement != self._input.advertisement:  # an earlier Advertisement of the provider
            return
        self._verdict = verdict
        self._changed = True

    @workflow.update
    async def accept(self, reason: str) -> str:
        """Manual acceptance: recorded on the Advertisement (annotation), decided by the admission
        workflow; returns the phase once decided."""
        return await self._decide("accept", reason)

    @workflow.update
    async def refuse(self, reason: str) -> str:
        return await self._decide("refuse", reason)

    async def _decide(self, decision: Literal["accept", "refuse"], reason: str) -> str:
        """The decision is recorded on the Advertisement (annotation: where kubectl users make it too, and what
        admission reads); the admission workflow decides (maybe still a refusal, e.g. a denied cluster) and
        signals its verdict once written."""
        self._verdict = None  # one from before this decision answers another
        await self._activity(ConsumerActivities.record_manual_decision,
                             ManualDecision(advertisement=self._input.advertisement, decision=decision, reason=reason),
                             summary=f"manual {decision}")  # fmt: skip
        undecided = AWAITING_A_PERSON | LIFTED_BY_ACCEPT if decision == "accept" else AWAITING_A_PERSON
        if not workflow.patched(VERDICT_SIGNALLED):
            return await self._poll_for_decision(undecided)

        def answered() -> bool:
            v = self._verdict
            return v is not None and v.decision == decision and _admission_answered(v.phase, v.reason, undecided)

        try:
            await workflow.wait_condition(answered, timeout=VERDICT_TIMEOUT, timeout_summary="no verdict: Pending")
        except TimeoutError:
            return "Pending"
        assert self._verdict is not None
        return self._record_decided(self._verdict.phase)

    async def _poll_for_decision(self, undecided: frozenset[tuple[str, str]]) -> str:
        """0.1.0's updates: look until admission has decided, DECISION_CHECKS times."""
        for _ in range(DECISION_CHECKS):
            obs = await self._activity(ConsumerActivities.observe_advertisement, self._input.advertisement,
                                       summary="decided?")  # fmt: skip
            if _admission_answered(obs.phase, obs.reason, undecided):
                return self._record_decided(str(obs.phase))
            await workflow.sleep(DECISION_CHECK_INTERVAL)
        return "Pending"

    def _record_decided(self, phase: str) -> str:
        self._decided = phase  # the validators refuse a second decision
        self._changed = True  # the main loop builds on it at once
        return phase

    @accept.validator
    def _validate_accept(self, reason: str) -> None:
        self._validate_decision(reason, AWAITING_A_PERSON | LIFTED_BY_ACCEPT)

    @refuse.validator
    def _validate_refuse(self, reason: str) -> None:
        self._validate_decision(reason, AWAITING_A_PERSON)

    def _validate_decision(self, reason: str, overturnable: frozenset[tuple[str, str]]) -> None:
        """Refusals reach the CLI as they are: a non-retryable ApplicationError of type InvalidDecision."""
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 256:
            raise _invalid_decision("give a reason: a non-empty text of at most 256 characters")
        if self._state.teardown is not None:
            raise _invalid_decision(f"{self._input.advertisement} is being torn down ({self._state.teardown})")
        phase = self._decided or (self._observation.phase if self._observation is not None else None)
        phase = phase or self._state.observed_phase  # a run continued as new has not looked yet
        # One refused because nobody decided in time, or for a virtual node never Ready, awaits a person's word.
        timed_out = self._decided is None and self._observation is not None and \
            (self._observation.phase, self._observation.reason) in overturnable  # fmt: skip
        if phase not in (None, "Pending") and not timed_out:
            raise _invalid_decision(f"{self._input.advertisement} is already {phase}; only a Pending one, or one "
                                    "refused as DecisionTimedOut or VirtualNodeNotReady (or by hand, to accept it), "
                                    "is decided by hand")  # fmt: skip

    @workflow.query
    def status(self) -> AdvertisementState:
        return self._state


def _admission_answered(phase: str | None, reason: str | None, undecided: frozenset[tuple[str, str]]) -> bool:
    """Whether admission has answered a decision by hand: not Pending, nor a refusal still awaiting a person."""
    return phase not in (None, "Pending") and (phase, reason) not in undecided


def _invalid_decision(why: str) -> ApplicationError:
    return ApplicationError(f"cannot decide by hand: {why}", type="InvalidDecision", non_retryable=True)
