"""Replay: every run of a workflow, fetched from the server, replays with the current code; with
TIDEPOOL_SAVE_HISTORIES=1 the histories are also saved to tests/histories/, where test_replay.py keeps
replaying them, so that a change that breaks running workflows fails a test."""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.admission import AdmissionWorkflow
from workflows.advertisement import AdvertisementWorkflow
from workflows.peering import PeeringWorkflow
from workflows.pool import PoolSchedulerWorkflow

HISTORIES = Path(__file__).with_name("histories")
WORKFLOWS = [PeeringWorkflow, AdmissionWorkflow, AdvertisementWorkflow, PoolSchedulerWorkflow]


# One for the session: each Replayer makes a thread pool that is never shut down.
_REPLAYER = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)


def replayer() -> Replayer:
    return _REPLAYER


def decided(history: WorkflowHistory) -> bool:
    """Whether the run has completed a workflow task. A run that has not has made no decision to check,
    and the replayer waits forever on a history without a workflow task: a run continued as new a moment
    ago, whose first task the server holds back when the previous run lasted less than a second."""
    return any(event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for event in history.events)


async def run_histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """The history of every run of `workflow_id`, in the server's listing order."""
    return [await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
            async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'")]  # fmt: skip


async def replay_all_runs(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    histories = [history for history in await run_histories(client, workflow_id) if decided(history)]
    assert histories, f"no run of {workflow_id} has decided anything"
    for history in histories:
        await replayer().replay_workflow(history)
    if os.environ.get("TIDEPOOL_SAVE_HISTORIES"):
        HISTORIES.mkdir(exist_ok=True)
        for history in histories:
            name = f"{workflow_id.split('-')[0]}-{history.run_id}.json"
            (HISTORIES / name).write_text(history.to_json())
    return histories
