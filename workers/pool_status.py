"""The pool's part of `tidepool status` (workers/cli.py): the Tenants of any given cluster that has them (the
pool's management cluster), and each tenant's placed namespaces and pods, read from its control plane.

A tenant's control plane is the given cluster of its name (--cluster NAME=KUBECONFIG), else the given cluster
whose API server its kubeconfig names (a management cluster that is a tenant too), else reached through its
kubeconfig Secret, read with the caller's credentials and parsed as the pool reads it (a peer kubeconfig:
server, CA, token; kube/tenants.py). A tenant that cannot be read is a row saying why, never a failure of
the command."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kube.clients import parse_peer_kubeconfig, peer_configuration
from kube.tenants import KUBECONFIG_KEY
from models.enforcement import status_message
from models.explain import as_mapping, resources_text
from models.kubeconfig import InvalidKubeconfig, PeerCredentials

Obj = Mapping[str, Any]
# A tenant's control plane that does not answer costs the command this long per call (seconds), not a hang.
TENANT_REQUEST_TIMEOUT = 10

TENANT_HEADER = ["tenant", "key", "weight", "ready", "held per super cluster"]


def tenant_rows(tenants: Iterable[Obj]) -> list[list[str]]:
    """The Tenants table: each Tenant's key, weight, Ready condition (status and reason, as the pool's last
    pass wrote it) and what its namespaces' slices hold in each super cluster."""
    rows = []
    for tenant in sorted(tenants, key=lambda t: str(as_mapping(t.get("metadata")).get("name"))):
        meta, spec, status = (as_mapping(tenant.get(k)) for k in ("metadata", "spec", "status"))
        ready = next((as_mapping(c) for c in status.get("conditions") or [] if as_mapping(c).get("type") == "Ready"), None)
        held = as_mapping(status.get("held"))
        rows.append([
            str(meta.get("name")) + (" (being removed)" if meta.get("deletionTimestamp") else ""),
            str(status.get("key") or "—"),
            str(spec.get("weight") or 1),
            f"{ready.get('status')} ({ready.get('reason')})" if ready else "not yet passed over",
            "; ".join(f"{cluster}: {resources_text(as_mapping(amount))}" for cluster, amount in sorted(held.items())) or "—",
        ])  # fmt: skip
    return rows


@dataclass
class TenantPlanes:
    """Where each Tenant's control plane is read from."""

    given: dict[str, str] = field(default_factory=dict)  # given cluster -> the Tenant it is
    reached: dict[str, k8s.ApiClient] = field(default_factory=dict)  # tenant -> a client built from its Secret
    problems: dict[str, str] = field(default_factory=dict)  # tenant -> why it cannot be read


def tenant_planes(tenants: Sequence[tuple[k8s.ApiClient, Obj]], clusters: Mapping[str, k8s.ApiClient]) -> TenantPlanes:
    """Each Tenant (with the management cluster it was listed in) matched to a given cluster, else reached
    through its kubeconfig Secret."""
    planes = TenantPlanes()
    names = [str(as_mapping(tenant.get("metadata")).get("name")) for _, tenant in tenants]
    planes.given = {name: name for name in names if name in clusters}  # by name first: a server match never takes one
    servers = {_server(api.configuration.host): name for name, api in clusters.items()}
    for (management, tenant), name in zip(tenants, names, strict=True):
        if name in clusters:
            continue
        ref = as_mapping(as_mapping(tenant.get("spec")).get("kubeConfigRef"))
        try:
            credentials = _credentials(management, str(ref.get("namespace")), str(ref.get("name")))
        except LookupError as e:
            planes.problems[name] = str(e)
            continue
        same = servers.get(_server(credentials.server))
        if same is not None and same not in planes.given:
            planes.given[same] = name
        else:
            configuration = peer_configuration(credentials)
            configuration.retries = 0  # one try within TENANT_REQUEST_TIMEOUT: a status, not a retry loop
            planes.reached[name] = k8s.ApiClient(configuration)
    return planes


def _server(url: str) -> str:
    return url.rstrip("/")


def _credentials(management: k8s.ApiClient, namespace: str, name: str) -> PeerCredentials:
    """The tenant's kubeconfig from its Secret, parsed as the pool parses it; LookupError saying why not
    (naming the Secret and the field, never a value)."""
    where = f"Secret {namespace}/{name}"
    try:
        secret = k8s.CoreV1Api(management).read_namespaced_secret(name, namespace, _request_timeout=TENANT_REQUEST_TIMEOUT)
    except ApiException as e:
        raise LookupError(f"{where} not read: {status_message(e.body) or e.reason}") from None
    except (HTTPError, OSError) as e:
        raise LookupError(f"{where} not read: {type(e).__name__}") from None
    data = (secret.data or {}).get(KUBECONFIG_KEY)
    if not data:
        raise LookupError(f"{where} has no key {KUBECONFIG_KEY!r}")
    try:
        return parse_peer_kubeconfig(base64.b64decode(data))
    except InvalidKubeconfig as e:
        raise LookupError(f"{where} key {KUBECONFIG_KEY!r} refused: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever the parser says may quote the Secret: say only where
        raise LookupError(f"{where} key {KUBECONFIG_KEY!r} is no usable kubeconfig ({type(e).__name__})") from None


def read_tenant(api: k8s.ApiClient) -> tuple[list[k8s.V1Namespace], list[k8s.V1Pod]]:
    """A tenant's namespaces and pods, through its own kubeconfig (what the pool's identity may list)."""
    core = k8s.CoreV1Api(api)
    namespaces = core.list_namespace(_request_timeout=TENANT_REQUEST_TIMEOUT).items
    return namespaces, core.list_pod_for_all_namespaces(_request_timeout=TENANT_REQUEST_TIMEOUT).items


def unreadable(e: Exception) -> str:
    """Why a tenant's control plane could not be read, without anything it answered beyond its status."""
    if isinstance(e, ApiException):
        return f"its control plane refused: {e.status} {status_message(e.body) or e.reason}"
    return f"its control plane did not answer ({type(e).__name__})"
