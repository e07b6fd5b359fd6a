"""The workers' Prometheus endpoints, scraped as Prometheus would: two real cluster workers (a provider
and a consumer, on clusters of the test's own) each with a metrics port, one peering pushed and accepted,
and the tidepool series carry the numbers of the Advertisement and the decision next to the SDK's own;
the pool worker's series count the slices it placed and the namespace it could not place."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from decimal import Decimal

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from deploy.localenv.temporal import free_port
from kube.metrics import (
    ACCEPTANCE_DECISIONS,
    ADVERTISED_CPU,
    ADVERTISED_MEMORY,
    PLACEMENT_FAILURES,
    PLACEMENTS,
    PUSH_LATENCY,
    PUSHES,
)
from kube.objects import apply_cluster_object, read_cluster_object
from kube.tenant_identity import add_tenant
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    SLICE_ANNOTATION,
    SUPER_CLUSTERS,
    SYSTEM_NAMESPACE,
    advertisement_name,
)
from models.quantities import parse_quantity
from models.settings import MetricsSettings
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.running import eventually, running_worker, worker_settings
from tests.scraping import naming_problems, scrape, scraped, value
from workers.peer import request_peering
from workers.pool import run as run_pool

pytestmark = [pytest.mark.env]

# Counters as Prometheus names them: the exporter appends _total to the instrument's name.
PUSHES_TOTAL, DECISIONS_TOTAL = f"{PUSHES}_total", f"{ACCEPTANCE_DECISIONS}_total"
PLACEMENTS_TOTAL, PLACEMENT_FAILURES_TOTAL = f"{PLACEMENTS}_total", f"{PLACEMENT_FAILURES}_total"

@pytest.mark.provider
@pytest.mark.consumer
async def test_the_workers_serve_the_peering_and_the_decision_next_to_the_sdk_metrics(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    create_node(provider.api_client(), "n1", cpu="6", memory="12Gi")
    apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 50})
    request_peering(provider.api_client(), consumer.api_client(), provider_id=provider_id, consumer_id=consumer_id)
    provider_port, consumer_port = free_port(), free_port()
    provider_settings = worker_settings(localenv, provider, provider_id).model_copy(
        update={"metrics": MetricsSettings(port=provider_port)}
    )
    consumer_settings = worker_settings(localenv, consumer, consumer_id).model_copy(
        update={"metrics": MetricsSettings(port=consumer_port)}
    )
    foreign = consumer.api_client()

    def accepted() -> dict[str, str] | None:
        obj = read_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(provider_id))
        if obj is None or (obj.get("status") or {}).get("phase") != "Accepted":
            return None
        return dict(obj["spec"]["resourceQuota"]["hard"])

    async with running_worker(provider_settings), running_worker(consumer_settings):
        hard = await eventually(accepted, timeout=60, what="the Advertisement accepted on the consumer")
        # The gauges follow the push that carried this Advertisement; a later push may only repeat it.
        provider_samples = await eventually(
            lambda: scraped(provider_port, ADVERTISED_CPU, foreign_cluster=consumer_id), what="the advertised cpu"
        )
        consumer_samples = await eventually(
            lambda: scraped(consumer_port, DECISIONS_TOTAL, provider=provider_id, phase="Accepted"),
            what="the acceptance decision",
        )
        naming = {"provider": naming_problems(provider_port, service="worker"),
                  "consumer": naming_problems(consumer_port, service="worker")}  # fmt: skip

    assert Decimal(str(value(provider_samples, ADVERTISED_CPU, foreign_cluster=consumer_id))) == parse_quantity(hard["cpu"])
    assert Decimal(str(value(provider_samples, ADVERTISED_MEMORY, foreign_cluster=consumer_id))) == parse_quantity(
        hard["memory"]
    )
    assert parse_quantity(hard["cpu"]) == Decimal(3)  # 6 CPU × 50%: the series carries the real share
    pushes = value(provider_samples, PUSHES_TOTAL, foreign_cluster=consumer_id, outcome="ok")
    assert pushes is not None and pushes >= 1
    assert value(provider_samples, f"{PUSH_LATENCY}_count", foreign_cluster=consumer_id, outcome="ok") == pushes
    assert value(provider_samples, PUSHES_TOTAL, foreign_cluster=consumer_id, outcome="failed") is None
    # The decision is counted once, when it is written, with its closed reason.
    assert value(consumer_samples, DECISIONS_TOTAL, provider=provider_id, phase="Accepted",
                 reason="WithinMaximum") == 1  # fmt: skip
    # The SDK's own metrics share the endpoint: the activities just run were counted there.
    assert value(provider_samples, "temporal_activity_execution_latency_count",
                 activity_type="push_advertisement", task_queue=provider_settings.task_queue)  # fmt: skip
    assert any(name.startswith("temporal_") for name, _, _ in consumer_samples)
    assert naming == {"provider": [], "consumer": []}


@pytest.mark.pool
async def test_the_pool_worker_serves_placements_and_placement_failures(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    tenant, super_cluster = make_cluster("tenant"), make_cluster("s1")
    api, core = tenant.api_client(), k8s.CoreV1Api(tenant.api_client())
    create_namespace(api, SYSTEM_NAMESPACE)
    add_tenant(api, api, "t1")  # the tenant's control plane is the pool's management cluster too
    create_node(super_cluster.api_client(), "s1-node", cpu="4", memory="8Gi")  # 4 slices of 1 CPU / 2Gi
    core.create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({"metadata": {"name": "super-s1"},
        "data": {"kubeconfig": base64.b64encode(super_cluster.kubeconfig.read_bytes()).decode()}}))  # fmt: skip
    apply_cluster_object(api, SUPER_CLUSTERS, {"apiVersion": API_VERSION, "kind": "SuperCluster", "metadata": {"name": "s1"},
        "spec": {"kubeConfigRef": {"name": "super-s1", "namespace": SYSTEM_NAMESPACE}}})  # fmt: skip
    def tenant_namespace(name: str, slices: int) -> None:
        core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": name, "annotations": {SLICE_ANNOTATION: '{"cpu": "1", "memory": "2Gi"}'}}}))
        core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate({"metadata": {"name": "quota"},
                                                     "spec": {"hard": {"cpu": str(slices), "memory": f"{2 * slices}Gi"}}}))  # fmt: skip

    tenant_namespace("shop", 3)  # fits
    tenant_namespace("huge", 20)  # fits nowhere
    port = free_port()
    settings = worker_settings(localenv, tenant, f"pool-{unique}").model_copy(update={"metrics": MetricsSettings(port=port)})
    stop = asyncio.Event()
    task = asyncio.create_task(run_pool(settings, stop=stop, task_queue=f"pool-{unique}",
                                        workflow_id=f"pool-scheduler-{unique}"))  # fmt: skip
    try:
        first = await eventually(lambda: scraped(port, PLACEMENT_FAILURES_TOTAL, reason="InsufficientCapacity")
                                 and scraped(port, PLACEMENTS_TOTAL, super_cluster="s1"), timeout=60,
                                 what="the pool's placement series")  # fmt: skip
        # One more namespace: a pass that places it finds "huge" still unplaced, for the same reason.
        tenant_namespace("small", 1)
        then = await eventually(lambda: (s := scrape(port)) and value(s, PLACEMENTS_TOTAL, super_cluster="s1") == 4 and s,
                                timeout=60, what="the third namespace placed")  # fmt: skip
        naming = naming_problems(port, service="pool")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
    assert value(first, PLACEMENTS_TOTAL, super_cluster="s1") == 3
    # A namespace that stays unplaced for the same reason is counted once, however many passes see it.
    assert value(first, PLACEMENT_FAILURES_TOTAL, reason="InsufficientCapacity") == 1
    assert value(then, PLACEMENT_FAILURES_TOTAL, reason="InsufficientCapacity") == 1
    assert naming == []
