"""What a provider enforces on its own API server in a foreign cluster's namespace, whatever the consumer's
virtual kubelet sends (issue 34): the objects, as data; activities/credentials.py applies them at each push,
and workers/virtual_kubelet.py reads the refusals they cause.

1. Pod Security Admission: the namespace's `pod-security.kubernetes.io/*` labels at the ClusterConfig's level
   (outgoingConfig.podSecurityLevel, default baseline): enforce, and warn and audit at the same level.
2. A ResourceQuota equal to the offer the consumer was pushed (`quota_hard`), so that it cannot run more than
   it accepted, with no node port or load balancer Service at all, and with a count of Secrets, ConfigMaps and
   Services bounded by the offered pods (each may hold about 1 MiB of the provider's etcd).
3. A LimitRange giving containers without requests a small default request (`DEFAULT_REQUEST`): a quota on
   requests.cpu/memory refuses a pod whose containers name none, and the consumer's own scheduler admitted
   it to the virtual node without any.
4. ValidatingAdmissionPolicies (and their bindings) in the foreign namespaces: on Services, only ClusterIP
   ones (headless included), no node port, external IP, external name or load balancer field; on pods, nothing
   that places them past the provider's scheduler (a node name, tolerations of its taints, a runtime class).
   The virtual kubelet's copies never carry any of it (models/virtual_kubelet.safe_pod_spec, service_copy).
   On Secrets, no service-account token: the token controller would fill it with a never-expiring token of
   the namespace's ServiceAccount named, the consumer's own included (one that outlives rotation and revocation).
5. `split_offer`: the offer spread over one consumer's namespaces (its control namespace and each namespace
   made for a RemoteNamespace, models/remote_namespaces.py), one ResourceQuota each, re-split at each push and
   whenever a quota's usage moves, so that together they never hold more than the offer.
6. `refusal`: what a 403 on creating a pod's copy says, as the rule that refused it and whether it is final
   for that pod spec (Pod Security, a policy) or may pass later (quota).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any, Final, Literal, get_args

from models.names import LABEL_CONSUMER, LABEL_MANAGED_BY, MANAGED_BY, OFFER_ANNOTATION
from models.quantities import format_quantity, parse_quantity
from models.resources import Resources

PodSecurityLevel = Literal["baseline", "restricted", "privileged"]
POD_SECURITY_LEVELS: Final = get_args(PodSecurityLevel)
POD_SECURITY_PREFIX: Final = "pod-security.kubernetes.io/"
POD_SECURITY_MODES: Final = ("enforce", "warn", "audit")

QUOTA_NAME: Final = "tidepool-offer"
LIMIT_RANGE_NAME: Final = "tidepool-default-requests"
SERVICES_POLICY_NAME: Final = "tidepool-consumer-services"
PODS_POLICY_NAME: Final = "tidepool-consumer-pods"
SECRETS_POLICY_NAME: Final = "tidepool-consumer-secrets"

# A container without requests gets these in the provider. Small: the consumer's scheduler counted such a
# pod as zero on the virtual node, so many of them must still fit in what it accepted; not zero: a quota on
# requests refuses a zero, and each pod should hold something of the offer (the pods quota is not the only
# bound). 10m and 32Mi are a tenth of what the scheduler assumes for scoring a request-less pod
# (100m / 200Mi, its non-zero defaults), rounded.
DEFAULT_REQUEST: Final = {"cpu": "10m", "memory": "32Mi"}
# Quota keys that refuse every node port and load balancer Service in the namespace, whoever makes it:
# the policy says why, the quota holds even where the policy is not installed.
NO_EXTERNAL_SERVICES: Final = {"services.nodeports": "0", "services.loadbalancers": "0"}
# The quota resource a node resource's requests count against; names not listed and without a "/"
# (an extended resource) have no quota key and are not limited.
_REQUESTED = ("cpu", "memory", "ephemeral-storage")
# Secrets, ConfigMaps and Services a consumer may keep in its namespace: per offered pod (the virtual kubelet
# copies those its pods use, and the Services that select them), plus a margin. The provider's own token anchor
# Secrets (activities/credentials.py, tidepool.token.N: at most 2 live) are in the namespace too and count
# against the Secrets' cap: the margin holds them.
OBJECTS_PER_POD: Final = 2
OBJECTS_MARGIN: Final = 20
_COUNTED = ("count/secrets", "count/configmaps", "services")
_HUGEPAGES = "hugepages-"


def pod_security_labels(level: PodSecurityLevel) -> dict[str, str]:
    """The namespace labels of Pod Security Admission at `level`, against the API server's latest rules."""
    labels: dict[str, str] = {}
    for mode in POD_SECURITY_MODES:
        labels[f"{POD_SECURITY_PREFIX}{mode}"] = level
        labels[f"{POD_SECURITY_PREFIX}{mode}-version"] = "latest"
    return labels


