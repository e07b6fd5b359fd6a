"""AdmissionWorkflow: the one place a consumer cluster decides which Advertisements it accepts, id
`admission-<cluster id>`. Watchers signal `changed` whenever an Advertisement or the ClusterConfig
changes; signals that arrive while a pass runs are folded into the next pass. One pass at a time is
what keeps twenty Advertisements arriving at once from overshooting the maximum: the decision itself
is a pure function of the cluster's Advertisements (models/admission.py), never a counter that drifts.

No periodic recheck: the watchers signal everything admission reads, and an Advertisement that expires
is deleted by its AdvertisementWorkflow, which signals this one; an idle admission costs nothing.

The pass is given the workflow's time, and while a manual decision is awaited under
manualDecisionTimeoutSeconds, a durable timer (shown in the Web UI) wakes the workflow at the earliest
deadline, so that the pass it starts refuses what nobody decided. A decision a pass writes on an
Advertisement decided by hand is signalled (`verdict`) to its AdvertisementWorkflow, whose accept or refuse
update is waiting for it.

An AdvertisementWorkflow torn down because its provider was unreachable signals
`provider_unreachable`; the workflow keeps, across continue-as-new, each such provider's teardowns in a row,
hands them to every pass (the provider's re-pushed Advertisement is refused UnreachableBackoff, 1 min doubling
to 1 h), and passes again when the back-off ends: no teardown → re-push → re-accept loop at full speed.
Likewise it keeps the consumer's own refusals (by hand, and of an offer whose virtual node was never Ready)
that each pass returns, and hands them to the next: a provider that deletes its refused Advertisement and
pushes a new one finds it refused too (models/admission.py kept_refusals).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

from workflows.failures import describe_failure
from workflows.search_attributes import HOME_CLUSTER

with workflow.unsafe.imports_passed_through():
    from activities.consumer import ConsumerActivities
    from models.consumer import AdmissionInput, AdmissionResult, UnreachableTeardowns, Verdict, record_unreachable
    from models.names import advertisement_workflow_id

ADMIT_TIMEOUT = timedelta(seconds=60)
ADMIT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
# A pass the retry policy gave up on (a permanent failure: a forbidden list) is shown and retried at the
# next signal, or after this long.
FAILED_PASS_RETRY = timedelta(minutes=5)


@workflow.defn
class AdmissionWorkflow:
    @workflow.init
    def __init__(self, input: AdmissionInput) -> None:
        self._input = input
        self._pending = True
        self._last: AdmissionResult | None = None

    @workflow.run
    async def run(self, input: AdmissionInput) -> None:
        workflow.upsert_search_attributes([HOME_CLUSTER.value_set(input.cluster_id)])
        while True:
            self._pending = False
            # The activity's every parameter, always: with fewer arguments than parameters the SDK decodes none
            # by its type (the time would arrive as text).
            args: list[object] = [input.cluster_id, workflow.now(), self._input.unreachable, self._input.refusals]
            try:
                self._last = await workflow.execute_activity_method(
                    ConsumerActivities.admit_advertisements, args=args,
                    start_to_close_timeout=ADMIT_TIMEOUT, retry_policy=ADMIT_RETRY, summary="admission pass",
                )  # fmt: skip
            except ActivityError as failure:  # the retry policy gave up: permanent, or not retried
                await self._wait_out(failure)
                self._continue_as_new_if_suggested()  # a failure that lasts days must not grow the history
                continue
            self._input.reconciles += 1
            self._input.refusals = self._last.kept_refusals
            if self._last.verdicts:  # no patch: 0.1.0's passes return none, so its histories never get here
                await asyncio.gather(*(self._tell(verdict) for verdict in self._last.verdicts))
            workflow.set_current_details(_details(self._last, self._input.reconciles, self._backing_off(),
                                                  sorted(self._input.refusals)))  # fmt: skip
            backoff_end = min((r.until for r in self._backing_off().values()), default=None)
            if backoff_end is not None and (self._last.next_decision_deadline is None
                                            or backoff_end < self._last.next_decision_deadline):
                await self._wait_until(backoff_end, f"unreachable back-off ends {backoff_end:%Y-%m-%d %H:%M:%S} UTC")
            elif self._last.next_decision_deadline is not None:
                await self._wait_until(self._last.next_decision_deadline)
            else:
                await workflow.wait_condition(lambda: self._pending)
            self._continue_as_new_if_suggested()

    async def _tell(self, verdict: Verdict) -> None:
        """The Advertisement's workflow answers its accept or refuse update with the verdict."""
        handle = workflow.get_external_workflow_handle(advertisement_workflow_id(self._input.cluster_id,
                                                                                 verdict.provider))  # fmt: skip
        try:
            await handle.signal("verdict", verdict)
        except FailureError as e:  # none running (decided by kubectl alone, or it ended): nobody waits
            workflow.logger.info("verdict on %s not signalled: %s", verdict.advertisement, e)

    def _continue_as_new_if_suggested(self) -> None:
        # Updates wait for the loop's next pass, so never block on them: continue-as-new only
        # between them (a suggestion is not a deadline).
        if workflow.info().is_continue_as_new_suggested() and workflow.all_handlers_finished():
            workflow.continue_as_new(self._input)

    async def _wait_out(self, failure: ActivityError) -> None:
        """Shows the failure in the current details and waits for the next signal or FAILED_PASS_RETRY: the
        one admission workflow of a cluster does not fail on a forbidden call."""
        error = describe_failure(failure)
        details = _details(self._last, self._input.reconciles) if self._last else "**Admission**"
        workflow.set_current_details(f"{details}\n\n**last pass failed** (retried at the next change or in "
                                     f"{FAILED_PASS_RETRY}): {error}")  # fmt: skip
        try:
            await workflow.wait_condition(lambda: self._pending, timeout=FAILED_PASS_RETRY,
                                          timeout_summary="retry the failed pass")  # fmt: skip
        except TimeoutError:
            pass

    async def _wait_until(self, deadline: datetime, summary: str | None = None) -> None:
        """The next signal, or the deadline of a manual decision still awaited (or of a back-off)."""
        delay = max(timedelta(seconds=1), deadline - workflow.now())
        try:
            await workflow.wait_condition(lambda: self._pending, timeout=delay, timeout_summary=summary
                                          or f"manual decision deadline {deadline:%Y-%m-%d %H:%M:%S} UTC")  # fmt: skip
        except TimeoutError:
            pass

    def _backing_off(self) -> dict[str, UnreachableTeardowns]:
        now = workflow.now()
        return {provider: r for provider, r in self._input.unreachable.items() if r.until > now}

    @workflow.signal
    def provider_unreachable(self, provider: str) -> None:
        """From an AdvertisementWorkflow whose teardown began because its virtual kubelet could not reach the
        provider: the provider's next Advertisement (it re-pushes as soon as this one is deleted) is refused
        until the back-off ends (models/admission.py rule 6¾), and the pass after that decides afresh."""
        if not isinstance(provider, str) or not 0 < len(provider) <= 253:
            workflow.logger.warning("ignored provider_unreachable: not a cluster id")
            return
        self._input.unreachable = record_unreachable(self._input.unreachable, provider, workflow.now())
        self._pending = True

    @workflow.signal
    def changed(self) -> None:
        """From the watchers: an Advertisement or the ClusterConfig changed; pass again."""
        self._pending = True

    @workflow.signal
    def reconcile(self) -> None:
        """0.1.0's name for `changed`: its runs' histories and workers still send it."""
        self.changed()

    @workflow.query
    def last_pass(self) -> AdmissionResult | None:
        return self._last


