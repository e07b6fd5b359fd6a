"""Least-privilege credentials a provider hands to a foreign cluster: a namespace of its own in the home
cluster, a ServiceAccount bound there to the ClusterRole that allows only what a virtual kubelet needs,
and a short-lived token in a kubeconfig. The kubeconfig is written straight to a Secret on the foreign cluster
by activities/peering.py; it never leaves the activity (no workflow input, result or log carries it).

Rotation revokes: each token is bound (TokenRequest boundObjectRef) to an anchor Secret of its generation
in the foreign namespace, and issuing generation N deletes the anchors before N-1 (models/credentials.py
says when and which). The API server refuses a bound token once its object is gone (within its ~10 s
authentication cache). The generation, its times and where it was written are annotations of the
namespace, so that a push knows without reading anything more whether to renew.

What the provider enforces there (models/enforcement.py) is applied with the namespace: its Pod Security
labels, a LimitRange, and a ResourceQuota holding its share of the offer (the offer split over the consumer's
namespaces: this one and those made for its RemoteNamespaces, activities/remote_namespaces.py), which
`enforce_offer` splits again at the pushes that do not ensure the access; the admission policy on Services is
installed like the ClusterRoles. The consumer asks for namespaces of its own here (RemoteNamespaces, through
REMOTE_NAMESPACES_RULES bound in this namespace alone); withdrawal deletes them with this one."""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.remote_namespaces import (
    delete_remote_namespaces,
    release_remote_namespace_requests,
    split_consumer_offer,
)
from kube.errors import already_exists
from kube.identity import token_kubeconfig
from kube.objects import FIELD_MANAGER, apply_core, ignore_not_found
from models.credentials import TokenGeneration, anchors_to_revoke, token_lifetime_seconds
from models.enforcement import (
    PodSecurityLevel,
    consumer_policies,
    limit_range,
    pod_security_labels,
)
from models.names import (
    CONSUMER_KEEPALIVE_LEASE,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    LABEL_TOKEN_ANCHOR,
    MANAGED_BY,
    SYSTEM_NAMESPACE,
    foreign_namespace,
    token_anchor_name,
)
from models.resources import Resources

SERVICE_ACCOUNT = "tidepool-virtual-kubelet"
BINDING = "tidepool-virtual-kubelet"
# A ClusterRole bound per namespace rather than a Role written per namespace: the worker may then bind
# this one role (RBAC verb `bind`, deploy/base/rbac.yaml) without holding its permissions itself,
# and cannot widen what it hands out. deploy/ installs it; tests/test_deploy.py keeps it equal to the rules.
CLUSTER_ROLE = "tidepool-foreign-virtual-kubelet"
# The worker's own access to the anchor Secrets: bound to itself in each foreign namespace (by the same
# `bind` verb), so that it holds no Secret rights anywhere else.
CREDENTIALS_CLUSTER_ROLE = "tidepool-foreign-credentials"
CREDENTIALS_BINDING = "tidepool-worker-credentials"
# The consumer's requests for namespaces of their own (issue 35): bound in its control namespace alone, so that
# a RemoteNamespace anywhere else cannot be made by it (and would be ignored: workers/remote_namespaces.py).
REMOTE_NAMESPACES_CLUSTER_ROLE = "tidepool-foreign-remote-namespaces"
REMOTE_NAMESPACES_BINDING = "tidepool-remote-namespaces"
WORKER_SERVICE_ACCOUNT = "tidepool-worker"
# The token generation annotations are written by a manager of their own: the namespace's server-side
# apply (manager "tidepool", every push) does not carry them, and so must not own them.
RECORD_FIELD_MANAGER = f"{FIELD_MANAGER}-credentials"
# How long a first rotation waits for the worker's new binding in a foreign namespace to take effect.
ANCHOR_FORBIDDEN_ATTEMPTS = 10
ANCHOR_FORBIDDEN_WAIT_SECONDS = 0.2

# The ClusterRoles are installed with tidepool: a push finds them there, so each process looks again only
# this long after it last found one (a cluster role read per push was a twelfth of a first push's calls).
CLUSTER_ROLE_RECHECK_SECONDS = 600
# client -> name -> monotonic time last found (per client: one process may hold several clusters' in tests)
_cluster_roles_found: weakref.WeakKeyDictionary[k8s.ApiClient, dict[str, float]] = weakref.WeakKeyDictionary()
_cluster_roles_lock = threading.Lock()

