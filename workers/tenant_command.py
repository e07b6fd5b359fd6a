"""`tidepool pool add-tenant` and `tidepool pool remove-tenant` (workers/cli.py parses them): a tenant control
plane registered with the pool's management cluster, and taken out of it.

Adding mints the pool's identity in the tenant's control plane with its administrator's kubeconfig and
registers it (kube/tenant_identity.py add_tenant): a second run puts the identity back as it should be,
renews its token and updates the weight. Removing deletes the Tenant; every super cluster's syncer holds it
with its finalizer until nothing of the tenant is left there, so the Tenant is gone when the pool holds
nothing of it. Only then do its kubeconfig Secret and, if asked, its identity go: the syncers read the
tenant with them while they drain."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from kube.objects import delete_cluster_object, ignore_not_found, list_cluster_objects, raw_json, read_cluster_object
from kube.tenant_identity import TENANT_IDENTITY, add_tenant, revoke_tenant_identity, tenant_secret_name
from models.api.common import DNS_LABEL
from models.api.tenant import MAX_WEIGHT, NAME_RULE
from models.enforcement import status_message
from models.names import GROUP, TENANT_FINALIZER_PREFIX, TENANT_SECRETS_NAMESPACE, TENANTS, VERSION, tenant_key

Say = Callable[[str], None]
# A human waits: a watch wakes --wait at once; past this a watch is opened again (and the deadline looked at).
WATCH_SECONDS = 30


class TenantCommandError(Exception):
    """What the command could not do, said to the user as it is (exit 1)."""


def tenant_arguments_problem(name: str, weight: int | None = None) -> str | None:
    """What is wrong with NAME or --weight, naming the argument and the CRD's rule for it."""
    if len(name) > 63 or not re.fullmatch(DNS_LABEL, name):
        return f"NAME {name!r}: {NAME_RULE}"
    if weight is not None and not 1 <= weight <= MAX_WEIGHT:
        return f"--weight {weight}: spec.weight is a whole number from 1 to {MAX_WEIGHT}"
    return None


def _refused(what: str, error: ApiException) -> TenantCommandError:
    return TenantCommandError(f"{what}: {status_message(error.body) or error.reason}")


def add_tenant_command(management: k8s.ApiClient, tenant_admin: k8s.ApiClient, name: str, *, weight: int,
                       server: str | None, say: Say) -> None:  # fmt: skip
    current = read_cluster_object(management, TENANTS, name)
    if current is not None and current["metadata"].get("deletionTimestamp"):
        raise TenantCommandError(f"Tenant {name} is being removed: add it again once it is gone "
                                 f"(`tidepool pool remove-tenant {name} --wait`)")  # fmt: skip
    key = tenant_key(name)
    # The registry serves only the older of two Tenants whose keys meet (1 in 34 billion): refused here instead.
    taken = [t["metadata"]["name"] for t in list_cluster_objects(management, TENANTS)
             if t["metadata"]["name"] != name and tenant_key(t["metadata"]["name"]) == key]  # fmt: skip
    if taken:
        raise TenantCommandError(f"Tenant {name}'s key {key} is Tenant {taken[0]}'s: choose another name")
    try:
        add_tenant(management, tenant_admin, name, weight=weight, server=server)
    except ApiException as e:
        if e.status in (403, 422):  # RBAC of either kubeconfig, or the CRD's rules: their own words
            raise _refused(f"Tenant {name}", e) from None
        raise
    done = "updated, token renewed" if current is not None else "registered"
    say(f"Tenant {name} {done}: key {key}, weight {weight}; identity {TENANT_IDENTITY} in its control plane, "
        f"kubeconfig in Secret {TENANT_SECRETS_NAMESPACE}/{tenant_secret_name(name)}")


def holders(tenant: dict[str, Any]) -> list[str]:
    """The super clusters whose syncers still hold a Tenant (their finalizers), and any other finalizer as is."""
    return [f.removeprefix(TENANT_FINALIZER_PREFIX) for f in tenant["metadata"].get("finalizers") or []]


def remove_tenant_command(management: k8s.ApiClient, name: str, *, wait: bool, timeout: float,
                          tenant_admin: k8s.ApiClient | None, say: Say) -> None:  # fmt: skip
    """Raises TenantCommandError when --wait times out, naming the clusters that still hold the Tenant."""
    current = read_cluster_object(management, TENANTS, name)
    secret = ((current or {}).get("spec") or {}).get("kubeConfigRef", {}).get("name") or tenant_secret_name(name)
    if current is None:
        say(f"Tenant {name} is not registered")
    else:
        try:
            delete_cluster_object(management, TENANTS, name)
        except ApiException as e:
            if e.status == 403:
                raise _refused(f"Tenant {name}", e) from None
            raise
        say(f"Tenant {name} deleted: each super cluster's syncer deletes what it made for it, then lets it go")
        left = _wait_gone(management, name, timeout=timeout if wait else 0, say=say)
        if left is not None and wait:
            raise TenantCommandError(f"Tenant {name} still held after {timeout:.0f} s by: {', '.join(left) or '-'}; "
                                     "its Secret and identity are kept until it is gone")  # fmt: skip
        if left is not None:
            say(f"its Secret{' and identity are' if tenant_admin else ' is'} kept until it is gone "
                f"(`tidepool pool remove-tenant {name} --wait`)")
            return
    ignore_not_found(k8s.CoreV1Api(management).delete_namespaced_secret, secret, TENANT_SECRETS_NAMESPACE)
    revoked = ""
    if tenant_admin is not None:
        revoke_tenant_identity(tenant_admin)
        revoked = f", identity {TENANT_IDENTITY} revoked in its control plane"
    say(f"Tenant {name} removed: nothing of it is left in the pool; Secret {TENANT_SECRETS_NAMESPACE}/{secret} "
        f"deleted{revoked}")


def _wait_gone(management: k8s.ApiClient, name: str, *, timeout: float, say: Say) -> list[str] | None:
    """Follows the Tenant with a watch until it is gone (None) or `timeout` passes (who holds it then),
    saying who holds it whenever that changes."""
    custom = k8s.CustomObjectsApi(management)
    deadline, said = time.monotonic() + timeout, None
    selector = f"metadata.name={name}"
    while True:
        listed = raw_json(custom.list_cluster_custom_object(GROUP, VERSION, TENANTS, field_selector=selector,
                                                            _preload_content=False))  # fmt: skip
        if not listed["items"]:
            return None
        held = holders(listed["items"][0])
        if held != said:
            say(f"held by: {', '.join(held) or '-'}")
            said = held
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return held
        seconds = max(1, min(WATCH_SECONDS, int(remaining + 0.999)))
        try:
            for event in watch.Watch().stream(custom.list_cluster_custom_object, GROUP, VERSION, TENANTS,
                                              field_selector=selector, timeout_seconds=seconds,
                                              resource_version=listed["metadata"]["resourceVersion"],
                                              _request_timeout=seconds + 10):  # fmt: skip
                if event["type"] == "DELETED":
                    return None
                if event["type"] not in ("ADDED", "MODIFIED"):
                    break  # an ERROR (the client raises on 410 itself): listed again
                held = holders(event["raw_object"])
                if held != said:
                    say(f"held by: {', '.join(held) or '-'}")
                    said = held
        except ApiException as e:
            if e.status != 410:  # expired: listed again
                raise
