"""The local environment is made of real parts: each test proves one of them works."""

from __future__ import annotations

import json
import urllib.request

import pytest
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.worker import Worker

from deploy.localenv.env import EnvState
from tests.conftest import Clusters
from tests.kube import (
    create_namespace,
    create_node,
    create_pod,
    delete_quietly,
    wait_for,
)
from tests.smoke_workflow import GreetingWorkflow, greet

pytestmark = pytest.mark.env


def test_a_namespace_written_through_one_client_is_read_through_another(clusters: Clusters, unique: str) -> None:
    name = f"smoke-{unique}"
    create_namespace(clusters.a.api_client(), name)
    reader = k8s.CoreV1Api(clusters.a.api_client())
    assert reader.read_namespace(name).metadata.name == name
    # ...and the clusters are separate: b has no such namespace.
    assert name not in {ns.metadata.name for ns in k8s.CoreV1Api(clusters.b.api_client()).list_namespace().items}
    delete_quietly(reader.delete_namespace, name)


def _ready(core: k8s.CoreV1Api, node: str) -> bool:
    conditions = core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_a_kwok_node_becomes_ready(clusters: Clusters, unique: str) -> None:
    api = clusters.a.api_client()
    core = k8s.CoreV1Api(api)
    node = f"smoke-node-{unique}"
    create_node(api, node, cpu="4", memory="8Gi")
    try:
        wait_for(lambda: _ready(core, node), timeout=60, what=f"node {node} Ready")
    finally:
        delete_quietly(core.delete_node, node)


def test_a_pod_with_a_request_is_bound_by_the_scheduler_and_runs(clusters: Clusters, unique: str) -> None:
    api = clusters.c.api_client()
    core = k8s.CoreV1Api(api)
    node, namespace = f"smoke-node-{unique}", f"smoke-{unique}"
    create_node(api, node, cpu="2", memory="4Gi", labels={"smoke": unique})
    create_namespace(api, namespace)
    try:
        create_pod(api, namespace, "p", requests={"cpu": "500m", "memory": "256Mi"}, node_selector={"smoke": unique})
        pod = wait_for(
            lambda: (p := core.read_namespaced_pod("p", namespace)).status.phase == "Running" and p,
            timeout=90, what="pod Running",
        )  # fmt: skip
        assert pod.spec.node_name == node  # bound by kube-scheduler, not by us
        assert pod.status.pod_ip
    finally:
        delete_quietly(core.delete_namespace, namespace)
        delete_quietly(core.delete_node, node)


async def test_a_workflow_runs_an_activity_on_the_temporal_server(temporal_client: Client, task_queue: str) -> None:
    async with Worker(temporal_client, task_queue=task_queue, workflows=[GreetingWorkflow], activities=[greet]):
        result = await temporal_client.execute_workflow(
            GreetingWorkflow.run, "tidepool", id=f"smoke-{task_queue}", task_queue=task_queue
        )
    assert result == f"hello tidepool from {task_queue}"
    history = await temporal_client.get_workflow_handle(f"smoke-{task_queue}").fetch_history()
    assert any(e.activity_task_completed_event_attributes.result.payloads for e in history.events)


def test_the_web_ui_answers_over_http_and_sees_the_clusters_namespaces(localenv: EnvState) -> None:
    assert localenv.temporal_ui
    with urllib.request.urlopen(localenv.temporal_ui, timeout=10) as response:
        assert response.status == 200
        assert b"<html" in response.read()
    # The UI's own API proxies to our server: it lists the per-cluster namespaces registered at start.
    with urllib.request.urlopen(f"{localenv.temporal_ui}/api/v1/namespaces", timeout=10) as response:
        names = {ns["namespaceInfo"]["name"] for ns in json.load(response)["namespaces"]}
    assert {"default", "cluster-a", "cluster-b", "cluster-c", "cluster-tenant"} <= names
