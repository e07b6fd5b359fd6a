"""A misbehaving or flapping peer makes bounded work (issue 34, item 7), on real clusters with real workers.

1. A consumer peered again at once after `tidepool unpeer --force`: the new PeeringRequest used to find the
   withdrawing run (USE_EXISTING), nothing started a peering when it ended, and its end deleted the new
   credentials Secret. Now the new request is peered (the old run continues as new for it, or a fresh run
   starts) and both credentials Secrets, the provider's copy of the consumer's kubeconfig and the consumer's
   copy of the provider's, survive the old run's end.
2. A provider that reaches the consumer, pushing with its real credentials, while the consumer cannot reach
   it (the server in the credentials it hands the consumer points nowhere): each teardown as
   ProviderUnreachable deleted the Advertisement, the provider pushed it again at once, admission accepted it
   and a new virtual kubelet was made, for ever. Now admission refuses the re-push (UnreachableBackoff) for a
   minute, doubling: over the window, one virtual kubelet.

The workflow tests that reproduce each loop on the old code, fast and with time skipping, are in
tests/test_workflow_peering.py and tests/test_workflow_consumer.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import ignore_not_found, read_cluster_object
from models.consumer import UNREACHABLE_BACKOFF_FIRST
from models.names import (
    ADVERTISEMENTS,
    FOREIGN_CLEANUP_FINALIZER,
    LABEL_MANAGED_BY,
    LABEL_NODE_TYPE,
    LABEL_PROVIDER,
    MANAGED_BY,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    VIRTUAL_NODE_TYPE,
    VK_CLEAN_ANNOTATION,
    admission_workflow_id,
    advertisement_name,
    advertisement_workflow_id,
    credentials_secret_name,
    peering_workflow_id,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.times import format_rfc3339
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.replay import replay_all_runs
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import cancel_peering, request_peering, request_secret_name

pytestmark = [pytest.mark.env, pytest.mark.hostile]


def _phase(api: k8s.ApiClient, provider_id: str) -> str | None:
    obj = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider_id))
    return ((obj or {}).get("status") or {}).get("phase")


@pytest.mark.timeout(480)
async def test_a_consumer_peered_again_right_after_a_forced_unpeer_is_peered_and_keeps_both_credentials(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str
) -> None:
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    home, there = provider.api_client(), consumer.api_client()
    create_node(home, "big", cpu="8", memory="16Gi")
    apply_cluster_config(home, outgoing={"sharingPercentage": 50})
    create_namespace(there, SYSTEM_NAMESPACE)
    request_peering(home, there, provider_id=provider_id, consumer_id=consumer_id)
    workflow_id = peering_workflow_id(provider_id, consumer_id)

    def held_secret() -> Any:
        return ignore_not_found(k8s.CoreV1Api(home).read_namespaced_secret, request_secret_name(consumer_id),
                                SYSTEM_NAMESPACE)  # fmt: skip

    def consumer_secret() -> Any:
        return ignore_not_found(k8s.CoreV1Api(there).read_namespaced_secret, credentials_secret_name(provider_id),
                                SYSTEM_NAMESPACE)  # fmt: skip

    async with (running_worker(worker_settings(localenv, provider, provider_id)),
                running_worker(worker_settings(localenv, consumer, consumer_id))):  # fmt: skip
        await eventually(lambda: _phase(there, provider_id) == "Accepted", timeout=60, what="the first acceptance")
        first = read_cluster_object(home, PEERING_REQUESTS, consumer_id)
        assert first is not None
        first_run = (await temporal_client.get_workflow_handle(workflow_id).describe()).run_id
        cancel_peering(home, consumer_id=consumer_id, force=True)
        repeered = datetime.now(UTC).replace(microsecond=0)
        # As `tidepool peer` would, from its own process: it waits for the old request to go.
        await asyncio.to_thread(request_peering, home, there, provider_id=provider_id, consumer_id=consumer_id)
        second = read_cluster_object(home, PEERING_REQUESTS, consumer_id)
        assert second is not None and second["metadata"]["uid"] != first["metadata"]["uid"]

        def pushed_again() -> bool:
            status = (read_cluster_object(home, PEERING_REQUESTS, consumer_id) or {}).get("status") or {}
            pushed = status.get("lastPushTime")
            return pushed is not None and datetime.fromisoformat(pushed.replace("Z", "+00:00")) >= repeered

        await eventually(pushed_again, timeout=90, what="a push of the new peering")
        # From the runs' own records, not the visibility list, which lags: the new run, failing its pushes while
        # the old namespace terminates, may have continued as new already (tests suggest it at 40 events).
        old = await temporal_client.get_workflow_handle(workflow_id, run_id=first_run).describe()
        assert old.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CONTINUED_AS_NEW), old.status
        current = await temporal_client.get_workflow_handle(workflow_id).describe()
        assert current.status == WorkflowExecutionStatus.RUNNING and current.run_id != first_run
        await eventually(consumer_secret, timeout=60, what="the consumer's credentials Secret written again")
        await asyncio.sleep(5)  # the old run's end, and the garbage collector, have had their chance
        held = held_secret()
        assert held is not None and held.metadata.deletion_timestamp is None, "the new request's kubeconfig is kept"
        assert FOREIGN_CLEANUP_FINALIZER not in (held.metadata.finalizers or [])
        assert [o.uid for o in held.metadata.owner_references or []] == [second["metadata"]["uid"]]
        assert consumer_secret() is not None, "the consumer keeps the provider's new credentials"
        assert (read_cluster_object(home, PEERING_REQUESTS, consumer_id) or {}).get("metadata", {}).get("uid") == \
            second["metadata"]["uid"]  # fmt: skip
    await replay_all_runs(temporal_client, workflow_id)


@pytest.mark.timeout(480)
async def test_a_provider_the_consumer_cannot_reach_is_not_accepted_again_and_again(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str
) -> None:
    """The consumer's virtual kubelet is played by the test (no process runs it): for each Deployment the
    consumer makes, it registers the virtual node as the real one would with credentials whose server
    answers nothing (Ready False, ProviderUnreachable) and says the provider namespace is clean, as it would
    once it could tell (the bounded two-minute wait for that report is the same with or without the
    back-off, and would only slow the loop down)."""
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    home, there = provider.api_client(), consumer.api_client()
    create_node(home, "big", cpu="8", memory="16Gi")
    apply_cluster_config(home, outgoing={"sharingPercentage": 50})
    create_namespace(there, SYSTEM_NAMESPACE)
    apply_cluster_config(there, keepalive={"thresholdFailures": 1, "retrySeconds": 1})
    network = NetworkModule(there, local_pod_cidr="10.0.0.0/16").start()
    settings = worker_settings(localenv, provider, provider_id)
    # The server the provider's credentials name for the consumer's virtual kubelet: nothing answers there.
    provider_settings = settings.model_copy(update={"cluster": settings.cluster.model_copy(
        update={"api_server_for_peers": "https://127.0.0.1:9"})})  # fmt: skip
    apps, core = k8s.AppsV1Api(there), k8s.CoreV1Api(there)
    created: set[str] = set()  # the uids of the virtual kubelet Deployments the consumer made

    def play_the_virtual_kubelet() -> None:
        deployment = ignore_not_found(apps.read_namespaced_deployment, virtual_kubelet_name(provider_id),
                                      SYSTEM_NAMESPACE)  # fmt: skip
        uid = str(deployment.metadata.uid) if deployment is not None else ""
        if deployment is None or deployment.metadata.deletion_timestamp or uid in created:
            return
        created.add(uid)
        apps.patch_namespaced_deployment(virtual_kubelet_name(provider_id), SYSTEM_NAMESPACE,
                                         {"metadata": {"annotations": {VK_CLEAN_ANNOTATION: "clean"}}})  # fmt: skip
        since = datetime.now(UTC) - timedelta(minutes=5)
        ignore_not_found(core.delete_node, virtual_node_name(provider_id))
        core.create_node(k8s.V1Node.model_validate({"metadata": {"name": virtual_node_name(provider_id), "labels": {
            LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE, LABEL_PROVIDER: provider_id, LABEL_MANAGED_BY: MANAGED_BY}}}))  # fmt: skip
        core.patch_node_status(virtual_node_name(provider_id), {"status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "ProviderUnreachable", "message": "connection refused",
            "lastTransitionTime": format_rfc3339(since),
            "lastHeartbeatTime": format_rfc3339(datetime.now(UTC))}]}})  # fmt: skip

    try:
        async with (running_worker(provider_settings), running_worker(worker_settings(localenv, consumer, consumer_id))):
            request_peering(home, there, provider_id=provider_id, consumer_id=consumer_id)

            async def refused() -> Any:
                play_the_virtual_kubelet()
                obj = read_cluster_object(there, ADVERTISEMENTS, advertisement_name(provider_id))
                return obj if ((obj or {}).get("status") or {}).get("reason") == "UnreachableBackoff" else None

            refusal = await eventually(refused, timeout=90, what="the re-pushed Advertisement refused, backing off")
            # Within the back-off, the provider keeps pushing and nothing is built again.
            window = UNREACHABLE_BACKOFF_FIRST.total_seconds() * 0.5
            deadline = asyncio.get_running_loop().time() + window
            while asyncio.get_running_loop().time() < deadline:
                play_the_virtual_kubelet()
                await asyncio.sleep(0.5)
            assert len(created) == 1, f"{len(created)} virtual kubelets in {window:.0f} s: the re-accept loop"
            assert _phase(there, provider_id) == "Refused"
            condition = next(c for c in refusal["status"]["conditions"] if c["type"] == "Accepted")
            assert "torn down 1 time in a row" in condition["message"], condition
            events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={advertisement_name(provider_id)}")
            assert any(e.reason == "UnreachableBackoff" for e in events.items)
            admission = temporal_client.get_workflow_handle(admission_workflow_id(consumer_id))
            details = (await admission.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)).current_details
            assert f"| {provider_id} | 1 |" in details, details
    finally:
        network.stop()
    await replay_all_runs(temporal_client, admission_workflow_id(consumer_id))
    await replay_all_runs(temporal_client, advertisement_workflow_id(consumer_id, provider_id))
