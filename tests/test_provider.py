"""The provider side against real clusters: a home cluster of the test's own (so that its numbers are
exactly the test's), cluster b as the foreign one, and the real worker of the home cluster."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import TimeSkipper

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.identity import mint_provider_identity
from kube.objects import patch_cluster_object_status, read_cluster_object
from models.api.common import SecretReference
from models.enforcement import QUOTA_NAME
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_NODE_TYPE,
    LABEL_OFFLOADED,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    VIRTUAL_NODE_TYPE,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
    peering_workflow_id,
)
from models.peering import PeeringInput, PeeringStatus, WithdrawResult
from tests.conftest import Clusters
from tests.kube import (
    apply_cluster_config,
    create_namespace,
    create_node,
    create_pod,
    create_runtime_class,
    wait_for,
)
from tests.replay import replay_all_runs
from tests.running import eventually, running_worker, worker_settings
from tests.steady import history, settled_history
from workers.peer import cancel_peering, request_peering, request_secret_name
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.provider]


def _config(api: k8s.ApiClient, **outgoing: Any) -> None:
    apply_cluster_config(api, outgoing=outgoing)


def _advertised(foreign: k8s.ApiClient, home_id: str) -> dict[str, str] | None:
    obj = read_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(home_id))
    return None if obj is None else obj["spec"]["resourceQuota"]["hard"]


def _enforced(api: k8s.ApiClient, foreign_id: str) -> tuple[dict[str, str], str | None]:
    """The quota's hard and the Pod Security level enforced in the foreign cluster's namespace here."""
    core, namespace = k8s.CoreV1Api(api), foreign_namespace(foreign_id)
    labels = core.read_namespace(namespace).metadata.labels or {}
    return (core.read_namespaced_resource_quota(QUOTA_NAME, namespace).spec.hard or {},
            labels.get("pod-security.kubernetes.io/enforce"))  # fmt: skip


def _peer(home: LocalCluster, home_id: str, foreign: LocalCluster, foreign_id: str) -> None:
    request_peering(home.api_client(), foreign.api_client(), provider_id=home_id, consumer_id=foreign_id)


@pytest.fixture
def home(make_cluster: Callable[[str], LocalCluster]) -> LocalCluster:
    return make_cluster("home")


def _populate(api: k8s.ApiClient, consumer: str) -> None:
    """Two physical nodes (6 CPU, 12Gi, 220 pods), one virtual node, and pods of every kind that the
    computation for `consumer` must count or leave out."""
    create_node(api, "n1", cpu="4", memory="8Gi")
    create_node(api, "n2", cpu="2", memory="4Gi")
    create_node(api, "virtual", cpu="100", memory="100Gi", labels={LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE})
    create_namespace(api, "work")
    create_runtime_class(api, "sandboxed", overhead={"cpu": "100m", "memory": "64Mi"})
    # Counted: max(containers 500m/1Gi, init 1/512Mi) + overhead 100m/64Mi = 1100m / 1Gi+64Mi.
    create_pod(api, "work", "running", node_name="n1", requests={"cpu": "500m", "memory": "1Gi"},
               init_requests=[{"cpu": "1", "memory": "512Mi"}], runtime_class="sandboxed")
    # Counted: 250m / 256Mi, still holding its resources while it terminates.
    create_pod(api, "work", "terminating", node_name="n2", requests={"cpu": "250m", "memory": "256Mi"})
    core = k8s.CoreV1Api(api)
    core.patch_namespaced_pod("terminating", "work", {"metadata": {"finalizers": ["tidepool.io/test-hold"]}})
    core.delete_namespaced_pod("terminating", "work")
    # Not counted: completed, offloaded by this consumer, on the virtual node, not yet scheduled.
    create_pod(api, "work", "completed", node_name="n2", requests={"cpu": "1", "memory": "1Gi"})
    # kwok starts every pod on its nodes; once it has, the pod "completes".
    wait_for(lambda: core.read_namespaced_pod("completed", "work").status.phase == "Running", timeout=30,
             what="kwok to start the pod")
    core.patch_namespaced_pod_status("completed", "work", {"status": {"phase": "Succeeded"}})
    create_namespace(api, foreign_namespace(consumer))  # where the consumer's copies run
    create_pod(api, foreign_namespace(consumer), "offloaded", node_name="n2", requests={"cpu": "1", "memory": "1Gi"},
               labels={LABEL_OFFLOADED: "true", LABEL_CONSUMER: consumer})
    create_pod(api, "work", "on-virtual", node_name="virtual", requests={"cpu": "3", "memory": "3Gi"})
    # fmt: skip


def _release_terminating(api: k8s.ApiClient) -> None:
    k8s.CoreV1Api(api).patch_namespaced_pod("terminating", "work", {"metadata": {"finalizers": None}})


async def test_the_advertisement_carries_exactly_the_shared_part_of_the_home_cluster(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, unique: str
) -> None:
    api, foreign = home.api_client(), clusters.b.api_client()
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _populate(api, foreign_id)
    _config(api, sharingPercentage=50)
    _peer(home, home_id, clusters.b, foreign_id)
    try:
        async with running_worker(worker_settings(localenv, home, home_id)):
            hard = await eventually(lambda: _advertised(foreign, home_id), what="the Advertisement on b")
    finally:
        _release_terminating(api)
    # (6 − 1.35) CPU × 50% = 2325m; (12Gi − 1Gi − 64Mi − 256Mi) × 50% = 5472Mi; (220 − 2) pods × 50% = 109.
    assert hard == {"cpu": "2325m", "memory": "5472Mi", "pods": "109"}


async def test_a_signal_an_update_and_a_cluster_config_edit_each_push_at_once(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, temporal_client: Client, unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, foreign = home.api_client(), clusters.b.api_client()
    create_node(api, "n1", cpu="10", memory="10Gi", pods="100")
    _config(api, sharingPercentage=10)
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    # Every push patches the PeeringRequest's status: the watcher must not start the peering again at each.
    starts: list[str] = []
    start_workflow = Client.start_workflow

    async def counting_start(self: Client, *args: Any, **kwargs: Any) -> Any:
        starts.append(kwargs.get("id", ""))
        return await start_workflow(self, *args, **kwargs)

    monkeypatch.setattr(Client, "start_workflow", counting_start)
    _peer(home, home_id, clusters.b, foreign_id)
    async with running_worker(worker_settings(localenv, home, home_id)):
        await eventually(lambda: (_advertised(foreign, home_id) or {}).get("cpu") == "1", what="10%")
        handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))

        await handle.signal(PeeringWorkflow.set_sharing_percentage, 20)
        await eventually(lambda: (_advertised(foreign, home_id) or {}).get("cpu") == "2", timeout=30, what="signal")

        status = await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 30)
        assert status.sharing_percentage == 30 and status.advertised is not None
        assert (_advertised(foreign, home_id) or {}).get("cpu") == "3"  # on the foreign cluster when it returns
        assert _enforced(api, foreign_id)[0]["requests.cpu"] == "3"  # and the quota with it (a signalled push too)

        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 101)
        assert "sharing_percentage must be an integer between 0 and 100, got 101" in str(refused.value.cause)
        assert (await handle.query(PeeringWorkflow.status)).sharing_percentage == 30
        assert (_advertised(foreign, home_id) or {}).get("cpu") == "3"  # nothing changed

        status = await handle.execute_update(PeeringWorkflow.update_sharing_percentage, None)  # the override dropped
        assert (status.sharing_percentage, status.sharing_percentage_override) == (10, None)
        _config(api, sharingPercentage=40)  # the ClusterConfig's again, each edit pushed at once
        await eventually(lambda: (_advertised(foreign, home_id) or {}).get("cpu") == "4", timeout=30, what="edit")
        # The Advertisement is on b before the workflow has taken in its push's result: ask until it has.
        async def adopted() -> PeeringStatus | None:
            status = await handle.query(PeeringWorkflow.status)
            return status if status.sharing_percentage == 40 else None

        status = await eventually(adopted, timeout=30, what="the ClusterConfig's percentage adopted")
        assert status.phase == "Advertised"
        assert status.pushes >= 4 and starts.count(peering_workflow_id(home_id, foreign_id)) == 1
        # A Pod Security level edited reaches the foreign namespace at the push the edit makes.
        quota, level = _enforced(api, foreign_id)
        assert (quota["requests.cpu"], level) == ("4", "baseline")
        _config(api, sharingPercentage=40, podSecurityLevel="restricted")
        await eventually(lambda: _enforced(api, foreign_id)[1] == "restricted", timeout=30, what="restricted")


async def test_withdrawal_leaves_nothing_on_either_cluster_and_duplicate_starts_yield_one_workflow(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api, foreign = home.api_client(), clusters.b.api_client()
    create_node(api, "n1", cpu="4", memory="4Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _peer(home, home_id, clusters.b, foreign_id)
    settings = worker_settings(localenv, home, home_id)
    async with running_worker(settings):
        await eventually(lambda: _advertised(foreign, home_id), what="the Advertisement on b")
        # A user starting the same peering from the CLI finds the running one.
        input = PeeringInput(foreign_cluster_id=foreign_id,
                             kube_config_ref=SecretReference(name=request_secret_name(foreign_id), namespace=SYSTEM_NAMESPACE))
        first: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))
        again = await temporal_client.start_workflow(
            PeeringWorkflow.run, input, id=peering_workflow_id(home_id, foreign_id), task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )  # fmt: skip
        assert again.result_run_id == (await first.describe()).run_id
        running = [w async for w in temporal_client.list_workflows(f"WorkflowId = '{peering_workflow_id(home_id, foreign_id)}'")]
        assert len(running) == 1

        cancel_peering(api, consumer_id=foreign_id)
        result = await first.result()
        assert result.foreign_cleaned and result.home_cleaned
    assert _advertised(foreign, home_id) is None
    with pytest.raises(ApiException) as gone:
        k8s.CoreV1Api(foreign).read_namespaced_secret(credentials_secret_name(home_id), SYSTEM_NAMESPACE)
    assert gone.value.status == 404
    await eventually(lambda: read_cluster_object(api, PEERING_REQUESTS, foreign_id) is None, what="request gone")
    namespaces = {ns.metadata.name for ns in k8s.CoreV1Api(api).list_namespace().items}
    await eventually(lambda: foreign_namespace(foreign_id) not in
                     {ns.metadata.name for ns in k8s.CoreV1Api(api).list_namespace().items}, what="namespace gone")
    del namespaces


def _can(api: k8s.ApiClient, namespace: str, verb: str, resource: str, subresource: str = "") -> bool:
    review = k8s.AuthorizationV1Api(api).create_self_subject_access_review(k8s.V1SelfSubjectAccessReview.model_validate(
        {"spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource,
                                         "subresource": subresource}}}))  # fmt: skip
    return bool(review.status.allowed)


async def test_the_foreign_credentials_allow_exactly_what_a_virtual_kubelet_needs(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, unique: str
) -> None:
    api, foreign = home.api_client(), clusters.b.api_client()
    create_node(api, "n1", cpu="4", memory="4Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _peer(home, home_id, clusters.b, foreign_id)
    async with running_worker(worker_settings(localenv, home, home_id)):
        await eventually(lambda: _advertised(foreign, home_id), what="the Advertisement on b")
    secret = k8s.CoreV1Api(foreign).read_namespaced_secret(credentials_secret_name(home_id), SYSTEM_NAMESPACE)
    kubeconfig = yaml.safe_load(base64.b64decode((secret.data or {})["kubeconfig"]))
    from kubernetes import config as k8s_config

    granted = k8s_config.new_client_from_config_dict(kubeconfig)
    own = foreign_namespace(foreign_id)
    for resource in ("pods", "configmaps", "secrets", "services"):
        for verb in ("get", "list", "watch", "create", "delete"):
            assert _can(granted, own, verb, resource), f"{verb} {resource} should be allowed"
    assert _can(granted, own, "patch", "pods") and not _can(granted, own, "update", "pods")
    assert _can(granted, own, "update", "configmaps") and not _can(granted, own, "patch", "services")
    assert not _can(granted, own, "patch", "pods", "status")  # the consumer's pods' status is written there
    assert _can(granted, own, "watch", "events") and not _can(granted, own, "create", "events")
    # The kubelet API it serves on the consumer: logs, exec, attach and port-forward of its copies.
    assert _can(granted, own, "get", "pods", "log")
    for subresource in ("exec", "attach", "portforward"):
        assert _can(granted, own, "create", "pods", subresource)
    # Nothing else: not other namespaces, not nodes, not RBAC.
    assert not _can(granted, "default", "get", "pods")
    assert not _can(granted, "default", "create", "pods", "exec")
    assert not _can(granted, own, "create", "roles")
    assert not _can(granted, "", "list", "nodes")
    assert not _can(granted, own, "get", "deployments")
    # ...and the token really is accepted by the home API server.
    k8s.CoreV1Api(granted).list_namespaced_pod(own)
    with pytest.raises(ApiException) as forbidden:
        k8s.CoreV1Api(granted).list_namespaced_pod("default")
    assert forbidden.value.status == 403


async def test_the_status_query_reports_the_push(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = home.api_client()
    create_node(api, "n1", cpu="2", memory="2Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _peer(home, home_id, clusters.b, foreign_id)
    async with running_worker(worker_settings(localenv, home, home_id)):
        handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))

        async def pushed() -> PeeringStatus | None:
            status = await handle.query(PeeringWorkflow.status)
            return status if status.pushes >= 1 else None

        status = await eventually(pushed, what="first push")
    assert status.phase == "Advertised" and status.sharing_percentage == 30  # the ClusterConfig default
    assert status.advertised == {"cpu": "600m", "memory": "614Mi", "pods": "33"}
    request = read_cluster_object(api, PEERING_REQUESTS, foreign_id)
    assert request is not None and request["status"]["phase"] == "Advertised"


async def test_thirty_five_minutes_give_exactly_four_pushes_across_continue_as_new(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api = home.api_client()
    create_node(api, "n1", cpu="2", memory="2Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    secret = "foreign-credentials"
    create_namespace(api, SYSTEM_NAMESPACE)
    handed = mint_provider_identity(clusters.b.api_client(), provider_id=home_id, lifetime_seconds=3600)
    k8s.CoreV1Api(api).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({
        "metadata": {"name": secret},
        "data": {"kubeconfig": base64.b64encode(handed.encode()).decode()},
    }))  # fmt: skip
    settings = worker_settings(localenv, home, home_id)
    skipper = TimeSkipper(temporal_client)
    async with running_worker(settings):
        # Started as a user would from the CLI: no PeeringRequest, credentials by reference.
        handle = await skipper.client.start_workflow(
            PeeringWorkflow.run,
            PeeringInput(foreign_cluster_id=foreign_id, kube_config_ref=SecretReference(name=secret, namespace=SYSTEM_NAMESPACE),
                         sharing_percentage=50),
            id=peering_workflow_id(home_id, foreign_id), task_queue=settings.task_queue,
        )  # fmt: skip
        first_run = (await handle.describe()).run_id
        assert await skipper.fast_forward(handle, timedelta(minutes=35))
        status = await handle.query(PeeringWorkflow.status)
        runs = [w async for w in temporal_client.list_workflows(f"WorkflowId = '{handle.id}'")]
        await handle.signal(PeeringWorkflow.withdraw)
        await handle.result()
    assert status.pushes == 4  # at 0, 10, 20 and 30 minutes
    assert status.sharing_percentage == 50  # state carried over continue-as-new
    assert len(runs) > 1 and (await handle.describe()).run_id != first_run
    await replay_all_runs(temporal_client, handle.id)


async def test_capacity_that_moves_past_the_threshold_is_pushed_without_waiting_for_the_period(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, unique: str
) -> None:
    api, foreign = home.api_client(), clusters.b.api_client()
    create_node(api, "n1", cpu="4", memory="8Gi")
    _config(api, sharingPercentage=50, capacityChangeThresholdPercent=10)
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _peer(home, home_id, clusters.b, foreign_id)
    async with running_worker(worker_settings(localenv, home, home_id)):
        await eventually(lambda: (_advertised(foreign, home_id) or {}).get("cpu") == "2", what="the first push")
        create_node(api, "n2", cpu="4", memory="8Gi")  # allocatable doubles: far past 10%
        await eventually(lambda: (_advertised(foreign, home_id) or {}).get("cpu") == "4", timeout=30,
                         what="the early push")  # fmt: skip


def _activities(events: list[Any], name: str) -> int:
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
               and e.activity_task_scheduled_event_attributes.activity_type.name == name)  # fmt: skip


def _signals(events: list[Any], name: str) -> int:
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
               and e.workflow_execution_signaled_event_attributes.signal_name == name)  # fmt: skip


def _timers(events: list[Any]) -> int:
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


@pytest.mark.steady
async def test_a_pending_decision_costs_nothing_until_the_foreign_cluster_decides_and_is_then_seen_at_once(
    localenv: EnvState, clusters: Clusters, home: LocalCluster, temporal_client: Client, unique: str
) -> None:
    api, foreign = home.api_client(), clusters.b.api_client()
    create_node(api, "n1", cpu="2", memory="2Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _peer(home, home_id, clusters.b, foreign_id)
    async with running_worker(worker_settings(localenv, home, home_id)):
        handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))
        await eventually(lambda: _advertised(foreign, home_id), what="the Advertisement on b")
        settled = await settled_history(temporal_client, handle.id)
        assert _activities(settled, "push_advertisement") == 1
        assert (await handle.query(PeeringWorkflow.status)).phase == "Advertised"  # pending: nobody decided

        # Twenty seconds of a pending decision: the old loop polled at 5, 10 and 20 s.
        await asyncio.sleep(20)
        assert len(await history(temporal_client, handle.id)) == len(settled), "a pending decision woke the workflow"

        patch_cluster_object_status(foreign, ADVERTISEMENTS, advertisement_name(home_id), {"phase": "Accepted"})

        async def accepted() -> PeeringStatus | None:
            status = await handle.query(PeeringWorkflow.status)
            return status if status.phase == "Accepted" else None

        await eventually(accepted, timeout=15, what="the acceptance seen")
        after = await settled_history(temporal_client, handle.id)
        assert _signals(after, "foreign_changed") == _signals(settled, "foreign_changed") + 1
        assert _activities(after, "read_foreign_decision") == _activities(settled, "read_foreign_decision") + 1
        assert _activities(after, "push_advertisement") == 1
        assert _timers(after) == _timers(settled)  # the period's timer runs on: the read started none

        # A push renews the TTL and the timestamp on b: that signals nobody.
        await handle.signal(PeeringWorkflow.set_sharing_percentage, 40)
        await eventually(lambda: (_advertised(foreign, home_id) or {}).get("cpu") == "800m", what="the push")
        pushed = await settled_history(temporal_client, handle.id)
        assert _activities(pushed, "push_advertisement") == 2
        assert _signals(pushed, "foreign_changed") == _signals(after, "foreign_changed")
    await replay_all_runs(temporal_client, handle.id)
