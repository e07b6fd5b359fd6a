"""A consumer attacks its provider with the credentials the provider handed it (issue 34, item 1): the
kubeconfig the provider's worker wrote into the consumer's Secret tidepool-kubeconfig-<provider>, used
directly against the provider's real API server, as `kubectl` would. Every attack must be refused by the
provider's own API server (Pod Security Admission, the ResourceQuota of the offer, the admission policy on
Services, RBAC); one that succeeds fails its test. Each refusal is checked to come from the defence meant
(its message), so that a test cannot pass on an unrelated error.

And end to end: a pod the provider refuses is not retried for ever by the virtual kubelet; the consumer's
pod says why (condition and Event), fails when the refusal is final, and waits when it is the quota."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities.credentials import REMOTE_NAMESPACES_RULES, SERVICE_ACCOUNT, VIRTUAL_KUBELET_RULES
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster
from deploy.localenv.env import EnvState
from kube.clients import client_from_peer_kubeconfig_text
from kube.objects import read_cluster_object
from models.api.conditions import POD_PROVIDER_CONDITION
from models.enforcement import (
    LIMIT_RANGE_NAME,
    PODS_POLICY_NAME,
    QUOTA_NAME,
    SECRETS_POLICY_NAME,
    SERVICE_ACCOUNT_TOKEN_TYPE,
    quota_hard,
)
from models.names import (
    ADVERTISEMENTS,
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
)
from models.resources import Resources
from tests.conftest import Clusters
from tests.kube import apply_cluster_config, create_node, create_runtime_class
from tests.offload import Peering, offloaded_namespace, peered, ready_node
from tests.running import eventually, running_worker, worker_settings
from workers.peer import request_peering

pytestmark = [pytest.mark.env, pytest.mark.hostile]


@dataclass(frozen=True)
class Granted:
    """What the consumer holds: a client with the provider's credentials for it, its namespace there."""

    provider: LocalCluster
    api: k8s.ApiClient
    namespace: str
    offered: dict[str, str]


def _granted_client(consumer: k8s.ApiClient, provider_id: str) -> k8s.ApiClient | None:
    try:
        secret = k8s.CoreV1Api(consumer).read_namespaced_secret(credentials_secret_name(provider_id), SYSTEM_NAMESPACE)
    except ApiException:
        return None
    return client_from_peer_kubeconfig_text(base64.b64decode((secret.data or {})["kubeconfig"]))


@pytest.fixture(scope="module")
async def granted(localenv: EnvState, clusters: Clusters) -> AsyncIterator[Granted]:
    """A provider of this module's own (one 4-CPU node, sharing half) peered with cluster b; its worker runs
    long enough to push once, which writes the credentials, the namespace and what it enforces there."""
    unique = uuid.uuid4().hex[:8]
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    provider = create_cluster(f"hostile-{unique}", binaries=binaries, workdir=workdir)
    try:
        api, consumer = provider.api_client(), clusters.b.api_client()
        create_node(api, "n1", cpu="4", memory="8Gi", pods="20")
        create_runtime_class(api, "runc", overhead={"cpu": "10m", "memory": "1Mi"})  # one a pod could name
        apply_cluster_config(api, outgoing={"sharingPercentage": 50})
        provider_id, consumer_id = f"hprov-{unique}", f"hcons-{unique}"
        request_peering(api, consumer, provider_id=provider_id, consumer_id=consumer_id)
        namespace = foreign_namespace(consumer_id)
        async with running_worker(worker_settings(localenv, provider, provider_id)):
            client = await eventually(lambda: _granted_client(consumer, provider_id), timeout=60,
                                      what="the credentials on the consumer")  # fmt: skip
            advertisement = await eventually(
                lambda: read_cluster_object(consumer, ADVERTISEMENTS, advertisement_name(provider_id)),
                what="the Advertisement on the consumer")  # fmt: skip
        # The admission policies the push installed take effect within a second or so: asked by dry runs.
        core = k8s.CoreV1Api(client)
        for attempt in (lambda: core.create_namespaced_pod(namespace, _pod("placed", spec={"nodeName": "n1"}),
                                                           dry_run="All"),
                        lambda: core.create_namespaced_service(namespace, _service("open", type="NodePort"),
                                                               dry_run="All"),
                        lambda: core.create_namespaced_secret(namespace, _token_secret("minted"), dry_run="All")):  # fmt: skip
            await eventually(lambda attempt=attempt: _in_force(attempt), timeout=30, what="the policies in force")
        yield Granted(provider=provider, api=client, namespace=namespace,
                      offered=advertisement["spec"]["resourceQuota"]["hard"])  # fmt: skip
    finally:
        delete_cluster(provider.name, binaries=binaries, workdir=workdir)


