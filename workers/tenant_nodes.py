"""Tenant pods look like pods: a syncer's (workers/syncer.py) virtual nodes and kubelet APIs in its tenants'
control planes, as virtualcluster's syncer and vn-agent give them. One TenantNodes per syncer:

- for each tenant it follows, a Node per physical node of this super cluster that runs the tenant's pods
  (models/pool/tenant_nodes.py tenant_node: the node's capacity, Ready, a NoSchedule taint), made when a
  copy is first scheduled there, and deleted once nothing of the tenant uses it (after a grace) or when the
  tenant is removed;
- binds a tenant pod to the virtual node of the node its copy was scheduled on (tenant control planes run no
  kube-scheduler: the pool is their scheduler);
- heartbeats every one of them in one loop (kube/lease.py renew_node_lease, every NODE_LEASE_RENEW_SECONDS;
  status only when it changes or every NODE_STATUS_REPORT_SECONDS, as a kubelet), so that the tenant's
  node-lifecycle controller keeps them Ready;
- serves the kubelet APIs of all its tenants (workers/kubelet_api.py) on one port (`kubelet_port`, which
  every node says): logs, exec, attach and port-forward reach the pod's copy here, for the tenant whose client
  CA issued the caller's certificate, authorized by that tenant's API server as a kubelet's are."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clock import utcnow
from kube.errors import already_exists
from kube.informer import Informer, Store
from kube.lease import NODE_LEASE_NAMESPACE, NODE_LEASE_RENEW_SECONDS, renew_node_lease
from kube.objects import drained, ignore_not_found
from kube.recent import SharedRecent
from models.names import LABEL_SUPER_CLUSTER, POD_CLUSTER_ANNOTATION, TENANT_UID_ANNOTATION, super_cluster_namespace
from models.names import tenant_node_name as node_name_of
from models.pool.tenant_nodes import nodes_in_use, tenant_node, to_delete
from models.times import format_rfc3339
from models.virtual_kubelet import node_status_report_due
from workers.kubelet_api import CopyRef, Elsewhere, KubeletApi, KubeletServer

log = logging.getLogger("tidepool.syncer.nodes")
Obj = dict[str, Any]
# As a kubelet: a node's status is written when it changes, and at least this often (nodeStatusReportFrequency).
NODE_STATUS_REPORT_SECONDS = 300
# A removed tenant's control plane gets this long to list its virtual nodes.
REMOVE_TIMEOUT_SECONDS = 10
# Pods bound whose binding the syncer's store may not show yet, per tenant (a bound pod is never bound again):
# the newest kept, far more than a burst's pods in flight between a binding and its watch event.
MAX_REMEMBERED_BINDINGS = 10_000


def _node_kept(obj: Obj) -> Obj:
    """What is read of a node: its name, labels and the status a virtual node shows; of a super cluster's
    node, its networks too (which a tenant's own endpoints may not name: models/pool/sync.py EndpointGuard)."""
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    return {"metadata": {"name": obj["metadata"]["name"], "labels": obj["metadata"].get("labels") or {}},
            "spec": {k: spec[k] for k in ("podCIDR", "podCIDRs") if k in spec},
            "status": {k: status[k] for k in ("capacity", "allocatable", "nodeInfo", "addresses") if k in status}}  # fmt: skip


def node_networks(node: Obj) -> list[str]:
    """A node's pod CIDRs and addresses (its name among them, which parses as no network)."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    return [*(spec.get("podCIDRs") or []), *([spec["podCIDR"]] if spec.get("podCIDR") else []),
            *(str(a.get("address")) for a in status.get("addresses") or [] if isinstance(a, dict))]  # fmt: skip


def _service_cidrs_kept(obj: Obj) -> Obj:
    """Of a ServiceCIDR (networking.k8s.io/v1), its CIDRs: where the super cluster's ClusterIPs are."""
    return {"metadata": {"name": obj["metadata"]["name"]}, "spec": {"cidrs": list((obj.get("spec") or {}).get("cidrs") or [])}}


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


class NotReadyToBind(Exception):
    """A copy scheduled on a node that cannot be shown yet (its kubelet API not serving, the node not listed):
    the pod is tried again after a backoff."""


class _Tenant:
    """One tenant as its virtual nodes see it: its client, its pods (the syncer's Store), its virtual nodes of
    this super cluster (a Store fed by an informer), its kubelet API, and what was last reported of each node."""

    def __init__(self, owner: TenantNodes, name: str, api: k8s.ApiClient, pods: Store[tuple[str, str], Obj]) -> None:
        self.name, self.api, self.pods = name, api, pods
        self.core = k8s.CoreV1Api(api)
        self.nodes: Store[str, Obj] = Store(_name, lambda *_: None)
        self.reported: dict[str, tuple[Obj, float]] = {}  # node -> (status, monotonic time of the report)
        self.since: dict[str, str] = {}  # node -> when it became Ready (this process's first report)
        self.unused_since: dict[str, float] = {}
        # Pod uids bound here, until the store shows them bound: the copy's next change (its status, Running)
        # comes back before the binding's watch event, and a second binding is a write refused with 409.
        self.bound: SharedRecent[str, None] = SharedRecent(MAX_REMEMBERED_BINDINGS)
        self.lock = threading.Lock()
        self._informer = Informer(f"syncer-{owner.cluster}-{name}-nodes", self.core.list_node, on_sync=self.nodes.sync,
                                  on_event=self.nodes.event, transform=_node_kept,
                                  label_selector=f"{LABEL_SUPER_CLUSTER}={owner.cluster}")  # fmt: skip
        self._server = owner.kubelet_server
        self.kubelet_api = KubeletApi(host=owner.address, port=0, provider=owner.super_api, locate=self._locate(owner),
                                      consumer=api, node_name=f"tenant {name} in {owner.cluster}",
                                      serves=lambda node: self.nodes.get(node) is not None,
                                      origin_uid=TENANT_UID_ANNOTATION)  # fmt: skip
        self.serving, self._stopped = False, False
        self._serving_lock = threading.Lock()  # serve (heartbeat, binds) against stop (unfollow)

    def start(self) -> _Tenant:
        self._informer.start()
        return self

    def stop(self) -> None:
        """Its kubelet API served no more (its open sessions cut), and never again."""
        self._informer.stop()
        with self._serving_lock:
            self._stopped = True
            if self.serving:
                self._server.remove(self.name, self.kubelet_api)

    def serve(self) -> bool:
        """The tenant's kubelet API served, if it can be (it reads the tenant's client CA) and the tenant is
        still followed."""
        with self._serving_lock:
            if not self.serving and not self._stopped:
                try:
                    self._server.add(self.name, self.kubelet_api)
                    self.serving = True
                except Exception as e:  # noqa: BLE001 - tried again at the next heartbeat; nodes wait for it
                    log.warning("tenant %s: kubelet API not started: %s", self.name, e)
            return self.serving

    def listed(self) -> bool:
        return self._informer.wait_synced(0)

    def _locate(self, owner: TenantNodes) -> Callable[[str, str], list[CopyRef]]:
        def locate(namespace: str, pod: str) -> list[CopyRef]:
            found = self.pods.get((namespace, pod))
            placed = ((found or {}).get("metadata", {}).get("annotations") or {}).get(POD_CLUSTER_ANNOTATION)
            if placed and placed != owner.cluster:
                raise Elsewhere(f"pod {namespace}/{pod} runs in super cluster {placed} now, not in {owner.cluster} "
                                "(its node, which cannot change, is still this one's)")  # fmt: skip
            return [CopyRef(super_cluster_namespace(self.name, namespace), pod)]

        return locate


def _serves_service_cidrs(api: k8s.ApiClient) -> bool:
    """Whether the API server serves networking.k8s.io/v1 servicecidrs (discovery, open to every identity).
    Unknown (no answer) counts as yes: the informer then fails its list, visibly, and the guard waits."""
    try:
        resources = k8s.NetworkingV1Api(api).get_api_resources().resources
    except (ApiException, urllib3.exceptions.HTTPError) as e:
        log.warning("discovery of networking.k8s.io/v1 failed (%s): ServiceCIDRs assumed served", e)
        return True
    return any(r.name == "servicecidrs" for r in resources or [])


class TenantNodes:
    """`copies_of(tenant)`: the tenant's pods' copies in this super cluster (the syncer's Store)."""

    def __init__(self, *, super_cluster: k8s.ApiClient, cluster: str, address: str, kubelet_port: int,
                 copies_of: Callable[[str], list[Obj]]) -> None:  # fmt: skip
        """`address`, `kubelet_port`: where tenants' API servers reach the kubelet APIs (0: a free port)."""
        self.cluster, self.address, self.super_api, self._copies_of = cluster, address, super_cluster, copies_of
        self.kubelet_server = KubeletServer(host=address, port=kubelet_port, name=f"syncer-{cluster}")
        self._physical: Store[str, Obj] = Store(_name, lambda *_: None)
        self._informer = Informer(f"syncer-{cluster}-nodes", k8s.CoreV1Api(super_cluster).list_node,
                                  on_sync=self._physical.sync, on_event=self._physical.event, transform=_node_kept)  # fmt: skip
        # The Service CIDRs (Kubernetes 1.33 and later serve them): its ClusterIPs, the `kubernetes` Service's
        # among them, are the super cluster's network too. None: not known yet whether it serves them.
        self._serves_service_cidrs: bool | None = None
        self._service_cidrs: Store[str, Obj] = Store(_name, lambda *_: None)
        self._service_cidr_informer = Informer(
            f"syncer-{cluster}-service-cidrs", k8s.NetworkingV1Api(super_cluster).list_service_cidr,
            on_sync=self._service_cidrs.sync, on_event=self._service_cidrs.event, transform=_service_cidrs_kept)  # fmt: skip
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"syncer-{cluster}-nodes", daemon=True)

    def networks(self) -> list[str]:
        """The super cluster's networks, as last listed: its nodes' pod CIDRs and addresses, its Service CIDRs."""
        return [*(network for node in self._physical.values() for network in node_networks(node)),
                *(cidr for served in self._service_cidrs.values() for cidr in served["spec"]["cidrs"])]  # fmt: skip

    def networks_listed(self, timeout: float) -> bool:
        """Whether `networks` is whole: the nodes listed, and the Service CIDRs, where the super cluster serves
        them. Until then the endpoint guard would let through what it does not know of (the syncer waits)."""
        if not self._informer.wait_synced(timeout):
            return False
        return self._serves_service_cidrs is False or self._service_cidr_informer.wait_synced(0)

    def start(self) -> TenantNodes:
        self.kubelet_server.start()  # first: a port already taken stops the syncer at once
        self._informer.start()
        self._serves_service_cidrs = _serves_service_cidrs(self.super_api)
        if self._serves_service_cidrs:
            self._service_cidr_informer.start()
        else:
            log.warning("super cluster %s serves no ServiceCIDRs (Kubernetes before 1.33): the endpoint guard "
                        "cannot refuse its Service IPs", self.cluster)  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop()
        self._service_cidr_informer.stop()
        with self._lock:
            tenants, self._tenants = list(self._tenants.values()), {}
        for tenant in tenants:
            tenant.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.kubelet_server.stop()

    def follow(self, tenant: str, api: k8s.ApiClient, pods: Store[tuple[str, str], Obj]) -> None:
        """A tenant side started (or replaced: a new client): its nodes are kept from now on."""
        self.unfollow(tenant)
        with self._lock:
            self._tenants[tenant] = _Tenant(self, tenant, api, pods).start()

    def unfollow(self, tenant: str) -> None:
        """A tenant side stopped: its nodes are left as they are (their Leases lapse) until it is followed again
        or removed."""
        with self._lock:
            found = self._tenants.pop(tenant, None)
        if found is not None:
            found.stop()

    def _tenant(self, tenant: str) -> _Tenant | None:
        with self._lock:
            return self._tenants.get(tenant)

    # --- binding ---

    def bind(self, tenant: str, pod: Obj, copy: Obj) -> bool:
        """A tenant pod with no node whose copy here is scheduled: bound to that node's virtual node, made first.
        Whether a watch event will bring the pod back: bound now, or refused as gone or bound already."""
        physical, uid = (copy.get("spec") or {}).get("nodeName"), pod["metadata"].get("uid") or ""
        followed = self._tenant(tenant)
        if followed is None:
            return False
        if (pod.get("spec") or {}).get("nodeName"):
            followed.bound.pop(uid)  # shown bound: the store says so from here on
            return False
        if not physical or pod["metadata"].get("deletionTimestamp") or uid in followed.bound:
            return False
        node = self._ensure(followed, physical)
        if node is None:
            raise NotReadyToBind(f"node {physical} of {self.cluster} cannot be shown to tenant {tenant} yet")
        meta = pod["metadata"]
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta["uid"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        try:
            # Not deserialized: the client's V1Binding model refuses the Status the API server answers with.
            drained(followed.core.create_namespaced_pod_binding(meta["name"], meta["namespace"],
                                                                k8s.V1Binding.model_validate(binding), _preload_content=False))  # fmt: skip
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or bound meanwhile (by us, through another key): nothing to do
                raise
        followed.bound.put(uid, None)
        followed.unused_since.pop(node, None)
        return True

    def bound_not_shown(self, tenant: str, pod: Obj) -> bool:
        """Whether this syncer bound the pod and the store does not show it bound yet."""
        followed = self._tenant(tenant)
        if followed is None or (pod.get("spec") or {}).get("nodeName"):
            return False
        return (pod["metadata"].get("uid") or "") in followed.bound

    def _ensure(self, tenant: _Tenant, physical: str) -> str | None:
        """The virtual node of a physical node, created if missing; None while it cannot be (no kubelet API yet,
        the physical node not listed, the tenant's nodes not listed)."""
        name = node_name_of(self.cluster, physical)
        if tenant.nodes.get(name) is not None or name in tenant.reported:
            return name
        found = self._physical.get(physical)
        if found is None or not tenant.listed() or not tenant.serve():
            return None
        self._report(tenant, found)
        return name

    def _report(self, tenant: _Tenant, physical: Obj) -> None:
        """The node's status, written when it changed or is due (created first, if it is not there)."""
        now = format_rfc3339(utcnow())
        name = node_name_of(self.cluster, physical["metadata"]["name"])
        with tenant.lock:
            body = tenant_node(super_cluster=self.cluster, node=physical, address=self.address,
                               kubelet_port=self.kubelet_server.port, heartbeat=now,
                               transition=tenant.since.setdefault(name, now))  # fmt: skip
            previous = tenant.reported.get(name)
            if not node_status_report_due(None if previous is None else previous[0], body["status"],
                                          since_last_report=time.monotonic() - (previous or ({}, 0.0))[1],
                                          report_every=NODE_STATUS_REPORT_SECONDS):  # fmt: skip
                return
            if previous is None and tenant.nodes.get(name) is None:
                try:
                    tenant.core.create_node(k8s.V1Node.model_validate(body))
                    log.info("tenant %s: node %s registered with %s", tenant.name, name, body["status"]["capacity"])
                except ApiException as e:
                    if not already_exists(e):
                        raise
            # A strategic merge keeps list entries it is not told to drop: an older address would stay first.
            addresses = [{"$patch": "replace"}, *body["status"]["addresses"]]
            try:
                tenant.core.patch_node_status(name, {"status": {**body["status"], "addresses": addresses}})
            except ApiException as e:
                if e.status == 404:  # deleted by hand: registered again at the next heartbeat, as a kubelet does
                    tenant.reported.pop(name, None)
                raise
            tenant.reported[name] = (body["status"], time.monotonic())

    # --- heartbeat and collection ---

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(NODE_LEASE_RENEW_SECONDS if self._informer.wait_synced(0) else 1):
            with self._lock:
                tenants = list(self._tenants.values())
            for tenant in tenants:
                try:
                    self._heartbeat(tenant)
                except Exception as e:  # noqa: BLE001 - one tenant unreachable holds no other's heartbeat
                    log.warning("tenant %s: heartbeat of its nodes in %s failed: %s", tenant.name, self.cluster, e)

    def _heartbeat(self, tenant: _Tenant) -> None:
        """Every node in use reported and its Lease renewed; every node unused past the grace deleted."""
        if not tenant.listed() or not tenant.serve():
            return
        copies = self._copies_of(tenant.name)
        ours = set(tenant.nodes.keys()) | set(tenant.reported)
        used = nodes_in_use(super_cluster=self.cluster, copies=copies, tenant_pods=tenant.pods.values(), tenant_nodes=ours)
        for scheduled in sorted({node for copy in copies if (node := (copy.get("spec") or {}).get("nodeName"))}):
            physical = self._physical.get(scheduled)
            if physical is not None:
                self._report(tenant, physical)
        now = time.monotonic()
        for name in ours:
            if name in used:  # a node only a moved pod is bound to, too: it must not go NotReady (and evict it)
                tenant.unused_since.pop(name, None)
                renew_node_lease(tenant.api, name)
            else:
                tenant.unused_since.setdefault(name, now)
        for name in to_delete(tenant.unused_since, now=now):
            self._delete(tenant.core, name)
            with tenant.lock:
                tenant.unused_since.pop(name, None)
                tenant.reported.pop(name, None)
                tenant.since.pop(name, None)

    def _delete(self, core: k8s.CoreV1Api, name: str) -> None:
        log.info("node %s: no pod uses it any more, deleted", name)
        ignore_not_found(core.delete_node, name)
        ignore_not_found(k8s.CoordinationV1Api(core.api_client).delete_namespaced_lease, name, NODE_LEASE_NAMESPACE)

    def remove(self, tenant: str, api: k8s.ApiClient) -> None:
        """A tenant being removed: every virtual node of this super cluster goes from its control plane (asked of
        its API server, not a Store: its side has stopped). Best effort: a control plane that does not answer
        (destroyed, or its credentials revoked) keeps them, NotReady without heartbeats, and holds up nothing,
        since its pods can run nowhere once the tenant is gone."""
        self.unfollow(tenant)
        core = k8s.CoreV1Api(api)
        try:
            listed = core.list_node(label_selector=f"{LABEL_SUPER_CLUSTER}={self.cluster}",
                                    _request_timeout=REMOVE_TIMEOUT_SECONDS).items  # fmt: skip
            for node in listed:
                if node.metadata is not None and node.metadata.name:
                    self._delete(core, node.metadata.name)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            log.warning("tenant %s: its virtual nodes of %s are left in its control plane, which did not answer (%s)",
                        tenant, self.cluster, type(e).__name__)  # fmt: skip
