"""PoolSchedulerWorkflow: the one place the pool's capacity is decided, id `pool-scheduler` on the pool's
task queue. Watchers of the tenant control plane and the SuperClusters signal `changed`; each pass (one
activity) places namespaces as quota slices and pods into their namespace's clusters. One pass at a
time is what keeps a hundred namespaces created at once from overcommitting any cluster. The watchers
signal only what a pass reads; a resync once a period, without a signal, uses capacity that appears where
nothing is watched (a super cluster's nodes). Its timer runs on across signalled passes: a wake never
restarts it.

When a pass leaves namespaces draining (their slices leave clusters: models/pool/moves.py), the moves are a
saga of activities after it, each visible in the history: `move_pods(namespace)` recreates the pods
elsewhere, and `finish_move(namespace)` removes them from the old clusters once the new copies run. A moved
pod that starts running signals `changed` (models/pool/triggers.py); a bounded timer is the backstop. The
state is the namespace's annotations: a worker killed mid-move resumes at the next pass.

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
    from models.pool.result import MoveInput, MoveProgress, PoolPassResult

PASS_TIMEOUT = timedelta(minutes=2)
# Unlimited: a pass is retried until it goes through, except what retrying cannot help (non-retryable
# errors reach the workflow, which waits for the next change or resync instead).
PASS_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
# The advertisement period's default: nothing in tidepool wakes more often than once a period on its own.
RESYNC = timedelta(minutes=10)
MOVE_TIMEOUT = timedelta(minutes=2)
MOVE_RETRY = PASS_RETRY  # as the pass: a step is retried until it goes through, except for good failures
# A moved pod that runs signals; this only covers a watch event lost. Not sooner: a pod may take a minute to
# start, and each look is a pass plus a move step.
MOVE_BACKSTOP = timedelta(minutes=1)


@workflow.defn
class PoolSchedulerWorkflow:
    def __init__(self) -> None:
        self._changed = True
        self._last: PoolPassResult | None = None
        self._last_error: str | None = None
        self._history: list[str] = []
        self._resync: asyncio.Future[None] | None = None
        self._moves: dict[str, str] = {}  # namespace -> the step its move is at

    @workflow.run
    async def run(self, passes: int = 0) -> None:
        while True:
            self._changed = False
            try:
                result = await workflow.execute_activity_method(
                    PoolActivities.schedule_pool, start_to_close_timeout=PASS_TIMEOUT, retry_policy=PASS_RETRY,
                    summary="place namespaces and pods",
                )  # fmt: skip
            except ActivityError as e:
                self._record_failure(e)
                draining: dict[str, dict[str, int]] = {}
            else:
                self._record(result)
                draining = result.draining
            passes += 1
            moving = bool(draining) and await self._move(draining)
            if self._resync is None or self._resync.done():
                self._resync = asyncio.ensure_future(workflow.sleep(RESYNC, summary="resync"))
            try:
                await workflow.wait_condition(lambda: self._changed or self._resync is None or self._resync.done(),
                                              timeout=MOVE_BACKSTOP if moving else None,
                                              timeout_summary="moves in progress: look again")  # fmt: skip
            except TimeoutError:
                pass
            if workflow.info().is_continue_as_new_suggested() and workflow.all_handlers_finished():
                workflow.continue_as_new(passes)

    async def _move(self, draining: dict[str, dict[str, int]]) -> bool:
        """The saga's later steps for each draining namespace; whether a moved pod is still on its way to
        running (the backstop's only concern: a pod that fits nowhere waits for a change, which signals)."""
        in_progress = False
        for namespace in sorted(draining):
            try:
                progress: MoveProgress = await workflow.execute_activity_method(
                    PoolActivities.move_pods, MoveInput(namespace=namespace), start_to_close_timeout=MOVE_TIMEOUT,
                    retry_policy=MOVE_RETRY, summary=f"move_pods({namespace})",
                )  # fmt: skip
                step, on_its_way = _move_step(progress), bool(progress.waiting)
                if progress.finishable:
                    progress = await workflow.execute_activity_method(
                        PoolActivities.finish_move, MoveInput(namespace=namespace), start_to_close_timeout=MOVE_TIMEOUT,
                        retry_policy=MOVE_RETRY, summary=f"finish_move({namespace})",
                    )  # fmt: skip
                    step = f"finished leaving {', '.join(progress.finishable)}" + (f"; {step}" if progress.draining else "")
            except ActivityError as e:
                self._record_failure(e)
                in_progress = True
                continue
            self._moves[namespace] = f"{_clusters(progress.draining) or '-'} | {step}"
            in_progress = in_progress or on_its_way
        workflow.set_current_details(self._details())
        return in_progress

    def _record_failure(self, error: ActivityError) -> None:
        """The failure above the last pass that went through."""
        self._last_error = describe_failure(error)
        workflow.logger.warning("pool pass failed: %s", self._last_error)
        workflow.set_current_details(self._details())

    def _record(self, result: PoolPassResult) -> None:
        self._last, self._last_error = result, None
        self._moves = {ns: step for ns, step in self._moves.items() if ns in result.draining}  # the others ended
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
        if self._moves:
            lines += ["", "Moves in progress:", "", "| namespace | leaving | step |", "|---|---|---|"]
            lines += [f"| {ns} | {step} |" for ns, step in sorted(self._moves.items())]
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


def _clusters(counts: dict[str, int]) -> str:
    return ", ".join(f"{c}×{n}" for c, n in sorted(counts.items()))


def _move_step(progress: MoveProgress) -> str:
    parts = []
    if progress.moved:
        parts.append("recreated " + ", ".join(f"{pod} ({how})" for pod, how in sorted(progress.moved.items())))
    if progress.waiting:
        parts.append("waiting for " + ", ".join(progress.waiting) + " to run")
    if progress.stuck:
        parts.append("fit nowhere else: " + ", ".join(f"{pod} ({why})" for pod, why in sorted(progress.stuck.items())))
    return "; ".join(parts) or "pods moved"