def _in_force(attempt: Callable[[], object]) -> bool:
    try:
        attempt()
    except ApiException as e:
        return e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body)
    return False


def _pod(name: str, *, spec: dict[str, Any] | None = None, container: dict[str, Any] | None = None) -> k8s.V1Pod:
    main = {"name": "x", "image": "busybox", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            **(container or {})}  # fmt: skip
    return k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {"containers": [main], **(spec or {})}})


def _refused(call: Callable[[], object]) -> str:
    """The refusal's message; the attack succeeding fails the test."""
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def _admitted_without_the_defence(granted: Granted, call: Callable[[k8s.CoreV1Api], object]) -> None:
    """The same object, asked by the provider's admin as a dry run in a namespace without the defence (no Pod
    Security labels, no quota, no policy): admitted. So the refusal above is the defence's, and without it the
    attack would have worked."""
    call(k8s.CoreV1Api(granted.provider.api_client()))


ROOT_PODS = [
    pytest.param({"container": {"securityContext": {"privileged": True}}}, "privileged", id="a privileged pod"),
    pytest.param({"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                  "container": {"volumeMounts": [{"name": "root", "mountPath": "/host"}]}}, "hostPath volumes",
                 id="the node's root filesystem mounted"),
    pytest.param({"spec": {"hostNetwork": True, "hostPID": True}}, "host namespaces",
                 id="the node's network and processes"),
    pytest.param({"container": {"ports": [{"containerPort": 22, "hostPort": 31555}]}}, "hostPort",
                 id="a port of the node's own"),
    pytest.param({"container": {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}}, "capabilities",
                 id="a capability beyond the default set"),
]  # fmt: skip


@pytest.mark.parametrize(("pod", "rule"), ROOT_PODS)
async def test_a_pod_that_would_own_the_providers_node_is_refused_by_pod_security(
    granted: Granted, pod: dict[str, Any], rule: str
) -> None:
    message = _refused(lambda: k8s.CoreV1Api(granted.api).create_namespaced_pod(granted.namespace, _pod("root", **pod)))
    assert 'violates PodSecurity \\"baseline:latest\\"' in message and rule in message, message
    _admitted_without_the_defence(granted, lambda core: core.create_namespaced_pod("default", _pod("root", **pod),
                                                                                dry_run="All"))  # fmt: skip


PAST_THE_SCHEDULER = [
    pytest.param({"nodeName": "n1"}, "spec.nodeName", id="a node of its choosing"),
    pytest.param({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                   "effect": "NoSchedule"}]}, "spec.tolerations", id="a taint of the provider tolerated"),
    pytest.param({"tolerations": [{"operator": "Exists"}]}, "spec.tolerations", id="every taint tolerated"),
    pytest.param({"runtimeClassName": "runc"}, "spec.runtimeClassName", id="a runtime class"),
    pytest.param({"priorityClassName": "system-node-critical"}, "spec.priorityClassName",
                 id="a system priority that preempts the provider's pods"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "field"), PAST_THE_SCHEDULER)
