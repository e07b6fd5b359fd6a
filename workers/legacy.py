"""Runs that the previous release started under ids without the home cluster (`peering-<foreign>`,
`advertisement-<provider>`; kept for runs started before issue 15). A worker upgraded in place keeps
signalling such a run, found on its own task queue, instead of starting a second loop beside it under the
new id; once that run has completed, the new id takes over. In a shared Temporal namespace the old id may
be another cluster's run: its task queue tells them apart, and another cluster's run is left alone.

Cheap: one describe per foreign cluster at first sight, cached; a cluster found without a legacy run is
never looked up again (no worker starts one any more). Used by workers/provider.py and workers/consumer.py,
from the worker's event loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from workers.watching import signal_if_running


class LegacyRuns:
    def __init__(self, client: Client, *, task_queue: str, legacy_id: Callable[[str], str]) -> None:
        self._client = client
        self._task_queue = task_queue
        self._legacy_id = legacy_id
        self._running: dict[str, bool] = {}  # by foreign cluster id: whether a legacy run of ours runs

    async def running(self, foreign: str, *, recheck: bool = False) -> str | None:
        """The legacy id while a run of ours runs under it, else None. With `recheck`, a run known to be
        running is looked up again: before a start, which must not be skipped for a run that has completed."""
        known = self._running.get(foreign)
        if known is None or (known and recheck):
            known = self._running[foreign] = await self._ours_running(foreign)
        return self._legacy_id(foreign) if known else None

    async def signal(self, foreign: str, workflow_id: str, signal: str, *args: Any) -> None:
        """Signal the legacy run while it runs, else the run under `workflow_id` (none running: nothing to tell)."""
        legacy = await self.running(foreign)
        if legacy is not None:
            if await signal_if_running(self._client, legacy, signal, *args):
                return
            self._running[foreign] = False  # it has completed since: the new id takes over
        await signal_if_running(self._client, workflow_id, signal, *args)

    def completed(self, foreign: str) -> None:
        self._running[foreign] = False

    async def _ours_running(self, foreign: str) -> bool:
        try:
            description = await self._client.get_workflow_handle(self._legacy_id(foreign)).describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return description.status == WorkflowExecutionStatus.RUNNING and description.task_queue == self._task_queue
