"""Replay: every run of a workflow, fetched from the server, replays with the current code; with
TIDEPOOL_SAVE_HISTORIES=1 the histories are also saved to tests/histories/<release>/ (the version in
pyproject.toml), where test_replay.py keeps replaying them, so that a change that breaks workflows begun
by a released version fails a test. Save them when a release is cut, from that release's code: a
directory holds what its release recorded, never histories of the development builds after it."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from workflows.admission import AdmissionWorkflow
from workflows.advertisement import AdvertisementWorkflow
from workflows.peering import PeeringWorkflow
from workflows.pool import PoolSchedulerWorkflow

HISTORIES = Path(__file__).with_name("histories")
# The release whose histories this code records: the package's version.
RELEASE: str = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
WORKFLOWS = [PeeringWorkflow, AdmissionWorkflow, AdvertisementWorkflow, PoolSchedulerWorkflow]


# One for the session: each Replayer makes a thread pool that is never shut down.
_REPLAYER = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)


def replayer() -> Replayer:
    return _REPLAYER


def release_key(name: str) -> tuple[int, ...] | None:
    """A release directory's version, to order them ("0.10.0" after "0.9.0"); None for any other name."""
    parts = name.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def releases() -> list[Path]:
    """The release directories under tests/histories/, oldest first."""
    found = [d for d in HISTORIES.iterdir() if d.is_dir() and release_key(d.name) is not None] if HISTORIES.is_dir() else []
    return sorted(found, key=lambda d: release_key(d.name) or ())


def decided(history: WorkflowHistory) -> bool:
    """Whether the run has completed a workflow task. A run that has not has made no decision to check,
    and the replayer waits forever on a history without a workflow task: a run continued as new a moment
    ago, whose first task the server holds back when the previous run lasted less than a second."""
    return any(event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for event in history.events)


async def every_run(client: Client, workflow_id: str) -> list[str]:
    """The run ids of `workflow_id`, open or closed: those visibility lists, and the chain of runs continued as
    new back from the latest (read from the runs' own histories: visibility may not list the newest yet)."""
    runs = [execution.run_id async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    try:
        run_id: str | None = (await client.get_workflow_handle(workflow_id).describe()).run_id
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        run_id = None  # never started: no run to follow
    chain: set[str] = set()
    while run_id and run_id not in chain:
        chain.add(run_id)
        if run_id not in runs:
            runs.append(run_id)
        run_id = await continued_from(client, workflow_id, run_id)
    return runs


async def continued_from(client: Client, workflow_id: str, run_id: str) -> str:
    """The run that `run_id` continued as new from; empty for a run started, not continued."""
    async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
        return event.workflow_execution_started_event_attributes.continued_execution_run_id
    raise AssertionError(f"run {run_id} of {workflow_id} has no history")


async def run_histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """The history of every run of `workflow_id` (`every_run`), oldest first."""
    histories = [await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
                 for run_id in await every_run(client, workflow_id)]  # fmt: skip
    return sorted(histories, key=lambda history: history.events[0].event_time.ToDatetime())


async def replay_all_runs(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    histories = [history for history in await run_histories(client, workflow_id) if decided(history)]
    assert histories, f"no run of {workflow_id} has decided anything"
    for history in histories:
        await replayer().replay_workflow(history)
    if os.environ.get("TIDEPOOL_SAVE_HISTORIES"):
        directory = HISTORIES / RELEASE
        directory.mkdir(parents=True, exist_ok=True)
        for history in histories:
            name = f"{workflow_id.split('-')[0]}-{history.run_id}.json"
            (directory / name).write_text(history.to_json())
    return histories