async def test_a_pod_placed_past_the_providers_scheduler_is_refused(
    granted: Granted, spec: dict[str, Any], field: str
) -> None:
    message = _refused(lambda: k8s.CoreV1Api(granted.api).create_namespaced_pod(granted.namespace,
                                                                                  _pod("placed", spec=spec)))  # fmt: skip
    assert "tidepool-consumer-pods" in message and field in message, message
    _admitted_without_the_defence(granted, lambda core: core.create_namespaced_pod("default", _pod("placed", spec=spec),
                                                                                dry_run="All"))  # fmt: skip


async def test_tolerations_added_to_a_pod_by_a_patch_are_refused(granted: Granted) -> None:
    """Kubernetes lets an update add tolerations: a pod created plain (allowed), then patched to tolerate every
    taint, would be placed by the scheduler on the provider's tainted nodes. Its labels it may still patch
    (the virtual kubelet does, on its copies)."""
    core = k8s.CoreV1Api(granted.api)
    core.create_namespaced_pod(granted.namespace, _pod("tolerated"))
    try:
        defaults = core.read_namespaced_pod("tolerated", granted.namespace).spec.tolerations or []
        every_taint = {"spec": {"tolerations": [*(t.to_dict() for t in defaults), {"operator": "Exists"}]}}
        message = _refused(lambda: core.patch_namespaced_pod("tolerated", granted.namespace, every_taint))
        assert PODS_POLICY_NAME in message and "spec.tolerations" in message, message
        core.patch_namespaced_pod("tolerated", granted.namespace, {"metadata": {"labels": {"seen": "yes"}}})
    finally:
        core.delete_namespaced_pod("tolerated", granted.namespace, grace_period_seconds=0)
    admin = k8s.CoreV1Api(granted.provider.api_client())  # without the policy: the same patch passes
    admin.create_namespaced_pod("default", _pod("tolerated"))
    try:
        defaults = admin.read_namespaced_pod("tolerated", "default").spec.tolerations or []
        admin.patch_namespaced_pod("tolerated", "default", {"spec": {"tolerations": [
            *(t.to_dict() for t in defaults), {"operator": "Exists"}]}}, dry_run="All")  # fmt: skip
    finally:
        admin.delete_namespaced_pod("tolerated", "default", grace_period_seconds=0)


def _token_secret(name: str, service_account: str = SERVICE_ACCOUNT) -> k8s.V1Secret:
    return k8s.V1Secret.model_validate({"metadata": {"name": name, "annotations": {
        "kubernetes.io/service-account.name": service_account}}, "type": SERVICE_ACCOUNT_TOKEN_TYPE})  # fmt: skip


async def test_a_secret_that_would_mint_a_token_of_the_consumers_identity_is_refused(granted: Granted) -> None:
    """The token controller would fill it with a never-expiring token of tidepool-virtual-kubelet here, one
    that outlives every rotation and the anchors' revocation."""
    message = _refused(lambda: k8s.CoreV1Api(granted.api).create_namespaced_secret(granted.namespace,
                                                                                     _token_secret("minted")))  # fmt: skip
    assert SECRETS_POLICY_NAME in message and SERVICE_ACCOUNT_TOKEN_TYPE in message, message
    _admitted_without_the_defence(granted, lambda admin: admin.create_namespaced_secret(
        "default", _token_secret("minted", "default"), dry_run="All"))  # fmt: skip


