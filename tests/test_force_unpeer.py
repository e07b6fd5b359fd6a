"""`tidepool unpeer --force` (issue 20, part 3) with the other side's control plane stopped (kwokctl stops
it, data kept).

On the provider, with the consumer stopped: the provider finishes its half at once and leaves no finalizer,
tries the consumer again while its last Advertisement could live there, and cleans it if it comes back in
time; past that, it says that the consumer's own TTL and keepalive clean it, and the credentials Secret goes
either way.

On the consumer, with the provider stopped: the consumer revokes the provider and tears down at once, in
order (virtual node, virtual kubelet, Advertisement); it cleans the copies of its pods in the provider if
the provider comes back while the last Advertisement could live; past that, the provider deletes them
itself once the virtual kubelet's keepalive there has lapsed. Either way nothing is left of the peering's
objects on the consumer, and no copy or keepalive on the provider."""

from __future__ import annotations

import asyncio
import base64
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
from kube.copies import copies_selector, keepalive_grace
from kube.objects import ignore_not_found, read_cluster_object
from models.consumer import AdvertisementState
from models.names import (
    ADVERTISEMENTS,
    CONSUMER_KEEPALIVE_LEASE,
    FOREIGN_CLEANUP_FINALIZER,
    KEEPALIVE_MIN_RENEW_SECONDS,
    LABEL_PROVIDER,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    advertisement_name,
    advertisement_workflow_id,
    credentials_secret_name,
    foreign_namespace,
    peering_workflow_id,
    provider_identity_name,
    virtual_kubelet_name,
)
from models.peering import WithdrawResult
from models.settings import VirtualKubeletSettings
from tests.faults import SecretValues, scan_runs
from tests.kube import apply_cluster_config, create_namespace, create_node, create_pod
from tests.offload import offloaded_namespace, peered, ready_node
from tests.replay import replay_all_runs
from tests.running import eventually, running_worker, worker_settings
from workers.peer import cancel_peering, leave_provider, request_peering, request_secret_name
from workflows.advertisement import AdvertisementWorkflow
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.explain]