def quota_hard(offered: Resources) -> dict[str, str]:
    """The ResourceQuota's `hard` for an offer: cpu, memory and ephemeral-storage as requests.*, hugepages
    and extended resources (a name with a "/") as requests.<name>, pods as pods; Secrets, ConfigMaps and
    Services counted (`object_count`); plus no node ports or load balancers."""
    hard: dict[str, str] = {}
    for name, amount in offered.to_kubernetes().items():
        if name == "pods":
            hard["pods"] = amount
        elif name in _REQUESTED or name.startswith(_HUGEPAGES) or "/" in name:
            hard[f"requests.{name}"] = amount
    count = str(object_count(offered))
    return {**hard, **{key: count for key in _COUNTED}, **NO_EXTERNAL_SERVICES}


def object_count(offered: Resources) -> int:
    """How many Secrets (the provider's token anchors included), ConfigMaps and Services each, for an offer:
    OBJECTS_PER_POD per offered pod plus OBJECTS_MARGIN (an offer without pods still holds the anchors)."""
    return OBJECTS_PER_POD * int(offered.get("pods", 0)) + OBJECTS_MARGIN


def resource_quota(namespace: str, offered: Resources, *, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": namespace, "labels": labels},
            "spec": {"hard": quota_hard(offered)}}  # fmt: skip


def limit_range(namespace: str, *, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": LIMIT_RANGE_NAME, "namespace": namespace, "labels": labels},
            "spec": {"limits": [{"type": "Container", "defaultRequest": dict(DEFAULT_REQUEST)}]}}  # fmt: skip


# The foreign namespaces, by the labels the provider's worker gives them (a consumer can write no namespace).
_FOREIGN_NAMESPACES = {
    "matchLabels": {LABEL_MANAGED_BY: MANAGED_BY},
    "matchExpressions": [{"key": LABEL_CONSUMER, "operator": "Exists"}],
}
_NOT_ALLOWED = "is not allowed on a consumer's Service here (ClusterIP only: no node port, external address or load balancer)"
_SERVICE_RULES: list[tuple[str, str]] = [
    # (CEL that must hold, the message: the field first)
    ("!has(object.spec.type) || object.spec.type == 'ClusterIP'",
     "spec.type must be ClusterIP on a consumer's Service here (no NodePort, LoadBalancer or ExternalName)"),
    ("!has(object.spec.ports) || object.spec.ports.all(p, !has(p.nodePort) || p.nodePort == 0)",
     f"spec.ports[].nodePort {_NOT_ALLOWED}"),
    ("!has(object.spec.healthCheckNodePort) || object.spec.healthCheckNodePort == 0",
     f"spec.healthCheckNodePort {_NOT_ALLOWED}"),
    ("!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0", f"spec.externalIPs {_NOT_ALLOWED}"),
    ("!has(object.spec.externalName) || object.spec.externalName == ''", f"spec.externalName {_NOT_ALLOWED}"),
    ("!has(object.spec.loadBalancerIP) || object.spec.loadBalancerIP == ''", f"spec.loadBalancerIP {_NOT_ALLOWED}"),
    ("!has(object.spec.loadBalancerSourceRanges) || size(object.spec.loadBalancerSourceRanges) == 0",
     f"spec.loadBalancerSourceRanges {_NOT_ALLOWED}"),
    ("!has(object.spec.loadBalancerClass) || object.spec.loadBalancerClass == ''",
     f"spec.loadBalancerClass {_NOT_ALLOWED}"),
]  # fmt: skip


