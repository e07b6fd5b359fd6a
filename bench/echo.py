"""The bare Temporal workflows the benchmarks compare with, in a module of their own because the workflow
sandbox re-imports a workflow's module and this one imports nothing but temporalio:

- EchoWorkflow (push_latency): a signal wakes the workflow, which runs one activity;
- TickWorkflow (actions_per_day): the least a periodic push can cost, one activity and one timer per
  period, continuing as new when the server suggests it."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from temporalio import activity, workflow

TIMEOUT = timedelta(seconds=30)


class EchoActivities:
    def __init__(self, on_run: Callable[[int, float], None]) -> None:
        self._on_run = on_run

    @activity.defn
    async def echo(self, value: int) -> int:
        self._on_run(value, time.perf_counter())
        return value


@workflow.defn
class TickWorkflow:
    @workflow.run
    async def run(self, period_seconds: int) -> None:
        while True:
            await workflow.execute_activity_method(EchoActivities.echo, 0, start_to_close_timeout=TIMEOUT)
            if workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(period_seconds)
            await workflow.sleep(period_seconds)


@workflow.defn
class EchoWorkflow:
    def __init__(self) -> None:
        self._pending: list[int] = []
        self._stop = False

    @workflow.run
    async def run(self) -> int:
        done = 0
        while True:
            await workflow.wait_condition(lambda: bool(self._pending) or self._stop)
            if not self._pending:
                return done
            value = self._pending.pop(0)
            await workflow.execute_activity_method(EchoActivities.echo, value, start_to_close_timeout=TIMEOUT)
            done += 1

    @workflow.signal
    def ping(self, value: int) -> None:
        self._pending.append(value)

    @workflow.signal
    def stop(self) -> None:
        self._stop = True
