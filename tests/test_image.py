"""tidepool's own image (deploy/image/Containerfile), built on a Debian base made here and run through
testcontainers: the worker in it serves a real cluster against the tests' Temporal and takes a peering
from its request to its withdrawal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle

from deploy.containers.podman import PodmanService
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import ADVERTISEMENTS, advertisement_name, peering_workflow_id
from models.peering import WithdrawResult
from tests.conftest import Clusters
from tests.containers import worker_container
from tests.kube import create_node, flattened_kubeconfig
from tests.running import eventually
from workers.peer import cancel_peering, request_peering
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.containers]


async def test_the_worker_in_tidepool_s_image_runs_a_peering_from_request_to_withdrawal(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], temporal_client: Client,
    podman_service: PodmanService, tmp_path: Path, unique: str,
) -> None:  # fmt: skip
    home = make_cluster("home")
    api = home.api_client()
    create_node(api, "n1", cpu="10", memory="10Gi")  # 30% by default: 3 CPU
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    # The image runs as a user of its own: it gets the kubeconfig as a mounted Secret would give it.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(flattened_kubeconfig(home.kubeconfig))
    kubeconfig.chmod(0o644)
    request_peering(api, clusters.b.api_client(), provider_id=home_id, consumer_id=foreign_id)
    environment = {
        "TIDEPOOL_CLUSTER_CLUSTER_ID": home_id,
        "TIDEPOOL_CLUSTER_KUBECONFIG": str(kubeconfig),
        "TIDEPOOL_TEMPORAL_ADDRESS": localenv.temporal_address,
        "TIDEPOOL_METRICS_PORT": "0",
    }
    command = ["python", "-m", "workers.cluster"]
    with worker_container(command=command, environment=environment, mounts=[kubeconfig]) as worker:
        advertisement = await eventually(
            lambda: read_cluster_object(clusters.b.api_client(), ADVERTISEMENTS, advertisement_name(home_id)),
            timeout=120, what="the Advertisement on b, pushed by the worker in the container",
        )  # fmt: skip
        assert advertisement["spec"]["resourceQuota"]["hard"]["cpu"] == "3"
        handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
            PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))
        cancel_peering(api, consumer_id=foreign_id)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        logs = b"".join(worker.get_logs()).decode(errors="replace")
    assert result.foreign_cleaned and result.home_cleaned, logs
    assert read_cluster_object(clusters.b.api_client(), ADVERTISEMENTS, advertisement_name(home_id)) is None
