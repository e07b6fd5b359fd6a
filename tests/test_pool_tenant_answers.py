"""A tenant's control plane is another owner's server, and may answer anything. The pool's pass reads every
tenant's pods as JSON: an answer that is no list of objects with a name, uid and creation time fails that
tenant's part of the pass, with the field and the rule said on its Tenant, and never the pass of the others
(activities/pool.py catches MalformedObject beside the network's and the API's errors, per tenant). And what
the pass writes of the pods it read: only those the pod placer left waiting."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from activities.pool import PLACER_BACKSTOP, PLACER_GRACE, Books, PoolActivities, TenantView, _read, _unreachable
from kube.clock import utcnow
from kube.metadata import MalformedObject
from models.pool.result import PoolPassResult
from models.resources import Resources
from tests.http import JsonAnswers, serving

pytestmark = [pytest.mark.pool, pytest.mark.tenants]

GOOD_META = {"name": "web", "namespace": "shop", "uid": "u-1", "creationTimestamp": "2026-11-27T10:00:00Z"}


class _Tenant(JsonAnswers):
    """Answers every GET with the body the test set for its path (without the query); takes every write,
    noting its method and path."""

    bodies: dict[str, bytes] = {}
    writes: list[str] = []

    def answer(self, path: str) -> bytes:
        return self.bodies.get(path.split("?")[0], b'{"kind": "List", "items": []}')

    def _written(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.writes.append(f"{self.command} {self.path.split('?')[0]}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_PATCH = do_POST = _written


@pytest.fixture
def tenant() -> Iterator[TenantView]:
    with serving(_Tenant) as url:
        yield TenantView("t3", k8s.ApiClient(k8s.Configuration(host=url)))
    _Tenant.bodies, _Tenant.writes = {}, []


def _pods(*items: Any) -> bytes:
    return json.dumps({"kind": "PodList", "items": list(items)}).encode()


def _place_pods(view: TenantView, books: Books | None = None, *, placer_leads: bool = False) -> PoolPassResult:
    pool = PoolActivities.__new__(PoolActivities)  # the pod pass reads only the tenant's view and the books
    pool._placer_leads = lambda: placer_leads
    result = PoolPassResult(clusters={})
    pool._place_pods(view, books or Books(), set(), result)
    return result


@pytest.mark.parametrize(("body", "said"), [
    (_pods({"metadata": {**GOOD_META, "uid": None}}), "metadata.uid must be a non-empty string"),
    (_pods({"metadata": {k: v for k, v in GOOD_META.items() if k != "name"}}), "metadata.name must be a non-empty string"),
    (_pods({"metadata": {**GOOD_META, "creationTimestamp": "yesterday"}}), "metadata.creationTimestamp must be an RFC 3339 time"),
    (_pods({"metadata": [GOOD_META]}), "metadata must be an object"),
    (_pods({"metadata": {**GOOD_META, "annotations": {"a": 1}}}), "metadata.annotations must map strings to strings"),
    (_pods({"metadata": {**GOOD_META, "namespace": 7}}), "metadata.namespace must be a string"),
    (_pods("web"), "an item is a str, not an object"),
    (b'{"kind": "PodList", "items": {"web": {}}}', "items must be a list"),
    (b"<html>pods</html>", "the body is not JSON"),
], ids=["no uid", "no name", "no time", "metadata a list", "annotation a number", "namespace a number",
        "item a string", "items a map", "not JSON"])  # fmt: skip
def test_a_pod_list_that_is_not_one_fails_that_tenant_with_the_field_and_the_rule(
    tenant: TenantView, body: bytes, said: str
) -> None:
    _Tenant.bodies = {"/api/v1/pods": body}
    with pytest.raises(MalformedObject) as raised:
        _place_pods(tenant)
    assert str(raised.value) == said
    assert _unreachable(raised.value) == f"its control plane answered an object that is not one: {said}"


def test_a_well_formed_pod_list_passes(tenant: TenantView) -> None:
    _Tenant.bodies = {"/api/v1/pods": _pods({"metadata": GOOD_META, "spec": {}, "status": {}})}
    _place_pods(tenant)  # no namespace of it is placed: nothing to write, and nothing raised


def test_a_namespace_without_identity_makes_the_tenant_unreadable_not_the_pass(tenant: TenantView) -> None:
    _Tenant.bodies = {"/api/v1/namespaces": b'{"kind": "NamespaceList", "items": [{"metadata": {"name": "shop"}}]}'}
    said = _read(tenant)
    assert said == "its control plane answered an object that is not one: a V1Namespace without metadata.name, " \
                   "uid or creationTimestamp"  # fmt: skip


@pytest.mark.parametrize(("age", "placer_leads", "placed"), [
    (PLACER_GRACE + timedelta(seconds=5), False, True),  # no replica holds the Lease: no placer runs
    (PLACER_GRACE - timedelta(seconds=5), False, False),
    (PLACER_GRACE + timedelta(seconds=5), True, False),  # the placer's, behind a burst's backlog
    (PLACER_BACKSTOP + timedelta(seconds=5), True, True),  # a placer that stalls
], ids=["no placer, past the grace", "no placer, within the grace", "a placer, past the grace",
        "a placer, past the backstop"])  # fmt: skip
def test_the_pass_places_a_waiting_pod_only_once_the_placer_had_its_time(
    tenant: TenantView, age: timedelta, placer_leads: bool, placed: bool
) -> None:
    created = (utcnow() - age).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = {"metadata": {**GOOD_META, "creationTimestamp": created, "resourceVersion": "7"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}, "status": {}}  # fmt: skip
    _Tenant.bodies = {"/api/v1/pods": _pods(pod)}
    books = Books(placements={"t3/shop": {"s1": 1}}, slices={"t3/shop": Resources(cpu="1", memory="1Gi")})
    result = _place_pods(tenant, books, placer_leads=placer_leads)
    assert result.pods_placed == ({"t3/shop/web": "s1"} if placed else {})
    assert _Tenant.writes == (["PATCH /api/v1/namespaces/shop/pods/web", "POST /api/v1/namespaces/shop/events"]
                              if placed else [])  # fmt: skip