# What the API server itself adds to every pod before validation (DefaultTolerationSeconds): allowed.
_DEFAULT_TOLERATIONS = "['node.kubernetes.io/not-ready', 'node.kubernetes.io/unreachable']"
# Checked at creation and at every update: an update may add tolerations (Kubernetes allows adding them), and a
# pod admitted at creation satisfies every rule but the node name, which the scheduler sets by a binding and
# which is then the provider's. So updates pass for whoever else holds a service-account identity here
# (the virtual kubelet's label patches; kube-controller-manager, which may run with service-account
# credentials, updates no toleration and sets no node name at creation).
_POD_RULES: list[tuple[str, str]] = [
    ("request.operation != 'CREATE' || !has(object.spec.nodeName) || object.spec.nodeName == ''",
     "spec.nodeName is not allowed on a consumer's pod here: the provider's scheduler places it"),
    (f"!has(object.spec.tolerations) || object.spec.tolerations.all(t, has(t.key) && t.key in {_DEFAULT_TOLERATIONS} "
     "&& has(t.effect) && t.effect == 'NoExecute')",
     "spec.tolerations may not tolerate the provider's taints on a consumer's pod here (only the API server's "
     "not-ready and unreachable defaults)"),
    ("!has(object.spec.runtimeClassName) || object.spec.runtimeClassName == ''",
     "spec.runtimeClassName is not allowed on a consumer's pod here"),
    # Kubernetes reserves the "system-" prefix for its own classes (2,000,000,000 and above): a pod at one preempts
    # and outlives every pod of the provider's under pressure. The copies carry no class (safe_pod_spec).
    ("!has(object.spec.priorityClassName) || !object.spec.priorityClassName.startsWith('system-')",
     "spec.priorityClassName may not name a system priority class on a consumer's pod here (it would preempt the "
     "provider's own pods)"),
]  # fmt: skip


SERVICE_ACCOUNT_TOKEN_TYPE: Final = "kubernetes.io/service-account-token"
_SECRET_RULES: list[tuple[str, str]] = [
    (f"!has(object.type) || object.type != '{SERVICE_ACCOUNT_TOKEN_TYPE}'",
     f"type {SERVICE_ACCOUNT_TOKEN_TYPE} is not allowed on a consumer's Secret here: the token controller would fill it with a "
     "never-expiring token of a ServiceAccount of this cluster"),
    ("!has(object.metadata.annotations) || "
     "!object.metadata.annotations.exists(k, k.startsWith('kubernetes.io/service-account.'))",
     "metadata.annotations kubernetes.io/service-account.* are not allowed on a consumer's Secret here"),
]  # fmt: skip