# What a foreign virtual kubelet may do in its namespace, and nothing else (Liqo bound cluster-admin).
VIRTUAL_KUBELET_RULES: list[dict[str, Any]] = [
    # Its copies (workers/virtual_kubelet.py): watched, created, labels patched, deleted, read once when one
    # seems lost; deleted by collection at teardown (kube/copies.py). Never updated whole, never their status.
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete", "deletecollection"]},
    # ConfigMaps' and Secrets' copies: watched, created, replaced when the source changes, read on a conflict.
    {"apiGroups": [""], "resources": ["configmaps", "secrets"],
     "verbs": ["get", "list", "watch", "create", "update", "delete", "deletecollection"]},
    # Services' copies the same way (ClusterIP only: the admission policy of models/enforcement.py); no collection.
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
    # The provider's Events about its copies, reflected as Events on the consumer's pods.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # WebSocket sessions: a GET upgraded, authorized as get and (since 1.30, for exec, attach and port-forward) create.
    {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"], "verbs": ["get", "create"]},
    # Its keepalive (kube/copies.py): create cannot be narrowed to a name (the namespace is its own); the rest is.
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [CONSUMER_KEEPALIVE_LEASE],
     "verbs": ["get", "patch", "delete"]},
]  # fmt: skip
# What the worker may do in a foreign namespace through CREDENTIALS_BINDING: its anchor Secrets; the quota and
# LimitRange it applies there (server-side apply: patch, and create the first time); and, once the consumer's
# keepalive has lapsed, delete the consumer's copies there (kube/copies.py) and the keepalive.
CREDENTIALS_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "create", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["deletecollection"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "delete"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [CONSUMER_KEEPALIVE_LEASE],
     "verbs": ["get", "delete"]},
    {"apiGroups": [""], "resources": ["resourcequotas", "limitranges"], "verbs": ["create", "patch"]},
]  # fmt: skip
# What a consumer's identity may do with RemoteNamespaces in its control namespace: ask (create), follow (get,
# list, watch) and give up (delete) its requests; never write their status (the provider's answer) nor update
# them (a name and a consumer namespace, immutable in effect: ask again).
REMOTE_NAMESPACES_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["tidepool.io"], "resources": ["remotenamespaces"], "verbs": ["get", "list", "watch", "create", "delete"]},
]  # fmt: skip


def _labels(foreign_cluster_id: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: foreign_cluster_id}


def _namespace(foreign_cluster_id: str, pod_security: PodSecurityLevel) -> dict[str, Any]:
    """The foreign namespace as applied, whole (one field manager owns all its labels)."""
    labels = {**_labels(foreign_cluster_id), **pod_security_labels(pod_security)}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": foreign_namespace(foreign_cluster_id),
                                                                  "labels": labels}}  # fmt: skip


def ensure_foreign_access(home: k8s.ApiClient, foreign_cluster_id: str, *, offered: Resources,
                          pod_security: PodSecurityLevel, calls: Executor) -> tuple[str, TokenGeneration | None]:  # fmt: skip
    """Namespace (with its Pod Security labels), ServiceAccount and RoleBindings for the foreign cluster, then
    the LimitRange and a ResourceQuota of `offered`; returns the namespace and the token generation it records
    (read from the namespace's apply, at no extra call). Server-side apply, so every cycle re-ensures them (a
    hand-edited binding or quota is put back). The objects in the namespace are applied at once on `calls`,
    which must run single API calls only (the caller waits for them)."""
    _ensure_cluster_role(home, CLUSTER_ROLE, VIRTUAL_KUBELET_RULES)
    _ensure_cluster_role(home, CREDENTIALS_CLUSTER_ROLE, CREDENTIALS_RULES)
    _ensure_cluster_role(home, REMOTE_NAMESPACES_CLUSTER_ROLE, REMOTE_NAMESPACES_RULES)
    _ensure_consumer_policies(home)
    namespace = foreign_namespace(foreign_cluster_id)
    labels = _labels(foreign_cluster_id)
    meta = {"name": BINDING, "namespace": namespace, "labels": labels}
    applied = apply_core(home, _namespace(foreign_cluster_id, pod_security))
    in_namespace: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "name": SERVICE_ACCOUNT}},
        *namespace_bindings(namespace, foreign_cluster_id),
        _binding(REMOTE_NAMESPACES_BINDING, namespace, REMOTE_NAMESPACES_CLUSTER_ROLE, consumer=foreign_cluster_id),
    ]  # fmt: skip
    for applying in [calls.submit(apply_core, home, body) for body in in_namespace]:
        applying.result()
    # Through the worker's own binding, just made: the quota is there before any credentials are. The offer is
    # split over the consumer's namespaces (this one and those made for its RemoteNamespaces).
    limiting = calls.submit(while_forbidden, apply_core, home, limit_range(namespace, labels=labels))
    splitting = calls.submit(split_consumer_offer, home, foreign_cluster_id, offered=offered)
    limiting.result()
    splitting.result()
    return namespace, TokenGeneration.from_annotations(applied["metadata"].get("annotations"))


