"""PoolSchedulerWorkflow against a stubbed pass, on a Temporal dev server with time skipping: what makes a
pass (a change signal, the resync once a period, which signals do not restart), continue-as-new, and a
pass that fails for good without failing the workflow. Seconds each, no clusters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TypeVar

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import TimeSkipper
from temporalio.worker import Worker

from models.pool.result import MoveInput, MoveProgress, PoolDecision, PoolPassResult
from workflows.pool import PoolSchedulerWorkflow

pytestmark = [pytest.mark.workflow, pytest.mark.pool]

T = TypeVar("T")
SETTLE_SECONDS = 10  # how long a stubbed pass may take to be scheduled and run on a loaded machine


class StubPass:
    """The pass as the workflow sees it: counts its calls, fails the ones it is told to."""

    def __init__(self, *, failing: set[int] | None = None) -> None:
        self.calls = 0
        self._failing = failing or set()

    @activity.defn(name="schedule_pool")
    def schedule_pool(self) -> PoolPassResult:
        self.calls += 1
        if self.calls in self._failing:
            raise ApplicationError("patch namespaces: forbidden", type="KubernetesForbidden", non_retryable=True)
        return PoolPassResult(clusters={"s1": "Ready"},
                              decisions=[PoolDecision(namespace="shop", placement={"s1": self.calls}, reason="placed")])  # fmt: skip


async def settled(condition: Callable[[], bool]) -> None:
    """Waits until `condition` holds or SETTLE_SECONDS pass; the caller asserts what it waited for."""
    for _ in range(SETTLE_SECONDS * 20):
        if condition():
            return
        await asyncio.sleep(0.05)


async def queried(query: Callable[[], Awaitable[T]], until: Callable[[T], bool]) -> T:
    """The query's answer once `until` holds of it, or after SETTLE_SECONDS; the caller asserts on it."""
    for _ in range(SETTLE_SECONDS * 20):
        answer = await query()
        if until(answer):
            break
        await asyncio.sleep(0.05)
    return answer


