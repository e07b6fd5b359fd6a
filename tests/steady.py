"""History helpers for the steady-state tests: what a workflow did, over every run of its chain, and the
history once it sleeps, so that a test can say that a window of churn added nothing to it."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client

from tests.replay import run_histories
from tests.running import eventually


async def history(client: Client, workflow_id: str) -> list[Any]:
    """The events of every run so far, oldest run first (the test server continues a workflow as new
    every 40 events)."""
    return [event for history in await run_histories(client, workflow_id) for event in history.events]


async def settled_history(client: Client, workflow_id: str) -> list[Any]:
    """The history once the workflow sleeps: no activity running and nothing new for 3 s."""

    async def quiet() -> list[Any] | None:
        before = await history(client, workflow_id)
        await asyncio.sleep(3)
        after = await history(client, workflow_id)
        idle = not (await client.get_workflow_handle(workflow_id).describe()).raw_description.pending_activities
        return after if idle and len(after) == len(before) else None

    result: list[Any] = await eventually(quiet, timeout=60, interval=0, what=f"{workflow_id} to sleep")
    return result
