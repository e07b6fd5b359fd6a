"""workers/syncer.py without clusters: a change on either side queues the one object it concerns, keyed by its
tenant, and the handler compares that object's two sides from the Stores (the copies themselves are tested
against real clusters in tests/test_pool_sync.py and tests/test_pool_tenants.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.tenants import TenantConnection
from models.names import (
    LABEL_MANAGED_BY,
    LABEL_TENANT,
    LABEL_TENANT_NAMESPACE,
    MANAGED_BY,
    super_cluster_namespace,
    tenant_finalizer,
    tenant_key,
)
from workers.syncer import COPY_MADE_SECONDS, NAMESPACE, Syncer, _TenantSide
from workers.tenant_nodes import NotReadyToBind

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


def _side(syncer: Syncer, tenant: str) -> _TenantSide:
    """A tenant's side as if its informers had listed: namespace `app`."""
    connection = TenantConnection(name=tenant, key=tenant_key(tenant), weight=1, deleting=False,
                                  finalizers=(tenant_finalizer("s1"),), credentials="1", problem=None,
                                  api=k8s.ApiClient())  # fmt: skip
    side = _TenantSide(syncer, connection)
    side._synced.set()
    syncer._sides[tenant] = side
    side.namespaces.sync([{"metadata": {"name": "app"}}])
    return side


def _syncer() -> tuple[Syncer, _SuperApis]:
    syncer = Syncer(management=k8s.ApiClient(), super_cluster=k8s.ApiClient(), cluster="s1", pooling=False)
    apis = _SuperApis()
    syncer._super = apis  # type: ignore[assignment]
    return syncer, apis


def _queued(syncer: Syncer) -> list[tuple[str, str, str, str]]:
    return [key for keys in syncer.queue._ready.values() for key in keys]


def test_a_change_on_either_side_queues_the_tenant_object_it_concerns() -> None:
    syncer, _ = _syncer()
    side = _side(syncer, "t1")
    side.sources["ConfigMap"].event("ADDED", _config_map("app", "settings"))
    copy = _config_map(super_cluster_namespace("t1", "app"), "old", **{LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: "t1",
                                                                     LABEL_TENANT_NAMESPACE: "app"})
    syncer._copies["ConfigMap"].event("ADDED", copy)
    assert _queued(syncer) == [("t1", "app", NAMESPACE, ""), ("t1", "app", "ConfigMap", "settings"),
                               ("t1", "app", "ConfigMap", "old")]  # fmt: skip


def test_a_copy_without_a_tenant_label_is_nobody_s_to_queue() -> None:
    """Made by something else (or by a syncer before tenants were labelled): never routed to a tenant."""
    syncer, _ = _syncer()
    syncer._copies["ConfigMap"].event("ADDED", _config_map("t1-app", "old", **{LABEL_TENANT_NAMESPACE: "app"}))
    assert _queued(syncer) == []


