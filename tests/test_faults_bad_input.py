"""Bad input of every kind tidepool takes, each case a clear error or a refusal with a reason:

- invalid fields of the CRs, refused by the API server with the field's path (tests/test_api_server.py
  has the first ones; these are the others);
- out-of-range or ill-typed signals and updates: an update is refused with the reason and nothing
  changes; a signal is ignored and the workflow goes on;
- Advertisements a foreign cluster may write that pass the CRD but mean nothing sensible: admission
  refuses them (Refused/Invalid) with the problem in the Accepted condition;
- garbage slice annotations of pool namespaces: a Warning event and the placement-status annotation say
  why, and no placement is written;
- Secrets that are not there or hold no kubeconfig: the peering or the pool reports it and goes on.

After each: the workers still run, and no history of the workflows involved has a failed workflow task
(a workflow whose task fails is stuck, however Running it looks)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster
from deploy.localenv.env import EnvState
from kube.objects import apply_cluster_object, read_cluster_object
from kube.tenant_identity import add_tenant
from models.api import Advertisement, ClusterConfig, PeeringRequest, SuperCluster
from models.api.common import SecretReference
from models.consumer import AdvertisementState
from models.names import (
    ADVERTISEMENT_FINALIZER,
    ADVERTISEMENTS,
    API_VERSION,
    CLUSTER_CONFIGS,
    DECISION_ANNOTATION,
    DECISION_REASON_ANNOTATION,
    PEERING_REQUESTS,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    SLICE_ANNOTATION,
    SUPER_CLUSTERS,
    SYSTEM_NAMESPACE,
    advertisement_name,
    advertisement_workflow_id,
    credentials_secret_name,
    peering_workflow_id,
    task_queue,
    virtual_kubelet_name,
)
from models.peering import PeeringInput, PeeringStatus
from models.times import format_rfc3339
from tests.conftest import Clusters
from tests.faults import WorkerProcess, failed_workflow_tasks
from tests.kube import apply_cluster_config, create_namespace, create_node, delete_quietly
from tests.running import eventually, worker_settings
from workers.peer import request_peering
from workflows.advertisement import AdvertisementWorkflow
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.faults]
# Each test's bound; the first of a group also pays for making its clusters and starting its workers.
SETUP_AND_TEST = 300

# 1. Invalid CR fields, refused by the API server naming the field -------------------------------------

PLURALS = {ClusterConfig: CLUSTER_CONFIGS, PeeringRequest: PEERING_REQUESTS, Advertisement: ADVERTISEMENTS,
           SuperCluster: SUPER_CLUSTERS}  # fmt: skip
_REF = {"name": "creds", "namespace": SYSTEM_NAMESPACE}


def _adv(**spec: Any) -> dict[str, Any]:
    return {"spec": {"clusterId": "provider-a", "resourceQuota": {"hard": {"cpu": "2"}}, "network": {"podCIDR": "10.1.0.0/16"},
                     "kubeConfigRef": _REF, "timestamp": "2026-01-01T00:00:00Z", "timeToLive": "2026-01-01T00:30:00Z",
                     **spec}}  # fmt: skip


CR_CASES = [
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"advertisementPeriodSeconds": 5}}},
                 "spec.outgoing.advertisementPeriodSeconds", id="a period under 10 s"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"advertisementPeriodSeconds": 10, "advertisementTimeToLiveSeconds": 20}}},
                 "spec.outgoing.advertisementTimeToLiveSeconds", id="a time to live under 30 s"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"capacityChangeThresholdPercent": 0}}},
                 "spec.outgoing.capacityChangeThresholdPercent", id="a capacity threshold of 0"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"enableBroadcaster": "maybe"}}},
                 "spec.outgoing.enableBroadcaster", id="a broadcaster switch that is not a boolean"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"sharingPercentage": "50%"}}},
                 "spec.outgoing.sharingPercentage", id="a percentage written as text"),
    pytest.param(ClusterConfig, {"spec": {"incoming": {"maxAcceptableAdvertisements": -1}}},
                 "spec.incoming.maxAcceptableAdvertisements", id="a negative maximum"),
    pytest.param(ClusterConfig, {"spec": {"incoming": {"podCIDRWaitTimeoutSeconds": 0}}},
                 "spec.incoming.podCIDRWaitTimeoutSeconds", id="a PodCIDR wait of 0"),
    pytest.param(ClusterConfig, {"spec": {"incoming": {"allowedClusters": "cluster-b"}}},
                 "spec.incoming.allowedClusters", id="an allow list that is not a list"),
    pytest.param(ClusterConfig, {"spec": {"keepalive": {"thresholdFailures": 0}}},
                 "spec.keepalive.thresholdFailures", id="a keepalive of 0 failures"),
    pytest.param(ClusterConfig, {"spec": {"keepalive": {"retrySeconds": 3601}}},
                 "spec.keepalive.retrySeconds", id="a keepalive retry over an hour"),
    pytest.param(PeeringRequest, {"spec": {"clusterIdentity": {"clusterId": "c" * 64}, "kubeConfigRef": _REF}},
                 "spec.clusterIdentity.clusterId", id="a cluster id of 64 characters"),
    pytest.param(PeeringRequest, {"spec": {"clusterIdentity": {"clusterId": "b"}, "kubeConfigRef": {"namespace": "x"}}},
                 "spec.kubeConfigRef.name", id="credentials without a Secret name"),
    pytest.param(Advertisement, _adv(clusterId="Provider-A"), "spec.clusterId", id="an upper-case provider id"),
    pytest.param(Advertisement, _adv(timestamp="yesterday"), "spec.timestamp", id="a timestamp that is no time"),
    pytest.param(Advertisement, _adv(kubeConfigRef={"name": "creds", "namespace": "n" * 64}),
                 "spec.kubeConfigRef.namespace", id="a Secret namespace of 64 characters"),
    pytest.param(SuperCluster, {"spec": {"kubeConfigRef": _REF, "headroom": {"cpu": "lots"}}}, "spec.headroom.cpu",
                 id="a headroom that is no quantity"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "obj", "field"), CR_CASES)
def test_an_invalid_cr_field_is_refused_by_the_api_server_naming_the_field(
    clusters: Clusters, unique: str, kind: Any, obj: dict[str, Any], field: str
) -> None:
    api, name = clusters.a.api_client(), f"bad-{unique}"
    with pytest.raises(ValidationError):  # the models agree with the API server
        kind.from_kubernetes({"metadata": {"name": name}, **obj})
    body = {"apiVersion": API_VERSION, "kind": kind.KIND, "metadata": {"name": name}, **obj}
    try:
        with pytest.raises(ApiException) as refused:
            k8s.CustomObjectsApi(api).create_cluster_custom_object("tidepool.io", "v1alpha1", PLURALS[kind], body)
    finally:
        delete_quietly(k8s.CustomObjectsApi(api).delete_cluster_custom_object, "tidepool.io", "v1alpha1",
                       PLURALS[kind], name)  # fmt: skip
    assert refused.value.status == 422 and refused.value.body is not None, refused.value
    message = json.loads(refused.value.body)["message"]
    assert field in message, message


# A world of its own for the rest: a provider peered with a consumer (Manual policy, so that the
# Advertisement waits Pending for a decision), both workers as separate processes. ------------------------


@dataclass
class World:
    provider: LocalCluster
    consumer: LocalCluster
    provider_id: str
    consumer_id: str
    workers: list[WorkerProcess]
    client: Client

    @property
    def peering(self) -> Any:
        return self.client.get_workflow_handle_for(PeeringWorkflow.run, peering_workflow_id(self.provider_id, self.consumer_id))

    @property
    def lifecycle(self) -> Any:
        return self.client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(self.consumer_id, self.provider_id))

    def advertised_cpu(self) -> str | None:
        obj = read_cluster_object(self.consumer.api_client(), ADVERTISEMENTS, advertisement_name(self.provider_id))
        return None if obj is None else obj["spec"]["resourceQuota"]["hard"].get("cpu")

    async def healthy(self, *workflow_ids: str) -> None:
        """No worker crashed; no workflow involved has a failed workflow task."""
        for worker in self.workers:
            assert worker.alive(), f"worker {worker.cluster_id} exited with {worker.exit_code()}; see {worker.log}"
        for workflow_id in workflow_ids:
            assert await failed_workflow_tasks(self.client, workflow_id) == []


def _own_clusters(localenv: EnvState, *roles: str) -> Iterator[dict[str, LocalCluster]]:
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    suffix = datetime.now(UTC).strftime("%H%M%S")
    names = {role: f"{role}-bad-{suffix}" for role in roles}
    try:
        yield {role: create_cluster(name, binaries=binaries, workdir=workdir) for role, name in names.items()}
    finally:
        for name in names.values():
            delete_cluster(name, binaries=binaries, workdir=workdir)


@pytest.fixture(scope="module")
def peer_clusters(localenv: EnvState) -> Iterator[dict[str, LocalCluster]]:
    yield from _own_clusters(localenv, "prov", "cons")


@pytest.fixture(scope="module")
def pool_clusters(localenv: EnvState) -> Iterator[dict[str, LocalCluster]]:
    yield from _own_clusters(localenv, "tenant", "super")


def _first_push_recorded(world: World) -> Callable[[], Awaitable[bool]]:
    async def recorded() -> bool:
        status: PeeringStatus = await world.peering.query(PeeringWorkflow.status)
        return status.pushes >= 1 and status.sharing_percentage is not None and status.foreign_phase is not None
    return recorded


@pytest.fixture(scope="module")
async def world(localenv: EnvState, peer_clusters: dict[str, LocalCluster],
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:  # fmt: skip
    provider, consumer = peer_clusters["prov"], peer_clusters["cons"]
    suffix = provider.name.rsplit("-", 1)[-1]
    provider_id, consumer_id = f"prov-{suffix}", f"cons-{suffix}"
    create_node(provider.api_client(), "big", cpu="10", memory="16Gi")
    apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 50})
    create_namespace(consumer.api_client(), SYSTEM_NAMESPACE)
    apply_cluster_config(consumer.api_client(), incoming={"acceptPolicy": "Manual"})
    logs = tmp_path_factory.mktemp("bad-input")
    workers = [WorkerProcess(cluster=c, cluster_id=i, temporal_address=localenv.temporal_address, log=logs / f"{i}.log")
               for c, i in ((provider, provider_id), (consumer, consumer_id))]  # fmt: skip
    client = await Client.connect(localenv.temporal_address, namespace="default", data_converter=pydantic_data_converter)
    try:
        for worker in workers:
            worker.start()
        request_peering(provider.api_client(), consumer.api_client(), provider_id=provider_id, consumer_id=consumer_id)
        world = World(provider, consumer, provider_id, consumer_id, workers, client)
        await eventually(lambda: world.advertised_cpu() == "5", timeout=90, what="the Advertisement on the consumer")
        # The Advertisement is there while the push's activity runs: the tests compare the workflow's status with
        # what it was before them, so they start once the push is recorded too.
        await eventually(_first_push_recorded(world), timeout=60, what="the first push in the peering's status")
        yield world
    finally:
        for worker in workers:
            worker.stop()


# 2. Out-of-range and ill-typed signals and updates -------------------------------------------------------

PEERING_INPUTS = [
    pytest.param("update", "update_sharing_percentage", 150, "between 0 and 100, got 150", id="update: 150 percent"),
    pytest.param("update", "update_sharing_percentage", -1, "between 0 and 100, got -1", id="update: -1 percent"),
    pytest.param("update", "update_sharing_percentage", True, "integer between 0 and 100, got True",
                 id="update: a boolean for a percentage"),
    pytest.param("update", "update_sharing_percentage", "fifty", "integer between 0 and 100, got 'fifty'",
                 id="update: text for a percentage"),
    pytest.param("update", "update_sharing_percentage", 33.5, "integer between 0 and 100, got 33.5",
                 id="update: a fraction of a percent"),
    pytest.param("update", "update_sharing_percent", 50, "'update_sharing_percent' expected but not found",
                 id="update: one that does not exist"),
    pytest.param("signal", "set_sharing_percentage", True, None, id="signal: a boolean for a percentage"),
    pytest.param("signal", "set_sharing_percentage", 150, None, id="signal: 150 percent"),
    pytest.param("signal", "set_sharing_percentage", -5, None, id="signal: -5 percent"),
    pytest.param("signal", "set_sharing_percentage", "fifty", None, id="signal: text for a percentage"),
    pytest.param("signal", "cluster_config_changed", "latest", None, id="signal: text for a generation"),
    pytest.param("signal", "withdraw", "Whenever", None, id="signal: a withdrawal for an unknown reason"),
    pytest.param("signal", "set_sharing_percent", 50, None, id="signal: one that does not exist"),
]  # fmt: skip


@pytest.mark.timeout(SETUP_AND_TEST)
@pytest.mark.parametrize(("kind", "name", "value", "reason"), PEERING_INPUTS)
async def test_a_bad_signal_is_ignored_and_a_bad_update_refused_and_nothing_changes(
    world: World, kind: str, name: str, value: Any, reason: str | None
) -> None:
    before: PeeringStatus = await world.peering.query(PeeringWorkflow.status)
    cpu = world.advertised_cpu()
    if kind == "update":
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await world.peering.execute_update(name, value)
        message = str(refused.value.cause)
        assert reason is not None and reason in message, message
    else:
        await world.peering.signal(name, value)
    # Not stuck: a valid update goes through the loop and comes back (it pushes the same percentage).
    after = await world.peering.execute_update(PeeringWorkflow.update_sharing_percentage, before.sharing_percentage,
                                               result_type=PeeringStatus)  # fmt: skip
    assert after.sharing_percentage == before.sharing_percentage and after.phase == before.phase
    assert after.pushes > before.pushes
    assert world.advertised_cpu() == cpu
    await world.healthy(world.peering.id)


# The reason None means the argument does not decode as text: the SDK refuses it before the validator runs.
DECISIONS = [
    pytest.param("accept", "x" * 257, "at most 256 characters", id="accept: a reason of 257 characters"),
    pytest.param("refuse", "", "a non-empty text", id="refuse: an empty reason"),
    pytest.param("accept", 42, None, id="accept: a number for a reason"),
    pytest.param("refuse", None, None, id="refuse: no reason at all"),
]  # fmt: skip


@pytest.mark.timeout(SETUP_AND_TEST)
@pytest.mark.parametrize(("update", "value", "reason"), DECISIONS)
async def test_a_bad_manual_decision_is_refused_and_the_advertisement_stays_pending(
    world: World, update: str, value: Any, reason: str | None
) -> None:
    consumer = world.consumer.api_client()
    await eventually(lambda: ((read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(world.provider_id))
                               or {}).get("status") or {}).get("phase") == "Pending", what="Pending")  # fmt: skip
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await world.lifecycle.execute_update(update, value)
    cause = refused.value.cause
    if reason is None:
        assert str(cause), "a refusal says why"
    else:
        assert isinstance(cause, ApplicationError) and cause.type == "InvalidDecision" and cause.non_retryable, cause
        assert reason in cause.message, cause.message
    adv = read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(world.provider_id))
    assert adv is not None and adv["status"]["phase"] == "Pending"
    annotations = adv["metadata"].get("annotations") or {}
    assert DECISION_ANNOTATION not in annotations and DECISION_REASON_ANNOTATION not in annotations  # none recorded
    await world.healthy(world.lifecycle.id)


# 3. Advertisements a foreign cluster may write: they pass the CRD, admission refuses them ------------------


def _foreign_advertisement(name: str, provider: str, *, hard: dict[str, str] | None = None,
                           born: timedelta = timedelta(0), ttl: timedelta = timedelta(minutes=30)) -> dict[str, Any]:  # fmt: skip
    now = datetime.now(UTC) + born
    return {"apiVersion": API_VERSION, "kind": "Advertisement", "metadata": {"name": name},
            "spec": {"clusterId": provider, "resourceQuota": {"hard": hard or {"cpu": "2", "memory": "4Gi"}},
                     "network": {"podCIDR": "10.9.0.0/16"}, "kubeConfigRef": {"name": credentials_secret_name(provider), "namespace": SYSTEM_NAMESPACE},
                     "timestamp": format_rfc3339(now), "timeToLive": format_rfc3339(now + ttl)}}  # fmt: skip


MALFORMED = [
    pytest.param(lambda p: _foreign_advertisement(advertisement_name(f"other-{p}"), p),
                 "metadata.name", id="a name that is not its clusterId's"),
    pytest.param(lambda p: _foreign_advertisement(advertisement_name(p), p, born=-timedelta(minutes=10), ttl=timedelta(minutes=5)),
                 "has passed", id="a time to live already passed"),
    pytest.param(lambda p: _foreign_advertisement(advertisement_name(p), p, hard={"cpu": "0", "memory": "0"}),
                 "offers nothing", id="resources that are all zero"),
]  # fmt: skip
# (A negative amount no longer passes the CRD: tests/test_api_server.py has the API server refuse it.)


@pytest.mark.timeout(SETUP_AND_TEST)
@pytest.mark.parametrize(("make", "problem"), MALFORMED)
async def test_a_malformed_foreign_advertisement_is_refused_with_the_problem_named(
    world: World, unique: str, make: Any, problem: str
) -> None:
    consumer = world.consumer.api_client()
    body = make(f"rogue-{unique}")
    name = body["metadata"]["name"]
    apply_cluster_object(consumer, ADVERTISEMENTS, body)
    try:
        obj = await eventually(lambda: _decided_or_gone(consumer, name), timeout=60, what="a decision")
        if obj is GONE:
            # An arrival already expired is refused, then deleted by its workflow at once (issue 14): the
            # refusal and the deletion are on record as Events.
            assert problem == "has passed", f"{name} was deleted, not refused"
            events = await eventually(lambda: _events_by_reason(consumer, name, {"Invalid", "Expired"}), timeout=30,
                                      what="the refusal's and the deletion's Events")  # fmt: skip
            assert problem in events["Invalid"]
        else:
            assert (obj["status"]["phase"], obj["status"]["reason"]) == ("Refused", "Invalid")
            accepted = next(c for c in obj["status"]["conditions"] if c["type"] == "Accepted")
            assert accepted["status"] == "False" and problem in accepted["message"], accepted
            assert not obj["metadata"].get("finalizers")  # nothing built on it
        with pytest.raises(ApiException) as no_virtual_kubelet:
            k8s.AppsV1Api(consumer).read_namespaced_deployment(virtual_kubelet_name(f"rogue-{unique}"), SYSTEM_NAMESPACE)
        assert no_virtual_kubelet.value.status == 404, no_virtual_kubelet.value  # not there, not merely unreadable
    finally:
        delete_quietly(k8s.CustomObjectsApi(consumer).delete_cluster_custom_object, "tidepool.io", "v1alpha1",
                       ADVERTISEMENTS, name)  # fmt: skip
    await world.healthy(advertisement_workflow_id(world.consumer_id, f"rogue-{unique}"))


GONE: dict[str, Any] = {"gone": True}


def _decided_or_gone(api: k8s.ApiClient, name: str) -> dict[str, Any] | None:
    obj = read_cluster_object(api, ADVERTISEMENTS, name)
    if obj is None:
        return GONE
    return obj if (obj.get("status") or {}).get("reason") else None


def _events_by_reason(api: k8s.ApiClient, name: str, reasons: set[str]) -> dict[str, str] | None:
    """The messages of the Events about `name` by reason, once there is one for each of `reasons`."""
    events = k8s.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    found = {e.reason: e.message or "" for e in events if e.reason}
    return found if reasons <= found.keys() else None


# 4. Missing Secrets ---------------------------------------------------------------------------------------

MISSING_SECRETS = [
    pytest.param(None, "does not exist", id="a kubeConfigRef to no Secret"),
    pytest.param({"other": base64.b64encode(b"x").decode()}, "has no key 'kubeconfig'", id="a Secret without the key"),
    pytest.param({"kubeconfig": base64.b64encode(b"clusters: [ {token: s3cr3t-t0ken-value").decode()},
                 "key 'kubeconfig' refused: kubeconfig: not YAML", id="a kubeconfig that is no YAML"),
    pytest.param({"kubeconfig": base64.b64encode(b"apiVersion: v1\nkind: Config\n").decode()},
                 "key 'kubeconfig' refused: clusters: must be a list of one entry", id="a kubeconfig without a cluster"),
]  # fmt: skip


@pytest.mark.timeout(SETUP_AND_TEST)
@pytest.mark.parametrize(("data", "reason"), MISSING_SECRETS)
async def test_a_peering_whose_credentials_are_missing_reports_it_and_can_be_withdrawn(
    world: World, unique: str, data: dict[str, str] | None, reason: str
) -> None:
    provider = world.provider.api_client()
    secret, foreign = f"creds-{unique}", f"ghost-{unique}"
    if data is not None:
        k8s.CoreV1Api(provider).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({"metadata": {"name": secret}, "data": data}))
    handle = await world.client.start_workflow(
        PeeringWorkflow.run, PeeringInput(foreign_cluster_id=foreign, kube_config_ref=SecretReference(name=secret, namespace=SYSTEM_NAMESPACE)),
        id=peering_workflow_id(world.provider_id, foreign), task_queue=task_queue(world.provider_id),
    )  # fmt: skip

    async def unreachable() -> PeeringStatus | None:
        status: PeeringStatus = await handle.query(PeeringWorkflow.status)
        return status if status.phase == "Unreachable" else None

    status = await eventually(unreachable, timeout=60, what="the peering Unreachable")
    assert status.last_error and reason in status.last_error, status.last_error
    assert "s3cr3t" not in status.last_error  # the error says where, never what the Secret holds
    assert not any(b"s3cr3t" in e.SerializeToString() for e in (await handle.fetch_history()).events)
    await handle.signal(PeeringWorkflow.withdraw)
    result = await handle.result()
    assert result.home_cleaned and not result.foreign_cleaned
    await world.healthy(handle.id)
    delete_quietly(k8s.CoreV1Api(provider).delete_namespaced_secret, secret, SYSTEM_NAMESPACE)


@pytest.mark.timeout(SETUP_AND_TEST)
async def test_a_peering_request_whose_secret_is_missing_says_so_in_its_status(world: World, unique: str) -> None:
    provider = world.provider.api_client()
    foreign = f"nosecret-{unique}"
    apply_cluster_object(provider, PEERING_REQUESTS, {"apiVersion": API_VERSION, "kind": "PeeringRequest",
        "metadata": {"name": foreign}, "spec": {"clusterIdentity": {"clusterId": foreign},
                                               "kubeConfigRef": {"name": f"absent-{unique}", "namespace": SYSTEM_NAMESPACE}}})  # fmt: skip
    obj = await eventually(lambda: (o := read_cluster_object(provider, PEERING_REQUESTS, foreign)) and
                           (o.get("status") or {}).get("phase") == "Unreachable" and o, timeout=60, what="Unreachable")  # fmt: skip
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "does not exist" in ready["message"], ready
    k8s.CustomObjectsApi(provider).delete_cluster_custom_object("tidepool.io", "v1alpha1", PEERING_REQUESTS, foreign)
    await eventually(lambda: read_cluster_object(provider, PEERING_REQUESTS, foreign) is None, timeout=60,
                     what="the request withdrawn and gone")  # fmt: skip
    await world.healthy(peering_workflow_id(world.provider_id, foreign))


@pytest.mark.timeout(SETUP_AND_TEST)
async def test_a_peering_started_with_an_invalid_input_fails_at_once_instead_of_hanging(world: World, unique: str) -> None:
    """From the `temporal` CLI anything can come: the workflow must fail with the reason, not retry a
    failing workflow task for ever."""
    workflow_id = peering_workflow_id(world.provider_id, f"bad-input-{unique}")
    handle = await world.client.start_workflow(
        "PeeringWorkflow", {"foreign_cluster_id": "Not_A_DNS_Label", "kube_config_ref": {"name": "s", "namespace": "n"}},
        id=workflow_id, task_queue=task_queue(world.provider_id),
    )  # fmt: skip
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), timeout=60)
    assert "foreign_cluster_id" in str(failed.value.cause), failed.value.cause
    await world.healthy(workflow_id)


@pytest.mark.timeout(SETUP_AND_TEST)
async def test_a_misnamed_advertisement_claiming_a_provider_does_not_hijack_the_real_ones_lifecycle(
    world: World, unique: str
) -> None:
    """A foreign cluster writes `advertisement-other` with clusterId p before p's own Advertisement arrives:
    admission refuses the misnamed one, and p's own is still decided and built on."""
    consumer = world.consumer.api_client()
    provider = f"victim-{unique}"
    impostor = _foreign_advertisement(advertisement_name(f"impostor-{unique}"), provider)
    apply_cluster_object(consumer, ADVERTISEMENTS, impostor)
    try:
        await eventually(lambda: ((read_cluster_object(consumer, ADVERTISEMENTS, impostor["metadata"]["name"]) or {})
                                  .get("status") or {}).get("reason") == "Invalid", timeout=60, what="the impostor refused")  # fmt: skip
        apply_cluster_object(consumer, ADVERTISEMENTS, _foreign_advertisement(advertisement_name(provider), provider))
        await eventually(lambda: ((read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(provider)) or {})
                                  .get("status") or {}).get("phase") == "Pending", timeout=60, what="the real one Pending")  # fmt: skip
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = world.client.get_workflow_handle_for(
            AdvertisementWorkflow.run, advertisement_workflow_id(world.consumer_id, provider))
        assert await handle.execute_update(AdvertisementWorkflow.accept, "the real one") == "Accepted"
        await eventually(lambda: ADVERTISEMENT_FINALIZER in (
            (read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(provider)) or {}).get("metadata", {})
            .get("finalizers") or []), timeout=60, what="the real one held by its lifecycle (finalizer)")  # fmt: skip
    finally:
        for name in (impostor["metadata"]["name"], advertisement_name(provider)):
            delete_quietly(k8s.CustomObjectsApi(consumer).delete_cluster_custom_object, "tidepool.io", "v1alpha1",
                           ADVERTISEMENTS, name)  # fmt: skip
    await world.healthy(advertisement_workflow_id(world.consumer_id, provider))


