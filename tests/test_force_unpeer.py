"""`tidepool unpeer --force` (issue 20, part 3) with the consumer's control plane stopped (kwokctl stops it,
data kept): the provider finishes its half at once and leaves no finalizer, tries the consumer again while
its last Advertisement could live there, and cleans it if it comes back in time; past that, it says that
the consumer's own TTL and keepalive clean it, and the credentials Secret goes either way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, start_cluster, stop_cluster
from deploy.localenv.env import EnvState
from kube.objects import ignore_not_found, read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    FOREIGN_CLEANUP_FINALIZER,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
    peering_workflow_id,
)
from models.peering import WithdrawResult
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.replay import replay_all_runs
from tests.running import eventually, running_worker, worker_settings
from workers.peer import cancel_peering, request_peering, request_secret_name
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.explain]

PERIOD = 10  # seconds


async def _details(handle: WorkflowHandle[Any, Any]) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(metadata.current_details)


@pytest.mark.timeout(480)
@pytest.mark.parametrize(("ttl", "comes_back"), [pytest.param(90, True, id="back in time: cleaned there"),
                                                 pytest.param(30, False, id="gone for good: its TTL cleans it")])  # fmt: skip
async def test_a_forced_unpeer_from_a_stopped_consumer_releases_at_once_and_cleans_there_if_it_comes_back(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str,
    ttl: int, comes_back: bool,
) -> None:  # fmt: skip
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    home = provider.api_client()
    create_node(home, "big", cpu="8", memory="16Gi")
    apply_cluster_config(home, outgoing={"sharingPercentage": 50, "advertisementPeriodSeconds": PERIOD,
                                         "advertisementTimeToLiveSeconds": ttl})  # fmt: skip
    create_namespace(consumer.api_client(), SYSTEM_NAMESPACE)
    request_peering(home, consumer.api_client(), provider_id=provider_id, consumer_id=consumer_id)
    peering: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
        PeeringWorkflow.run, peering_workflow_id(provider_id, consumer_id))

    def advertisement() -> dict[str, Any] | None:
        return read_cluster_object(consumer.api_client(), ADVERTISEMENTS, advertisement_name(provider_id))

    def held_secret() -> Any:
        return ignore_not_found(k8s.CoreV1Api(home).read_namespaced_secret, request_secret_name(consumer_id), SYSTEM_NAMESPACE)

    async with (running_worker(worker_settings(localenv, provider, provider_id)),
                running_worker(worker_settings(localenv, consumer, consumer_id))):  # fmt: skip
        await eventually(lambda: ((advertisement() or {}).get("status") or {}).get("phase") == "Accepted",
                         timeout=60, what="the Advertisement accepted")  # fmt: skip
        stop_cluster(consumer.name, binaries=binaries, workdir=workdir)
        cancel_peering(home, consumer_id=consumer_id, force=True)

        # At home, at once: the request gone (no finalizer holds it), the consumer's access revoked, and the
        # credentials held for the cleaning to come.
        await eventually(lambda: read_cluster_object(home, PEERING_REQUESTS, consumer_id) is None,
                         timeout=30, what="the PeeringRequest released")  # fmt: skip
        namespace = ignore_not_found(k8s.CoreV1Api(home).read_namespace, foreign_namespace(consumer_id))
        assert namespace is None or namespace.metadata.deletion_timestamp is not None
        secret = await eventually(held_secret, what="the credentials Secret")
        assert FOREIGN_CLEANUP_FINALIZER in (secret.metadata.finalizers or [])
        details = await eventually(lambda: _details(peering), what="the workflow's details")
        assert "forced unpeer: cleaned at home" in details and "not cleaned yet" in details, details

        if comes_back:
            start_cluster(consumer, binaries=binaries, workdir=workdir)
        result = await asyncio.wait_for(peering.result(), timeout=ttl + 120)
        assert result.home_cleaned and result.foreign_cleaned is comes_back, result
        assert ("cleaned (its Advertisement" if comes_back else "its TTL and keepalive clean it") in result.note
        assert result.note in await _details(peering)
        # No finalizer left behind: the credentials Secret goes with its request.
        await eventually(lambda: held_secret() is None, timeout=60, what="the credentials Secret gone")
        if comes_back:  # the consumer tears down what it had, and nothing of the provider is left there
            await eventually(lambda: advertisement() is None, timeout=90, what="the Advertisement gone")
            assert ignore_not_found(k8s.CoreV1Api(consumer.api_client()).read_namespaced_secret,
                                    credentials_secret_name(provider_id), SYSTEM_NAMESPACE) is None  # fmt: skip
    if not comes_back:
        start_cluster(consumer, binaries=binaries, workdir=workdir)  # for make_cluster's deletion
    await replay_all_runs(temporal_client, peering.id)
