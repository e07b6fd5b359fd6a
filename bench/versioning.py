"""versioning: Worker Versioning against patches, on the real PeeringWorkflow (issue 37, "A baseline").

What an upgrade costs the running peerings each way: `peerings` PeeringWorkflows (the real class, with the
stubbed activities of tests/test_workflow_peering.py) on a Temporal dev server of the benchmark's own, no
clusters. Four runs, each on its own task queue:

- `pinned`: Worker Versioning as the workflow is today. Worker v1 (deployment `tidepool-<cluster>`, build
  `v1`, PINNED by default) is made the current version, the peerings start, worker v2 joins and is made
  current. Then: how many runs moved to v2 on that alone (`stall_seconds` later); with v1 stopped, how many
  peerings leave an update unanswered for `stall_seconds` (they need v1); with v1 back, every peering is
  woken (a push each) until it continues as new (the dev server suggests it from 40 events), and the new
  runs' versions are read (describe: versioning info); with v1 stopped for good, the stalls again.
- `upgrade_on_can`: the same, with the continue-as-new that the workflow would make under Worker Versioning,
  `initial_versioning_behavior=AUTO_UPGRADE`: the new runs start on the current version, v2.
- `upgrade_when_told`: that, and the workflow continues as new at its loop's next pass once the server says
  the current version moved (`is_target_worker_deployment_version_changed`), not only at the history limit.
  Both changes are patched into the SDK calls for their run only, so that workflows/ stays as released.
- baseline, `patches` (today's way): one unversioned worker replaced by the next at once (the Deployment's
  Recreate strategy); every peering answers an update from the new worker.

Figures: seconds until every peering runs the new code (for the versioned runs from the first forced wake:
what continuing as new itself takes; from the new worker's start for patches), peerings stalled
with the old worker stopped, workers of two versions side by side and for how long. How long v1 must run in
production is projected: a peering continues as new once its history passes the server's default 4,096
events, at `history_events_per_day` (1,590, `python -m bench actions_per_day`); told, at its loop's next pass, at
the latest one period (600 s).
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

from temporalio import workflow
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker, WorkerDeploymentConfig

from bench.common import emit, log
from deploy.localenv.binaries import temporal_cli
from deploy.localenv.temporal import TEST_DYNAMIC_CONFIG, start_temporal, stop_process_group
from models.api.common import SecretReference
from models.names import peering_workflow_id, task_queue
from models.peering import PeeringInput, WithdrawResult
from tests.test_workflow_peering import StubProvider
from workflows.peering import PeeringWorkflow

DEFAULTS: dict[str, Any] = {"peerings": 20, "stall_seconds": 5.0, "history_events_per_day": 1590.0}
SUGGEST_CONTINUE_AS_NEW_DEFAULT = 4096  # the server's limit.historyCount.suggestContinueAsNew
PERIOD_SECONDS = 600  # the ClusterConfig's default advertisementPeriodSeconds: a peering's loop wakes at least that often
MOVE_TIMEOUT = 60.0  # seconds for the continued runs to show their version
Peering = WorkflowHandle[Any, WithdrawResult]


@asynccontextmanager
async def _server() -> AsyncIterator[Client]:
    """A dev server of the benchmark's own, as the workflow tests start theirs (continue-as-new suggested
    from 40 events)."""
    log_file = Path(tempfile.mkdtemp(prefix="tidepool-bench-versioning-")) / "temporal.log"
    endpoint = start_temporal(cli=temporal_cli(), namespaces=[], log_file=log_file, headless=True,
                              dynamic_config=TEST_DYNAMIC_CONFIG)  # fmt: skip
    log(f"Temporal dev server on {endpoint.address}, log {log_file}")
    try:
        yield await Client.connect(endpoint.address, namespace="default", data_converter=pydantic_data_converter)
    finally:
        stop_process_group(endpoint.pid)


def _worker(client: Client, stub: StubProvider, cluster: str, build: str | None) -> Worker:
    """The peering worker of `cluster`: build `build` of deployment `tidepool-<cluster>` (PINNED), or
    unversioned."""
    config = None if build is None else WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=task_queue(cluster), build_id=build),
        use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED,
    )  # fmt: skip
    return Worker(client, task_queue=task_queue(cluster), workflows=[PeeringWorkflow], identity=f"{cluster}-{build}",
                  activities=[stub.push_advertisement, stub.read_foreign_decision, stub.withdraw_peering,
                              stub.clean_foreign, stub.release_credentials],
                  deployment_config=config)  # fmt: skip


async def _set_current(client: Client, cluster: str, build: str) -> None:
    """`temporal worker deployment set-current-version`; the server knows a version once its worker polls."""
    request = SetWorkerDeploymentCurrentVersionRequest(namespace=client.namespace, deployment_name=task_queue(cluster),
                                                       build_id=build)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            return
        except RPCError as e:  # "no Worker Deployment found ... does your Worker Deployment have pollers?"
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server refused {build} as current version of {task_queue(cluster)}: {e}") from e
            await asyncio.sleep(0.2)


async def _start(client: Client, cluster: str, count: int) -> list[Peering]:
    ids = [peering_workflow_id(cluster, f"f{i}") for i in range(count)]
    for i, workflow_id in enumerate(ids):
        await client.start_workflow(
            PeeringWorkflow.run,
            PeeringInput(foreign_cluster_id=f"f{i}", home_cluster_id=cluster,
                         kube_config_ref=SecretReference(name="foreign-credentials", namespace="tidepool-system")),
            id=workflow_id, task_queue=task_queue(cluster),
        )  # fmt: skip
    # Handles without a run id: signals, updates and queries go to the current run, across continue-as-new.
    peerings = [client.get_workflow_handle(workflow_id, result_type=WithdrawResult) for workflow_id in ids]
    await asyncio.gather(*(_pushed(p, 1) for p in peerings))
    return peerings


async def _pushed(peering: Peering, pushes: int) -> None:
    while (await peering.query(PeeringWorkflow.status)).pushes < pushes:
        await asyncio.sleep(0.05)


async def _build(peering: Peering) -> tuple[str, str]:
    """The current run's id and the build it is on ('' while its first task has not completed)."""
    description = (await peering.describe()).raw_description
    info = description.workflow_execution_info
    return info.execution.run_id, info.versioning_info.deployment_version.build_id


