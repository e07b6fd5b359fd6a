"""Run a cluster's real worker (workers/cluster.py) inside the test's event loop, against the real
local environment, and stop it cleanly afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.client import WorkflowFailureError

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from models.settings import (
    ClusterSettings,
    HealthSettings,
    MetricsSettings,
    TemporalSettings,
    WorkerSettings,
)
from workers.cluster import run


def worker_settings(
    localenv: EnvState, cluster: LocalCluster, cluster_id: str, *, temporal_address: str | None = None,
    namespace: str = "default",
) -> WorkerSettings:  # fmt: skip
    """A worker of `cluster` on the environment's Temporal, or on the server at `temporal_address`."""
    return WorkerSettings(
        cluster=ClusterSettings(cluster_id=cluster_id, kubeconfig=str(cluster.kubeconfig)),
        temporal=TemporalSettings(address=temporal_address or localenv.temporal_address, namespace=namespace),
        metrics=MetricsSettings(port=0),
        health=HealthSettings(port=0),
    )


@asynccontextmanager
async def running_worker(settings: WorkerSettings) -> AsyncIterator[None]:
    """The worker runs beside the test body; if it stops on its own, the body is cancelled and the test
    fails with what stopped the worker, instead of waiting for a workflow nobody serves."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, stop=stop))
    body = asyncio.current_task()

    def stopped(_: asyncio.Task[None]) -> None:
        if not stop.is_set() and body is not None:
            body.cancel("the worker stopped")

    task.add_done_callback(stopped)
    try:
        await asyncio.sleep(0.5)  # the worker's pollers and watchers start
        yield
    except asyncio.CancelledError:
        if task.done() and not stop.is_set():
            raise RuntimeError("the worker stopped while the test ran") from _error_of(task)
        raise
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)


def _error_of(task: asyncio.Task[None]) -> BaseException | None:
    return None if task.cancelled() else task.exception()


# What a check raises when its condition can never hold any more: an invariant broken while waiting
# (AssertionError) or a bug in the check itself. The wait fails at once instead of retrying until the
# violation is over. Everything else is "not yet": an API error, a connection refused, a sub-call's
# TimeoutError, or a lookup into an object not written yet (KeyError, TypeError on None, ...).
NEVER: tuple[type[BaseException], ...] = (
    AssertionError,
    NameError,
    ImportError,
    NotImplementedError,
    RecursionError,
    WorkflowFailureError,
)


async def eventually(check, *, timeout: float = 30, interval: float = 0.2, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Awaits until `check()` (sync or async) returns something truthy; returns it. An exception of
    NEVER raised by the check propagates at once; any other is retried and named in the timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
        except NEVER:
            raise
        except Exception as e:  # noqa: BLE001 - "not yet": kept for the timeout message
            last_error = e
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}; last error: {last_error!r}")
        await asyncio.sleep(interval)
