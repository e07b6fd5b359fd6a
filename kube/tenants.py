"""The pool's Tenants, followed in its management cluster: each registered Tenant with an API client for its
control plane, built from its kubeconfig Secret and rebuilt when the Secret changes to another server or CA;
a rotated token goes into the client in use, so its next call carries it and nothing restarts. The scheduler's worker and every super
cluster's syncer hold one and are told, per tenant, when its connection changes.

The kubeconfig is the tenant's, untrusted: parsed as a peer kubeconfig (server, CA, token; anything else
refused, naming the field, never the value). A Tenant without a usable one has no client and a `problem`
saying why; whoever serves it keeps what it made until the kubeconfig is fixed or the Tenant removed. Two
Tenants whose keys collide (models/names.py: tenant_key) are served as the older one only."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from pydantic import ValidationError

from kube.clients import UnusableKubeconfigSecret, client_from_secret_data, parse_peer_kubeconfig, peer_configuration
from kube.informer import Informer, Store
from models.api import Tenant
from models.names import GROUP, TENANT_SECRETS_NAMESPACE, TENANTS, VERSION, tenant_key

log = logging.getLogger("tidepool.tenants")
Obj = dict[str, Any]
KUBECONFIG_KEY = "kubeconfig"


@dataclass(frozen=True)
class TenantConnection:
    """A registered Tenant as the pool serves it. Equal while nothing the pool acts on changed: a renewed
    token is no change (the client in use takes it); a client for another server or CA is one, and its
    holders start their informers again."""

    name: str
    key: str
    weight: int
    deleting: bool
    finalizers: tuple[str, ...]
    credentials: str | None = field(compare=False)  # the resourceVersion of the Secret its client was built from
    problem: str | None  # why it has no client
    api: k8s.ApiClient | None = field(default=None, compare=False, repr=False)

    @property
    def served(self) -> bool:
        return self.api is not None and not self.deleting


def _secret_kept(obj: Obj) -> Obj:
    """Only what the registry reads of a Secret: whose it is and its kubeconfig."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "data": {KUBECONFIG_KEY: data[KUBECONFIG_KEY]} if KUBECONFIG_KEY in data else {}}  # fmt: skip


