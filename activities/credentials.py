"""Least-privilege credentials a provider hands to a foreign cluster: a namespace of its own in the home
cluster, a ServiceAccount bound there to the ClusterRole that allows only what a virtual kubelet needs,
and a short-lived token in a kubeconfig. The kubeconfig is written straight to a Secret on the foreign cluster
by activities/peering.py; it never leaves the activity (no workflow input, result or log carries it)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from temporalio.exceptions import ApplicationError

from activities.kube import apply_core, ignore_not_found
from models.names import LABEL_CONSUMER, LABEL_MANAGED_BY, MANAGED_BY, foreign_namespace

SERVICE_ACCOUNT = "tidepool-virtual-kubelet"
BINDING = "tidepool-virtual-kubelet"
# A ClusterRole bound per namespace rather than a Role written per namespace: the worker may then bind
# this one role (RBAC verb `bind`, deploy/base/rbac.yaml) without holding its permissions itself,
# and cannot widen what it hands out. deploy/ installs it; tests/test_deploy.py keeps it equal to the rules.
CLUSTER_ROLE = "tidepool-foreign-virtual-kubelet"

# What a foreign virtual kubelet may do in its namespace, and nothing else (Liqo bound cluster-admin).
VIRTUAL_KUBELET_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "update", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]  # fmt: skip


def _labels(foreign_cluster_id: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: foreign_cluster_id}


def ensure_foreign_access(home: k8s.ApiClient, foreign_cluster_id: str) -> str:
    """Namespace, ServiceAccount and RoleBinding for the foreign cluster; returns the namespace.
    Server-side apply, so every cycle re-ensures them (a hand-edited binding is put back)."""
    _ensure_cluster_role(home)
    namespace = foreign_namespace(foreign_cluster_id)
    labels = _labels(foreign_cluster_id)
    meta = {"name": BINDING, "namespace": namespace, "labels": labels}
    apply_core(home, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
    apply_core(home, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "name": SERVICE_ACCOUNT}})
    apply_core(home, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}],
    })  # fmt: skip
    return namespace


def _ensure_cluster_role(home: k8s.ApiClient) -> None:
    """Installed with tidepool; created here only where it is missing and the worker may (a local
    cluster, where the worker is admin). Never updated here: the worker can read it, not write it."""
    rbac = k8s.RbacAuthorizationV1Api(home)
    if ignore_not_found(rbac.read_cluster_role, CLUSTER_ROLE) is not None:
        return
    try:
        rbac.create_cluster_role({"metadata": {"name": CLUSTER_ROLE, "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
                                  "rules": VIRTUAL_KUBELET_RULES})  # fmt: skip
    except ApiException as e:
        if e.status == 409:  # another peering created it meanwhile
            return
        if e.status == 403:
            raise ApplicationError(
                f"ClusterRole {CLUSTER_ROLE} is missing and the worker may not create it: install tidepool's "
                "manifests (kubectl apply -k deploy/overlays/...)", type="MissingClusterRole",
            ) from e  # fmt: skip
        raise


def issue_kubeconfig(home: k8s.ApiClient, *, namespace: str, lifetime_seconds: int, server: str | None) -> str:
    """A kubeconfig with a fresh token of the ServiceAccount (TokenRequest: bound, expiring)."""
    request = {"spec": {"expirationSeconds": lifetime_seconds}}
    token = k8s.CoreV1Api(home).create_namespaced_service_account_token(SERVICE_ACCOUNT, namespace, request)
    configuration = home.configuration
    cluster: dict[str, Any] = {"server": server or configuration.host}
    if configuration.ssl_ca_cert:
        cluster["certificate-authority-data"] = base64.b64encode(Path(configuration.ssl_ca_cert).read_bytes()).decode()
    elif not configuration.verify_ssl:
        cluster["insecure-skip-tls-verify"] = True
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "provider", "cluster": cluster}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token.status.token}}],
        "contexts": [{"name": "provider", "context": {"cluster": "provider", "user": SERVICE_ACCOUNT,
                                                      "namespace": namespace}}],
        "current-context": "provider",
    }  # fmt: skip
    return yaml.safe_dump(config)


def revoke_foreign_access(home: k8s.ApiClient, foreign_cluster_id: str) -> None:
    """Deleting the namespace deletes the ServiceAccount (so every token it issued stops working), the
    Role, the binding, and whatever the foreign cluster still ran here."""
    ignore_not_found(k8s.CoreV1Api(home).delete_namespace, foreign_namespace(foreign_cluster_id))