def enforce_offer(home: k8s.ApiClient, foreign_cluster_id: str, *, offered: Resources,
                  pod_security: PodSecurityLevel | None, calls: Executor) -> None:  # fmt: skip
    """At a push that does not ensure the access: the offer pushed split again over the consumer's quotas, and, when the
    ClusterConfig changed since the last push (`pod_security` given), the namespace's Pod Security labels."""
    splitting = calls.submit(split_consumer_offer, home, foreign_cluster_id, offered=offered)
    if pod_security is not None:
        apply_core(home, _namespace(foreign_cluster_id, pod_security))
    splitting.result()


def _binding(name: str, namespace: str, cluster_role: str, *, consumer: str | None) -> dict[str, Any]:
    """A RoleBinding of `cluster_role` in `namespace`: to the consumer's ServiceAccount (in its control
    namespace), or with `consumer` None to the worker itself."""
    subject = ({"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": foreign_namespace(consumer)}
               if consumer is not None else
               {"kind": "ServiceAccount", "name": WORKER_SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE})  # fmt: skip
    labels = _labels(consumer) if consumer is not None else {LABEL_MANAGED_BY: MANAGED_BY}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [subject],
    }  # fmt: skip


def namespace_bindings(namespace: str, consumer: str) -> list[dict[str, Any]]:
    """In a namespace made for `consumer` (its control namespace or a remote one): its virtual kubelet's rights,
    and the worker's own (the anchors, the quota and LimitRange, the clean-up after a silent consumer)."""
    return [_binding(BINDING, namespace, CLUSTER_ROLE, consumer=consumer),
            _binding(CREDENTIALS_BINDING, namespace, CREDENTIALS_CLUSTER_ROLE, consumer=None)]  # fmt: skip


def while_forbidden(call: Callable[..., Any], *args: Any) -> Any:
    """A binding just made takes effect once the API server's authorizer has seen it (milliseconds): wait for
    that here rather than fail the whole push over it. A namespace being deleted refuses for good: not waited."""
    for attempt in range(ANCHOR_FORBIDDEN_ATTEMPTS):
        try:
            return call(*args)
        except ApiException as e:
            terminating = "being terminated" in str(e.body)
            if e.status != 403 or terminating or attempt == ANCHOR_FORBIDDEN_ATTEMPTS - 1:
                raise
            time.sleep(ANCHOR_FORBIDDEN_WAIT_SECONDS)
    raise AssertionError("unreachable")


def _ensure_cluster_role(home: k8s.ApiClient, name: str, rules: list[dict[str, Any]]) -> None:
    """Installed with tidepool; created here only where it is missing and the worker may (a local
    cluster, where the worker is admin). Never updated here: the worker can read it, not write it."""
    rbac = k8s.RbacAuthorizationV1Api(home)
    body = {"metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGED_BY}}, "rules": rules}
    _ensure_installed(home, f"ClusterRole {name}", read=lambda: rbac.read_cluster_role(name),
                      create=lambda: rbac.create_cluster_role(k8s.V1ClusterRole.model_validate(body)))  # fmt: skip


def _ensure_consumer_policies(home: k8s.ApiClient) -> None:
    """The admission policies on consumers' Services and pods (models/enforcement.py) and their bindings, the
    same way."""
    admission = k8s.AdmissionregistrationV1Api(home)
    calls: dict[str, tuple[Callable[..., Any], Callable[..., Any], Any]] = {
        "ValidatingAdmissionPolicy": (admission.read_validating_admission_policy,
                                      admission.create_validating_admission_policy, k8s.V1ValidatingAdmissionPolicy),
        "ValidatingAdmissionPolicyBinding": (admission.read_validating_admission_policy_binding,
                                             admission.create_validating_admission_policy_binding,
                                             k8s.V1ValidatingAdmissionPolicyBinding),
    }  # fmt: skip
    for body in consumer_policies():
        read, create, model = calls[body["kind"]]
        name = body["metadata"]["name"]
        _ensure_installed(home, f"{body['kind']} {name}", read=functools.partial(read, name),
                          create=functools.partial(create, model.model_validate(body)))  # fmt: skip


def _ensure_installed(home: k8s.ApiClient, what: str, *, read: Callable[[], Any], create: Callable[[], Any]) -> None:
    """An object installed with tidepool (deploy/base), looked for again only CLUSTER_ROLE_RECHECK_SECONDS after
    it was last found; created where missing and the worker may."""
    with _cluster_roles_lock:
        found = _cluster_roles_found.get(home, {}).get(what)
    if found is not None and time.monotonic() - found < CLUSTER_ROLE_RECHECK_SECONDS:
        return
    if ignore_not_found(read) is None:
        try:
            create()
        except ApiException as e:
            if e.status == 403:
                raise ApplicationError(
                    f"{what} is missing and the worker may not create it: install tidepool's manifests "
                    "(kubectl apply -k deploy/overlays/...)", type="MissingInstall",
                ) from e  # fmt: skip
            if not already_exists(e):  # another peering created it meanwhile
                raise
    with _cluster_roles_lock:
        _cluster_roles_found.setdefault(home, {})[what] = time.monotonic()


@dataclass(frozen=True)
class IssuedKubeconfig:
    text: str
    expires_at: datetime


def issue_kubeconfig(
    home: k8s.ApiClient, *, namespace: str, generation: int, lifetime_seconds: int, server: str | None
) -> IssuedKubeconfig:
    """A kubeconfig with a fresh token of the ServiceAccount (TokenRequest: expiring, and bound to the
    anchor Secret of `generation`, whose deletion revokes it)."""
    anchor = _ensure_anchor(home, namespace, generation)
    request = k8s.AuthenticationV1TokenRequest.model_validate({"spec": {
        "expirationSeconds": token_lifetime_seconds(lifetime_seconds),
        "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": anchor.metadata.name, "uid": anchor.metadata.uid},
    }})  # fmt: skip
    issued = k8s.CoreV1Api(home).create_namespaced_service_account_token(SERVICE_ACCOUNT, namespace, request).status
    if issued is None or not issued.token or issued.expiration_timestamp is None:
        raise ApplicationError(f"TokenRequest for {namespace}/{SERVICE_ACCOUNT} answered without a token", type="NoToken")
    text = token_kubeconfig(home.configuration, server=server, token=issued.token, user=SERVICE_ACCOUNT,
                            namespace=namespace)  # fmt: skip
    return IssuedKubeconfig(text=text, expires_at=issued.expiration_timestamp)


