"""The pool's identity in a tenant's control plane, and the tenant's registration in the pool's management
cluster: what `tidepool pool add-tenant` does, run with the tenant's admin credentials and the pool's.

In the tenant's control plane: tidepool-system, the ServiceAccount tidepool-pool, a ClusterRole with what the
pool's scheduler (activities/pool.py) and syncers (workers/syncer.py) call there and nothing more
(TENANT_RULES; deploy/pool/tenant/rbac.yaml is the same, for operators who apply it themselves), a binding,
a Role to mint its own next token, and a token in a kubeconfig. In the management cluster: that kubeconfig
as the Secret tidepool-tenants/tenant-<name>, and the Tenant naming it."""

from __future__ import annotations

import base64
from typing import Any

from kubernetes import client as k8s

from kube.identity import apply_identity, request_token, revoke_identity, token_kubeconfig
from kube.objects import apply_cluster_object, apply_core
from models.names import (
    API_VERSION,
    LABEL_MANAGED_BY,
    LABEL_TENANT,
    MANAGED_BY,
    SYSTEM_NAMESPACE,
    TENANT_SECRETS_NAMESPACE,
    TENANTS,
)

TENANT_IDENTITY = "tidepool-pool"
# A tenant's token lives a day; the pool worker renews it at half-life (workers/pool.py) with the token itself.
TENANT_TOKEN_LIFETIME_SECONDS = 24 * 3600

# What the pool does in a tenant's control plane. The scheduler: places namespaces (annotations) from their
# quotas, pods into their namespace's clusters (an annotation, a status condition), Events on both; a move
# waits on Services and claims. The syncers: read every synced kind (models/pool/sync.py SYNCED_KINDS),
# push status up (pods, LoadBalancer addresses, PVC binding through mirrored PersistentVolumes), reflect
# Events, delete a tenant pod whose copy was evicted. Tenant pods look like pods (workers/tenant_nodes.py): the
# syncers keep virtual nodes (their status), bind pods to them, and ask whether a kubelet API's caller may
# reach them (nodes/proxy).
TENANT_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/status", "services/status", "persistentvolumeclaims/status"],
     "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets", "services", "serviceaccounts", "resourcequotas",
                                      "limitranges", "persistentvolumeclaims", "endpoints"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "networkpolicies"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "get", "list", "watch", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]  # fmt: skip
# The virtual nodes' heartbeats: a Role in each of these namespaces. (The client CA the kubelet APIs trust,
# kube-system/extension-apiserver-authentication, is read under the configmaps rule above, which the copies need.)
TENANT_OTHER_ROLES: dict[str, list[dict[str, Any]]] = {
    "kube-node-lease": [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "patch", "delete"]},
    ],
}  # fmt: skip
# In tidepool-system: the next token of its own ServiceAccount, and nobody else's.
TENANT_NAMESPACE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [TENANT_IDENTITY], "verbs": ["create"]},
]


def tenant_secret_name(tenant: str) -> str:
    return f"tenant-{tenant}"


def mint_tenant_identity(tenant_admin: k8s.ApiClient, *, lifetime_seconds: int = TENANT_TOKEN_LIFETIME_SECONDS,
                         server: str | None = None) -> str:  # fmt: skip
    """Apply the pool's identity in the tenant's control plane (every call puts it back as it should be) and
    return a kubeconfig with a new token for it. `server`: the tenant's API server as the pool reaches it, if
    not the address `tenant_admin` uses."""
    apply_identity(tenant_admin, name=TENANT_IDENTITY, labels={LABEL_MANAGED_BY: MANAGED_BY},
                   cluster_rules=TENANT_RULES, namespace_rules=TENANT_NAMESPACE_RULES, other_roles=TENANT_OTHER_ROLES)  # fmt: skip
    token = request_token(tenant_admin, TENANT_IDENTITY, lifetime_seconds)
    return token_kubeconfig(tenant_admin.configuration, server=server, token=token, user=TENANT_IDENTITY,
                            namespace=SYSTEM_NAMESPACE)  # fmt: skip


def renew_tenant_token(identity: k8s.ApiClient, *, lifetime_seconds: int = TENANT_TOKEN_LIFETIME_SECONDS) -> str:
    """A kubeconfig with the next token, asked for with the current one (`identity`, which must still work)."""
    token = request_token(identity, TENANT_IDENTITY, lifetime_seconds)
    return token_kubeconfig(identity.configuration, server=None, token=token, user=TENANT_IDENTITY,
                            namespace=SYSTEM_NAMESPACE)  # fmt: skip


def revoke_tenant_identity(tenant_admin: k8s.ApiClient) -> None:
    revoke_identity(tenant_admin, TENANT_IDENTITY, other_namespaces=TENANT_OTHER_ROLES)


def write_tenant_kubeconfig(management: k8s.ApiClient, tenant: str, kubeconfig: str, *, secret: str | None = None) -> None:
    """The kubeconfig Secret a Tenant names (`secret`, default tenant-<name>), in tidepool-tenants (made if
    missing); the registries reload it."""
    apply_core(management, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT_SECRETS_NAMESPACE}})
    apply_core(management, {"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": secret or tenant_secret_name(tenant), "namespace": TENANT_SECRETS_NAMESPACE,
                                         "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: tenant}},
                            "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}})  # fmt: skip


def register_tenant(management: k8s.ApiClient, tenant: str, *, kubeconfig: str, weight: int = 1) -> None:
    """The tenant's kubeconfig Secret, then its Tenant (applied: a second call updates the weight)."""
    write_tenant_kubeconfig(management, tenant, kubeconfig)
    apply_cluster_object(management, TENANTS, {
        "apiVersion": API_VERSION, "kind": "Tenant", "metadata": {"name": tenant},
        "spec": {"kubeConfigRef": {"name": tenant_secret_name(tenant), "namespace": TENANT_SECRETS_NAMESPACE},
                 "weight": weight}})  # fmt: skip


def add_tenant(management: k8s.ApiClient, tenant_admin: k8s.ApiClient, tenant: str, *, weight: int = 1,
               server: str | None = None) -> None:  # fmt: skip
    """`tidepool pool add-tenant`: the pool's identity minted in the tenant's control plane, then registered."""
    register_tenant(management, tenant, kubeconfig=mint_tenant_identity(tenant_admin, server=server), weight=weight)
