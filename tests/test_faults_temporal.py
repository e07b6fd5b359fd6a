"""Faults of the Temporal server, made the honest way: its container is restarted (SIGTERM, then started
again on its database file, kept in a volume) or paused (every process frozen, connections left open).
Each test has a server of its own, so that no other test sees the fault; the worker is the real one, the
clusters real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from deploy.containers.podman import PodmanService
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from deploy.localenv.temporal import TEST_DYNAMIC_CONFIG
from kube.objects import read_cluster_object
from models.names import ADVERTISEMENTS, advertisement_name, peering_workflow_id
from models.peering import WithdrawResult
from tests.conftest import Clusters
from tests.containers import TemporalContainer, temporal_container
from tests.kube import create_node
from tests.running import eventually, running_worker, worker_settings
from workers.peer import cancel_peering, request_peering
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.faults, pytest.mark.containers]

# A pause longer than a few of the worker's task round trips, so that calls in flight meet a silent server.
PAUSE_SECONDS = 10


@pytest.fixture
def temporal(podman_service: PodmanService, tmp_path: Path) -> Iterator[TemporalContainer]:
    with temporal_container(namespaces=[], dynamic_config=TEST_DYNAMIC_CONFIG, data_dir=tmp_path / "temporal") as server:
        yield server


def _cpu_advertised(foreign: LocalCluster, home_id: str) -> str | None:
    obj = read_cluster_object(foreign.api_client(), ADVERTISEMENTS, advertisement_name(home_id))
    return None if obj is None else str(obj["spec"]["resourceQuota"]["hard"]["cpu"])


async def _peerings(
    temporal: TemporalContainer, home: LocalCluster, home_id: str, foreigns: dict[str, LocalCluster]
) -> dict[str, WorkflowHandle[PeeringWorkflow, WithdrawResult]]:
    """Asks `home` for resources on behalf of each foreign cluster; the handles of the peerings to come."""
    for foreign_id, foreign in foreigns.items():
        request_peering(home.api_client(), foreign.api_client(), provider_id=home_id, consumer_id=foreign_id)
    client = await Client.connect(temporal.endpoint.address, data_converter=pydantic_data_converter)
    return {f: client.get_workflow_handle_for(PeeringWorkflow.run, peering_workflow_id(home_id, f)) for f in foreigns}


async def _first_run_id(handle: WorkflowHandle[PeeringWorkflow, WithdrawResult]) -> str:
    """The run that began the latest run's chain of continue-as-new."""
    return (await handle.describe()).raw_description.workflow_execution_info.first_run_id


async def test_a_restart_of_the_temporal_server_mid_peering_loses_no_workflow(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], temporal: TemporalContainer,
    unique: str,
) -> None:  # fmt: skip
    home = make_cluster("home")
    create_node(home.api_client(), "n1", cpu="10", memory="10Gi")  # 30% by default: 3 CPU
    home_id = f"home-{unique}"
    foreigns = {f"b-{unique}": clusters.b, f"c-{unique}": clusters.c}
    settings = worker_settings(localenv, home, home_id, temporal_address=temporal.endpoint.address)
    async with running_worker(settings):
        handles = await _peerings(temporal, home, home_id, foreigns)
        runs = {f: (await eventually(h.describe, what=f"peering {f} started")).run_id for f, h in handles.items()}

        # While the first pushes are under way; the worker goes on in this event loop meanwhile.
        await asyncio.to_thread(temporal.restart)

        for foreign in foreigns.values():
            await eventually(lambda f=foreign: _cpu_advertised(f, home_id) == "3", timeout=60, what="first push")
        for handle in handles.values():
            await handle.signal(PeeringWorkflow.set_sharing_percentage, 50)
        for foreign in foreigns.values():
            await eventually(lambda f=foreign: _cpu_advertised(f, home_id) == "5", timeout=60, what="signal's push")
        for foreign_id in foreigns:
            cancel_peering(home.api_client(), consumer_id=foreign_id)
        results = {f: await asyncio.wait_for(h.result(), timeout=60) for f, h in handles.items()}
    # The same runs went on, or their continuations (the test server suggests continue-as-new at 40 events, and
    # a restart's retried tasks get there): nothing was started again from scratch.
    assert {f: await _first_run_id(h) for f, h in handles.items()} == runs
    assert all(r.foreign_cleaned and r.home_cleaned for r in results.values())
    assert all(_cpu_advertised(foreign, home_id) is None for foreign in foreigns.values())


async def test_a_temporal_server_cut_off_by_a_pause_is_caught_up_with_once_it_answers_again(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], temporal: TemporalContainer,
    unique: str,
) -> None:  # fmt: skip
    home = make_cluster("home")
    create_node(home.api_client(), "n1", cpu="10", memory="10Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    settings = worker_settings(localenv, home, home_id, temporal_address=temporal.endpoint.address)
    async with running_worker(settings):
        handles = await _peerings(temporal, home, home_id, {foreign_id: clusters.b})
        handle = handles[foreign_id]
        await eventually(lambda: _cpu_advertised(clusters.b, home_id) == "3", timeout=60, what="first push")

        await asyncio.to_thread(temporal.pause)
        try:
            # Sent while the server is frozen: it waits, and is taken in once the server answers again.
            signal = asyncio.create_task(handle.signal(PeeringWorkflow.set_sharing_percentage, 50))
            await asyncio.sleep(PAUSE_SECONDS)
            assert not signal.done()
        finally:
            await asyncio.to_thread(temporal.unpause)
        await asyncio.wait_for(signal, timeout=60)
        await eventually(lambda: _cpu_advertised(clusters.b, home_id) == "5", timeout=60, what="the signal's push")
        status = await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 70)
        assert status.sharing_percentage == 70 and _cpu_advertised(clusters.b, home_id) == "7"
        cancel_peering(home.api_client(), consumer_id=foreign_id)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.foreign_cleaned and result.home_cleaned
    assert _cpu_advertised(clusters.b, home_id) is None