async def test_secrets_beyond_the_count_are_refused_by_the_quota(granted: Granted) -> None:
    """Each Secret may hold about 1 MiB of the provider's etcd: their count is bounded (and ConfigMaps' and
    Services' the same way, models.enforcement.object_count)."""
    core, admin = k8s.CoreV1Api(granted.api), k8s.CoreV1Api(granted.provider.api_client())

    def counted() -> k8s.V1ResourceQuota | None:  # once the quota controller has counted what is there
        quota = admin.read_namespaced_resource_quota(QUOTA_NAME, granted.namespace)
        return quota if "count/secrets" in ((quota.status and quota.status.used) or {}) else None

    quota = await eventually(counted, timeout=30, what="the Secrets counted")
    room = int(quota.spec.hard["count/secrets"]) - int(quota.status.used["count/secrets"])
    assert 0 < room <= 100
    made: list[str] = []
    try:
        for i in range(room):
            core.create_namespaced_secret(granted.namespace, k8s.V1Secret.model_validate(
                {"metadata": {"name": f"fill-{i}"}, "stringData": {"x": "y"}}))  # fmt: skip
            made.append(f"fill-{i}")
        message = _refused(lambda: core.create_namespaced_secret(granted.namespace, k8s.V1Secret.model_validate(
            {"metadata": {"name": "one-more"}, "stringData": {"x": "y"}})))  # fmt: skip
        assert "exceeded quota" in message and "count/secrets" in message, message
    finally:
        for name in made:
            core.delete_namespaced_secret(name, granted.namespace)


async def test_the_namespace_enforces_pod_security_and_the_offer_as_a_quota(granted: Granted) -> None:
    core = k8s.CoreV1Api(granted.provider.api_client())
    labels = core.read_namespace(granted.namespace).metadata.labels or {}
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert core.read_namespaced_resource_quota(QUOTA_NAME, granted.namespace).spec.hard == quota_hard(
        Resources(granted.offered))  # fmt: skip
    assert granted.offered["cpu"] == "2"  # half of the node


async def test_pods_beyond_the_offer_are_refused_by_the_quota(granted: Granted) -> None:
    core = k8s.CoreV1Api(granted.api)
    message = _refused(lambda: core.create_namespaced_pod(granted.namespace, _pod(
        "huge", container={"resources": {"requests": {"cpu": "3"}}})))  # fmt: skip
    assert "exceeded quota" in message and "requests.cpu" in message, message
    # One by one up to the offer: 2 CPU in 1-CPU pods, and pods without requests (the LimitRange's default) past it.
    made: list[str] = []
    try:
        for i in range(2):
            core.create_namespaced_pod(granted.namespace, _pod(f"fill-{i}", container={"resources": {"requests": {"cpu": "1"}}}))
            made.append(f"fill-{i}")
        message = _refused(lambda: core.create_namespaced_pod(granted.namespace, k8s.V1Pod.model_validate(
            {"metadata": {"name": "one-more"}, "spec": {"containers": [{"name": "x", "image": "busybox"}]}})))
        assert "exceeded quota" in message and "requests.cpu=10m" in message, message  # the default request
    finally:
        for name in made:
            core.delete_namespaced_pod(name, granted.namespace, grace_period_seconds=0)


def _service(name: str, **spec: Any) -> k8s.V1Service:
    return k8s.V1Service.model_validate({"metadata": {"name": name}, "spec": {
        "selector": {"app": "x"}, "ports": [{"port": 80}], **spec}})  # fmt: skip


SERVICES = [
    pytest.param({"type": "NodePort", "ports": [{"port": 80, "nodePort": 31555}]}, "spec.type", id="a NodePort"),
    pytest.param({"type": "LoadBalancer"}, "spec.type", id="a LoadBalancer"),
    pytest.param({"externalIPs": ["10.96.0.10"]}, "spec.externalIPs", id="an external IP (intercepting an address)"),
    pytest.param({"type": "ExternalName", "externalName": "kubernetes.default.svc", "selector": None, "ports": None},
                 "spec.type", id="an ExternalName"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "field"), SERVICES)