async def _stalled(peerings: list[Peering], seconds: float) -> tuple[int, float]:
    """Peerings whose update (a share of 50%, answered once pushed) is unanswered after `seconds`, and the
    seconds until the last answered one returned."""
    started = time.monotonic()

    async def answered(peering: Peering) -> float | None:
        try:
            await asyncio.wait_for(peering.execute_update(PeeringWorkflow.update_sharing_percentage, 50), seconds)
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            return None
        return time.monotonic() - started

    times = await asyncio.gather(*(answered(p) for p in peerings))
    return sum(t is None for t in times), max((t for t in times if t is not None), default=math.inf)


async def _continue_as_new(client: Client, peering: Peering) -> tuple[int, int]:
    """Wakes the peering (capacity_changed: a push), one wake at a time, until it continues as new; how many
    wakes that took and how many events the old run had (below the limit: it was told)."""
    first, _ = await _build(peering)
    wakes = 0
    while (await _build(peering))[0] == first:
        pushes = await _pushes(peering)
        await peering.signal(PeeringWorkflow.capacity_changed)
        wakes += 1
        while (await _build(peering))[0] == first and await _pushes(peering) <= pushes:
            await asyncio.sleep(0.05)
    old = await client.get_workflow_handle(peering.id, run_id=first).describe()
    return wakes, old.raw_description.workflow_execution_info.history_length


async def _pushes(peering: Peering) -> int:
    try:
        return (await peering.query(PeeringWorkflow.status)).pushes
    except RPCError:  # a run just begun by continue-as-new answers once its first task ran
        return -1


@contextmanager
def _upgrading(*, when_told: bool) -> Iterator[None]:
    """What PeeringWorkflow would do under Worker Versioning, patched in for one run so that workflows/ stays
    as released: its continue-as-new starts the new run on the current version instead of inheriting its
    pinned one; `when_told`, it also continues as new at its loop's next pass once the server says that the
    current version moved (the workflow's existing is_continue_as_new_suggested check)."""
    upgrading = partial(workflow.continue_as_new,
                        initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE)  # fmt: skip
    suggested = workflow.Info.is_continue_as_new_suggested

    def suggested_or_told(info: workflow.Info) -> bool:
        return suggested(info) or info.is_target_worker_deployment_version_changed()

    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(workflow, "continue_as_new", upgrading))
        if when_told:
            patches.enter_context(mock.patch.object(workflow.Info, "is_continue_as_new_suggested", suggested_or_told))
        yield


class _Running:
    """A worker run beside the benchmark, stopped when the benchmark says (a release's Deployment going)."""

    def __init__(self, worker: Worker) -> None:
        self._worker, self._task = worker, asyncio.create_task(worker.run())

    async def stop(self) -> None:
        await self._worker.shutdown()
        await self._task


