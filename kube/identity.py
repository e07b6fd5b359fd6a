"""A provider's identity on a consumer cluster: what the provider may do there, and nothing else.

Minted on the consumer by `tidepool peer` (workers/peer.py, run with the consumer's admin credentials):
the namespace tidepool-system, a ServiceAccount for this provider, a ClusterRole and a Role (with their
bindings) naming only its own objects, and a short-lived token in a kubeconfig. Renewed by the provider
itself (activities/peering.py), with that token: it may mint its own ServiceAccount's next token, no one
else's. What it may do follows what the provider calls on a consumer: server-side apply, read, patch and
delete of its Advertisement (a watch on it by `fieldSelector=metadata.name=`, which RBAC authorizes by
name), the same on its credentials Secret, and a TokenRequest for itself.

Also the one way tidepool writes a kubeconfig around a token (activities/credentials.py uses it for the
virtual kubelets' tokens): the server and CA of the client that minted it, so that no file of the
minting machine is referred to."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from kube.objects import apply_core, ignore_not_found
from models.credentials import TokenLife, token_lifetime_seconds
from models.names import (
    ADVERTISEMENTS,
    GROUP,
    LABEL_MANAGED_BY,
    LABEL_PROVIDER,
    MANAGED_BY,
    SYSTEM_NAMESPACE,
    advertisement_name,
    credentials_secret_name,
    provider_identity_name,
)

RBAC = "rbac.authorization.k8s.io/v1"
# The lifetime `tidepool peer` asks for; the provider's renewals keep the one the token was minted with.
DEFAULT_TOKEN_LIFETIME_SECONDS = 3600


def provider_cluster_rules(provider_id: str) -> list[dict[str, Any]]:
    """Cluster-scoped: its own Advertisement. A server-side apply that creates it is authorized as a
    `patch` and then as a `create` of that name (which resourceNames can hold: the name is in the URL);
    `list` and `watch` by name are the decision watch's (fieldSelector metadata.name)."""
    advertisement = [advertisement_name(provider_id)]
    return [
        {"apiGroups": [GROUP], "resources": [ADVERTISEMENTS], "resourceNames": advertisement,
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": [GROUP], "resources": [f"{ADVERTISEMENTS}/status"], "resourceNames": advertisement,
         "verbs": ["get"]},
    ]  # fmt: skip


def provider_namespace_rules(provider_id: str) -> list[dict[str, Any]]:
    """In tidepool-system: its own credentials Secret (written by server-side apply, so `create` and
    `patch` of that name; deleted at withdrawal) and the next token of its own ServiceAccount."""
    return [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [credentials_secret_name(provider_id)],
         "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [provider_identity_name(provider_id)],
         "verbs": ["create"]},
    ]  # fmt: skip


def mint_provider_identity(
    consumer: k8s.ApiClient, *, provider_id: str, lifetime_seconds: int, server: str | None = None
) -> str:
    """Apply the provider's identity on the consumer (every call puts it back as it should be) and return
    a kubeconfig with a new token for it. `server`: the consumer's API server as the provider reaches it,
    if not the address `consumer` uses."""
    name = provider_identity_name(provider_id)
    apply_identity(consumer, name=name, labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: provider_id},
                   cluster_rules=provider_cluster_rules(provider_id), namespace_rules=provider_namespace_rules(provider_id))  # fmt: skip
    token = request_token(consumer, name, lifetime_seconds)
    return token_kubeconfig(consumer.configuration, server=server, token=token, user=name, namespace=SYSTEM_NAMESPACE)


def revoke_provider_identity(consumer: k8s.ApiClient, *, provider_id: str) -> None:
    """The consumer's unpeer: the provider's identity goes, bindings first, so that it can write nothing here
    any more (no Advertisement comes back) and every token minted for it stops working with its
    ServiceAccount. A later `tidepool peer` mints it again."""
    revoke_identity(consumer, provider_identity_name(provider_id))


