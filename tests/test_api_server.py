"""The real API server enforces the same rules as the models, with messages that name the field."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from deploy.localenv.binaries import ensure_binaries
from models.api import Advertisement, ClusterConfig, PeeringRequest
from tests.conftest import Clusters
from tests.test_api_models import INVALID, advertisement

pytestmark = [pytest.mark.env, pytest.mark.api]

PLURALS = {ClusterConfig: "clusterconfigs", PeeringRequest: "peeringrequests", Advertisement: "advertisements"}


def _create(api: k8s.ApiClient, kind: Any, name: str, obj: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": "tidepool.io/v1alpha1", "kind": kind.KIND, **obj, "metadata": {"name": name}}
    created = k8s.CustomObjectsApi(api).create_cluster_custom_object(
        "tidepool.io", "v1alpha1", PLURALS[kind], body, field_validation="Strict"
    )
    assert isinstance(created, dict), created  # the client types a custom object as `object`
    return created


def _message(refused: ApiException) -> str:
    """What the API server said in the Status body of a refused call."""
    assert refused.body is not None, refused
    return str(json.loads(refused.body)["message"])


def _delete(api: k8s.ApiClient, kind: Any, name: str) -> None:
    try:
        k8s.CustomObjectsApi(api).delete_cluster_custom_object("tidepool.io", "v1alpha1", PLURALS[kind], name)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.mark.parametrize(("kind", "obj", "field"), [p for p in INVALID if p.values[0] in PLURALS])
def test_the_api_server_refuses_what_the_models_refuse_and_names_the_field(
    clusters: Clusters, unique: str, kind: Any, obj: dict[str, Any], field: str
) -> None:
    api = clusters.a.api_client()
    name = f"bad-{unique}"
    with pytest.raises(ValidationError):
        kind.from_kubernetes({"metadata": {"name": name}, **obj})
    try:
        with pytest.raises(ApiException) as refused:
            _create(api, kind, name, obj)
    finally:
        _delete(api, kind, name)
    assert refused.value.status in (400, 422)
    message = _message(refused.value)
    assert field.split(".")[-1] in message, message


def test_the_ttl_rule_has_the_same_message_in_both_places(clusters: Clusters, unique: str) -> None:
    bad = advertisement(timeToLive="2025-12-31T23:00:00Z")
    with pytest.raises(ValidationError) as python_error:
        Advertisement.from_kubernetes(bad)
    with pytest.raises(ApiException) as server_error:
        _create(clusters.a.api_client(), Advertisement, f"ttl-{unique}", bad)
    assert "timeToLive must be later than timestamp" in str(python_error.value)
    assert "timeToLive must be later than timestamp" in _message(server_error.value)


def test_a_cluster_id_cannot_change_once_set(clusters: Clusters, unique: str) -> None:
    api = clusters.a.api_client()
    name = f"imm-{unique}"
    _create(api, Advertisement, name, advertisement())
    try:
        with pytest.raises(ApiException) as refused:
            k8s.CustomObjectsApi(api).patch_cluster_custom_object(
                "tidepool.io", "v1alpha1", "advertisements", name, {"spec": {"clusterId": "someone-else"}}
            )
        assert "clusterId is immutable" in _message(refused.value)
    finally:
        _delete(api, Advertisement, name)


def test_a_valid_advertisement_is_stored_and_shows_its_printer_columns(clusters: Clusters, unique: str) -> None:
    api = clusters.a.api_client()
    name = f"ok-{unique}"
    stored = _create(api, Advertisement, name, advertisement())
    try:
        assert Advertisement.from_kubernetes(stored).spec.resource_quota.hard == {"cpu": "2", "memory": "4Gi"}
        kubectl = ensure_binaries().kubectl
        shown = subprocess.run([str(kubectl), "--kubeconfig", str(clusters.a.kubeconfig), "get", "adv", name],
                               check=True, capture_output=True, text=True).stdout.splitlines()  # fmt: skip
        assert shown[0].split() == ["NAME", "CLUSTER", "PHASE", "CPU", "MEMORY", "EXPIRES", "AGE"]
        assert shown[1].split()[:2] == [name, "provider-a"]
    finally:
        _delete(api, Advertisement, name)