def _details(result: AdmissionResult, passes: int, backing_off: dict[str, UnreachableTeardowns] | None = None,
             refusing: list[str] | None = None) -> str:  # fmt: skip
    lines = [
        f"**Admission** — policy **{result.policy}**, accepted {result.total_accepted}"
        + (f" of at most {result.maximum}" if result.maximum is not None else ""),
        f"- passes: {passes}",
    ]
    if result.accepted:
        lines.append(f"- accepted in the last pass: {', '.join(result.accepted)}")
    if result.refused:
        lines += ["", "| refused | reason |", "|---|---|"]
        lines += [f"| {name} | {reason} |" for name, reason in sorted(result.refused.items())]
    if result.pending:
        lines.append(f"- pending a manual decision: {', '.join(result.pending)}")
    if result.next_decision_deadline is not None:
        lines.append(f"- next manual decision deadline: {result.next_decision_deadline:%Y-%m-%d %H:%M:%S} UTC "
                     "(manualDecisionTimeoutSeconds)")  # fmt: skip
    if refusing:
        lines.append(f"- refusals kept past their Advertisements ({len(refusing)}): {', '.join(refusing[:10])}"
                     + (", …" if len(refusing) > 10 else ""))
    if backing_off:
        lines += ["", "| backing off from | torn down as unreachable in a row | not accepted again before |", "|---|---|---|"]
        lines += [f"| {provider} | {r.count} | {r.until:%Y-%m-%d %H:%M:%S} UTC |" for provider, r in sorted(backing_off.items())]
    return "\n".join(lines)
