"""PoolSchedulerWorkflow: the one place the pool's capacity is decided, id `pool-scheduler` on the pool's
task queue. Watchers of the tenant control plane and the SuperClusters signal `changed`; each pass (one
activity) places namespaces as quota slices and pods into their namespace's clusters. One pass at a
time is what keeps a hundred namespaces created at once from overcommitting any cluster. The watchers
signal only what a pass reads; a resync once a period, without a signal, uses capacity that appears where
nothing is watched (a super cluster's nodes). Its timer runs on across signalled passes: a wake never
restarts it.

A pass that fails for good (a non-retryable error, such as a forbidden call) does not end the workflow:
the error is shown in its current details and the next change or resync tries again."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.failures import describe_failure
from workflows.search_attributes import SUPER_CLUSTERS

with workflow.unsafe.imports_passed_through():
    from activities.pool import PoolActivities
    from models.pool.result import PoolPassResult

PASS_TIMEOUT = timedelta(minutes=2)
# Unlimited: a pass is retried until it goes through, except what retrying cannot help (non-retryable
# errors reach the workflow, which waits for the next change or resync instead).
PASS_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
RECHECK = timedelta(minutes=1)  # runs started before RESYNC_ONCE_A_PERIOD: a recheck after every pass
# The advertisement period's default: nothing in tidepool wakes more often than once a period on its own.
RESYNC = timedelta(minutes=10)
RESYNC_ONCE_A_PERIOD = "pool-resync-once-a-period"


@workflow.defn
class PoolSchedulerWorkflow:
    def __init__(self) -> None:
        self._changed = True
        self._last: PoolPassResult | None = None
        self._last_error: str | None = None
        self._history: list[str] = []
        self._resync: asyncio.Future[None] | None = None

    @workflow.run
    async def run(self, passes: int = 0) -> None:
        resync_once_a_period = workflow.patched(RESYNC_ONCE_A_PERIOD)
        while True:
            self._changed = False
            try:
                result = await workflow.execute_activity_method(
                    PoolActivities.schedule_pool, start_to_close_timeout=PASS_TIMEOUT, retry_policy=PASS_RETRY,
                    summary="place namespaces and pods",
                )  # fmt: skip
            except ActivityError as e:
                self._record_failure(e)
            else:
                self._record(result)
            passes += 1
            if resync_once_a_period:
                if self._resync is None or self._resync.done():
                    self._resync = asyncio.ensure_future(workflow.sleep(RESYNC, summary="resync"))
                await workflow.wait_condition(lambda: self._changed or self._resync is None or self._resync.done())
            else:
                try:
                    await workflow.wait_condition(lambda: self._changed, timeout=RECHECK, timeout_summary="recheck")
                except TimeoutError:
                    pass
            if workflow.info().is_continue_as_new_suggested() and workflow.all_handlers_finished():
                workflow.continue_as_new(passes)

    def _record_failure(self, error: ActivityError) -> None:
        """The failure above the last pass that went through."""
        self._last_error = describe_failure(error)
        workflow.logger.warning("pool pass failed: %s", self._last_error)
        workflow.set_current_details(self._details())

    def _record(self, result: PoolPassResult) -> None:
        self._last, self._last_error = result, None
        for decision in result.decisions:
            where = ", ".join(f"{c}×{n}" for c, n in (decision.placement or {}).items()) or "not placed"
            self._history = [f"| {decision.namespace} | {where} | {decision.reason} |", *self._history][:30]
        clusters = sorted(result.clusters)
        if workflow.info().typed_search_attributes.get(SUPER_CLUSTERS) != clusters:
            workflow.upsert_search_attributes([SUPER_CLUSTERS.value_set(clusters)])
        workflow.set_current_details(self._details())

    def _details(self) -> str:
        lines = ["**Super cluster pool**", ""]
        if self._last_error is not None:
            lines += [f"Last pass failed (tried again at the next change or resync): {self._last_error}", ""]
        result = self._last or PoolPassResult()
        lines += ["| super cluster | state |", "|---|---|"]
        lines += [f"| {name} | {state} |" for name, state in sorted(result.clusters.items())]
        lines += ["", "Recent namespace decisions:", "", "| namespace | placement | why |", "|---|---|---|", *self._history]
        if result.pods_unplaced:
            lines += ["", "Pods waiting:", *[f"- {pod}: {why}" for pod, why in sorted(result.pods_unplaced.items())]]
        return "\n".join(lines)

    @workflow.signal
    def changed(self) -> None:
        self._changed = True

    @workflow.query
    def last_pass(self) -> PoolPassResult | None:
        return self._last

    @workflow.query
    def last_error(self) -> str | None:
        """Why the last pass failed for good; None once a pass went through."""
        return self._last_error
