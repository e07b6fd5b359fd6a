"""What every set of watchers shares: informers started and stopped together, and Temporal calls
handed from the informers' handler threads to the worker's event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from kube.informer import Informer

log = logging.getLogger(__name__)


class Watchers:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._informers: list[Informer[Any]] = []

    def start(self) -> None:
        for informer in self._informers:
            informer.start()

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()

    def _submit(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Informers call handlers on threads of their own; Temporal calls belong to the worker's event loop."""
        assert self._loop is not None, "watchers that call Temporal need the worker's loop"
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        future.add_done_callback(_log_failure)


async def signal_if_running(client: Client, workflow_id: str, signal: str, *args: Any) -> bool:
    """Whether a run under `workflow_id` took the signal: none running (NOT_FOUND) has nothing to be told."""
    try:
        await client.get_workflow_handle(workflow_id).signal(signal, args=args)
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return False
    return True


def _log_failure(future: Future[None]) -> None:
    if future.exception() is not None:
        log.warning("watcher call failed: %s", future.exception())
