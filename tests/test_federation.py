"""Many clusters through one Temporal namespace (issue 15): three clusters peering all-to-all, and a
broadcaster disabled and enabled again without a worker restart. Every worker is in the namespace `default`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_OFFLOADED,
    PEERING_FINALIZER,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    advertisement_name,
    advertisement_workflow_id,
    foreign_namespace,
    peering_workflow_id,
    task_queue,
    virtual_kubelet_name,
)
from models.peering import WithdrawResult
from models.settings import WorkerSettings
from tests.conftest import Clusters
from tests.kube import apply_cluster_config, create_namespace, create_node, create_pod
from tests.replay import continued_from
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import cancel_peering, request_peering
from workflows.peering import PeeringWorkflow
from workflows.search_attributes import HOME_CLUSTER

pytestmark = [pytest.mark.env, pytest.mark.federation]


def _advertised(foreign: k8s.ApiClient, home_id: str) -> dict[str, str] | None:
    obj = read_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(home_id))
    return None if obj is None else obj["spec"]["resourceQuota"]["hard"]


def _peer(home: LocalCluster, home_id: str, foreign: LocalCluster, foreign_id: str) -> None:
    request_peering(home.api_client(), foreign.api_client(), provider_id=home_id, consumer_id=foreign_id)


# Three clusters all-to-all ---------------------------------------------------------------------------
# Each cluster: one node of its own size, its own sharing percentage and PodCIDR. Nothing runs on the
# nodes, so each offer is allocatable × percentage, rounded down to 1m of CPU, 1Mi of memory, one pod
# (models/resources.py: Resources.scale), the same to both consumers.
FEDERATION: dict[str, dict[str, Any]] = {
    # 3 CPU × 30% = 900m; 5Gi = 5120Mi × 30% = 1536Mi; 110 pods × 30% = 33.
    "a": {"node": {"cpu": "3", "memory": "5Gi", "pods": "110"}, "percent": 30, "pod_cidr": "10.1.0.0/16",
          "offer": {"cpu": "900m", "memory": "1536Mi", "pods": "33"}},
    # 5 CPU × 45% = 2250m; 7Gi = 7168Mi × 45% = 3225.6Mi → 3225Mi; 110 pods × 45% = 49.5 → 49.
    "b": {"node": {"cpu": "5", "memory": "7Gi", "pods": "110"}, "percent": 45, "pod_cidr": "10.2.0.0/16",
          "offer": {"cpu": "2250m", "memory": "3225Mi", "pods": "49"}},
    # 2 CPU × 70% = 1400m; 3Gi = 3072Mi × 70% = 2150.4Mi → 2150Mi; 50 pods × 70% = 35.
    "c": {"node": {"cpu": "2", "memory": "3Gi", "pods": "50"}, "percent": 70, "pod_cidr": "10.3.0.0/16",
          "offer": {"cpu": "1400m", "memory": "2150Mi", "pods": "35"}},
}  # fmt: skip
# Six peerings, nine workflows to start and three clusters to build on a loaded machine.
CONVERGE_TIMEOUT = 120


async def test_three_clusters_peer_all_to_all_through_one_namespace_each_with_workflows_of_its_own(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str
) -> None:
    clusters = {name: make_cluster(name) for name in FEDERATION}
    ids = {name: f"{name}-{unique}" for name in FEDERATION}
    pairs = [(home, foreign) for home in FEDERATION for foreign in FEDERATION if home != foreign]
    settings: dict[str, WorkerSettings] = {}
    networks: list[NetworkModule] = []
    for name, spec in FEDERATION.items():
        api = clusters[name].api_client()
        create_node(api, "n1", **spec["node"])
        apply_cluster_config(api, outgoing={"sharingPercentage": spec["percent"]})
        create_namespace(api, SYSTEM_NAMESPACE)
        base = worker_settings(localenv, clusters[name], ids[name])
        settings[name] = base.model_copy(update={"cluster": base.cluster.model_copy(update={"pod_cidr": spec["pod_cidr"]})})
        # The clusters have no network module: this one writes the remapping each acceptance waits for.
        networks.append(NetworkModule(api, local_pod_cidr=spec["pod_cidr"]).start())
    for home, foreign in pairs:
        _peer(clusters[home], ids[home], clusters[foreign], ids[foreign])
    try:
        async with AsyncExitStack() as stack:
            for name in FEDERATION:
                await stack.enter_async_context(running_worker(settings[name]))

            def deployed() -> list[str]:
                """The pairs whose consumer has not yet accepted and started the provider's virtual kubelet."""
                apps = {name: k8s.AppsV1Api(clusters[name].api_client()) for name in FEDERATION}
                waiting = []
                for provider, consumer in pairs:
                    advert = read_cluster_object(clusters[consumer].api_client(), ADVERTISEMENTS, advertisement_name(ids[provider]))
                    names = {d.metadata.name for d in apps[consumer].list_namespaced_deployment(SYSTEM_NAMESPACE).items}
                    if (advert or {}).get("status", {}).get("phase") != "Accepted" or virtual_kubelet_name(ids[provider]) not in names:
                        waiting.append(f"{provider}→{consumer}")
                return waiting

            await eventually(lambda: not deployed(), timeout=CONVERGE_TIMEOUT,
                             what="six Advertisements Accepted, each with its virtual kubelet Deployment")  # fmt: skip

            for provider, consumer in pairs:
                assert _advertised(clusters[consumer].api_client(), ids[provider]) == FEDERATION[provider]["offer"], (
                    f"the offer of {provider} to {consumer}"
                )
            workflows = {
                **{peering_workflow_id(ids[h], ids[f]): h for h, f in pairs},  # the provider runs the peering
                **{advertisement_workflow_id(ids[f], ids[h]): f for h, f in pairs},  # the consumer its Advertisement's
            }
            assert len(workflows) == 12, "workflow ids collide"
            for workflow_id, home in workflows.items():
                description = await temporal_client.get_workflow_handle(workflow_id).describe()
                assert description.status == WorkflowExecutionStatus.RUNNING, workflow_id
                assert description.task_queue == task_queue(ids[home]), workflow_id
                home_attribute = description.typed_search_attributes.get(HOME_CLUSTER)
                assert home_attribute == ids[home], f"{workflow_id} says HomeCluster {home_attribute}"

            # Pods consumer b offloaded into a (in b's namespace there, within the quota of b's offer) hold 900m /
            # 1536Mi and a pod slot of a's node: the offer to c becomes (3 − 0.9 CPU, 5120 − 1536 Mi, 110 − 1
            # pods) × 30% = 630m, 1075.2Mi → 1075Mi, 32.7 → 32, pushed early (the period is 10 minutes); b's own
            # pods leave b's offer as it was.
            create_namespace(clusters["a"].api_client(), foreign_namespace(ids["b"]))  # where b's copies run
            create_pod(clusters["a"].api_client(), foreign_namespace(ids["b"]), "from-b", node_name="n1",
                       requests={"cpu": "900m", "memory": "1536Mi"},
                       labels={LABEL_OFFLOADED: "true", LABEL_CONSUMER: ids["b"]})  # fmt: skip
            shrunk = {"cpu": "630m", "memory": "1075Mi", "pods": "32"}
            await eventually(lambda: _advertised(clusters["c"].api_client(), ids["a"]) == shrunk, timeout=60,
                             what="a's offer to c shrunk by b's offloaded pods, before the period")  # fmt: skip
            assert _advertised(clusters["b"].api_client(), ids["a"]) == FEDERATION["a"]["offer"], "b's own pods shrank b's offer"

            # Every running workflow of these clusters is one of the twelve (and each cluster's admission):
            # none attached to another cluster's.
            query = " OR ".join(f"HomeCluster = '{i}'" for i in ids.values())
            listed = await eventually(lambda: _listed(temporal_client, f"ExecutionStatus = 'Running' AND ({query})", 15),
                                      timeout=30, what="the fifteen workflows in visibility")  # fmt: skip
            assert sorted(listed) == sorted([*workflows, *(f"admission-{i}" for i in ids.values())])

            for home, foreign in pairs:
                cancel_peering(clusters[home].api_client(), consumer_id=ids[foreign])
            for home, foreign in pairs:
                handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
                    PeeringWorkflow.run, peering_workflow_id(ids[home], ids[foreign]))
                assert (await handle.result()).home_cleaned
    finally:
        for network in networks:
            network.stop()


