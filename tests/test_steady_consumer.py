"""Issue 14, consumer side, against a real cluster and the real worker: heartbeats and TTL refreshes cost
the AdvertisementWorkflow nothing (its history does not grow), and an Advertisement that expires without
being accepted is deleted with a reason while its workflow completes. Each test first shows that a change
the workflow does read still reaches it, so that "nothing happened" cannot come from a dead watcher."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import apply_cluster_object, patch_cluster_object, patch_cluster_object_status, read_cluster_object
from models.consumer import AdvertisementState
from models.names import (
    ADVERTISEMENTS,
    LABEL_NODE_TYPE,
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    VIRTUAL_NODE_TYPE,
    admission_workflow_id,
    advertisement_name,
    advertisement_workflow_id,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.times import format_micro_time, format_rfc3339
from tests.kube import apply_cluster_config, create_namespace
from tests.replay import replay_all_runs
from tests.running import eventually, running_worker, worker_settings
from tests.steady import history, settled_history
from tests.test_consumer import advertisement
from workflows.advertisement import AdvertisementWorkflow

pytestmark = [pytest.mark.env, pytest.mark.consumer, pytest.mark.steady]
# A kubelet renews its Lease every 10 s; the watcher's key (what the workflow reads, not when) is what is
# tested, so the renewals come faster here: each one a separate watch event all the same.
HEARTBEAT = timedelta(seconds=5)
HEARTBEATS = 12
SETTLE = 2.0  # seconds for a watch event to reach the worker and its signal the workflow


@pytest.fixture
def consumer(make_cluster: Callable[[str], LocalCluster]) -> LocalCluster:
    cluster = make_cluster("cons")
    create_namespace(cluster.api_client(), SYSTEM_NAMESPACE)
    return cluster


def _phase(api: k8s.ApiClient, provider: str) -> str | None:
    return ((read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) or {}).get("status") or {}).get("phase")


def _deployment_exists(api: k8s.ApiClient, provider: str) -> bool:
    names = k8s.AppsV1Api(api).list_namespaced_deployment(SYSTEM_NAMESPACE).items
    return virtual_kubelet_name(provider) in {d.metadata.name for d in names}


async def _steady_accepted(api: k8s.ApiClient, client: Client, consumer_id: str, provider: str) -> WorkflowHandle[Any, Any]:
    """An accepted Advertisement with its virtual kubelet Deployment, its workflow waiting."""
    apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider))
    await eventually(lambda: _phase(api, provider) == "Accepted", what="accepted")
    patch_cluster_object_status(api, ADVERTISEMENTS, advertisement_name(provider), {"remoteRemappedPodCIDR": "None"})
    await eventually(lambda: _deployment_exists(api, provider), what="the virtual kubelet Deployment")
    return client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(consumer_id, provider))


def _ready(status: str, reason: str, *, since: str, heartbeat: str) -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "message": reason,
            "lastHeartbeatTime": heartbeat, "lastTransitionTime": since}  # fmt: skip


def _heartbeat(core: k8s.CoreV1Api, coordination: k8s.CoordinationV1Api, node: str, since: str) -> None:
    """What a kubelet does every 10 s: renew the node's Lease and (the old way) patch its status with
    fresh heartbeat times, nothing else changing."""
    now = datetime.now(UTC)
    core.patch_node_status(node, {"status": {"conditions": [
        _ready("True", "KubeletReady", since=since, heartbeat=format_rfc3339(now))]}})  # fmt: skip
    renew = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": format_micro_time(now)}
    try:
        coordination.patch_namespaced_lease(node, "kube-node-lease", {"spec": renew})
    except k8s.ApiException as e:
        if e.status != 404:
            raise
        coordination.create_namespaced_lease("kube-node-lease", k8s.V1Lease.model_validate({"metadata": {"name": node}, "spec": renew}))


async def test_a_virtual_node_that_heartbeats_for_a_minute_adds_no_event_to_its_advertisement_workflow(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    core, coordination = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    apply_cluster_config(api, incoming={"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 5})
    provider = f"prov-{unique}"
    node = virtual_node_name(provider)
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        handle = await _steady_accepted(api, temporal_client, f"cons-{unique}", provider)
        # A virtual node as the virtual kubelet registers it (not a kwok one: nobody else writes it).
        core.create_node(k8s.V1Node.model_validate({"metadata": {"name": node, "labels": {LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE,
                                                                 LABEL_PROVIDER: provider}}}))  # fmt: skip
        since = format_rfc3339(datetime.now(UTC))
        _heartbeat(core, coordination, node, since)
        before = len(await settled_history(temporal_client, handle.id))

        for _ in range(HEARTBEATS):
            await asyncio.sleep(HEARTBEAT.total_seconds())
            _heartbeat(core, coordination, node, since)
        await asyncio.sleep(SETTLE)  # the last heartbeat's watch event reaches the worker
        events = await history(temporal_client, handle.id)
        added = [EventType.Name(e.event_type) for e in events[before:]]
        assert len(events) == before, f"{HEARTBEATS} heartbeats added {added}"

        # The same watcher does pass on what the workflow reads: the Ready condition's status and reason.
        now = format_rfc3339(datetime.now(UTC))
        core.patch_node_status(node, {"status": {"conditions": [_ready("False", "PodCIDRNotSet", since=now,
                                                                       heartbeat=now)]}})  # fmt: skip
        await eventually(lambda: _signals_after(temporal_client, handle.id, before),
                         what="the NotReady node signalled to the workflow")


async def _signals_after(client: Client, workflow_id: str, index: int) -> int:
    events = await history(client, workflow_id)
    return sum(1 for e in events[index:] if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)


async def test_a_push_that_only_renews_the_time_to_live_of_an_accepted_advertisement_signals_nothing(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    apply_cluster_config(api, incoming={"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 5})
    provider = f"prov-{unique}"
    cluster_id = f"cons-{unique}"
    async with running_worker(worker_settings(localenv, consumer, cluster_id)):
        handle = await _steady_accepted(api, temporal_client, f"cons-{unique}", provider)
        admission = temporal_client.get_workflow_handle(admission_workflow_id(cluster_id))
        before = len(await settled_history(temporal_client, handle.id))
        admission_before = len(await settled_history(temporal_client, admission.id))

        for minutes in (40, 50, 60):  # three pushes, as the provider makes them: the whole spec, applied
            renewed = advertisement(provider, ttl=timedelta(minutes=minutes))
            apply_cluster_object(api, ADVERTISEMENTS, renewed)
            await asyncio.sleep(1)
        await asyncio.sleep(SETTLE)  # the last push's watch event reaches the worker
        landed = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider))
        assert landed is not None and landed["spec"]["timeToLive"] == renewed["spec"]["timeToLive"]  # the pushes did land
        assert len(await history(temporal_client, handle.id)) == before
        assert len(await history(temporal_client, admission.id)) == admission_before

        # A push that changes what is offered does reach the workflow (and only it: admission reads no capacity).
        patch_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider),
                             {"spec": {"resourceQuota": {"hard": {"cpu": "3", "memory": "4Gi", "pods": "10"}}}})
        await eventually(lambda: _signals_after(temporal_client, handle.id, before), what="the capacity change signalled")


async def test_an_expired_never_accepted_advertisement_is_deleted_with_a_reason_and_its_workflow_completes(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    pending, refused = f"pend-{unique}", f"ref-{unique}"
    # Manual: the first waits for a decision nobody makes; the allow list refuses the second.
    apply_cluster_config(api, incoming={"acceptPolicy": "Manual", "maxAcceptableAdvertisements": 5,
                                        "allowedClusters": [pending]})  # fmt: skip
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        for provider in (pending, refused):
            apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider, ttl=timedelta(seconds=20)))
        await eventually(lambda: (_phase(api, pending), _phase(api, refused)) == ("Pending", "Refused"),
                         what="one pending, one refused")  # fmt: skip
        handles: dict[str, WorkflowHandle[AdvertisementWorkflow, AdvertisementState]] = {
            p: temporal_client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", p))
            for p in (pending, refused)}  # fmt: skip
        states = {p: await asyncio.wait_for(h.result(), timeout=90) for p, h in handles.items()}
        for provider, state in states.items():
            assert state.teardown == "Expired", provider
            assert "advertisement" in state.deleted, provider
            assert read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) is None
            events = k8s.CoreV1Api(api).list_namespaced_event(
                "default", field_selector=f"involvedObject.name={advertisement_name(provider)},reason=Expired").items
            assert len(events) == 1 and "passed while" in (events[0].message or ""), provider
            # Slept until the expiry, then deleted: not a timer a second.
            timers = [e for e in await history(temporal_client, handles[provider].id)
                      if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
            assert len(timers) <= 2, f"{provider}: {len(timers)} timers"
        await replay_all_runs(temporal_client, advertisement_workflow_id(f"cons-{unique}", refused))
        await replay_all_runs(temporal_client, admission_workflow_id(f"cons-{unique}"))