def _policy(name: str, resource: str, operations: list[str], rules: list[tuple[str, str]]) -> dict[str, Any]:
    """A policy on `resource` in the foreign namespaces, for requests made by a ServiceAccount (a consumer's
    identity is one; people and the provider's own controllers are not held to it)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": _FOREIGN_NAMESPACES,
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                                   "resources": [resource]}],
            },
            "matchConditions": [{"name": "a-service-account", "expression":
                                 "has(request.userInfo.groups) && 'system:serviceaccounts' in request.userInfo.groups"}],
            "validations": [{"expression": expression, "message": message, "reason": "Forbidden"}
                            for expression, message in rules],
        },
    }  # fmt: skip


def _binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }  # fmt: skip


def consumer_policies() -> list[dict[str, Any]]:
    """The admission policies on what a consumer makes in its namespace here, each followed by its binding.
    Services: ClusterIP only, nothing that opens a port on the provider's nodes or an address outside its
    cluster network (an external IP would also intercept that address's traffic in the cluster,
    CVE-2020-8554). Pods (at creation and update; the node name at creation only: a scheduled pod's is the
    scheduler's): placed by the provider's scheduler, never past it onto a node of its choosing or a tainted
    one, nor at a system priority. Secrets: no service-account token of this cluster's minted into them."""
    services = _policy(SERVICES_POLICY_NAME, "services", ["CREATE", "UPDATE"], _SERVICE_RULES)
    pods = _policy(PODS_POLICY_NAME, "pods", ["CREATE", "UPDATE"], _POD_RULES)
    secrets = _policy(SECRETS_POLICY_NAME, "secrets", ["CREATE", "UPDATE"], _SECRET_RULES)
    return [services, _binding(SERVICES_POLICY_NAME), pods, _binding(PODS_POLICY_NAME),
            secrets, _binding(SECRETS_POLICY_NAME)]


# ---------------------------------------------------------------------------------------------------
# Refusals, as the virtual kubelet reads them on a pod's copy.

RefusedBy = Literal["PodSecurity", "ResourceQuota", "AdmissionPolicy"]
MAX_REFUSAL_MESSAGE = 512
_FORBIDDEN_PREFIX = re.compile(r'^[a-z.]+ "[^"]*" is forbidden: ')
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class Refusal:
    by: RefusedBy
    message: str  # the rule, as the provider's API server said it, bounded

    @property
    def final(self) -> bool:
        """Refused for this pod spec for good (a kubelet's admission rejection: the pod fails); a quota
        refusal may pass once the offer grows or other pods end (the pod stays Pending and is retried)."""
        return self.by != "ResourceQuota"


def status_message(body: str | bytes | None) -> str | None:
    """The message of an API server's Status body (its own words, never the exception's text, which carries
    the response headers); None when the body is no Status."""
    try:
        message = json.loads(body or "{}").get("message")
    except (ValueError, AttributeError):
        return None
    return str(message) if message else None


def refusal(status: int | None, body: str | bytes | None) -> Refusal | None:
    """The provider's rule in a refused create (403): None for any other answer, including a 403 of RBAC
    (credentials, not the pod). The message comes from the other cluster: printable, one line, bounded."""
    if status != 403 or not body:
        return None
    message = status_message(body) or ""
    message = _FORBIDDEN_PREFIX.sub("", _UNPRINTABLE.sub(" ", message)).strip()
    by: RefusedBy
    if "violates PodSecurity" in message:
        by = "PodSecurity"
    elif message.startswith(("exceeded quota", "failed quota")):
        by = "ResourceQuota"
    elif "ValidatingAdmissionPolicy" in message:
        by = "AdmissionPolicy"
    else:
        return None
    if len(message) > MAX_REFUSAL_MESSAGE:
        message = message[: MAX_REFUSAL_MESSAGE - 1] + "…"
    return Refusal(by=by, message=message)


# ---------------------------------------------------------------------------------------------------
# The offer spread over one consumer's namespaces (issue 35): its control namespace (the single-namespace
# layout's copies, the token anchors) and each remote namespace made for it hold one ResourceQuota each.

# Quota keys counted in thousandths (the API server's own precision for cpu); every other key in whole units
# (bytes, pods, objects): a share is never a fraction of what it counts.
_MILLI_KEYS = ("requests.cpu",)


def _unit(key: str) -> Decimal:
    return Decimal("0.001") if key in _MILLI_KEYS else Decimal(1)


def split_offer(offer: Mapping[str, str], used: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """Each namespace's `hard` (by namespace, for every namespace of `used`): per key of the offer's quota
    (`quota_hard`), hard_i = used_i + (offer − Σ used) / n, the free part split evenly in whole units (the
    remainder's units to the first namespaces by name, so that the split is the same wherever it is computed).

    Invariants: Σ hard ≤ offer for every key while Σ used ≤ offer (they are equal but for less than one unit
    per namespace); no namespace's hard is below its used (an offer that shrank below what runs leaves each at
    its used: nothing new is admitted anywhere, nothing running is refused); a key the offer holds at 0 (node
    ports, load balancers) is 0 everywhere. Keys `used` has and the offer has not are not limited."""
    names = sorted(used)
    result: dict[str, dict[str, str]] = {name: {} for name in names}
    if not names:
        return result
    for key, total_text in offer.items():
        total = parse_quantity(total_text)
        unit = _unit(key)
        held = {name: parse_quantity(used[name].get(key, "0")) for name in names}
        free = max(total - sum(held.values(), Decimal(0)), Decimal(0))
        units = int((free / unit).to_integral_value(rounding=ROUND_FLOOR))
        share, remainder = divmod(units, len(names))
        for index, name in enumerate(names):
            extra = share + (1 if index < remainder else 0)
            result[name][key] = format_quantity(held[name] + extra * unit) if total else "0"
    return result


def quota_for(namespace: str, hard: Mapping[str, str], *, labels: dict[str, str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One namespace's ResourceQuota with its share of the offer (`split_offer`)."""
    metadata: dict[str, Any] = {"name": QUOTA_NAME, "namespace": namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": metadata, "spec": {"hard": dict(hard)}}


def offer_annotation(offer: Mapping[str, str]) -> dict[str, str]:
    """The whole offer's quota (`quota_hard`), kept on the control namespace's quota (whose hard is only its
    share): what the provider's worker splits again whenever a quota's usage moves between pushes. Written with
    every write of that quota (a server-side apply without it would remove it)."""
    return {OFFER_ANNOTATION: json.dumps(dict(offer), sort_keys=True)}


def offer_of(annotations: Mapping[str, str] | None) -> dict[str, str] | None:
    """`offer_annotation`'s inverse; None when absent or unreadable (no push recorded one yet)."""
    text = (annotations or {}).get(OFFER_ANNOTATION)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return None
    return dict(value)