async def _versioned(client: Client, params: dict[str, Any], cluster: str) -> dict[str, float]:
    count, stall = int(params["peerings"]), float(params["stall_seconds"])
    stub = StubProvider()
    figures: dict[str, float] = {}
    v1 = _Running(_worker(client, stub, cluster, "v1"))
    await _set_current(client, cluster, "v1")
    peerings = await _start(client, cluster, count)
    v2 = _Running(_worker(client, stub, cluster, "v2"))
    await _set_current(client, cluster, "v2")
    await asyncio.sleep(stall)
    builds = await asyncio.gather(*(_build(p) for p in peerings))
    figures["moved_by_setting_current"] = sum(b == "v2" for _, b in builds)
    await v1.stop()
    log(f"{cluster}: v1 stopped, v2 current: updating every peering")
    figures["peerings_stalled"], _ = await _stalled(peerings, stall)
    v1 = _Running(_worker(client, stub, cluster, "v1"))  # back, so that the pinned runs can continue as new
    log(f"{cluster}: v1 back: waking every peering until it continues as new")
    forced = time.monotonic()
    continued = await asyncio.gather(*(_continue_as_new(client, p) for p in peerings))
    figures["wakes_to_continue_max"] = max(wakes for wakes, _ in continued)
    figures["events_at_continue_as_new_min"] = min(events for _, events in continued)
    deadline = time.monotonic() + MOVE_TIMEOUT
    while True:
        builds = await asyncio.gather(*(_build(p) for p in peerings))
        if all(b == "v2" for _, b in builds) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    figures["move_all_seconds"] = time.monotonic() - forced if all(b == "v2" for _, b in builds) else math.inf
    figures["moved_by_continue_as_new"] = sum(b == "v2" for _, b in builds)
    figures["continued_on_v1"] = sum(b == "v1" for _, b in builds)
    await v1.stop()
    log(f"{cluster}: v1 stopped for good: updating every peering")
    figures["stalled_once_v1_is_gone"], _ = await _stalled(peerings, stall)
    for peering in peerings:
        await peering.terminate("benchmark done")
    await v2.stop()
    return figures


async def _patched(client: Client, params: dict[str, Any], cluster: str) -> dict[str, float]:
    count, stall = int(params["peerings"]), float(params["stall_seconds"])
    stub = StubProvider()
    async with _worker(client, stub, cluster, None):
        peerings = await _start(client, cluster, count)
    async with _worker(client, stub, cluster, None):  # the next release, started as the old one stopped
        stalled, answered_in = await _stalled(peerings, stall)
        for peering in peerings:
            await peering.terminate("benchmark done")
    return {"peerings_stalled": stalled, "move_all_seconds": answered_in}


async def _measure(params: dict[str, Any]) -> None:
    count = int(params["peerings"])
    async with _server() as client:
        log("patches: one worker replaced by the next")
        patches = await _patched(client, params, "bench-patches")
        log("Worker Versioning, the workflow as released: continue-as-new inherits the pinned version")
        pinned = await _versioned(client, params, "bench-pinned")
        log("Worker Versioning, continue-as-new upgrading to the current version")
        with _upgrading(when_told=False):
            on_can = await _versioned(client, params, "bench-on-can")
        log("Worker Versioning, continue-as-new as soon as the current version moves")
        with _upgrading(when_told=True):
            when_told = await _versioned(client, params, "bench-when-told")
    period_days = PERIOD_SECONDS / 86400
    history_days = SUGGEST_CONTINUE_AS_NEW_DEFAULT / float(params["history_events_per_day"])
    common = {"peerings": count, "stall_seconds": float(params["stall_seconds"]),
              "baseline": "patches: one unversioned worker replaced by the next at once"}  # fmt: skip
    for mode, figures, projected in (("pinned", pinned, history_days), ("upgrade_on_can", on_can, history_days),
                                     ("upgrade_when_told", when_told, period_days)):  # fmt: skip
        moved = figures["moved_by_continue_as_new"] == count
        extra = {**common, **{k: v for k, v in figures.items() if k not in ("move_all_seconds", "peerings_stalled")}}
        emit(f"versioning.{mode}.move_all_seconds", figures["move_all_seconds"], "s",
             baseline=patches["move_all_seconds"], params={**extra, "from": "the first wake after v2 became current"})  # fmt: skip
        emit(f"versioning.{mode}.peerings_stalled", figures["peerings_stalled"], "peerings",
             baseline=patches["peerings_stalled"], params={**common, "with": "v1 stopped after v2 became current"})  # fmt: skip
        emit(f"versioning.{mode}.workers_side_by_side", 2, "versions", baseline=1, params=common)
        emit(f"versioning.{mode}.side_by_side_days_projected", projected if moved else math.inf, "days", baseline=0,
             params={**common, "history_events_per_day": float(params["history_events_per_day"]),
                     "suggest_continue_as_new_events": SUGGEST_CONTINUE_AS_NEW_DEFAULT,
                     "period_seconds": PERIOD_SECONDS,
                     "until": "the history limit" if projected == history_days else "the next period's push"})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
