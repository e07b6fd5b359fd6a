"""A one-activity workflow for the smoke test, in a module of its own so that the workflow sandbox
imports nothing else of the test module."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def greet(name: str) -> str:
    return f"hello {name} from {activity.info().task_queue}"


@workflow.defn
class GreetingWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(greet, name, start_to_close_timeout=timedelta(seconds=10))