async def test_a_service_that_opens_the_providers_nodes_or_addresses_is_refused(
    granted: Granted, spec: dict[str, Any], field: str
) -> None:
    core = k8s.CoreV1Api(granted.api)
    message = _refused(lambda: core.create_namespaced_service(granted.namespace, _service("open", **spec)))
    assert "tidepool-consumer-services" in message and field in message, message
    _admitted_without_the_defence(granted, lambda admin: admin.create_namespaced_service("default", _service(
        "open", **spec), dry_run="All"))  # fmt: skip
    # A ClusterIP Service, as the virtual kubelet makes them, passes; changed into a NodePort, refused.
    core.create_namespaced_service(granted.namespace, _service("plain"))
    try:
        message = _refused(lambda: core.replace_namespaced_service("plain", granted.namespace, _service(
            "plain", type="NodePort")))  # fmt: skip
        assert "spec.type" in message, message
    finally:
        core.delete_namespaced_service("plain", granted.namespace)


WHAT_IT_ENFORCES = [
    pytest.param(lambda core, ns: core.patch_namespace(ns, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "privileged"}}}), id="its namespace relabelled privileged"),
    pytest.param(lambda core, ns: core.delete_namespaced_resource_quota(QUOTA_NAME, ns), id="the quota deleted"),
    pytest.param(lambda core, ns: core.patch_namespaced_resource_quota(QUOTA_NAME, ns, {"spec": {"hard": {
        "requests.cpu": "1000"}}}), id="the quota raised"),
    pytest.param(lambda core, ns: core.delete_namespaced_limit_range(LIMIT_RANGE_NAME, ns), id="the LimitRange deleted"),
    pytest.param(lambda core, _ns: core.create_namespaced_pod("default", _pod("elsewhere")),
                 id="a pod outside its namespace"),
]  # fmt: skip


@pytest.mark.parametrize("attack", WHAT_IT_ENFORCES)
async def test_the_consumer_cannot_undo_what_the_provider_enforces(granted: Granted, attack: Any) -> None:
    message = _refused(lambda: attack(k8s.CoreV1Api(granted.api), granted.namespace))
    assert "cannot" in message, message  # RBAC's refusal


def _expanded(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {(group, resource, verb, name) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]
            for name in rule.get("resourceNames") or [""]}  # fmt: skip


async def test_the_consumers_identity_may_do_exactly_what_a_virtual_kubelet_needs(granted: Granted) -> None:
    review = k8s.AuthorizationV1Api(granted.api).create_self_subject_rules_review(
        k8s.V1SelfSubjectRulesReview.model_validate({"spec": {"namespace": granted.namespace}}))
    rules = [r.to_dict() for r in review.status.resource_rules]
    held = _expanded([{"apiGroups": r["api_groups"] or [], "resources": r["resources"] or [], "verbs": r["verbs"],
                       "resourceNames": r.get("resource_names")} for r in rules])  # fmt: skip
    # Every authenticated user may ask what it may do (system:basic-user): not the provider's grant.
    asking = {"authorization.k8s.io", "authentication.k8s.io"}
    # In its control namespace, and there alone, it also asks for namespaces of its own (issue 35).
    assert {rule for rule in held if rule[0] not in asking} == _expanded(VIRTUAL_KUBELET_RULES + REMOTE_NAMESPACES_RULES)


# End to end -------------------------------------------------------------------------------------------------

@pytest.fixture
async def peering(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str,
                  tmp_path: Path) -> AsyncIterator[Peering]:  # fmt: skip
    async with peered(localenv, make_cluster, unique, consumer_pod_cidr="10.2.0.0/16", log_dir=tmp_path) as peering:
        yield peering


def _on_virtual_node(peering: Peering, name: str, container: dict[str, Any]) -> k8s.V1Pod:
    return k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "x", "image": "busybox", **container}],
        "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
        "nodeSelector": {LABEL_PROVIDER: peering.provider_id}}})  # fmt: skip


def _refusal_events(core: k8s.CoreV1Api, namespace: str, pod: str) -> list[k8s.CoreV1Event]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items
    return [e for e in events if e.reason == "ProviderRefused" and e.type == "Warning"]