class StubSaga(StubPass):
    """A namespace whose slices drain until its moved pod runs (`runs` set by the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []
        self.runs = False
        self.finished = False

    @activity.defn(name="schedule_pool")
    def schedule_pool(self) -> PoolPassResult:
        self.calls += 1
        self.steps.append("pass")
        return PoolPassResult(draining={} if self.finished else {"shop": {"s1": 1}})

    @activity.defn(name="move_pods")
    def move_pods(self, move: MoveInput) -> MoveProgress:
        self.steps.append(f"move_pods({move.namespace})")
        moved = {"web": "s1 → s2"} if self.steps.count(self.steps[-1]) == 1 else {}
        return MoveProgress(namespace=move.namespace, draining={"s1": 1}, moved=moved,
                            waiting=[] if self.runs else ["web"], finishable=["s1"] if self.runs else [])  # fmt: skip

    @activity.defn(name="finish_move")
    def finish_move(self, move: MoveInput) -> MoveProgress:
        self.steps.append(f"finish_move({move.namespace})")
        self.finished = True
        return MoveProgress(namespace=move.namespace, finishable=["s1"])


@asynccontextmanager
async def scheduler(client: Client, stub: StubPass) -> AsyncIterator[WorkflowHandle[PoolSchedulerWorkflow, None]]:
    task_queue = f"test-pool-{uuid.uuid4().hex[:12]}"
    steps = [stub.move_pods, stub.finish_move] if isinstance(stub, StubSaga) else []
    with ThreadPoolExecutor(2) as executor:
        async with Worker(client, task_queue=task_queue, workflows=[PoolSchedulerWorkflow],
                          activities=[stub.schedule_pool, *steps], activity_executor=executor):  # fmt: skip
            handle = await client.start_workflow(PoolSchedulerWorkflow.run, id=f"pool-{uuid.uuid4()}",
                                                 task_queue=task_queue)  # fmt: skip
            try:
                yield handle
            finally:
                await handle.terminate("test over")


async def test_a_change_signal_makes_a_pass(workflow_client: Client) -> None:
    stub = StubPass()
    async with scheduler(workflow_client, stub) as handle:
        await settled(lambda: stub.calls >= 1)
        assert stub.calls == 1  # the first pass, at start
        await handle.signal(PoolSchedulerWorkflow.changed)
        await settled(lambda: stub.calls >= 2)
        assert stub.calls == 2
        last = await queried(lambda: handle.query(PoolSchedulerWorkflow.last_pass),
                             lambda last: last is not None and last.decisions[0].placement == {"s1": 2})  # fmt: skip
    assert last is not None and last.decisions[0].placement == {"s1": 2}


async def test_the_resync_runs_once_a_period_and_a_signal_does_not_restart_it(workflow_client: Client) -> None:
    stub = StubPass()
    skipper = TimeSkipper(workflow_client)
    async with scheduler(skipper.client, stub) as handle:
        await settled(lambda: stub.calls >= 1)
        assert stub.calls == 1  # at 0 min
        assert await skipper.fast_forward(handle, timedelta(minutes=5))
        await handle.signal(PoolSchedulerWorkflow.changed)
        await settled(lambda: stub.calls >= 2)
        assert stub.calls == 2  # at 5 min, signalled
        assert await skipper.fast_forward(handle, timedelta(minutes=6))
        await settled(lambda: stub.calls >= 3)
        assert stub.calls == 3  # at 10 min: the resync started at 0, not at the signal (that would be 15)
        assert await skipper.fast_forward(handle, timedelta(minutes=10))
        await settled(lambda: stub.calls >= 4)
        assert stub.calls == 4  # at 20 min


async def test_a_long_run_continues_as_new_and_keeps_passing(workflow_client: Client) -> None:
    stub = StubPass()
    skipper = TimeSkipper(workflow_client)
    async with scheduler(skipper.client, stub) as handle:
        await settled(lambda: stub.calls >= 1)
        first_run = (await handle.describe()).run_id
        for _ in range(8):  # the test server suggests continue-as-new after 40 events: a few passes
            await handle.signal(PoolSchedulerWorkflow.changed)
            calls = stub.calls
            await settled(lambda: stub.calls > calls)  # noqa: B023 - awaited within the iteration
        runs = [w async for w in workflow_client.list_workflows(f"WorkflowId = '{handle.id}'")]
        latest = (await handle.describe()).run_id
    assert stub.calls == 9
    assert len(runs) > 1 and latest != first_run


async def test_a_pass_that_fails_for_good_is_recorded_and_the_next_change_passes(workflow_client: Client) -> None:
    stub = StubPass(failing={1})
    async with scheduler(workflow_client, stub) as handle:
        error = await queried(lambda: handle.query(PoolSchedulerWorkflow.last_error), lambda e: e is not None)
        assert error == "schedule_pool: KubernetesForbidden: patch namespaces: forbidden"
        assert stub.calls == 1  # non-retryable: not retried by the activity's policy
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        await handle.signal(PoolSchedulerWorkflow.changed)
        error = await queried(lambda: handle.query(PoolSchedulerWorkflow.last_error), lambda e: e is None)
        assert error is None
        assert stub.calls == 2


async def test_a_move_is_steps_after_the_pass_that_wait_for_the_moved_pods_and_finish_once_they_run(
    workflow_client: Client,
) -> None:
    stub = StubSaga()
    skipper = TimeSkipper(workflow_client)
    async with scheduler(skipper.client, stub) as handle:
        await settled(lambda: len(stub.steps) >= 2)
        assert stub.steps == ["pass", "move_pods(shop)"]  # the pod is not running yet: no finish
        current = await queried(lambda: _details(handle), lambda text: "Moves in progress" in text)
        assert "| shop | s1×1 | recreated web (s1 → s2); waiting for web to run |" in current, current
        assert await skipper.fast_forward(handle, timedelta(seconds=50))
        assert stub.steps == ["pass", "move_pods(shop)"]  # no look again before the backstop
        assert await skipper.fast_forward(handle, timedelta(seconds=15))
        await settled(lambda: len(stub.steps) >= 4)
        assert stub.steps == ["pass", "move_pods(shop)"] * 2  # the backstop: a lost watch event is covered
        stub.runs = True
        await handle.signal(PoolSchedulerWorkflow.changed)  # the moved pod runs: its watcher signals
        await settled(lambda: len(stub.steps) >= 7)
        assert stub.steps[4:] == ["pass", "move_pods(shop)", "finish_move(shop)"]
        current = await queried(lambda: _details(handle), lambda text: "Moves in progress" in text)
        assert "finished leaving s1" in current
        await handle.signal(PoolSchedulerWorkflow.changed)
        await settled(lambda: len(stub.steps) >= 8)
        assert stub.steps[7:] == ["pass"]  # nothing drains any more: no step after the pass
        current = await queried(lambda: _details(handle), lambda text: "Moves in progress" not in text)
        assert "Moves in progress" not in current


async def _details(handle: WorkflowHandle[PoolSchedulerWorkflow, None]) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(metadata.current_details)