# 5. The pool: garbage slice annotations, a SuperCluster whose Secret is missing ---------------------------


@dataclass
class PoolWorld:
    tenant: LocalCluster
    client: Client
    workflow_id: str
    task: asyncio.Task[None]


@pytest.fixture(scope="module")
async def pool(localenv: EnvState, pool_clusters: dict[str, LocalCluster]) -> AsyncIterator[PoolWorld]:
    from workers.pool import run

    tenant, super_ = pool_clusters["tenant"], pool_clusters["super"]
    api = tenant.api_client()
    create_namespace(api, SYSTEM_NAMESPACE)
    add_tenant(api, api, "t1")  # the tenant's control plane is the pool's management cluster too
    create_node(super_.api_client(), "s-node", cpu="8", memory="16Gi")
    k8s.CoreV1Api(api).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({"metadata": {"name": "super-s1"},
        "data": {"kubeconfig": base64.b64encode(super_.kubeconfig.read_bytes()).decode()}}))  # fmt: skip
    for name, secret in (("s1", "super-s1"), ("lost", "no-such-secret")):
        apply_cluster_object(api, SUPER_CLUSTERS, {"apiVersion": API_VERSION, "kind": "SuperCluster", "metadata": {"name": name},
                                                   "spec": {"kubeConfigRef": {"name": secret, "namespace": SYSTEM_NAMESPACE}}})  # fmt: skip
    suffix = tenant.name.rsplit("-", 1)[-1]
    stop = asyncio.Event()
    workflow_id = f"pool-scheduler-bad-{suffix}"
    task = asyncio.create_task(run(worker_settings(localenv, tenant, f"pool-bad-{suffix}"), stop=stop,
                                   task_queue=f"pool-bad-{suffix}", workflow_id=workflow_id))  # fmt: skip
    client = await Client.connect(localenv.temporal_address, namespace="default", data_converter=pydantic_data_converter)
    try:
        yield PoolWorld(tenant, client, workflow_id, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)