def _copies(provider: k8s.CoreV1Api, peering: Peering) -> list[str]:
    return sorted(str(p.metadata.name) for p in provider.list_namespaced_pod(peering.remote("team")).items)


async def _lower_the_quota(provider: k8s.CoreV1Api, namespace: str, *, cpu: str) -> None:
    """Lowers the offer's quota by hand, once it holds: the quota controller has counted the namespace (else
    its first count moves the usage, and the offer's split writes its own limit over this one), and admission
    enforces the new limit (it reads the status's copy, which that controller writes after the spec's)."""
    await eventually(lambda: provider.read_namespaced_resource_quota(QUOTA_NAME, namespace).status.used is not None,
                     what="the quota's first count")  # fmt: skip
    provider.patch_namespaced_resource_quota(QUOTA_NAME, namespace, {"spec": {"hard": {"requests.cpu": cpu}}})
    await eventually(lambda: (provider.read_namespaced_resource_quota(QUOTA_NAME, namespace).status.hard or {})
                     .get("requests.cpu") == cpu, what="the lowered quota enforced")  # fmt: skip


def _said(pod: k8s.V1Pod) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == POD_PROVIDER_CONDITION), None)


async def test_a_pod_the_provider_refuses_fails_on_the_consumer_with_the_rule_and_is_not_retried(
    peering: Peering,
) -> None:
    core = k8s.CoreV1Api(peering.consumer.api_client())
    provider = k8s.CoreV1Api(peering.provider.api_client())
    await eventually(lambda: ready_node(core, peering.node), timeout=90, what="the virtual node Ready")
    remote = await offloaded_namespace(peering, "team")  # Pod Security and the quota hold in its remote namespace
    core.create_namespaced_pod("team", _on_virtual_node(peering, "root", {"securityContext": {"privileged": True}}))
    pod = await eventually(lambda: (p := core.read_namespaced_pod("root", "team")).status.phase == "Failed" and p,
                           timeout=60, what="the refused pod Failed")  # fmt: skip
    assert pod.status.reason == "ProviderRefused"
    assert 'violates PodSecurity "baseline:latest": privileged (container "x"' in pod.status.message
    said = _said(pod)
    assert (said.status, said.reason) == ("False", "ProviderRefused") and said.message == pod.status.message
    await eventually(lambda: len(_refusal_events(core, "team", "root")) == 1, what="one Warning Event")
    # Not retried: over a few seconds, no second attempt (it would say so again) and no copy.
    await asyncio.sleep(5)
    events = _refusal_events(core, "team", "root")
    assert len(events) == 1 and (events[0].count or 1) == 1
    assert core.read_namespaced_pod("root", "team").status.phase == "Failed"
    assert _copies(provider, peering) == []

    # The quota: refused while the offer is used up (here: an operator lowered it by hand), Pending with the
    # condition, tried again with a backoff; once it fits, the copy is made and the condition goes.
    await _lower_the_quota(provider, remote, cpu="1")
    core.create_namespaced_pod("team", _on_virtual_node(peering, "big", {"resources": {"requests": {"cpu": "2"}}}))
    pod = await eventually(lambda: _said(p := core.read_namespaced_pod("big", "team")) and p, timeout=60,
                           what="the quota refusal on the pod")  # fmt: skip
    assert pod.status.phase == "Pending" and "exceeded quota" in _said(pod).message
    await asyncio.sleep(3)
    assert len(_refusal_events(core, "team", "big")) == 1  # said once, not at each attempt
    provider.patch_namespaced_resource_quota(QUOTA_NAME, remote, {"spec": {"hard": {"requests.cpu": "4"}}})
    await eventually(lambda: _copies(provider, peering) == ["big"], timeout=90,
                     what="the copy made once the quota allows it")  # fmt: skip
    await eventually(lambda: _said(core.read_namespaced_pod("big", "team")) is None, what="the condition gone")
