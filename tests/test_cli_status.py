"""`tidepool status`'s pool part (workers/pool_status.py) without clusters: the Tenants table from Tenant
objects, and where each tenant's control plane is read from."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from models.kubeconfig import PeerCredentials
from workers import pool_status
from workers.pool_status import tenant_planes, tenant_rows

pytestmark = pytest.mark.tenants


def _tenant(name: str, *, weight: int | None = None, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"kubeConfigRef": {"name": f"tenant-{name}", "namespace": "tidepool-tenants"}}
    if weight is not None:
        spec["weight"] = weight
    return {"metadata": {"name": name, **meta}, "spec": spec, **({"status": status} if status is not None else {})}


def _ready(ok: bool, reason: str) -> dict[str, Any]:
    return {"type": "Ready", "status": "True" if ok else "False", "reason": reason, "message": "",
            "lastTransitionTime": "2026-11-25T12:00:00Z"}  # fmt: skip


@pytest.mark.parametrize(("tenant", "row"), [
    pytest.param(_tenant("blue", weight=3, status={"key": "blue-x", "conditions": [_ready(True, "Reachable")],
                                                   "held": {"b": {"cpu": "2", "memory": "4Gi"}, "a": {"cpu": "1"}}}),
                 ["blue", "blue-x", "3", "True (Reachable)", "a: cpu 1; b: cpu 2, memory 4Gi"], id="reachable, holding in two"),
    pytest.param(_tenant("red", status={"key": "red-y", "conditions": [_ready(False, "Unreachable")], "held": {"a": {"cpu": "1"}}}),
                 ["red", "red-y", "1", "False (Unreachable)", "a: cpu 1"], id="unreachable keeps what it held"),
    pytest.param(_tenant("new"), ["new", "—", "1", "not yet passed over", "—"], id="no pass over it yet"),
    pytest.param(_tenant("bad", status={"conditions": [_ready(False, "InvalidKubeconfig")]}),
                 ["bad", "—", "1", "False (InvalidKubeconfig)", "—"], id="a kubeconfig the pool refused"),
    pytest.param(_tenant("gone", deletionTimestamp="2026-11-25T12:00:00Z"), ["gone (being removed)", "—", "1",
                 "not yet passed over", "—"], id="being removed"),
])  # fmt: skip
def test_the_tenants_table_shows_key_weight_readiness_and_holdings_per_super_cluster(tenant: dict[str, Any],
                                                                                      row: list[str]) -> None:  # fmt: skip
    assert tenant_rows([tenant]) == [row]


def test_tenants_are_listed_by_name() -> None:
    assert [r[0] for r in tenant_rows([_tenant("b"), _tenant("a")])] == ["a", "b"]


def _api(host: str) -> k8s.ApiClient:
    return k8s.ApiClient(k8s.Configuration(host=host))


def test_each_tenant_is_read_from_the_cluster_of_its_name_else_the_one_its_kubeconfig_names_else_its_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = {"tenant-t1": "https://10.0.0.1:6443/", "tenant-t3": "https://10.0.0.3:6443"}

    def credentials(management: k8s.ApiClient, namespace: str, name: str) -> PeerCredentials:
        if name not in servers:
            raise LookupError(f"Secret {namespace}/{name} not read: secrets {name!r} not found")
        return PeerCredentials(server=servers[name], certificate_authority=b"", token="t")

    monkeypatch.setattr(pool_status, "_credentials", credentials)
    monkeypatch.setattr(pool_status, "peer_configuration", lambda c: k8s.Configuration(host=c.server))
    clusters = {"mgmt": _api("https://10.0.0.1:6443"), "t2": _api("https://10.0.0.2:6443")}
    management = clusters["mgmt"]
    planes = tenant_planes([(management, _tenant(n)) for n in ("t1", "t2", "t3", "t4")], clusters)
    assert planes.given == {"mgmt": "t1", "t2": "t2"}  # t1's kubeconfig names mgmt's server: one control plane
    assert set(planes.reached) == {"t3"} and planes.reached["t3"].configuration.host == "https://10.0.0.3:6443"
    assert planes.reached["t3"].configuration.retries == 0
    assert planes.problems == {"t4": "Secret tidepool-tenants/tenant-t4 not read: secrets 'tenant-t4' not found"}