def test_a_source_is_copied_once_and_a_copy_without_a_source_is_deleted() -> None:
    syncer, apis = _syncer()
    side = _side(syncer, "t1")
    side.sources["ConfigMap"].sync([_config_map("app", "settings")])
    syncer._handle(("t1", "app", "ConfigMap", "settings"))
    target = super_cluster_namespace("t1", "app")
    assert apis.calls == [("apply", "ConfigMap", target, "settings")]
    copy = apis.applied[0]
    assert copy["metadata"]["namespace"] == target and copy["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY
    assert copy["metadata"]["labels"][LABEL_TENANT] == "t1"
    syncer._copies["ConfigMap"].event("ADDED", copy)  # its watch event: it holds the source's digest
    apis.calls.clear()
    syncer._handle(("t1", "app", "ConfigMap", "settings"))
    assert apis.calls == []  # unchanged: no write
    side.sources["ConfigMap"].event("DELETED", _config_map("app", "settings"))
    syncer._handle(("t1", "app", "ConfigMap", "settings"))
    assert apis.calls == [("delete", "ConfigMap", target, "settings")]


def test_two_tenants_with_the_same_namespace_touch_only_their_own_copies() -> None:
    syncer, apis = _syncer()
    one, two = _side(syncer, "one"), _side(syncer, "two")
    for side in (one, two):
        side.sources["ConfigMap"].sync([_config_map("app", "settings")])
    syncer._handle(("one", "app", "ConfigMap", "settings"))
    syncer._handle(("two", "app", "ConfigMap", "settings"))
    targets = [namespace for _, _, namespace, _ in apis.calls]
    assert targets == [super_cluster_namespace("one", "app"), super_cluster_namespace("two", "app")]
    assert targets[0] != targets[1]
    for body in apis.applied:
        syncer._copies["ConfigMap"].event("ADDED", body)
    apis.calls.clear()
    one.sources["ConfigMap"].event("DELETED", _config_map("app", "settings"))  # one's source goes: one's copy only
    for key in [k for k in _queued(syncer) if k[2] == "ConfigMap"]:
        syncer._handle(key)
    assert apis.calls == [("delete", "ConfigMap", super_cluster_namespace("one", "app"), "settings")]


def test_a_tenant_not_listed_yet_is_not_touched() -> None:
    """An unreachable control plane never lists: its copies stay, whatever they are."""
    syncer, apis = _syncer()
    side = _side(syncer, "t1")
    side._synced.clear()
    copy = _config_map(super_cluster_namespace("t1", "app"), "kept", **{LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: "t1",
                                                                     LABEL_TENANT_NAMESPACE: "app"})
    syncer._copies["ConfigMap"].event("ADDED", copy)
    syncer._handle(("t1", "app", "ConfigMap", "kept"))
    assert apis.calls == []


class _Refusing:
    """A super cluster whose API server refuses every pod copy, saying `message`."""

    def __init__(self, message: str) -> None:
        self.message = message

    def create_namespaced_pod(self, namespace: str, body: Any, **_options: Any) -> None:
        raise _forbidden(self.message)


def _forbidden(message: str) -> ApiException:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": message})
    return error


class _TenantPods:
    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.statuses.append(body)


@pytest.mark.parametrize("message,told", [
    pytest.param('pods "web" is forbidden: violates PodSecurity "baseline:latest": privileged', True,
                 id="a rule it breaks: told to the tenant, once"),
    pytest.param('pods "web" is forbidden: exceeded quota: q, requested: cpu=1, used: cpu=2, limited: cpu=2', False,
                 id="its namespace's quota copy not raised yet: tried again after a backoff"),
    pytest.param("unable to create new content in namespace x because it is being terminated", False,
                 id="its namespace's old copy still going: tried again after a backoff"),
])  # fmt: skip
def test_only_a_refusal_that_lasts_is_told_to_the_tenant(message: str, told: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    syncer, _ = _syncer()
    side = _side(syncer, "t1")
    syncer.down = _Refusing(message)  # type: ignore[assignment]
    side.up = _TenantPods()  # type: ignore[assignment]
    monkeypatch.setattr("workers.syncer.record_event", lambda *args, **kwargs: None)
    side.sources["Pod"].sync([{"metadata": {"namespace": "app", "name": "web", "uid": "u1"},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}])  # fmt: skip
    if told:
        syncer._handle(("t1", "app", "Pod", "web"))
        assert [s["status"]["reason"] for s in side.up.statuses] == ["SuperClusterRefused"]  # type: ignore[attr-defined]
    else:
        with pytest.raises(ApiException):
            syncer._handle(("t1", "app", "Pod", "web"))
        assert side.up.statuses == []  # type: ignore[attr-defined]


class _SuperPods:
    """A super cluster's pods as its API server holds them, the syncer's store lagging behind: which exist,
    and the calls made."""

    def __init__(self, *existing: str) -> None:
        self.existing: set[str] = set(existing)
        self.calls: list[str] = []

    def read_namespaced_pod(self, name: str, namespace: str, **_options: Any) -> urllib3.HTTPResponse:
        self.calls.append(f"get {name}")
        if name not in self.existing:
            raise ApiException(status=404, reason="Not Found")
        return urllib3.HTTPResponse(body=b"{}")

    def create_namespaced_pod(self, namespace: str, body: Any, **_options: Any) -> urllib3.HTTPResponse:
        self.calls.append(f"create {body.metadata.name}")
        self.existing.add(body.metadata.name)
        return urllib3.HTTPResponse(body=b"{}")


@pytest.mark.parametrize("there", [True, False], ids=["its watch event late: read, not made again",
                                                      "deleted before the store saw it: made again"])  # fmt: skip
def test_a_copy_made_whose_watch_event_is_late_is_read_before_it_is_made_again(
    there: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second create of a copy that is there is refused as existing, after the super cluster's quota admission
    charged it (the charge holds until its quota controller's next full count): a burst's lagging watch made
    duplicates."""
    syncer, _ = _syncer()
    side = _side(syncer, "t1")
    syncer.down = pods = _SuperPods()  # type: ignore[assignment]
    side.sources["Pod"].sync([{"metadata": {"namespace": "app", "name": "web", "uid": "u1"},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}])  # fmt: skip
    clock = [1000.0]
    monkeypatch.setattr("workers.syncer.time.monotonic", lambda: clock[0])
    syncer._handle(("t1", "app", "Pod", "web"))
    syncer._handle(("t1", "app", "Pod", "web"))  # its watch event not in yet: made a moment ago
    assert pods.calls == ["create web"]
    if not there:
        pods.existing.clear()
    clock[0] += COPY_MADE_SECONDS + 1
    syncer._handle(("t1", "app", "Pod", "web"))
    assert pods.calls == ["create web", "get web"] + ([] if there else ["create web"])
    syncer._handle(("t1", "app", "Pod", "web"))  # read a moment ago (or made again): neither read nor made
    assert len(pods.calls) == (2 if there else 3)


class _TenantStatuses:
    """A tenant's API server taking status pushes, answering each with the pod moved on."""

    def __init__(self) -> None:
        self.pushed: list[str | None] = []

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict[str, Any],
                                    **_options: Any) -> urllib3.HTTPResponse:  # fmt: skip
        self.pushed.append(body["status"].get("phase"))
        return urllib3.HTTPResponse(body=json.dumps({"metadata": {"resourceVersion": "8"}}).encode())


def _scheduled_copy(phase: str) -> dict[str, Any]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: "t1", LABEL_TENANT_NAMESPACE: "app"}
    return {"metadata": {"namespace": super_cluster_namespace("t1", "app"), "name": "web", "uid": "c1", "labels": labels},
            "spec": {"nodeName": "n1"},
            "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "True"}]}}  # fmt: skip


@pytest.mark.parametrize(("phase", "binding", "pushed"), [
    ("Pending", "written", []),  # the binding says PodScheduled: nothing left to push until it runs
    ("Running", "written", []),  # pushed once the binding's watch event brings the pod back
    ("Pending", "node not shown yet", ["Pending"]),  # a binding that fails holds no status back
    ("Running", "refused", ["Running"]),
    ("Running", "bound before", ["Running"]),
], ids=["scheduled, bound now", "running, bound now", "scheduled, its node not shown yet", "running, its binding refused",
        "running, bound before"])  # fmt: skip
def test_a_scheduled_copy_binds_its_tenant_pod_before_its_status_is_pushed(
    phase: str, binding: str, pushed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    syncer, _ = _syncer()
    side = _side(syncer, "t1")
    side.up = statuses = _TenantStatuses()  # type: ignore[assignment]
    failure = {"node not shown yet": NotReadyToBind("n1"), "refused": ApiException(status=500, reason="Internal")}

    def bind(tenant: str, pod: dict[str, Any], copy: dict[str, Any]) -> bool:
        if binding in failure:
            raise failure[binding]
        return not pod["spec"].get("nodeName")  # bound now; a pod the store shows bound is not bound again

    def tenant_pod(version: str, *, bound: bool) -> dict[str, Any]:
        return {"metadata": {"namespace": "app", "name": "web", "uid": "u1", "resourceVersion": version},
                "spec": {"containers": [{"name": "c", "image": "x"}], **({"nodeName": "s1.n1"} if bound else {})},
                "status": {"phase": "Pending",
                           **({"conditions": [{"type": "PodScheduled", "status": "True"}]} if bound else {})}}  # fmt: skip

    monkeypatch.setattr(syncer.nodes, "bind", bind)
    side.sources["Pod"].sync([tenant_pod("7", bound=binding == "bound before")])
    syncer._copies["Pod"].sync([_scheduled_copy(phase)])
    if binding in failure:
        with pytest.raises(type(failure[binding])):
            syncer._handle(("t1", "app", "Pod", "web"))
    else:
        syncer._handle(("t1", "app", "Pod", "web"))
    assert statuses.pushed == pushed
    if binding == "written":  # the binding's watch event: the pod bound, what is left of the copy's status pushed
        side.sources["Pod"].sync([tenant_pod("8", bound=True)])
        syncer._handle(("t1", "app", "Pod", "web"))
        assert statuses.pushed == ([] if phase == "Pending" else ["Running"])