PERIOD = 10  # seconds
KEEPALIVE_RENEW = KEEPALIVE_MIN_RENEW_SECONDS


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
                         timeout=60, what="the PeeringRequest released")  # fmt: skip
        namespace = ignore_not_found(k8s.CoreV1Api(home).read_namespace, foreign_namespace(consumer_id))
        assert namespace is None or namespace.metadata.deletion_timestamp is not None
        secret = await eventually(held_secret, what="the credentials Secret")
        assert FOREIGN_CLEANUP_FINALIZER in (secret.metadata.finalizers or [])
        async def said() -> str | None:  # published once the home side is done, after the release seen above
            details = await _details(peering)
            return details if "forced unpeer: cleaned at home" in details and "not cleaned yet" in details else None

        await eventually(said, what="the workflow's details saying the home side is clean, the foreign side not yet")

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


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("ttl", "comes_back"), [
    pytest.param(90, True, id="back in time: the consumer cleans there"),
    pytest.param(40, False, id="gone for good: the provider cleans once the keepalive lapsed"),
])  # fmt: skip
async def test_a_forced_unpeer_on_the_consumer_from_a_stopped_provider_tears_down_at_once_and_the_copies_go_either_way(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str,
    tmp_path: Path, ttl: int, comes_back: bool,
) -> None:  # fmt: skip
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    # The virtual kubelet renews its keepalive as often as it may: the provider's grace is then the TTL, not
    # 4 renewals of 30 s (kube/copies.py keepalive_grace).
    async with peered(localenv, make_cluster, unique, consumer_pod_cidr="10.0.0.0/16", log_dir=tmp_path,
                      virtual_kubelet=VirtualKubeletSettings(keepalive_renew_seconds=KEEPALIVE_RENEW)) as peering:
        provider_id, consumer_id = peering.provider_id, peering.consumer_id
        home, there = peering.consumer.api_client(), peering.provider.api_client()
        apply_cluster_config(there, outgoing={"sharingPercentage": 50, "advertisementPeriodSeconds": PERIOD,
                                              "advertisementTimeToLiveSeconds": ttl})  # fmt: skip
        core, apps = k8s.CoreV1Api(home), k8s.AppsV1Api(home)
        namespace, selector = foreign_namespace(consumer_id), copies_selector(consumer_id)

        def copies() -> list[Any]:
            """In the control namespace and in the offloaded namespace's remote namespace."""
            core = k8s.CoreV1Api(peering.provider.api_client())
            return [p for ns in (namespace, peering.remote("shop"))
                    for p in core.list_namespaced_pod(ns, label_selector=selector).items]  # fmt: skip

        def keepalive() -> Any:
            return ignore_not_found(k8s.CoordinationV1Api(peering.provider.api_client()).read_namespaced_lease,
                                    CONSUMER_KEEPALIVE_LEASE, namespace)  # fmt: skip

        await eventually(lambda: ready_node(core, peering.node), timeout=90, what="the virtual node Ready")
        await offloaded_namespace(peering, "shop")
        create_pod(home, "shop", "web", requests={"cpu": "1"}, node_selector={LABEL_PROVIDER: provider_id},
                   tolerations=[{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}])  # fmt: skip
        await eventually(copies, timeout=60, what="the pod's copy in the provider")
        await eventually(keepalive, timeout=60, what="the virtual kubelet's keepalive in the provider")

        # What the provider gave us, to look for in the history afterwards (clean_provider works with it).
        secrets = SecretValues()
        held = core.read_namespaced_secret(credentials_secret_name(provider_id), SYSTEM_NAMESPACE)
        secrets.add_kubeconfig("the provider's credentials", base64.b64decode((held.data or {})["kubeconfig"]).decode())
        assert any("token" in label for label in secrets.values), "no token read: the scan would prove nothing"
        # `shop`'s namespace in the provider, which the virtual kubelet asked for (issue 35): it goes with the
        # copies, either way.
        def remote_namespace() -> Any:
            return ignore_not_found(k8s.CoreV1Api(peering.provider.api_client()).read_namespace, peering.remote("shop"))

        assert remote_namespace() is not None

        def left_there() -> bool:
            """True once nothing of the consumer's is left in the provider; otherwise says what is."""
            left = {"copies": len(copies()), "keepalive": keepalive() is not None,
                    "remote namespace": remote_namespace() is not None}  # fmt: skip
            if any(left.values()):
                raise LookupError(f"still in the provider: {left}")  # not yet: named in the timeout
            return True

        stop_cluster(peering.provider.name, binaries=binaries, workdir=workdir)
        leave_provider(home, provider_id=provider_id, force=True)
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(
            AdvertisementWorkflow.run, advertisement_workflow_id(consumer_id, provider_id))

        # Here, at once (no two-minute wait on the provider): the provider may write nothing more, and the
        # teardown is done in order.
        await eventually(lambda: read_cluster_object(home, ADVERTISEMENTS, advertisement_name(provider_id)) is None,
                         timeout=45, what="the Advertisement released")  # fmt: skip
        assert ignore_not_found(apps.read_namespaced_deployment, virtual_kubelet_name(provider_id), SYSTEM_NAMESPACE) is None
        assert ignore_not_found(core.read_node, peering.node) is None
        assert ignore_not_found(core.read_namespaced_service_account, provider_identity_name(provider_id),
                                SYSTEM_NAMESPACE) is None  # fmt: skip
        details = await eventually(lambda: _details(handle), what="the workflow's details")
        assert "forced unpeer" in details and "not cleaned yet" in details, details

        if comes_back:
            start_cluster(peering.provider, binaries=binaries, workdir=workdir)
        state = await asyncio.wait_for(handle.result(), timeout=ttl + 120)
        outcome = state.provider_cleanup_outcome or ""
        assert outcome.startswith("cleaned") if comes_back else "the provider deletes them itself" in outcome, outcome
        details = await _details(handle)
        print(details)  # docs/peering.md, "Unpeering: On the consumer", shows it
        assert outcome in details
        assert ignore_not_found(core.read_namespaced_secret, credentials_secret_name(provider_id), SYSTEM_NAMESPACE) is None
        if not comes_back:
            start_cluster(peering.provider, binaries=binaries, workdir=workdir)
            # Its periodic push finds the keepalive lapsed (the push itself fails: its identity was revoked).
            grace = keepalive_grace(ttl, KEEPALIVE_RENEW).total_seconds()
            await eventually(left_there, timeout=grace + 60, what="the provider's own cleaning")
            events = k8s.CoreV1Api(there).list_namespaced_event("default", field_selector=f"involvedObject.name={consumer_id}")
            assert any(e.reason == "ConsumerSilent" and "copies here were deleted" in (e.message or "") for e in events.items)
        else:  # deleted: the provider's kwok ends the pods; the keepalive goes with the last of them, or by the
            # provider's own check
            await eventually(left_there, timeout=keepalive_grace(ttl, KEEPALIVE_RENEW).total_seconds() + 30,
                             what="the copies, the remote namespace and the keepalive gone")  # fmt: skip
    replayed = await replay_all_runs(temporal_client, handle.id)
    # Every run's history, not only the latest's: the credentials are read early, and the run that read them may
    # have continued as new since.
    scanned, findings = await scan_runs(temporal_client, handle.id, secrets)
    assert findings == []
    assert scanned >= len(replayed), (scanned, len(replayed))