def _ensure_anchor(home: k8s.ApiClient, namespace: str, generation: int) -> Any:
    """The anchor Secret of `generation` (created, or found if a retried activity made it already).
    The worker reaches it through a binding to itself in this namespace alone (made by ensure_foreign_access)."""
    core = k8s.CoreV1Api(home)
    name = token_anchor_name(generation)
    # Empty: only its existence (and uid) matters.
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TOKEN_ANCHOR: str(generation)}
    body = k8s.V1Secret.model_validate({"metadata": {"name": name, "labels": labels}, "type": "Opaque"})
    for attempt in range(ANCHOR_FORBIDDEN_ATTEMPTS):
        try:
            return core.create_namespaced_secret(namespace, body)
        except ApiException as e:
            if already_exists(e):
                return core.read_namespaced_secret(name, namespace)
            if e.status != 403 or attempt == ANCHOR_FORBIDDEN_ATTEMPTS - 1:
                raise
            # A binding just made takes effect once the API server's authorizer has seen it (milliseconds):
            # wait for that here rather than fail the whole push over it.
            time.sleep(ANCHOR_FORBIDDEN_WAIT_SECONDS)
    raise AssertionError("unreachable")


def record_token(home: k8s.ApiClient, namespace: str, generation: TokenGeneration) -> None:
    """Remember, on the namespace, which token the foreign cluster now holds (never the token)."""
    k8s.CoreV1Api(home).patch_namespace(namespace, {"metadata": {"annotations": generation.to_annotations()}},
                                        field_manager=RECORD_FIELD_MANAGER)  # fmt: skip


def revoke_older_tokens(home: k8s.ApiClient, namespace: str, *, current: int, calls: Executor) -> list[int]:
    """Delete the anchors before the previous generation, at once on `calls`: their tokens stop working.
    Returns which went."""
    core = k8s.CoreV1Api(home)
    deleting = {generation: calls.submit(ignore_not_found, core.delete_namespaced_secret, token_anchor_name(generation),
                                         namespace) for generation in anchors_to_revoke(current=current)}  # fmt: skip
    return [generation for generation, deleted in deleting.items() if deleted.result() is not None]


def revoke_foreign_access(home: k8s.ApiClient, foreign_cluster_id: str) -> None:
    """Deleting the namespace deletes the ServiceAccount (so every token it issued stops working), the
    Role, the binding, and whatever the foreign cluster still ran here; every namespace made for its
    RemoteNamespaces goes too, and their RemoteNamespaces' finalizers are released."""
    delete_remote_namespaces(home, foreign_cluster_id)
    release_remote_namespace_requests(home, foreign_cluster_id)
    ignore_not_found(k8s.CoreV1Api(home).delete_namespace, foreign_namespace(foreign_cluster_id))
