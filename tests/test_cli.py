"""The commands README.md and docs/peering.md give users, run as users run them: the `temporal` CLI against the
real server, and `tidepool status`."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from deploy.localenv.binaries import temporal_cli
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.identity import mint_provider_identity
from models.credentials import TokenLife
from models.names import SYSTEM_NAMESPACE, peering_workflow_id, provider_identity_name
from tests.conftest import Clusters
from tests.kube import create_namespace, create_node
from tests.running import eventually, running_worker, worker_settings
from workers.peer import request_secret_name

pytestmark = [pytest.mark.env, pytest.mark.provider]


async def temporal(localenv: EnvState, *args: str) -> str:
    """Run the CLI without blocking the event loop: the worker under test shares it."""
    process = await asyncio.create_subprocess_exec(
        str(temporal_cli()), *args, "--address", localenv.temporal_address, "-n", "default",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_a_user_starts_signals_queries_and_lists_a_peering_with_the_temporal_cli(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    home = make_cluster("home")
    api = home.api_client()
    create_node(api, "n1", cpu="10", memory="10Gi")
    create_namespace(api, SYSTEM_NAMESPACE)
    settings = worker_settings(localenv, home, f"home-{unique}")
    # What `tidepool peer` hands a provider (its own identity on the consumer), written here by hand: the test is
    # the temporal CLI's start, not the PeeringRequest's.
    handed = mint_provider_identity(clusters.b.api_client(), provider_id=settings.cluster.cluster_id, lifetime_seconds=3600)
    k8s.CoreV1Api(api).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({"metadata": {"name": "peer-b"}, "data": {
        "kubeconfig": base64.b64encode(handed.encode()).decode()}}))  # fmt: skip
    foreign = f"b-{unique}"
    workflow_id = peering_workflow_id(settings.cluster.cluster_id, foreign)
    start = ["workflow", "start", "--task-queue", settings.task_queue, "--type", "PeeringWorkflow",
             "--workflow-id", workflow_id, "--id-conflict-policy", "UseExisting", "-o", "json", "--input",
             json.dumps({"foreign_cluster_id": foreign,
                         "kube_config_ref": {"name": "peer-b", "namespace": SYSTEM_NAMESPACE}})]  # fmt: skip
    async with running_worker(settings):
        first = json.loads(await temporal(localenv, *start))["runId"]
        again = json.loads(await temporal(localenv, *start))["runId"]
        assert again == first  # one peering per foreign cluster, ever

        await temporal(localenv, "workflow", "signal", "-w", workflow_id, "--name", "set_sharing_percentage", "-i", "20")

        async def shared() -> dict[str, object] | None:
            out = await temporal(localenv, "workflow", "query", "-w", workflow_id, "--name", "status", "-o", "json")
            status = json.loads(out)["queryResult"][0]
            return status if status["sharing_percentage"] == 20 and (status["advertised"] or {}).get("cpu") == "2" else None

        await eventually(shared, timeout=30, what="the signalled percentage pushed")
        async def listed() -> list[dict[str, object]]:
            out = await temporal(localenv, "workflow", "list", "--query", f"ForeignCluster='{foreign}'", "-o", "json")
            return json.loads(out) if out.strip() else []

        found = await eventually(listed, timeout=20, what="the peering listed by ForeignCluster")
        assert {w["execution"]["workflowId"] for w in found} == {workflow_id}
        await temporal(localenv, "workflow", "signal", "-w", workflow_id, "--name", "withdraw")


def test_tidepool_status_shows_one_table_across_clusters(clusters: Clusters) -> None:
    result = subprocess.run([sys.executable, "-m", "workers.cli", "status", "--cluster", f"a={clusters.a.kubeconfig}",
                             "--cluster", f"b={clusters.b.kubeconfig}"], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert result.returncode == 0, result.stderr
    for title in ("Peerings (provider side)", "Advertisements (consumer side)", "Virtual nodes", "Offloaded pods",
                  "Pool placements", "Pool pods"):
        assert title in result.stdout


@pytest.mark.federation
def test_tidepool_peer_hands_the_provider_a_token_of_its_own_identity_never_the_consumer_s_admin_kubeconfig(
    clusters: Clusters, unique: str
) -> None:
    provider_id, consumer_id = f"p-{unique}", f"c-{unique}"
    common = ["--provider", str(clusters.a.kubeconfig), "--consumer-id", consumer_id]
    peer = subprocess.run([sys.executable, "-m", "workers.cli", "peer", *common, "--provider-id", provider_id,
                           "--consumer", str(clusters.b.kubeconfig), "--token-lifetime", "600"],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert peer.returncode == 0, peer.stderr
    try:
        secret = k8s.CoreV1Api(clusters.a.api_client()).read_namespaced_secret(request_secret_name(consumer_id),
                                                                              SYSTEM_NAMESPACE)  # fmt: skip
        handed = yaml.safe_load(base64.b64decode((secret.data or {})["kubeconfig"]))
        [user] = handed["users"]
        assert user["name"] == provider_identity_name(provider_id) and set(user["user"]) == {"token"}
        life = TokenLife.of_jwt(user["user"]["token"])
        assert life is not None and life.lifetime_seconds == 600
    finally:
        unpeer = subprocess.run([sys.executable, "-m", "workers.cli", "unpeer", *common], capture_output=True, text=True,
                                timeout=60, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
        assert unpeer.returncode == 0, unpeer.stderr
