"""What a consumer trusts of an Advertisement (issue 15, items 4 and 9), against a real cluster of the test's
own and its real worker: only the credentials Secret the protocol assigns the provider, only prices within
the ClusterConfig's caps, and price lists the API server itself refuses when they are garbage."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiException

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import apply_cluster_object, read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    CLUSTER_CONFIGS,
    GROUP,
    SYSTEM_NAMESPACE,
    VERSION,
    advertisement_name,
    credentials_secret_name,
    virtual_kubelet_name,
)
from tests.conftest import Clusters
from tests.kube import apply_cluster_config, create_namespace, delete_quietly
from tests.running import eventually, running_worker, worker_settings
from tests.test_consumer import advertisement

pytestmark = [pytest.mark.env, pytest.mark.consumer, pytest.mark.federation]


@pytest.fixture
def consumer(make_cluster: Callable[[str], LocalCluster]) -> LocalCluster:
    cluster = make_cluster("trust")
    create_namespace(cluster.api_client(), SYSTEM_NAMESPACE)
    return cluster


def _refused(api: k8s.ApiClient, name: str) -> dict[str, Any] | None:
    obj = read_cluster_object(api, ADVERTISEMENTS, name)
    return obj if obj is not None and (obj.get("status") or {}).get("phase") == "Refused" else None


def _event_message(api: k8s.ApiClient, name: str, reason: str) -> str | None:
    events = k8s.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return next((e.message or "" for e in events if e.reason == reason), None)


@pytest.mark.parametrize(
    ("make", "reason", "says"),
    [
        pytest.param(
            lambda rogue, victim: {**advertisement(rogue), "spec": {**advertisement(rogue)["spec"], "kubeConfigRef": {
                "name": credentials_secret_name(victim), "namespace": SYSTEM_NAMESPACE}}},
            "UnexpectedCredentials",
            lambda rogue, victim: [f"spec.kubeConfigRef names Secret {SYSTEM_NAMESPACE}/{credentials_secret_name(victim)}",
                                   f"{SYSTEM_NAMESPACE}/{credentials_secret_name(rogue)}"],
            id="a rogue provider pointing at another provider's credentials",
        ),
        pytest.param(
            lambda rogue, victim: {**advertisement(rogue), "spec": {**advertisement(rogue)["spec"],
                                                                  "prices": {"cpu": "0.05", "memory": "0.001"}}},
            "PriceTooHigh",
            lambda rogue, victim: ["spec.prices.cpu is 0.05 per CPU, above maxPrices.cpu 0.04"],
            id="a provider asking more than the cap",
        ),
    ],
)  # fmt: skip
async def test_an_advertisement_the_consumer_does_not_trust_is_refused_with_its_reason_and_an_event(
    localenv: EnvState, consumer: LocalCluster, unique: str, make: Any, reason: str, says: Any
) -> None:
    api = consumer.api_client()
    apply_cluster_config(api, incoming={"maxPrices": {"cpu": "0.04", "memory": "0.01"}})
    rogue, victim = f"rogue-{unique}", f"victim-{unique}"
    name = advertisement_name(rogue)
    async with running_worker(worker_settings(localenv, consumer, f"trust-{unique}")):
        apply_cluster_object(api, ADVERTISEMENTS, make(rogue, victim))
        obj = await eventually(lambda: _refused(api, name), timeout=60, what=f"{name} refused")
        event = await eventually(lambda: _event_message(api, name, reason), what=f"the {reason} Event")
    assert obj["status"]["reason"] == reason
    accepted = next(c for c in obj["status"]["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("False", reason)
    for words in says(rogue, victim):
        assert words in accepted["message"] and words in event, (accepted["message"], event)
    assert not obj["metadata"].get("finalizers")  # nothing was built on it
    with pytest.raises(ApiException):
        k8s.AppsV1Api(api).read_namespaced_deployment(virtual_kubelet_name(rogue), SYSTEM_NAMESPACE)


@pytest.mark.parametrize(
    ("plural", "body", "field"),
    [
        pytest.param(CLUSTER_CONFIGS, {"kind": "ClusterConfig", "spec": {"incoming": {"maxPrices": {"cpu": "-1"}}}},
                     "spec.incoming.maxPrices.cpu", id="a negative cap"),
        pytest.param(CLUSTER_CONFIGS, {"kind": "ClusterConfig", "spec": {"outgoing": {"prices": {"memory": -2}}}},
                     "spec.outgoing.prices.memory", id="a negative price written as a number"),
        pytest.param(ADVERTISEMENTS, {"kind": "Advertisement", "spec": {**advertisement("p")["spec"],
                                                                        "prices": {"cpu": "cheap"}}},
                     "spec.prices.cpu", id="an advertised price that is no number"),
    ],
)  # fmt: skip
def test_a_garbage_price_is_refused_by_the_api_server_naming_the_field(
    clusters: Clusters, unique: str, plural: str, body: dict[str, Any], field: str
) -> None:
    api, name = clusters.a.api_client(), f"bad-{unique}"
    objects = k8s.CustomObjectsApi(api)
    try:
        with pytest.raises(ApiException) as refused:
            objects.create_cluster_custom_object(GROUP, VERSION, plural,
                                                 {"apiVersion": API_VERSION, "metadata": {"name": name}, **body})  # fmt: skip
    finally:
        delete_quietly(objects.delete_cluster_custom_object, GROUP, VERSION, plural, name)
    assert refused.value.status == 422 and refused.value.body is not None, refused.value
    message = json.loads(refused.value.body)["message"]
    assert field in message, message
