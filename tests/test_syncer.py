"""workers/syncer.py without clusters: a change on either side queues the one object it concerns, and the
handler compares that object's two sides from the Stores (the copies themselves are tested against real
clusters in tests/test_pool_sync.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from models.names import LABEL_MANAGED_BY, LABEL_TENANT_NAMESPACE, MANAGED_BY, super_cluster_namespace
from workers.syncer import NAMESPACE, Syncer

pytestmark = [pytest.mark.pool]


class _SuperApis:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.applied: list[dict[str, Any]] = []

    def apply(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(("apply", kind, namespace, body["metadata"]["name"]))
        self.applied.append(body)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.calls.append(("delete", kind, namespace, name))


def _config_map(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels}, "data": {"k": "v"}}


def _syncer() -> tuple[Syncer, _SuperApis]:
    syncer = Syncer(tenant=k8s.ApiClient(), super_cluster=k8s.ApiClient(), cluster="s1", tenant_name="t1",
                    pooling=False)  # fmt: skip
    apis = _SuperApis()
    syncer._apis["super"] = apis  # type: ignore[assignment]
    syncer._namespaces.sync([{"metadata": {"name": "app"}}])
    return syncer, apis


def test_a_change_on_either_side_queues_the_tenant_object_it_concerns() -> None:
    syncer, _ = _syncer()
    syncer._sources["ConfigMap"].event("ADDED", _config_map("app", "settings"))
    syncer._copies["ConfigMap"].event("ADDED", _config_map(super_cluster_namespace("t1", "app"), "old", **{LABEL_TENANT_NAMESPACE: "app"}))
    queued = [key for keys in syncer.queue._ready.values() for key in keys]  # one line per tenant namespace
    assert queued == [("app", NAMESPACE, ""), ("app", "ConfigMap", "settings"), ("app", "ConfigMap", "old")]


def test_a_source_is_copied_once_and_a_copy_without_a_source_is_deleted() -> None:
    syncer, apis = _syncer()
    syncer._sources["ConfigMap"].sync([_config_map("app", "settings")])
    syncer._handle(("app", "ConfigMap", "settings"))
    assert apis.calls == [("apply", "ConfigMap", super_cluster_namespace("t1", "app"), "settings")]
    copy = apis.applied[0]
    assert copy["metadata"]["namespace"] == super_cluster_namespace("t1", "app") and copy["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY
    syncer._copies["ConfigMap"].event("ADDED", copy)  # its watch event: it holds the source's digest
    apis.calls.clear()
    syncer._handle(("app", "ConfigMap", "settings"))
    assert apis.calls == []  # unchanged: no write
    syncer._sources["ConfigMap"].event("DELETED", _config_map("app", "settings"))
    syncer._handle(("app", "ConfigMap", "settings"))
    assert apis.calls == [("delete", "ConfigMap", super_cluster_namespace("t1", "app"), "settings")]
