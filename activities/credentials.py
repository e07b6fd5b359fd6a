"""Least-privilege credentials a provider hands to a foreign cluster: a namespace of its own in the home
cluster, a ServiceAccount bound to a Role that allows only what a virtual kubelet needs there, and a
short-lived token in a kubeconfig. The kubeconfig is written straight to a Secret on the foreign cluster
by activities/peering.py; it never leaves the activity (no workflow input, result or log carries it)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from activities.kube import apply_core, ignore_not_found
from models.names import LABEL_CONSUMER, LABEL_MANAGED_BY, MANAGED_BY, foreign_namespace

SERVICE_ACCOUNT = "tidepool-virtual-kubelet"
ROLE = "tidepool-virtual-kubelet"

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
    """Namespace, ServiceAccount, Role and RoleBinding for the foreign cluster; returns the namespace.
    Server-side apply, so every cycle re-ensures them (a hand-edited Role is put back)."""
    namespace = foreign_namespace(foreign_cluster_id)
    labels = _labels(foreign_cluster_id)
    meta = {"name": ROLE, "namespace": namespace, "labels": labels}
    apply_core(home, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
    apply_core(home, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "name": SERVICE_ACCOUNT}})
    apply_core(home, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
                      "rules": VIRTUAL_KUBELET_RULES})  # fmt: skip
    apply_core(home, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}],
    })  # fmt: skip
    return namespace


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
