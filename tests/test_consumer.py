"""The consumer side against a real cluster of the test's own: Advertisements are written as a provider
would write them; the consumer's real worker admits them and runs their lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import TimeSkipper

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import (
    apply_cluster_object,
    list_cluster_objects,
    patch_cluster_object,
    patch_cluster_object_status,
    read_cluster_object,
)
from models.consumer import AdvertisementState
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    DECISION_ANNOTATION,
    REFUSED_OFFER_ANNOTATION,
    SYSTEM_NAMESPACE,
    VK_CLEAN_ANNOTATION,
    admission_workflow_id,
    advertisement_name,
    advertisement_workflow_id,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.times import format_rfc3339
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.replay import replay_all_runs
from tests.running import eventually, running_worker, worker_settings
from workflows.admission import AdmissionWorkflow
from workflows.advertisement import AdvertisementWorkflow

pytestmark = [pytest.mark.env, pytest.mark.consumer]


def advertisement(provider: str, *, cpu: str = "2", ttl: timedelta = timedelta(minutes=30)) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "apiVersion": API_VERSION, "kind": "Advertisement", "metadata": {"name": advertisement_name(provider)},
        "spec": {"clusterId": provider, "resourceQuota": {"hard": {"cpu": cpu, "memory": "4Gi", "pods": "10"}},
                 "network": {"podCIDR": "10.1.0.0/16"},
                 "kubeConfigRef": {"name": f"tidepool-kubeconfig-{provider}", "namespace": SYSTEM_NAMESPACE},
                 "timestamp": format_rfc3339(now), "timeToLive": format_rfc3339(now + ttl)},
    }  # fmt: skip


def _incoming(api: k8s.ApiClient, **incoming: Any) -> None:
    apply_cluster_config(api, incoming=incoming)


def _phases(api: k8s.ApiClient) -> dict[str, str | None]:
    return {a["spec"]["clusterId"]: (a.get("status") or {}).get("phase") for a in list_cluster_objects(api, ADVERTISEMENTS)}


def _accepted_message(api: k8s.ApiClient, provider: str) -> str:
    obj = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c.get("message") or "" for c in conditions if c["type"] == "Accepted"), "")


def _accepted(api: k8s.ApiClient) -> set[str]:
    return {p for p, phase in _phases(api).items() if phase == "Accepted"}


@pytest.fixture
def consumer(make_cluster: Callable[[str], LocalCluster]) -> LocalCluster:
    cluster = make_cluster("cons")
    create_namespace(cluster.api_client(), SYSTEM_NAMESPACE)
    return cluster


async def test_auto_accept_max_follows_a_maximum_raised_and_lowered(
    localenv: EnvState, consumer: LocalCluster, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=2)
    providers = [f"p{i}-{unique}" for i in range(4)]
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        for provider in providers:  # one after the other: arrival order is creation order
            apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider))
            await eventually(lambda p=provider: _phases(api).get(p) in ("Accepted", "Refused"), what=f"{provider} decided")
        assert _accepted(api) == set(providers[:2])
        assert (read_cluster_object(api, ADVERTISEMENTS, advertisement_name(providers[2])) or {})["status"]["reason"] == "MaxReached"

        _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=3)  # raised: the next in line
        await eventually(lambda: _accepted(api) == set(providers[:3]), what="the third accepted")
        # The one still refused says the new maximum (issue 15, item 8b).
        await eventually(lambda: "maxAcceptableAdvertisements is 3" in _accepted_message(api, providers[3]),
                         what="the refusal rewritten with the new maximum")  # fmt: skip

        _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=1)  # lowered: accepted ones stay
        late = f"late-{unique}"
        apply_cluster_object(api, ADVERTISEMENTS, advertisement(late))
        await eventually(lambda: _phases(api).get(late) == "Refused", what="a late arrival refused")
        assert _accepted(api) == set(providers[:3])


async def test_twenty_advertisements_arriving_at_once_with_a_maximum_of_five_accept_exactly_five(
    localenv: EnvState, consumer: LocalCluster, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=5)
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        for i in range(20):
            apply_cluster_object(api, ADVERTISEMENTS, advertisement(f"burst{i}-{unique}"))
        await eventually(lambda: all(p in ("Accepted", "Refused") for p in _phases(api).values())
                         and len(_phases(api)) == 20, timeout=60, what="all twenty decided")  # fmt: skip
        await eventually(lambda: len(_accepted(api)) == 5, what="five accepted")
    assert len(_accepted(api)) == 5


async def test_deny_and_allow_lists_and_invalid_advertisements_are_refused_with_their_reasons(
    localenv: EnvState, consumer: LocalCluster, unique: str
) -> None:
    api = consumer.api_client()
    allowed, denied, stranger = f"friend-{unique}", f"foe-{unique}", f"stranger-{unique}"
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=10,
              allowedClusters=[allowed, denied, f"empty-{unique}", f"expired-{unique}"],
              deniedClusters=[denied])  # fmt: skip
    empty = advertisement(f"empty-{unique}")
    empty["spec"]["resourceQuota"]["hard"] = {}
    expired = advertisement(f"expired-{unique}", ttl=timedelta(seconds=-60))
    expired["spec"]["timestamp"] = format_rfc3339(datetime.now(UTC) - timedelta(minutes=5))
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        for body in (advertisement(allowed), advertisement(denied), advertisement(stranger), empty, expired):
            apply_cluster_object(api, ADVERTISEMENTS, body)

        def reason(provider: str) -> str | None:
            obj = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) or {}
            return (obj.get("status") or {}).get("reason")

        def events(provider: str) -> list[str]:
            return [str(e.reason) for e in k8s.CoreV1Api(api).list_namespaced_event(
                "default", field_selector=f"involvedObject.name={advertisement_name(provider)}").items]  # fmt: skip

        await eventually(lambda: all(reason(p) for p in (allowed, denied, stranger, f"empty-{unique}")),
                         what="every decision")  # fmt: skip
        # The one that arrived expired is refused with its reason on record, then deleted as expired (issue 14).
        await eventually(lambda: "Expired" in events(f"expired-{unique}"), what="the expired one deleted")
    phases = _phases(api)
    assert phases[allowed] == "Accepted"
    assert (phases[denied], reason(denied)) == ("Refused", "Denied")  # deny wins over allow
    assert (phases[stranger], reason(stranger)) == ("Refused", "NotAllowed")
    assert (phases[f"empty-{unique}"], reason(f"empty-{unique}")) == ("Refused", "Invalid")
    assert f"expired-{unique}" not in phases
    assert sorted(events(f"expired-{unique}")) == ["Expired", "Invalid"]  # refused, then deleted


async def test_manual_acceptance_by_update_and_by_annotation(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="Manual", maxAcceptableAdvertisements=10)
    by_update, by_annotation, refused = f"upd-{unique}", f"ann-{unique}", f"ref-{unique}"
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        for provider in (by_update, by_annotation, refused):
            apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider))
        await eventually(lambda: set(_phases(api).values()) == {"Pending"} and len(_phases(api)) == 3,
                         what="all pending")  # fmt: skip
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", by_update))
        with pytest.raises(WorkflowUpdateFailedError) as bad:
            await handle.execute_update(AdvertisementWorkflow.accept, "  ")
        assert isinstance(bad.value.cause, ApplicationError) and bad.value.cause.type == "InvalidDecision"
        assert "give a reason" in bad.value.cause.message
        assert await handle.execute_update(AdvertisementWorkflow.accept, "capacity for the batch jobs") == "Accepted"

        patch_cluster_object(api, ADVERTISEMENTS, advertisement_name(by_annotation),
                             {"metadata": {"annotations": {DECISION_ANNOTATION: "accept"}}})  # fmt: skip
        refuse: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", refused))
        assert await refuse.execute_update(AdvertisementWorkflow.refuse, "too expensive") == "Refused"
        await eventually(lambda: _phases(api)[by_annotation] == "Accepted", what="accepted by annotation")
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await handle.execute_update(AdvertisementWorkflow.refuse, "changed my mind")
        assert isinstance(again.value.cause, ApplicationError) and again.value.cause.type == "InvalidDecision"
        assert "already Accepted" in again.value.cause.message
    assert _phases(api) == {by_update: "Accepted", by_annotation: "Accepted", refused: "Refused"}
    reason = (read_cluster_object(api, ADVERTISEMENTS, advertisement_name(refused)) or {})["status"]["reason"]
    assert reason == "ManuallyRefused"


@pytest.mark.explain
async def test_a_manual_decision_nobody_makes_in_time_is_refused_and_can_still_be_accepted_by_hand(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="Manual", manualDecisionTimeoutSeconds=3600)
    provider = f"late-{unique}"

    def status() -> dict[str, Any]:
        return (read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) or {}).get("status") or {}

    skipper = TimeSkipper(temporal_client)
    admission = temporal_client.get_workflow_handle(admission_workflow_id(f"cons-{unique}"))
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider, ttl=timedelta(hours=3)))
        await eventually(lambda: status().get("reason") == "AwaitingManualDecision", what="pending with a deadline")
        deadline = datetime.fromisoformat(status()["decisionDeadline"].replace("Z", "+00:00"))
        assert timedelta(minutes=59) < deadline - datetime.now(UTC) <= timedelta(hours=1)
        assert status()["decisionDeadline"] in _accepted_message(api, provider)
        await asyncio.wait_for(skipper.fast_forward(admission, timedelta(minutes=61)), timeout=60)
        await eventually(lambda: status().get("reason") == "DecisionTimedOut", what="refused when nobody decided")
        assert status()["phase"] == "Refused" and "decisionDeadline" not in status()
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(
            AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", provider))  # fmt: skip
        assert await handle.execute_update(AdvertisementWorkflow.accept, "late, but wanted") == "Accepted"
        assert status()["reason"] == "ManuallyAccepted"
    await replay_all_runs(temporal_client, admission_workflow_id(f"cons-{unique}"))


@pytest.mark.explain
async def test_a_virtual_node_never_ready_is_refused_and_its_virtual_kubelet_removed_until_the_offer_changes(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=5, virtualNodeReadyTimeoutSeconds=600)
    provider = f"stuck-{unique}"
    name = advertisement_name(provider)
    skipper = TimeSkipper(temporal_client)

    def found() -> dict[str, Any]:
        return read_cluster_object(api, ADVERTISEMENTS, name) or {}

    apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider, ttl=timedelta(hours=3)))
    patch_cluster_object_status(api, ADVERTISEMENTS, name,
                                {"phase": "Accepted", "reason": "WithinMaximum", "remoteRemappedPodCIDR": "None"})
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        # No virtual kubelet runs the Deployment here: its node never registers.
        await eventually(lambda: _deployment(api, provider), what="the virtual kubelet Deployment")
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(
            AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", provider))  # fmt: skip
        await asyncio.wait_for(skipper.fast_forward(handle, timedelta(minutes=11)), timeout=60)
        await eventually(lambda: _deployment(api, provider) is None and not found()["metadata"].get("finalizers"),
                         what="the virtual kubelet removed and the finalizer dropped")  # fmt: skip
        assert (found()["status"]["phase"], found()["status"]["reason"]) == ("Refused", "VirtualNodeNotReady")
        assert REFUSED_OFFER_ANNOTATION in found()["metadata"]["annotations"]
        # Admission passes again (a ClusterConfig edit signals it) and keeps it refused: no re-accept loop.
        admission = temporal_client.get_workflow_handle(admission_workflow_id(f"cons-{unique}"))
        _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=6, virtualNodeReadyTimeoutSeconds=600)

        async def passed_with_six() -> bool:
            last = await admission.query(AdmissionWorkflow.last_pass)
            return last is not None and last.maximum == 6

        await eventually(passed_with_six, what="an admission pass under the new maximum")
        assert found()["status"]["reason"] == "VirtualNodeNotReady"
        state = await eventually(lambda: handle.query(AdvertisementWorkflow.status), what="the workflow's state")
        assert state.teardown is None and "virtual-kubelet" in state.deleted and "advertisement" not in state.deleted
        # A new offer is decided afresh: accepted, and the virtual kubelet is back.
        apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider, cpu="3", ttl=timedelta(hours=3)))
        await eventually(lambda: _deployment(api, provider) is not None and found()["status"]["phase"] == "Accepted",
                         what="accepted again with its new offer")  # fmt: skip
        assert REFUSED_OFFER_ANNOTATION not in (found()["metadata"].get("annotations") or {})
    await replay_all_runs(temporal_client, advertisement_workflow_id(f"cons-{unique}", provider))


def _deployment(api: k8s.ApiClient, provider: str) -> Any:
    try:
        return k8s.AppsV1Api(api).read_namespaced_deployment(virtual_kubelet_name(provider), SYSTEM_NAMESPACE)
    except k8s.ApiException as e:
        if e.status == 404:
            return None
        raise


def _condition(api: k8s.ApiClient, provider: str, kind: str) -> dict[str, Any] | None:
    obj = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


async def test_nothing_is_created_before_the_pod_cidr_remapping_and_a_deleted_virtual_kubelet_comes_back(
    localenv: EnvState, consumer: LocalCluster, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=5, podCIDRWaitTimeoutSeconds=3)
    provider = f"prov-{unique}"
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider))
        await eventually(lambda: _phases(api).get(provider) == "Accepted", what="accepted")
        timed_out = await eventually(lambda: _condition(api, provider, "PodCIDRReady"), what="timeout condition")
        assert timed_out["reason"] == "RemappingTimedOut" and timed_out["status"] == "False"
        assert _deployment(api, provider) is None  # still nothing built

        patch_cluster_object_status(api, ADVERTISEMENTS, advertisement_name(provider), {"remoteRemappedPodCIDR": "None"})
        created = await eventually(lambda: _deployment(api, provider), what="the virtual kubelet Deployment")
        reference = await eventually(  # written once the Deployment is
            lambda: ((read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) or {}).get("status") or {})
            .get("vkReference"), what="the Advertisement's vkReference")  # fmt: skip
        assert reference == {"name": virtual_kubelet_name(provider), "namespace": SYSTEM_NAMESPACE}

        k8s.AppsV1Api(api).delete_namespaced_deployment(virtual_kubelet_name(provider), SYSTEM_NAMESPACE)
        back = await eventually(lambda: (d := _deployment(api, provider)) is not None
                                and d.metadata.uid != created.metadata.uid and d, what="recreated")  # fmt: skip
        assert back.metadata.name == virtual_kubelet_name(provider)


async def test_teardown_deletes_the_node_then_the_virtual_kubelet_then_the_advertisement(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    """The virtual kubelet's part (cleaning the provider namespace) is played here by its protocol: the
    clean annotation on its Deployment. tests/test_virtual_kubelet.py runs the real one end to end."""
    api = consumer.api_client()
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=5)
    provider = f"prov-{unique}"
    async with running_worker(worker_settings(localenv, consumer, f"cons-{unique}")):
        apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider))
        await eventually(lambda: _phases(api).get(provider) == "Accepted", what="accepted")
        patch_cluster_object_status(api, ADVERTISEMENTS, advertisement_name(provider), {"remoteRemappedPodCIDR": "None"})
        await eventually(lambda: _deployment(api, provider), what="the virtual kubelet Deployment")
        create_node(api, virtual_node_name(provider), cpu="2", memory="4Gi",
                    labels={"tidepool.io/type": "virtual-node", "tidepool.io/provider": provider})  # fmt: skip

        k8s.CustomObjectsApi(api).delete_cluster_custom_object("tidepool.io", "v1alpha1", ADVERTISEMENTS,
                                                               advertisement_name(provider))  # fmt: skip
        core = k8s.CoreV1Api(api)
        await eventually(lambda: virtual_node_name(provider) not in {n.metadata.name for n in core.list_node().items},
                         what="the virtual node deleted first")  # fmt: skip
        assert _deployment(api, provider) is not None  # the virtual kubelet still has the provider to clean
        assert read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) is not None
        k8s.AppsV1Api(api).patch_namespaced_deployment(virtual_kubelet_name(provider), SYSTEM_NAMESPACE,
                                                       {"metadata": {"annotations": {VK_CLEAN_ANNOTATION: "clean"}}})
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", provider))
        state = await asyncio.wait_for(handle.result(), timeout=180)
    deleted = state.deleted
    assert deleted["virtual-node"] < deleted["virtual-kubelet"] < deleted["advertisement"]
    await replay_all_runs(temporal_client, advertisement_workflow_id(f"cons-{unique}", provider))
    await replay_all_runs(temporal_client, admission_workflow_id(f"cons-{unique}"))
    assert read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) is None
    assert _deployment(api, provider) is None


async def test_an_advertisement_that_is_not_refreshed_expires_and_is_torn_down(
    localenv: EnvState, consumer: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = consumer.api_client()
    _incoming(api, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=5)
    provider = f"prov-{unique}"
    settings = worker_settings(localenv, consumer, f"cons-{unique}")
    skipper = TimeSkipper(temporal_client)
    apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider, ttl=timedelta(minutes=30)))
    patch_cluster_object_status(api, ADVERTISEMENTS, advertisement_name(provider),
                                {"phase": "Accepted", "reason": "WithinMaximum", "remoteRemappedPodCIDR": "None"})
    async with running_worker(settings):
        # The watcher starts the workflow; the skipper turns time skipping on for it and jumps its clock.
        handle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(AdvertisementWorkflow.run, advertisement_workflow_id(f"cons-{unique}", provider))
        await eventually(lambda: _deployment(api, provider), what="the virtual kubelet Deployment")
        k8s.AppsV1Api(api).patch_namespaced_deployment(virtual_kubelet_name(provider), SYSTEM_NAMESPACE,
                                                       {"metadata": {"annotations": {VK_CLEAN_ANNOTATION: "clean"}}})
        try:
            await asyncio.wait_for(skipper.fast_forward(handle, timedelta(minutes=31)), timeout=60)
        except TimeoutError:
            pass  # the (experimental) fast-forward poll can miss a run that ends with it: the result tells
        state = await asyncio.wait_for(handle.result(), timeout=60)
    assert state.teardown == "Expired"
    assert read_cluster_object(api, ADVERTISEMENTS, advertisement_name(provider)) is None
    assert _deployment(api, provider) is None
