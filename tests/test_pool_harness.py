"""The end-to-end pool tests' harness (tests/pool.py), without clusters: a pool worker that dies with an error
fails the test at teardown instead of being discarded with the tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tests.pool import WorkerDied, WorkerTasks

pytestmark = pytest.mark.pool


async def _serves(stop: asyncio.Event) -> None:
    await stop.wait()


async def _crashes(stop: asyncio.Event) -> None:
    raise RuntimeError("the scheduler's watch lost its connection")


async def _crashes_once_told_to_stop(stop: asyncio.Event) -> None:
    await stop.wait()
    raise RuntimeError("the lease could not be released")


async def test_workers_that_return_when_told_and_a_killed_one_stop_quietly() -> None:
    workers = WorkerTasks()
    workers.start(_serves)
    await asyncio.sleep(0)
    workers.kill()  # as test_a_worker_killed_in_the_middle_of_a_move_converges does, then starts another
    workers.start(_serves)
    await asyncio.sleep(0)
    await workers.stop()


@pytest.mark.parametrize("run", [pytest.param(_crashes, id="a worker that crashed while the test ran"),
                                 pytest.param(_crashes_once_told_to_stop, id="a worker that crashed stopping")])  # fmt: skip
async def test_a_worker_that_died_with_an_error_fails_the_teardown(
    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
) -> None:
    workers = WorkerTasks()
    workers.start(_serves)
    workers.start(run)
    await asyncio.sleep(0)
    with pytest.raises(WorkerDied, match=r"pool worker #2 died: RuntimeError") as died:
        await workers.stop()
    assert isinstance(died.value.__cause__, RuntimeError)


async def test_a_worker_that_crashed_before_the_test_killed_it_still_fails_the_teardown() -> None:
    workers = WorkerTasks()
    workers.start(_crashes)
    await asyncio.sleep(0.01)  # dead already
    workers.kill()  # too late: the kill does not hide the crash
    with pytest.raises(WorkerDied, match="lost its connection"):
        await workers.stop()


async def _cancelled_from_within(stop: asyncio.Event) -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()  # as a fatal error of Temporal's Worker cancels the task it runs in
    await stop.wait()


async def test_a_worker_cancelled_by_something_other_than_a_kill_fails_the_teardown() -> None:
    workers = WorkerTasks()
    workers.start(_cancelled_from_within)
    await asyncio.sleep(0.01)
    with pytest.raises(WorkerDied, match="CancelledError"):
        await workers.stop()