def apply_identity(api: k8s.ApiClient, *, name: str, labels: dict[str, str], cluster_rules: list[dict[str, Any]],
                   namespace_rules: list[dict[str, Any]], other_roles: Mapping[str, list[dict[str, Any]]] | None = None,
                   ) -> None:  # fmt: skip
    """A ServiceAccount `name` in tidepool-system (made if missing), with a ClusterRole and a Role of these rules
    bound to it, each named `name`: every call puts them back as they should be (server-side apply).
    `other_roles`: a Role of its rules in each of these namespaces (which every cluster has: kube-system...)."""
    meta = {"name": name, "labels": labels}
    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": SYSTEM_NAMESPACE}]
    apply_core(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}})
    apply_core(api, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": SYSTEM_NAMESPACE}})
    roles = [("ClusterRole", None, cluster_rules), ("Role", SYSTEM_NAMESPACE, namespace_rules),
             *(("Role", namespace, rules) for namespace, rules in (other_roles or {}).items())]  # fmt: skip
    for kind, namespace, rules in roles:
        where = {"namespace": namespace} if namespace else {}
        apply_core(api, {"apiVersion": RBAC, "kind": kind, "metadata": {**meta, **where}, "rules": rules})
        apply_core(api, {"apiVersion": RBAC, "kind": f"{kind}Binding", "metadata": {**meta, **where}, "subjects": subjects,
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}})  # fmt: skip


def revoke_identity(api: k8s.ApiClient, name: str, *, other_namespaces: Iterable[str] = ()) -> None:
    """An identity `apply_identity` made goes, bindings first, so that no token minted for it works a moment
    longer than its bindings. `other_namespaces`: those of its `other_roles`."""
    rbac, core = k8s.RbacAuthorizationV1Api(api), k8s.CoreV1Api(api)
    namespaces = [SYSTEM_NAMESPACE, *other_namespaces]
    ignore_not_found(rbac.delete_cluster_role_binding, name)
    for namespace in namespaces:
        ignore_not_found(rbac.delete_namespaced_role_binding, name, namespace)
    ignore_not_found(rbac.delete_cluster_role, name)
    for namespace in namespaces:
        ignore_not_found(rbac.delete_namespaced_role, name, namespace)
    ignore_not_found(core.delete_namespaced_service_account, name, SYSTEM_NAMESPACE)


def renew_provider_token(identity: k8s.ApiClient, *, provider_id: str, lifetime_seconds: int) -> str:
    """A kubeconfig with the next token, asked for with the current one (`identity`, which must still work)."""
    name = provider_identity_name(provider_id)
    token = request_token(identity, name, lifetime_seconds)
    return token_kubeconfig(identity.configuration, server=None, token=token, user=name, namespace=SYSTEM_NAMESPACE)


def bearer_token_life(api: k8s.ApiClient) -> TokenLife | None:
    """When the token a client authenticates with was issued and expires; None for a client that holds no
    ServiceAccount token (an administrator's certificate, say: not tidepool's to renew)."""
    header = api.configuration.api_key.get("BearerToken") or api.configuration.api_key.get("authorization")
    if not header:
        return None
    return TokenLife.of_jwt(str(header).removeprefix("Bearer ").strip())


def request_token(api: k8s.ApiClient, service_account: str, lifetime_seconds: int) -> str:
    request = k8s.AuthenticationV1TokenRequest.model_validate(
        {"spec": {"expirationSeconds": token_lifetime_seconds(lifetime_seconds)}})  # fmt: skip
    issued = k8s.CoreV1Api(api).create_namespaced_service_account_token(service_account, SYSTEM_NAMESPACE, request).status
    if issued is None or not issued.token:
        raise ApplicationError(f"TokenRequest for {SYSTEM_NAMESPACE}/{service_account} answered without a token",
                               type="NoToken")  # fmt: skip
    return str(issued.token)


def token_kubeconfig(
    configuration: k8s.Configuration, *, server: str | None, token: str, user: str, namespace: str
) -> str:
    """A self-contained kubeconfig for `token`: the server and CA of `configuration` (CA embedded), in the
    only shape the other side accepts (models/kubeconfig.py): a client that verifies no CA has none to
    give, and minting fails rather than write `insecure-skip-tls-verify`."""
    cluster: dict[str, Any] = {"server": server or configuration.host,
                               "certificate-authority-data": base64.b64encode(_ca_pem(configuration)).decode()}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "cluster", "context": {"cluster": "cluster", "user": user, "namespace": namespace}}],
        "current-context": "cluster",
    }
    return str(yaml.safe_dump(config))


def _ca_pem(configuration: k8s.Configuration) -> bytes:
    data = getattr(configuration, "ca_cert_data", None)
    if configuration.ssl_ca_cert and configuration.verify_ssl:
        return Path(configuration.ssl_ca_cert).read_bytes()
    if data and configuration.verify_ssl:
        return data.encode() if isinstance(data, str) else bytes(data)
    raise ApplicationError(
        f"the client for {configuration.host} verifies no CA (none given, or TLS verification off): a kubeconfig "
        "for the other cluster must embed the CA of this one; use a kubeconfig with certificate-authority(-data)",
        type="NoCertificateAuthority", non_retryable=True)  # fmt: skip