async def _listed(client: Client, query: str, expected: int) -> list[str] | None:
    ids = [w.id async for w in client.list_workflows(query)]
    return ids if len(ids) >= expected else None


# Broadcaster disabled and enabled again ----------------------------------------------------------------
@pytest.mark.provider
async def test_enabling_the_broadcaster_again_resumes_the_peering_without_a_worker_restart(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], temporal_client: Client,
    unique: str,
) -> None:  # fmt: skip
    home = make_cluster("home")
    api, foreign = home.api_client(), clusters.b.api_client()
    create_node(api, "n1", cpu="4", memory="4Gi")
    home_id, foreign_id = f"home-{unique}", f"b-{unique}"
    _peer(home, home_id, clusters.b, foreign_id)
    handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
        PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))
    async with running_worker(worker_settings(localenv, home, home_id)):
        await eventually(lambda: _advertised(foreign, home_id), what="the Advertisement on b")
        first_run = (await handle.describe()).run_id

        apply_cluster_config(api, outgoing={"enableBroadcaster": False})
        assert (await handle.result()).note == "BroadcasterDisabled"
        assert _advertised(foreign, home_id) is None
        request = read_cluster_object(api, PEERING_REQUESTS, foreign_id)
        assert request is not None and request["status"]["phase"] == "Withdrawn"
        assert PEERING_FINALIZER not in (request["metadata"].get("finalizers") or [])

        apply_cluster_config(api, outgoing={"enableBroadcaster": True})
        await eventually(lambda: _advertised(foreign, home_id), timeout=60, what="the Advertisement back on b")
        resumed = await handle.describe()
        assert resumed.run_id != first_run and resumed.status == WorkflowExecutionStatus.RUNNING

        def pushed_again() -> bool:
            request = read_cluster_object(api, PEERING_REQUESTS, foreign_id) or {}
            return (request.get("status") or {}).get("phase") == "Advertised" and PEERING_FINALIZER in request["metadata"].get("finalizers", [])

        await eventually(pushed_again, what="the PeeringRequest's status rewritten and its finalizer back")
        runs = await eventually(lambda: _runs_including(temporal_client, handle.id, resumed.run_id), what="the resumed run listed")
        # Started, not continued as new (the test server suggests that every 40 events): the first, the resumed one.
        started = [run for run in runs if not await continued_from(temporal_client, handle.id, run)]
        assert len(started) == 2, f"runs started while the broadcaster was disabled: {started}"

        cancel_peering(api, consumer_id=foreign_id)
        assert (await handle.result()).home_cleaned


async def _runs_including(client: Client, workflow_id: str, run_id: str) -> list[str] | None:
    runs = [w.run_id async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    return runs if run_id in runs else None