class TenantRegistry:
    def __init__(self, management: k8s.ApiClient, *, name: str, changed: Callable[[str], None],
                 tenant_object_changed: Callable[[str, Obj | None, Obj | None], None] | None = None) -> None:  # fmt: skip
        """`changed(tenant)`: its connection changed; `tenant_object_changed(tenant, old, new)`: anything of
        its Tenant did (its status: the pool's records)."""
        self._changed = changed
        self._object_changed = tenant_object_changed
        self._lock = threading.Lock()
        self._connections: dict[str, TenantConnection] = {}
        self._tenants: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._tenant_seen)
        self._secrets: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], lambda *_: self._refresh())
        self._listed: set[str] = set()  # which of the two stores has been listed: nobody is told before both
        custom, core = k8s.CustomObjectsApi(management), k8s.CoreV1Api(management)
        self._informers = [
            Informer(f"{name}-tenants", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=TENANTS, on_sync=self._listing("tenants", self._tenants), on_event=self._tenants.event),
            Informer(f"{name}-tenant-secrets", core.list_namespaced_secret, namespace=TENANT_SECRETS_NAMESPACE,
                     on_sync=self._listing("secrets", self._secrets), on_event=self._secrets.event,
                     transform=_secret_kept),
        ]  # fmt: skip

    def _tenant_seen(self, tenant: str, old: Obj | None, new: Obj | None) -> None:
        self._refresh()
        if self._object_changed is not None:
            self._object_changed(tenant, old, new)

    def _listing(self, which: str, store: Store[str, Obj]) -> Callable[[list[Obj]], None]:
        def listed(objects: list[Obj]) -> None:
            store.sync(objects)
            self._listed.add(which)
            self._refresh()

        return listed

    def start(self) -> TenantRegistry:
        for informer in self._informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Both listed and every connection worked out: what the registry says from now on is the cluster's."""
        return all(informer.wait_synced(timeout) for informer in self._informers)

    def get(self, tenant: str) -> TenantConnection | None:
        with self._lock:
            return self._connections.get(tenant)

    def tenant_object(self, tenant: str) -> Obj | None:
        """The Tenant as last listed or watched (its status too), for a writer of its status."""
        return self._tenants.get(tenant)

    def connections(self) -> list[TenantConnection]:
        with self._lock:
            return list(self._connections.values())

    def _refresh(self) -> None:
        """Every connection worked out again from the two stores (a few per tenant: cheap), and each one that
        changed told. Called by both informers' handlers, one at a time."""
        if len(self._listed) < len(self._informers):
            return  # a Secret not listed yet is not a Secret missing
        with self._lock:
            before = self._connections
            after: dict[str, TenantConnection] = {}
            keys: dict[str, str] = {}
            for obj in sorted(self._tenants.values(), key=_age):
                connection = self._connect(obj, before.get(obj["metadata"]["name"]), keys)
                after[connection.name] = connection
            self._connections = after
        for name in sorted(before.keys() | after.keys()):
            old, new = before.get(name), after.get(name)
            if old != new or (old is not None and new is not None and old.api is not new.api):
                self._changed(name)

    def _connect(self, obj: Obj, before: TenantConnection | None, keys: dict[str, str]) -> TenantConnection:
        meta = obj["metadata"]
        name = meta["name"]
        common = {"name": name, "key": tenant_key(name), "deleting": bool(meta.get("deletionTimestamp")),
                  "finalizers": tuple(meta.get("finalizers") or ())}  # fmt: skip
        try:
            tenant = Tenant.from_kubernetes(obj)
        except ValidationError as e:  # the CRD's schema holds these rules: an object older than them
            return TenantConnection(**common, weight=1, credentials=None, problem=_first_error(e))
        taken = keys.setdefault(common["key"], name)
        if taken != name:
            return TenantConnection(**common, weight=tenant.spec.weight, credentials=None,
                                    problem=f"its key {common['key']} is Tenant {taken}'s: rename one of them")  # fmt: skip
        ref = tenant.spec.kube_config_ref
        secret = self._secrets.get(ref.name)
        version = (secret or {}).get("metadata", {}).get("resourceVersion")
        if before is not None and before.api is not None and before.credentials == version:
            return TenantConnection(**common, weight=tenant.spec.weight, credentials=version, problem=None, api=before.api)
        problem, api = _client_of(secret, ref.namespace, ref.name)
        if problem:
            log.warning("tenant %s: %s", name, problem)
        elif before is not None and before.api is not None and api is not None and _same_endpoint(before.api, api):
            # A renewed token (the pool renews each one at half its life): the client in use takes it, so
            # that its holders keep their informers and caches rather than listing the tenant again.
            before.api.configuration.api_key = dict(api.configuration.api_key)
            api = before.api
        return TenantConnection(**common, weight=tenant.spec.weight, credentials=version, problem=problem, api=api)


def _same_endpoint(old: k8s.ApiClient, new: k8s.ApiClient) -> bool:
    """The same server behind the same CA (its file is named by its content: kube/clients.py _ca_file)."""
    return bool(old.configuration.host == new.configuration.host
                and old.configuration.ssl_ca_cert == new.configuration.ssl_ca_cert)


def _client_of(secret: Obj | None, namespace: str, name: str) -> tuple[str | None, k8s.ApiClient | None]:
    if secret is None:
        return f"Secret {namespace}/{name} with its kubeconfig does not exist", None
    try:
        return None, client_from_secret_data(secret.get("data"), namespace=namespace, name=name, key=KUBECONFIG_KEY,
                                             parse=_tenant_client)  # fmt: skip
    except UnusableKubeconfigSecret as e:
        return str(e), None


def _tenant_client(text: bytes) -> k8s.ApiClient:
    configuration = peer_configuration(parse_peer_kubeconfig(text))
    # One try per call: a pass reading a tenant that does not answer moves on after one request timeout.
    configuration.retries = 0
    return k8s.ApiClient(configuration)


def _age(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("creationTimestamp") or "", meta["name"]


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