GARBAGE_SLICES = [
    pytest.param("a slice", "not a JSON ResourceList", id="a slice that is no JSON"),
    pytest.param('["cpu", "1"]', "must be a JSON object of quantities", id="a slice that is a list"),
    pytest.param('{"cpu": "lots"}', "lots", id="a slice whose quantity is none"),
    pytest.param('{"cpu": "0", "memory": "0"}', "must be positive", id="a slice of nothing"),
]  # fmt: skip


@pytest.mark.timeout(SETUP_AND_TEST)
@pytest.mark.parametrize(("annotation", "problem"), GARBAGE_SLICES)
async def test_a_garbage_slice_annotation_is_reported_on_the_namespace_and_nothing_is_placed(
    pool: PoolWorld, unique: str, annotation: str, problem: str
) -> None:
    core = k8s.CoreV1Api(pool.tenant.api_client())
    namespace = f"team-{unique}"
    core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": namespace, "annotations": {SLICE_ANNOTATION: annotation}}}))
    core.create_namespaced_resource_quota(namespace, k8s.V1ResourceQuota.model_validate({"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": "2", "memory": "4Gi"}}}))

    def status() -> dict[str, Any] | None:
        text = (core.read_namespace(namespace).metadata.annotations or {}).get(PLACEMENT_STATUS_ANNOTATION)
        return json.loads(text) if text else None

    placed = await eventually(status, timeout=60, what="the namespace's placement status")
    assert (placed["status"], placed["reason"]) == ("False", "InvalidSlice"), placed
    assert problem in placed["message"], placed
    assert PLACEMENTS_ANNOTATION not in (core.read_namespace(namespace).metadata.annotations or {})

    def warned() -> bool:  # the event is recorded just after the annotation
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={namespace}").items
        events += core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={namespace}").items
        return any(e.reason == "InvalidSlice" and e.type == "Warning" and problem in (e.message or "") for e in events)

    await eventually(warned, timeout=30, what="a Warning event InvalidSlice on the namespace")
    assert not pool.task.done(), "the pool worker stopped"
    assert await failed_workflow_tasks(pool.client, pool.workflow_id) == []
    core.delete_namespace(namespace)


@pytest.mark.timeout(SETUP_AND_TEST)
async def test_a_super_cluster_whose_secret_is_missing_fails_its_probes_with_the_reason(pool: PoolWorld) -> None:
    from workflows.pool import PoolSchedulerWorkflow

    handle = pool.client.get_workflow_handle_for(PoolSchedulerWorkflow.run, pool.workflow_id)

    async def states() -> dict[str, str] | None:
        last = await handle.query(PoolSchedulerWorkflow.last_pass)
        said = last.clusters.get("lost", "") if last is not None else ""
        return last.clusters if last is not None and "does not exist" in said else None

    clusters = await eventually(states, timeout=60, what="a pool pass that saw the prober's verdict on both")
    assert clusters["s1"].startswith("Ready (ProbeSucceeded)")
    # Failing, within the grace period or past it by the time the pass ran: never Ready.
    assert clusters["lost"].split(":")[0] in ("Suspect (ProbeFailing)", "Unreachable (Unreachable)"), clusters
    assert not pool.task.done(), "the pool worker stopped"
    assert await failed_workflow_tasks(pool.client, pool.workflow_id) == []
