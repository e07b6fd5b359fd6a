"""A consumer asks its provider for namespaces of its own (issue 35, the provider side): RemoteNamespaces created
with the consumer's REAL credentials (the kubeconfig the provider's worker wrote into the consumer's Secret), on
the provider's real API server, answered by the provider's real worker (workers/remote_namespaces.py).

A granted request becomes a namespace with Pod Security, a LimitRange, the consumer's binding and its share of
the offer; a name the consumer may not have is refused with the rule and nothing changes; the consumer cannot
answer itself, ask anywhere else, or run pods outside its namespaces; its namespaces together never hold more
than the offer; a request deleted deletes its namespace; a withdrawal deletes them all."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities.credentials import BINDING, CLUSTER_ROLE, SERVICE_ACCOUNT, VIRTUAL_KUBELET_RULES
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster
from deploy.localenv.env import EnvState
from kube.clients import client_from_peer_kubeconfig_text
from kube.errors import already_exists
from kube.objects import ignore_not_found, list_cluster_objects, read_cluster_object
from models.enforcement import LIMIT_RANGE_NAME, QUOTA_NAME
from models.names import (
    ADVERTISEMENTS,
    GROUP,
    LABEL_CONSUMER,
    LABEL_CONSUMER_NAMESPACE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    PEERING_REQUESTS,
    REMOTE_NAMESPACE_FINALIZER,
    REMOTE_NAMESPACES,
    SYSTEM_NAMESPACE,
    VERSION,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
)
from models.quantities import parse_quantity
from tests.conftest import Clusters
from tests.kube import apply_cluster_config, create_node
from tests.running import eventually, running_worker, worker_settings
from workers.peer import request_peering

pytestmark = [pytest.mark.env, pytest.mark.offloading]


@dataclass(frozen=True)
class Granted:
    provider: LocalCluster
    admin: k8s.ApiClient  # the provider's administrator
    consumer: k8s.ApiClient  # the consumer's identity on the provider, with its real token
    consumer_id: str
    control: str  # its control namespace
    offered: dict[str, str]


def _granted_client(consumer: k8s.ApiClient, provider_id: str) -> k8s.ApiClient | None:
    try:
        secret = k8s.CoreV1Api(consumer).read_namespaced_secret(credentials_secret_name(provider_id), SYSTEM_NAMESPACE)
    except ApiException:
        return None
    return client_from_peer_kubeconfig_text(base64.b64decode((secret.data or {})["kubeconfig"]))


@pytest.fixture(scope="module")
async def granted(localenv: EnvState, clusters: Clusters) -> AsyncIterator[Granted]:
    """A provider of this module's own (one 4-CPU node, sharing half: 2 CPUs and 10 pods offered) peered with
    cluster b, its worker running for the whole module (the controller answers the requests)."""
    unique = uuid.uuid4().hex[:8]
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    provider = create_cluster(f"remotens-{unique}", binaries=binaries, workdir=workdir)
    try:
        admin, consumer = provider.api_client(), clusters.b.api_client()
        create_node(admin, "n1", cpu="4", memory="8Gi", pods="20")
        apply_cluster_config(admin, outgoing={"sharingPercentage": 50})
        provider_id, consumer_id = f"rprov-{unique}", f"rcons-{unique}"
        request_peering(admin, consumer, provider_id=provider_id, consumer_id=consumer_id)
        async with running_worker(worker_settings(localenv, provider, provider_id)):
            client = await eventually(lambda: _granted_client(consumer, provider_id), timeout=60,
                                      what="the credentials on the consumer")  # fmt: skip
            advertisement = await eventually(
                lambda: read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(provider_id)),
                what="the Advertisement on the consumer")  # fmt: skip
            # The admission policies the first push installed take effect within a second or so: asked by a dry run.
            await eventually(lambda: _policy_in_force(client, foreign_namespace(consumer_id)), timeout=30,
                             what="the consumer-scope policies in force")  # fmt: skip
            yield Granted(provider=provider, admin=admin, consumer=client, consumer_id=consumer_id,
                          control=foreign_namespace(consumer_id), offered=advertisement["spec"]["resourceQuota"]["hard"])  # fmt: skip
    finally:
        delete_cluster(provider.name, binaries=binaries, workdir=workdir)


def _open_service() -> k8s.V1Service:
    return k8s.V1Service.model_validate({"metadata": {"name": "open"},
                                         "spec": {"externalIPs": ["192.0.2.1"], "ports": [{"port": 80}]}})  # fmt: skip


def _policy_in_force(api: k8s.ApiClient, namespace: str) -> bool:
    try:
        k8s.CoreV1Api(api).create_namespaced_service(namespace, _open_service(), dry_run="All")
    except ApiException as e:
        return e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body)
    return False


def _ask(api: k8s.ApiClient, namespace: str, name: str, consumer_namespace: str = "shop") -> None:
    k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, REMOTE_NAMESPACES, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RemoteNamespace", "metadata": {"name": name},
        "spec": {"consumerNamespace": consumer_namespace}})  # fmt: skip


def _request(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = k8s.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, REMOTE_NAMESPACES, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    assert isinstance(obj, dict)
    return obj


async def _answered(granted: Granted, name: str, phase: str) -> dict[str, Any]:
    def answer() -> dict[str, Any] | None:
        obj = _request(granted.consumer, granted.control, name)
        return obj if obj and (obj.get("status") or {}).get("phase") == phase else None

    return await eventually(answer, timeout=30, what=f"RemoteNamespace {name} {phase}")  # type: ignore[no-any-return]


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")


def _gone(call: Any, *args: Any) -> bool:
    try:
        call(*args)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


async def test_a_remote_namespace_becomes_a_namespace_with_pod_security_limits_quota_and_the_binding(granted: Granted) -> None:
    _ask(granted.consumer, granted.control, "shop-granted", consumer_namespace="shop")
    obj = await _answered(granted, "shop-granted", "Ready")
    assert (_ready(obj)["status"], _ready(obj)["reason"]) == ("True", "Created")
    assert REMOTE_NAMESPACE_FINALIZER in obj["metadata"]["finalizers"]
    core, rbac = k8s.CoreV1Api(granted.admin), k8s.RbacAuthorizationV1Api(granted.admin)
    labels = core.read_namespace("shop-granted").metadata.labels or {}
    assert labels[LABEL_MANAGED_BY] == MANAGED_BY and labels[LABEL_CONSUMER] == granted.consumer_id
    assert labels[LABEL_CONSUMER_NAMESPACE] == "shop"
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert core.read_namespaced_limit_range(LIMIT_RANGE_NAME, "shop-granted").spec.limits
    hard = core.read_namespaced_resource_quota(QUOTA_NAME, "shop-granted").spec.hard or {}
    assert hard["services.nodeports"] == "0" and parse_quantity(hard["requests.cpu"]) > 0
    binding = rbac.read_namespaced_role_binding(BINDING, "shop-granted")
    assert (binding.role_ref.kind, binding.role_ref.name) == ("ClusterRole", CLUSTER_ROLE)
    assert [(s.name, s.namespace) for s in binding.subjects] == [(SERVICE_ACCOUNT, granted.control)]
    # The consumer's own identity may do there exactly what its virtual kubelet needs (no RemoteNamespaces).
    review = k8s.AuthorizationV1Api(granted.consumer).create_self_subject_rules_review(
        k8s.V1SelfSubjectRulesReview.model_validate({"spec": {"namespace": "shop-granted"}}))
    held = {(group, resource, verb, name) for r in review.status.resource_rules for group in r.api_groups or []
            for resource in r.resources or [] for verb in r.verbs for name in r.resource_names or [""]
            if group not in ("authorization.k8s.io", "authentication.k8s.io")}  # fmt: skip
    assert held == {(group, resource, verb, name) for rule in VIRTUAL_KUBELET_RULES for group in rule["apiGroups"]
                    for resource in rule["resources"] for verb in rule["verbs"]
                    for name in rule.get("resourceNames") or [""]}  # fmt: skip
    # A privileged pod is refused there as in the control namespace (Pod Security, the consumer-scope policies).
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(granted.consumer).create_namespaced_pod("shop-granted", _pod("root", privileged=True))
    assert refused.value.status == 403 and "PodSecurity" in str(refused.value.body)
    with pytest.raises(ApiException) as refused:  # the consumer-scope policies select it by its labels
        k8s.CoreV1Api(granted.consumer).create_namespaced_service("shop-granted", _open_service())
    assert refused.value.status == 403 and "ValidatingAdmissionPolicy" in str(refused.value.body)


@pytest.mark.hostile
async def test_a_name_the_provider_already_has_is_refused_as_taken_and_nothing_changes(granted: Granted) -> None:
    core = k8s.CoreV1Api(granted.admin)
    core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "payroll", "labels": {"team": "hr"}}}))
    before = core.read_namespace("payroll").metadata
    _ask(granted.consumer, granted.control, "payroll")  # EnforceSameName of the consumer's namespace `payroll`
    obj = await _answered(granted, "payroll", "Refused")
    assert (_ready(obj)["status"], _ready(obj)["reason"]) == ("False", "NameTaken")
    assert "'payroll'" in obj["status"]["message"] and "not made for" in obj["status"]["message"]
    after = core.read_namespace("payroll").metadata
    assert (after.labels, after.resource_version) == (before.labels, before.resource_version)
    assert core.list_namespaced_resource_quota("payroll").items == []
    assert k8s.RbacAuthorizationV1Api(granted.admin).list_namespaced_role_binding("payroll").items == []
    # Deleting a refused request leaves the namespace alone.
    k8s.CustomObjectsApi(granted.consumer).delete_namespaced_custom_object(GROUP, VERSION, granted.control,
                                                                           REMOTE_NAMESPACES, "payroll")  # fmt: skip
    await eventually(lambda: _request(granted.admin, granted.control, "payroll") is None, what="the refused request gone")
    assert core.read_namespace("payroll").metadata.deletion_timestamp is None


@pytest.mark.hostile
async def test_another_consumer_s_namespace_is_taken(granted: Granted) -> None:
    k8s.CoreV1Api(granted.admin).create_namespace(k8s.V1Namespace.model_validate({"metadata": {
        "name": "theirs", "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: "someone-else"}}}))  # fmt: skip
    _ask(granted.consumer, granted.control, "theirs")
    obj = await _answered(granted, "theirs", "Refused")
    assert _ready(obj)["reason"] == "NameTaken"
    assert k8s.RbacAuthorizationV1Api(granted.admin).list_namespaced_role_binding("theirs").items == []


@pytest.mark.hostile
@pytest.mark.parametrize("name", ["kube-system", "tidepool-x", "default"])
async def test_a_reserved_name_is_refused(granted: Granted, name: str) -> None:
    _ask(granted.consumer, granted.control, name)
    obj = await _answered(granted, name, "Refused")
    assert _ready(obj)["reason"] == "NameReserved" and f"'{name}'" in obj["status"]["message"]
    if name == "tidepool-x":
        assert _gone(k8s.CoreV1Api(granted.admin).read_namespace, name)
    else:
        labels = k8s.CoreV1Api(granted.admin).read_namespace(name).metadata.labels or {}
        assert LABEL_CONSUMER not in labels


@pytest.mark.hostile
async def test_the_consumer_cannot_answer_its_own_request_nor_ask_outside_its_control_namespace(granted: Granted) -> None:
    _ask(granted.consumer, granted.control, "self-answer")
    custom = k8s.CustomObjectsApi(granted.consumer)
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, granted.control, REMOTE_NAMESPACES, "self-answer",
                                                     {"status": {"phase": "Ready"}})  # fmt: skip
    assert refused.value.status == 403
    with pytest.raises(ApiException) as refused:  # nor update it (a finalizer removed, a spec changed)
        custom.patch_namespaced_custom_object(GROUP, VERSION, granted.control, REMOTE_NAMESPACES, "self-answer",
                                              {"spec": {"consumerNamespace": "other"}})  # fmt: skip
    assert refused.value.status == 403
    await _answered(granted, "self-answer", "Ready")
    for namespace in ("default", "self-answer", "kube-system"):
        with pytest.raises(ApiException) as refused:
            _ask(granted.consumer, namespace, "elsewhere")
        assert refused.value.status == 403, namespace
    # A RemoteNamespace an administrator makes outside a control namespace is not answered.
    _ask(granted.admin, "default", "outside")
    await eventually(lambda: _request(granted.consumer, granted.control, "self-answer") is not None, timeout=3)
    assert (_request(granted.admin, "default", "outside") or {}).get("status") is None
    assert _gone(k8s.CoreV1Api(granted.admin).read_namespace, "outside")


@pytest.mark.hostile
async def test_the_consumer_cannot_create_pods_in_a_namespace_that_is_not_its_own(granted: Granted) -> None:
    k8s.CoreV1Api(granted.admin).create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "inventory"}}))
    for namespace in ("inventory", "default", "kube-system"):
        with pytest.raises(ApiException) as refused:
            k8s.CoreV1Api(granted.consumer).create_namespaced_pod(namespace, _pod("intruder"))
        assert refused.value.status == 403, namespace


def _pod(name: str, *, cpu: str = "100m", privileged: bool = False) -> k8s.V1Pod:
    container: dict[str, Any] = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {"containers": [container]}})


@pytest.mark.hostile
async def test_the_consumer_s_pods_in_two_remote_namespaces_together_cannot_exceed_the_offer(granted: Granted) -> None:
    for name in ("split-a", "split-b"):
        _ask(granted.consumer, granted.control, name)
        await _answered(granted, name, "Ready")
    offered_cpu = parse_quantity(granted.offered["cpu"])
    core = k8s.CoreV1Api(granted.consumer)
    admitted: list[Decimal] = []
    refused = 0
    # 400m each, alternating: the offer (2 CPUs) holds at most 5 of them over every namespace of the consumer.
    for index in range(12):
        namespace = ("split-a", "split-b")[index % 2]
        for _attempt in range(5):
            try:
                core.create_namespaced_pod(namespace, _pod(f"p{index}", cpu="400m"))
                admitted.append(Decimal("0.4"))
            except ApiException as e:
                if e.status == 409 and not already_exists(e):
                    # Quota admission lost a race with the re-split of the quota it charges (the provider
                    # writing its hard): nothing was created, and a client tries again, as kubectl's user would.
                    await asyncio.sleep(0.2)
                    continue
                assert e.status == 403 and "exceeded quota" in str(e.body), e.body
                refused += 1
            break
        else:
            raise AssertionError(f"p{index}: five conflicts in a row with the quota's re-split")
        # each admitted pod moves its quota's usage: the offer is split again before the next
        await _quota_settled(granted, namespace)
    assert refused > 0 and sum(admitted, Decimal(0)) <= offered_cpu
    used = _used_cpu(granted)
    assert used <= offered_cpu
    hards = sum(parse_quantity(q.spec.hard["requests.cpu"]) for q in _quotas(granted))
    assert hards <= offered_cpu


def _quotas(granted: Granted) -> list[Any]:
    return list(k8s.CoreV1Api(granted.admin).list_resource_quota_for_all_namespaces(
        label_selector=f"{LABEL_CONSUMER}={granted.consumer_id}").items)  # fmt: skip


def _used_cpu(granted: Granted) -> Decimal:
    return sum((parse_quantity((q.status.used or {}).get("requests.cpu", "0")) for q in _quotas(granted)), Decimal(0))


async def _quota_settled(granted: Granted, namespace: str) -> None:
    def settled() -> bool:
        quota = k8s.CoreV1Api(granted.admin).read_namespaced_resource_quota(QUOTA_NAME, namespace)
        return (quota.status.hard or {}) == (quota.spec.hard or {})

    await eventually(settled, timeout=15, what=f"{namespace}'s quota settled")


async def test_deleting_the_remote_namespace_deletes_the_namespace(granted: Granted) -> None:
    _ask(granted.consumer, granted.control, "short-lived")
    await _answered(granted, "short-lived", "Ready")
    k8s.CustomObjectsApi(granted.consumer).delete_namespaced_custom_object(GROUP, VERSION, granted.control,
                                                                           REMOTE_NAMESPACES, "short-lived")  # fmt: skip
    core = k8s.CoreV1Api(granted.admin)
    await eventually(lambda: _gone(core.read_namespace, "short-lived"), timeout=60, what="the namespace gone")
    await eventually(lambda: _request(granted.admin, granted.control, "short-lived") is None, timeout=30,
                     what="the request released")  # fmt: skip


async def test_a_remote_namespace_deleted_behind_the_controller_s_back_is_made_again(granted: Granted) -> None:
    _ask(granted.consumer, granted.control, "resilient")
    await _answered(granted, "resilient", "Ready")
    core = k8s.CoreV1Api(granted.admin)
    uid = core.read_namespace("resilient").metadata.uid
    core.delete_namespace("resilient")

    def made_again() -> bool:
        namespace = ignore_not_found(core.read_namespace, "resilient")
        return namespace is not None and namespace.metadata.uid != uid and namespace.status.phase == "Active"

    await eventually(made_again, timeout=90, what="the namespace made again")
    await eventually(lambda: ignore_not_found(core.read_namespaced_resource_quota, QUOTA_NAME, "resilient"),
                     timeout=30, what="its quota")  # fmt: skip


async def test_withdrawal_deletes_every_remote_namespace_of_the_consumer(granted: Granted) -> None:
    """Last in the module: the peering ends."""
    for name in ("leaving-a", "leaving-b"):
        _ask(granted.consumer, granted.control, name)
        await _answered(granted, name, "Ready")
    custom = k8s.CustomObjectsApi(granted.admin)
    for request in list_cluster_objects(granted.admin, PEERING_REQUESTS):
        custom.delete_cluster_custom_object(GROUP, VERSION, PEERING_REQUESTS, request["metadata"]["name"])
    core = k8s.CoreV1Api(granted.admin)

    def all_gone() -> bool:
        left = core.list_namespace(label_selector=f"{LABEL_CONSUMER}={granted.consumer_id}").items
        if left:
            raise LookupError(f"left: {[(ns.metadata.name, ns.status.phase) for ns in left]}")
        return True

    await eventually(all_gone, timeout=240, what="every namespace of the consumer gone")
    assert _gone(core.read_namespace, granted.control)
