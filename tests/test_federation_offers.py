"""Per-consumer offers against real clusters (issue 15 items 1 and 2): a provider of the test's own with one
4 CPU / 8Gi node, offering 100% to two consumers (the shared clusters b and c, whose workers do not run:
their Advertisements only have to arrive). Consumer b's offloaded pods shrink the offer to c and not b's own;
a burst of ordinary pods shrinks both. Each move reaches the consumers in one early push, long before the
period."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_OFFLOADED,
    advertisement_name,
    foreign_namespace,
    peering_workflow_id,
)
from models.peering import WithdrawResult
from tests.conftest import Clusters
from tests.kube import apply_cluster_config, create_namespace, create_node, create_pod
from tests.running import eventually, running_worker, worker_settings
from tests.steady import settled_history
from workers.peer import request_peering
from workflows.peering import PeeringWorkflow

pytestmark = [pytest.mark.env, pytest.mark.federation, pytest.mark.provider]

BURST = 5


def _offer(foreign: LocalCluster, home_id: str) -> dict[str, str] | None:
    obj = read_cluster_object(foreign.api_client(), ADVERTISEMENTS, advertisement_name(home_id))
    return None if obj is None else obj["spec"]["resourceQuota"]["hard"]


async def _pushes(handle: WorkflowHandle[Any, Any]) -> int:
    return (await handle.query(PeeringWorkflow.status)).pushes


async def test_pods_offloaded_by_one_consumer_shrink_only_the_offers_to_the_others_within_one_early_push(
    localenv: EnvState, clusters: Clusters, make_cluster: Any, temporal_client: Client, unique: str
) -> None:
    home: LocalCluster = make_cluster("home")
    api = home.api_client()
    create_node(api, "n1", cpu="4", memory="8Gi", pods="110")
    create_namespace(api, "work")
    # An hour's period: every push after the first two is an early one. Ten seconds between early pushes
    # to one consumer (the minimum), so that the burst's push to c is not held back for long.
    apply_cluster_config(api, outgoing={"sharingPercentage": 100, "advertisementPeriodSeconds": 3600,
                                        "advertisementTimeToLiveSeconds": 7200, "capacityChangeThresholdPercent": 10,
                                        "earlyPushMinIntervalSeconds": 10})  # fmt: skip
    home_id, b_id, c_id = f"home-{unique}", f"b-{unique}", f"c-{unique}"
    for consumer_id, consumer in ((b_id, clusters.b), (c_id, clusters.c)):
        request_peering(api, consumer.api_client(), provider_id=home_id, consumer_id=consumer_id)
    b: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
        PeeringWorkflow.run, peering_workflow_id(home_id, b_id)
    )
    c: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
        PeeringWorkflow.run, peering_workflow_id(home_id, c_id)
    )
    everything = {"cpu": "4", "memory": "8Gi", "pods": "110"}

    async with running_worker(worker_settings(localenv, home, home_id)):
        for consumer in (clusters.b, clusters.c):
            assert await eventually(lambda: _offer(consumer, home_id), what="the first push") == everything  # noqa: B023 - awaited here
        # The start may push twice (the ClusterConfig's first signal can arrive during the first push):
        # count from here.
        for handle in (b, c):
            await settled_history(temporal_client, handle.id)
        b_start, c_start = await _pushes(b), await _pushes(c)

        # Consumer b's pods, as its virtual kubelet would have offloaded them: 3 CPU / 6Gi and 2 pod slots.
        create_namespace(api, foreign_namespace(b_id))  # where b's copies run, within the quota of b's offer (all)
        for name, cpu, memory in (("b-1", "2", "4Gi"), ("b-2", "1", "2Gi")):
            create_pod(api, foreign_namespace(b_id), name, node_name="n1", requests={"cpu": cpu, "memory": memory},
                       labels={LABEL_OFFLOADED: "true", LABEL_CONSUMER: b_id})  # fmt: skip
        # (4 − 3) CPU, (8 − 6) Gi, 110 − 2 pods: b's pods are used capacity for c.
        await eventually(lambda: _offer(clusters.c, home_id) == {"cpu": "1", "memory": "2Gi", "pods": "108"},
                         timeout=30, what="the early push to c")  # fmt: skip
        for handle in (b, c):
            await settled_history(temporal_client, handle.id)
        assert await _pushes(c) == c_start + 1, "one early push to c"
        assert await _pushes(b) == b_start, "b's own pods do not move its offer"
        assert _offer(clusters.b, home_id) == everything

        # A burst of ordinary pods, 100m / 256Mi each, all at once: it shrinks every offer.
        with ThreadPoolExecutor(BURST) as pool:
            list(pool.map(lambda i: create_pod(api, "work", f"burst-{i}", node_name="n1",
                                               requests={"cpu": "100m", "memory": "256Mi"}), range(BURST)))  # fmt: skip
        await eventually(lambda: _offer(clusters.b, home_id) == {"cpu": "3500m", "memory": "6912Mi", "pods": "105"},
                         timeout=30, what="the early push to b")  # fmt: skip
        await eventually(lambda: _offer(clusters.c, home_id) == {"cpu": "500m", "memory": "768Mi", "pods": "103"},
                         timeout=30, what="the early push to c")  # fmt: skip
        for handle in (b, c):
            await settled_history(temporal_client, handle.id)
        assert (await _pushes(b), await _pushes(c)) == (b_start + 1, c_start + 2), "one early push each for the burst"

        for handle in (b, c):
            await handle.signal(PeeringWorkflow.withdraw)
            await handle.result()
