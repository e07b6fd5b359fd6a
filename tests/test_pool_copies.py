"""The one token-stripping rule and the one status-copy rule (models/pods.py) that the virtual kubelet's
copies and the pool syncer's copies share. Pure: no cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from models.pods import copied_status, strip_service_account_token
from models.pool.sync import pod_for_super
from models.virtual_kubelet import safe_pod_spec

pytestmark = [pytest.mark.pool, pytest.mark.vk]

TOKEN_MOUNT = {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
SPEC: dict[str, Any] = {
    "serviceAccountName": "builder",
    "containers": [{"name": "main", "image": "busybox", "volumeMounts": [
        {"name": "settings", "mountPath": "/s"}, TOKEN_MOUNT, {"name": "my-token", "mountPath": "/t"}]}],
    "initContainers": [{"name": "init", "image": "busybox", "volumeMounts": [TOKEN_MOUNT]}],
    "volumes": [
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
        # A token the user projected under a name of their own: a credential of the origin all the same.
        {"name": "my-token", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault"}}]}},
    ],
}  # fmt: skip


def _copies() -> list[pytest.ParameterSet]:
    tenant_pod = {"metadata": {"name": "web", "uid": "u1"}, "spec": copy.deepcopy(SPEC)}
    return [
        pytest.param(safe_pod_spec(SPEC, "shop"), id="the virtual kubelet's copy in the provider"),
        pytest.param(pod_for_super(tenant_pod, target_namespace="t-shop", tenant_namespace="shop")["spec"],
                     id="the syncer's copy in a super cluster"),
    ]  # fmt: skip


@pytest.mark.parametrize("spec", _copies())
def test_no_copy_carries_a_service_account_token_of_the_origin(spec: dict[str, Any]) -> None:
    assert [v["name"] for v in spec["volumes"]] == ["settings"]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["settings"]
    assert spec["initContainers"][0]["volumeMounts"] == []
    assert spec["automountServiceAccountToken"] is False


def test_a_spec_left_without_volumes_has_no_volumes_key_and_the_origin_is_untouched() -> None:
    spec = {"containers": [{"name": "main", "volumeMounts": [TOKEN_MOUNT]}], "volumes": [SPEC["volumes"][1]]}
    stripped = copy.deepcopy(spec)
    strip_service_account_token(stripped)
    assert "volumes" not in stripped
    assert stripped["containers"][0]["volumeMounts"] == []
    assert SPEC["volumes"][1]["name"] == "kube-api-access-abcde"


def test_the_origin_shows_the_copys_running_state_and_never_the_other_clusters_machines() -> None:
    status = {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}], "hostIP": "192.168.1.1",
              "hostIPs": [{"ip": "192.168.1.1"}], "qosClass": "BestEffort", "reason": "Evicted",
              "initContainerStatuses": [], "startTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    assert copied_status(status) == {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                                     "reason": "Evicted", "initContainerStatuses": [],
                                     "startTime": "2026-01-01T00:00:00Z", "message": None}  # fmt: skip


def test_a_reason_the_copy_no_longer_has_is_cleared_on_the_origin() -> None:
    assert copied_status({"phase": "Running"}) == {"phase": "Running", "reason": None, "message": None}
