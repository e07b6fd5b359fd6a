"""The virtual kubelet: `python -m workers.virtual_kubelet`, the program of the Deployment the consumer
creates for an accepted Advertisement. It stands for the provider as one node of the consumer cluster:

- registers the virtual node (capacity = the Advertisement's, kept current), renews its Lease, and says
  in the Ready condition why it is not ready (NodeReadyReason: PodCIDRNotSet, ProviderUnreachable,
  InvalidCredentials). Like a kubelet, the Lease (renewed every NODE_LEASE_RENEW_SECONDS) is the heartbeat;
  the node's status is patched when something in it changes, and otherwise every NODE_STATUS_REPORT_SECONDS;
- renews a keepalive Lease in the provider namespace (kube/copies.py, every keepalive_renew_seconds):
  should this cluster go away, the provider deletes the copies itself once it has lapsed;
- talks to the provider with the credentials of its mounted kubeconfig as they are renewed (the file is
  followed, kube/clients.py PeerKubeconfigFileClient): a rotation needs no restart. The provider wrote
  that file: only its server, CA, token and namespace are used (models/kubeconfig.py); one that says more
  is refused, the last accepted credentials kept, and a Warning Event InvalidCredentials on the node names
  the field (with none accepted yet, the node is NotReady, InvalidCredentials);
- offloads namespaces (issue 35): for each NamespaceOffloading whose cluster selector selects its node, asks
  the provider for the namespace's remote namespace (a RemoteNamespace in its control namespace
  `tidepool-foreign-<consumer>`, named by the mapping strategy) and writes this provider's entry in the
  NamespaceOffloading's status.clusters (server-side apply, field manager tidepool-vk-<provider>); a
  namespace no longer offloaded here is drained: its copies (pods first), then its RemoteNamespace, then
  the entry;
- reflects, into each namespace's remote namespace and under their own names: the pods bound to its node
  (and brings their status back, their IPs through the PodCIDR remapping, so that the consumer's
  EndpointSlices list them beside local pods); the ConfigMaps and Secrets those pods use, edits and
  deletions included; the namespace's Services (the provider's own controllers give each copy the pods'
  copies as endpoints). A pod whose namespace has no Ready remote namespace gets no copy and says why
  (condition tidepool.io/ProviderAdmitted False, NamespaceNotReady). The provider's Events about the pods'
  copies come back as Events on the pods, within a budget per pod (models/pods.py: EventBudget); what the
  provider reports is bounded, and a pod IP outside its advertised PodCIDR is never shown
  (models/virtual_kubelet.py: status_for_consumer);
- adopts the copies an earlier release made in the control namespace (`<namespace>-<name>`): each keeps
  running and stands for its pod until the pod's copy in its remote namespace runs, and is deleted only
  then; a pod whose namespace is not offloaded, or that runs to completion, keeps it until the pod goes
  (models/virtual_kubelet.py: legacy_copy_may_go);
- serves the kubelet API (workers/kubelet_api.py) at the node's InternalIP and kubelet port: the consumer's
  `kubectl logs`, `exec`, `attach` and `port-forward` on its pods reach their copies;
- on teardown (the Advertisement Deleting, its node deleted) deletes all it created in the provider (its
  keepalive last), marks its Deployment `tidepool.io/provider-namespace: clean`, and exits 0. Credentials refused (401)
  mean clean only when the provider marked its Advertisement withdrawn (it deleted the namespace itself);
  otherwise the provider side is not known to be clean, and the consumer's teardown timeout decides.

Reflection is controller-runtime's shape: informers keep both sides in memory (Stores, trimmed to what
is compared), every change queues its key on the kind's work queue, and the kind's workers reconcile one
key at a time from the caches, level-triggered, so that a restart never leaves a duplicate or an orphan.
A kind's workers (settings: TIDEPOOL_VK_<KIND>_WORKERS) are its own: a burst of one kind does not hold up
another; 0 Service or Event workers reflect no Service or Event. It never touches an object in the
provider that does not carry its labels (models/virtual_kubelet.copy_labels). The provider side is watched
per provider namespace, on one thread whatever their number (workers/provider_watches.py).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio.common import MetricMeter

from kube.clients import client_from_own_kubeconfig_file, client_from_peer_kubeconfig_file
from kube.clock import utcnow
from kube.copies import copies_selector, delete_offloaded, drop_keepalive, renew_keepalive
from kube.errors import already_exists
from kube.informer import Informer, Store
from kube.lease import NODE_LEASE_RENEW_SECONDS, renew_node_lease
from kube.metrics import Metrics
from kube.objects import delete_exactly, ignore_not_found, raw_json, read_cluster_object, record_event, with_condition
from kube.workqueue import WorkQueue, namespace_of
from models.api.conditions import POD_PROVIDER_CONDITION, NodeReadyReason, ProviderAdmittedReason, condition
from models.api.offloading import NamespaceOffloadingSpec
from models.enforcement import Refusal, refusal
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    GROUP,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    LABEL_PROVIDER,
    MANAGED_BY,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    PROVIDER_WITHDRAWN_ANNOTATION,
    REMOTE_NAMESPACES,
    SYSTEM_NAMESPACE,
    VERSION,
    VK_CLEAN_ANNOTATION,
    credentials_secret_name,
    foreign_namespace,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.offloading import remote_namespace_name, selects
from models.pods import (
    COPIED_STATUS,
    EventBudget,
    ReflectedEvents,
    StatusShape,
    Throttle,
    clipped,
    condition_of,
    dropped_events_event,
    event_for_origin,
    status_patch,
    status_shape,
)
from models.settings import VirtualKubeletProcessSettings
from models.times import format_rfc3339
from models.virtual_kubelet import (
    FOREIGN_IP_WARNING_SECONDS,
    ORIGIN_NAME,
    ORIGIN_NAMESPACE,
    ORIGIN_UID,
    ORIGIN_VERSION,
    REFLECTED_ANNOTATION,
    SOURCE_DIGEST,
    RemoteTarget,
    config_copy,
    copy_labels,
    foreign_ip_message,
    legacy_copy_may_go,
    moves_to_remote_namespace,
    namespace_not_ready_message,
    node_status_report_due,
    offloading_entry,
    pod_copy,
    referenced_objects,
    reflected_name,
    remote_namespace_request,
    remote_target,
    service_copy,
    status_for_consumer,
    virtual_node,
    when_copy_lost,
)
from workers.kubelet_api import CopyRef, KubeletApi
from workers.metrics import metrics_runtime
from workers.provider_watches import ProviderWatches, Watched

log = logging.getLogger("tidepool.virtual_kubelet")
RESYNC_SECONDS = 10
# Every key of every kind is reconciled again this often, whatever the watches said: a safety net, as
# controller-runtime's resync; the caches make a pass that finds nothing to do cost no API call.
REFLECTION_RESYNC_SECONDS = 300
# Secrets are not watched (the virtual kubelet may read the Secrets it is told of, not list them all, as
# a kubelet): the ones offloaded pods use are read again this often, kubelet's TTL cache strategy.
SECRET_REREAD_SECONDS = 60
# A ConfigMap's or Secret's reconcile runs under one of these, by key: more than the workers that share them.
CONFIG_LOCKS = 64
# A kubelet's defaults: the Lease is the heartbeat (kube/lease.py NODE_LEASE_RENEW_SECONDS); the node's status
# is written when it changes, and at least every 5 minutes (nodeStatusReportFrequency).
NODE_STATUS_REPORT_SECONDS = 300
# Passes run every RESYNC_SECONDS or sooner when woken: renew a little early rather than skip a period.
LEASE_RENEW_SLACK_SECONDS = 1
# The provider's own "Scheduled" names a node of the provider; the consumer's scheduler has said where
# the pod is (the virtual node).
UNREFLECTED_EVENT_REASONS = {"Scheduled"}

Obj = dict[str, Any]
PodKey = tuple[str, str]  # the consumer pod's (namespace, name)
RemoteKey = tuple[str, str]  # a copy's (provider namespace, name)
ConfigKind = Literal["ConfigMap", "Secret"]
ConfigKey = tuple[ConfigKind, str, str]  # (kind, namespace, name) in the consumer
CONFIG_KINDS: tuple[ConfigKind, ...] = ("ConfigMap", "Secret")


class ProviderRefusedPod(Exception):
    """A pod's copy the provider refuses for now (its quota): the work queue tries it again after its backoff."""


# What the caches keep of each object: what the reconcilers compare, so that a change elsewhere in an
# object (managedFields, a kubelet's heartbeat) queues nothing. A pod's spec and status are kept as compact
# JSON, parsed when used (a copy made, a status compared): as dicts they would hold a 10,000-pod node's
# memory several times over. The strings every object repeats (namespaces, label and annotation keys, most
# label values) are interned: one copy each, not one per object. Longer values are mostly unique (a uid, a
# pod's name): interning them would only fill the table.
MAX_INTERNED = 32


def _lean_meta(meta: Obj, keys: tuple[str, ...]) -> Obj:
    kept: Obj = {}
    for key in keys:
        if key not in meta:
            continue
        value = meta[key]
        if key == "namespace" and isinstance(value, str):
            value = sys.intern(value)
        elif key in ("labels", "annotations") and isinstance(value, dict):
            value = {sys.intern(k): sys.intern(v) if isinstance(v, str) and len(v) <= MAX_INTERNED else v
                     for k, v in value.items() if isinstance(k, str)}  # fmt: skip
        kept[key] = value
    return kept


@functools.lru_cache(maxsize=1024)
def _shared(shape: StatusShape) -> StatusShape:
    """One StatusShape object for all the pods of one shape (the pods of a Deployment): each held a set of
    condition types of its own, 0.7 KiB a pod."""
    return shape


def _consumer_pod(pod: Obj) -> Obj:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    config_maps, secrets = referenced_objects(spec)
    return {"metadata": _lean_meta(meta, ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp")),
            "spec": _compact(spec), "status": _compact(_copied(pod.get("status"))),
            "restartPolicy": spec.get("restartPolicy"), "shape": _shared(status_shape(spec)),
            "uses": sorted([*(("ConfigMap", n) for n in config_maps), *(("Secret", n) for n in secrets)])}  # fmt: skip


def _provider_copy(obj: Obj) -> Obj:
    return {"metadata": _lean_meta(obj["metadata"], ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp"))}


def _provider_pod(pod: Obj) -> Obj:
    return {**_provider_copy(pod), "status": _compact(_copied(pod.get("status")))}


def _copied(status: Obj | None) -> Obj:
    return {k: v for k, v in (status or {}).items() if k in COPIED_STATUS}


def _compact(obj: Obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _status(obj: Obj) -> Obj:
    return dict(json.loads(obj.get("status") or "{}"))


def _version_only(obj: Obj) -> Obj:
    return {"metadata": _lean_meta(obj["metadata"], ("name", "namespace", "resourceVersion"))}


def _service(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace") if k in meta}, "spec": obj.get("spec") or {}}


def _event(obj: Obj) -> Obj:
    """What models.pods.event_for_origin and ReflectedEvents read of a provider's Event, cut to the provider's
    bounds: not its managedFields, nor the copy's uid."""
    involved, source = obj.get("involvedObject") or {}, obj.get("source") or {}
    component = clipped("component", source.get("component") or obj.get("reportingComponent"))
    kept: Obj = {"metadata": _lean_meta(obj["metadata"], ("name", "namespace", "uid")),
                 "involvedObject": {k: involved[k] for k in ("name", "fieldPath") if k in involved},
                 "source": {"component": sys.intern(component)} if isinstance(component, str) else {},
                 **{k: obj[k] for k in ("type", "count", "firstTimestamp", "lastTimestamp", "eventTime")
                    if obj.get(k) is not None}}  # fmt: skip
    for key in ("reason", "message"):  # the provider's sizes
        if (value := clipped(key, obj.get(key))) is not None:
            kept[key] = sys.intern(value) if key == "reason" else value
    return kept


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _remote_request(obj: Obj) -> Obj:
    meta, status = obj["metadata"], obj.get("status") or {}
    return {"metadata": {k: meta[k] for k in ("name", "deletionTimestamp") if k in meta}, "spec": obj.get("spec") or {},
            "status": {k: status[k] for k in ("phase", "message") if k in status}}  # fmt: skip


def _consumer_namespace(request: Obj | None) -> str | None:
    return ((request or {}).get("spec") or {}).get("consumerNamespace")


def _origin(obj: Obj | None) -> tuple[str, str] | None:
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    namespace, name = annotations.get(ORIGIN_NAMESPACE), annotations.get(ORIGIN_NAME)
    return (namespace, name) if namespace and name else None


class VirtualKubelet:
    def __init__(self, config: VirtualKubeletProcessSettings) -> None:
        self.config = config
        self.node = virtual_node_name(config.provider_id)
        self.consumer = client_from_own_kubeconfig_file(config.consumer_kubeconfig)
        # The provider wrote this one: only its server, CA, token and namespace are used (models/kubeconfig.py).
        self.provider = client_from_peer_kubeconfig_file(config.provider_kubeconfig)
        self.remote_namespace = self.provider.namespace or foreign_namespace(config.consumer_id)
        self._refusal_said: str | None = None  # the provider kubeconfig's refusal last said in an Event
        self.core, self.remote = k8s.CoreV1Api(self.consumer), k8s.CoreV1Api(self.provider)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready_since: tuple[bool, NodeReadyReason, str] | None = None  # (ready, reason, lastTransitionTime)
        # What this process last wrote of its node (labels, status), when, and when it last renewed the Lease.
        self._reported: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._node_missing = False  # set by the node's watch; the next pass registers it again
        self._reported_at = 0.0
        self._lease_renewed_at: float | None = None
        self._keepalive_renewed_at: float | None = None  # the keepalive in the provider namespace (kube/copies.py)
        # No Temporal client here: the runtime only serves the Prometheus endpoint.
        self._runtime = metrics_runtime(config.metrics_port, service="virtual-kubelet")
        self._metrics = Metrics(self._runtime.metric_meter if self._runtime else MetricMeter.noop)

        # Reflection: set while the Advertisement is Accepted and the provider answers; workers drop keys
        # while it is clear, and every key is queued again when it is set.
        self._reflecting = threading.Event()
        self._resynced_at = self._secrets_read_at = 0.0
        self._synced_kinds: tuple[bool, ...] = ()  # which of (pods and config, Services, Events) have listed
        self._pod_cidrs: tuple[str | None, str | None] = (None, None)  # (the provider's, as remapped here)
        self._index_lock = threading.Lock()
        self._refs: dict[ConfigKey, set[PodKey]] = {}  # which pods use each ConfigMap and Secret
        self._config_locks = [threading.Lock() for _ in range(CONFIG_LOCKS)]  # _reconcile_config, by key
        self._events_reflected = ReflectedEvents()
        # What the provider reports is bounded per consumer pod (forgotten when the pod goes): Events reflected
        # (models/pods.py: EventBudget), and Warnings about addresses outside its PodCIDR.
        self._event_budget: EventBudget[PodKey] = EventBudget()
        self._foreign_ip_warnings: Throttle[PodKey] = Throttle(FOREIGN_IP_WARNING_SECONDS)
        self.pods: Store[PodKey, Obj] = Store(_key, self._pod_changed)
        self.copies: Store[RemoteKey, Obj] = Store(_key, self._copy_changed)
        self.config_maps: Store[PodKey, Obj] = Store(_key, self._config_map_changed)
        self.config_copies = {kind: Store(_key, self._config_copy_changed(kind)) for kind in CONFIG_KINDS}
        self.services: Store[PodKey, Obj] = Store(_key, lambda key, _old, _new: self.service_queue.add(key))
        self.service_copies: Store[RemoteKey, Obj] = Store(_key, self._service_copy_changed)
        self.events: Store[RemoteKey, Obj] = Store(_key, self._event_changed)
        # Namespace offloading: the consumer's NamespaceOffloadings (by namespace) and this consumer's
        # RemoteNamespaces in the provider's control namespace (by name), and what each offloaded namespace's
        # remote namespace is now (`_targets`, by consumer namespace; the pods' reconcilers read it).
        self.offloadings: Store[str, Obj] = Store(self._offloading_key, self._offloading_changed)
        self.remote_namespaces: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._request_changed)
        self._targets: dict[str, RemoteTarget] = {}
        self._request_errors: dict[str, str] = {}  # consumer namespace -> why its RemoteNamespace was not created
        self._node_labels: dict[str, str] | None = None  # as its watch last saw them; None while it is missing
        # Fair between namespaces: one namespace's burst of 10,000 pods does not hold back another's next one.
        self.pod_queue: WorkQueue[PodKey] = WorkQueue("pods", self._reconcile_pod, workers=config.pod_workers,
                                                      owner=namespace_of)  # fmt: skip
        self.config_queue: WorkQueue[ConfigKey] = WorkQueue("config", self._reconcile_config,
                                                            workers=config.config_workers,
                                                            owner=lambda key: key[1])  # fmt: skip
        self.service_queue: WorkQueue[PodKey] = WorkQueue("services", self._reconcile_service,
                                                          workers=config.service_workers, owner=namespace_of)  # fmt: skip
        self.event_queue: WorkQueue[RemoteKey] = WorkQueue("events", self._reconcile_event, workers=config.event_workers,
                                                           owner=namespace_of)  # fmt: skip
        self.namespace_queue: WorkQueue[str] = WorkQueue("namespaces", self._reconcile_namespace,
                                                         workers=config.namespace_workers)  # fmt: skip

        mine = {"labelSelector": copies_selector(config.consumer_id)}
        custom = k8s.CustomObjectsApi(self.consumer)
        self._informers: list[Informer[Any]] = [
            self._informer("vk-consumer-pods", self.pods, self.core.list_pod_for_all_namespaces, _consumer_pod,
                           field_selector=f"spec.nodeName={self.node}"),
            self._informer("vk-consumer-configmaps", self.config_maps, self.core.list_config_map_for_all_namespaces,
                           _version_only),
            self._informer("vk-namespace-offloadings", self.offloadings, custom.list_cluster_custom_object,
                           self._offloading, group=GROUP, version=VERSION, plural=NAMESPACE_OFFLOADINGS),
            # Its own node: one deleted by hand is registered again at once (its pods would otherwise be
            # garbage-collected as orphans before the next periodic status report); its labels are what
            # NamespaceOffloadings' cluster selectors select.
            Informer("vk-node", self.core.list_node, field_selector=f"metadata.name={self.node}",
                     on_sync=self._node_listed, on_event=self._node_event),
        ]  # fmt: skip
        # A provider of an earlier release serves no RemoteNamespaces: the copies already there keep running,
        # and pods wait (NamespaceNotReady) rather than the whole reflection.
        self._request_informer = self._informer(
            "vk-remote-namespaces", self.remote_namespaces, k8s.CustomObjectsApi(self.provider).list_namespaced_custom_object,
            _remote_request, group=GROUP, version=VERSION, namespace=self.remote_namespace, plural=REMOTE_NAMESPACES)  # fmt: skip
        # What it made in the provider, per provider namespace (workers/provider_watches.py): the control
        # namespace always (the single-namespace layout's copies), each Ready remote namespace while it is.
        # Pods wait for none but their own kinds: a provider whose tidepool is older may not let this one list
        # Events, and its Services and Events follow as soon as they have listed.
        kinds = [Watched("pods", self.copies, _provider_pod, mine),
                 Watched("configmaps", self.config_copies["ConfigMap"], _provider_copy, mine),
                 Watched("secrets", self.config_copies["Secret"], _provider_copy, mine)]  # fmt: skip
        if config.service_workers:
            kinds.append(Watched("services", self.service_copies, _provider_copy, mine))
        if config.event_workers:
            kinds.append(Watched("events", self.events, _event, {"fieldSelector": "involvedObject.kind=Pod"}))
        self._watches = ProviderWatches(self.provider, kinds, on_listed=self._provider_listed)
        self._service_informers = [
            self._informer("vk-consumer-services", self.services, self.core.list_service_for_all_namespaces, _service),
        ] if config.service_workers else []  # fmt: skip
        self._config_apis = {kind: _ConfigApi(self.core, self.remote, kind) for kind in CONFIG_KINDS}
        self._queues: list[WorkQueue[Any]] = [self.pod_queue, self.config_queue, self.service_queue, self.event_queue,
                                              self.namespace_queue]  # fmt: skip
        # The kubelet API (kubectl logs, exec, attach, port-forward), where the node says it is.
        self._kubelet_api = KubeletApi(host=config.node_ip, port=config.kubelet_port, provider=self.provider,
                                       locate=self.copy_locations, consumer=self.consumer,
                                       node_name=self.node) if config.node_ip and config.kubelet_port else None  # fmt: skip

    @staticmethod
    def _informer(name: str, store: Store[Any, Obj], list_call: Any, transform: Any, **kwargs: Any) -> Informer[Obj]:
        return Informer(name, list_call, on_sync=store.sync, on_event=store.event, transform=transform, **kwargs)

    def _node_listed(self, nodes: list[dict[str, Any]]) -> None:
        if not nodes:
            self._node_event("DELETED", {})
        else:
            self._node_event("ADDED", nodes[0])

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        labels = None if kind == "DELETED" else dict((node.get("metadata") or {}).get("labels") or {})
        if kind == "DELETED":
            self._node_missing = True
            self._wake.set()
        # While the node is missing, no namespace is judged unselected (its copies would be deleted): the
        # selectors are read again once it is back.
        if labels is not None and labels != self._node_labels:
            self._node_labels = labels
            self.namespace_queue.add_all(self._namespaces_known())
        elif labels is None:
            self._node_labels = None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> int:
        for informer in [*self._informers, self._request_informer, *self._service_informers]:
            informer.start()
        self._watches.ensure(self.remote_namespace)  # the single-namespace layout's copies
        for queue in self._queues:
            queue.start()
        if self._kubelet_api is not None:
            self._kubelet_api.start()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    if self.reconcile():
                        return 0
                except Exception as e:  # noqa: BLE001 - the next pass tries again; the log says why
                    log.warning("pass failed: %s", e)
                self._wake.wait(RESYNC_SECONDS)
            return 0
        finally:
            self._reflecting.clear()
            if self._kubelet_api is not None:
                self._kubelet_api.stop()
            for queue in self._queues:
                queue.stop()
            for informer in [*self._informers, self._request_informer, *self._service_informers]:
                informer.stop()
            self._watches.stop()

    # One pass -----------------------------------------------------------------------------------------
    def reconcile(self) -> bool:
        """One level-triggered pass over the node; True once teardown is complete (the program then exits 0)."""
        self.provider.follow()  # a refused provider kubeconfig is said whatever the Advertisement's phase
        self._say_refusal()
        advertisement = read_cluster_object(self.consumer, ADVERTISEMENTS, self.config.advertisement)
        phase = ((advertisement or {}).get("status") or {}).get("phase")
        if advertisement is None or phase == "Deleting" or (advertisement["metadata"].get("deletionTimestamp")):
            self._reflecting.clear()
            return self._teardown(advertisement)
        if phase != "Accepted":
            self._reflecting.clear()
            return False  # not ours to run yet (or refused): nothing to register
        reachable, error = self._provider_reachable()
        self._ensure_node(advertisement, reachable=reachable, error=error)
        if reachable:
            self._renew_keepalive()
        # The PodCIDR the network module decided for, not the spec's: a provider may edit that after acceptance
        # (to our own PodCIDR, say), and until a new decision its pods' IPs are shown inside the old one only.
        status = advertisement.get("status") or {}
        pod_cidrs = (status.get("remappedForPodCIDR"), status.get("remoteRemappedPodCIDR"))
        if pod_cidrs != self._pod_cidrs and pod_cidrs[0] != (advertisement["spec"].get("network") or {}).get("podCIDR"):
            log.warning("provider %s: spec.network.podCIDR is not the %s the network module decided for: no pod IP "
                        "outside that is shown until it decides again", self.config.provider_id, pod_cidrs[0])
        remapped, self._pod_cidrs = pod_cidrs != self._pod_cidrs, pod_cidrs
        # Every key is queued again when reflection starts, when an optional kind's informers have listed,
        # and every REFLECTION_RESYNC_SECONDS.
        control = self.remote_namespace
        state = (all(i.wait_synced(0) for i in self._informers)
                 and all(self._watches.listed(control, kind) for kind in ("pods", "configmaps", "secrets")),
                 all(i.wait_synced(0) for i in self._service_informers) and self._watches.listed(control, "services"),
                 self._watches.listed(control, "events"), self._request_informer.wait_synced(0))  # fmt: skip
        if not (reachable and state[0]):
            self._reflecting.clear()
        elif (not self._reflecting.is_set() or state != self._synced_kinds
              or time.monotonic() - self._resynced_at > REFLECTION_RESYNC_SECONDS):  # fmt: skip
            self._reflecting.set()
            self._resync()
            self._synced_kinds = state
        else:
            if remapped:
                self.pod_queue.add_all(self.pods.keys())  # every pod's IP is shown anew
            if time.monotonic() - self._secrets_read_at > SECRET_REREAD_SECONDS:
                self._secrets_read_at = time.monotonic()
                with self._index_lock:
                    secrets = [ref for ref in self._refs if ref[0] == "Secret"]
                self.config_queue.add_all(secrets)
        if self._reflecting.is_set():
            self._collect_legacy_copies()
        self._metrics.reflected_pods(provider=self.config.provider_id, count=sum(
            1 for key in self.pods.keys() if self._copy_of(key) is not None))  # fmt: skip
        return False

    def _resync(self) -> None:
        self._resynced_at = time.monotonic()
        self.namespace_queue.add_all(self._namespaces_known())
        self.pod_queue.add_all([*self.pods.keys(), *filter(None, map(_origin, self.copies.values()))])
        for kind in CONFIG_KINDS:
            with self._index_lock:
                used = [(kind, ns, name) for (k, ns, name) in self._refs if k == kind]
            copied = [(kind, *origin) for c in self.config_copies[kind].values() if (origin := _origin(c))]
            self.config_queue.add_all([*used, *copied])
        if self.config.service_workers:
            self.service_queue.add_all([*self.services.keys(), *filter(None, map(_origin, self.service_copies.values()))])
        if self.config.event_workers:
            self.event_queue.add_all(self.events.keys())

    def _namespaces_known(self) -> set[str]:
        """Every consumer namespace offloaded, or with a RemoteNamespace of ours (one going too)."""
        requested = {ns for r in self.remote_namespaces.values() if (ns := _consumer_namespace(r))}
        with self._index_lock:
            targeted = set(self._targets)
        return {*self.offloadings.keys(), *requested, *targeted}

    def _provider_reachable(self) -> tuple[bool, str]:
        try:
            self.remote.list_namespaced_pod(self.remote_namespace, limit=1)
            return True, ""
        except ApiException as e:  # its str() carries the response's headers (Date): keep the message stable
            return False, f"{e.status} {e.reason}"
        except Exception as e:  # noqa: BLE001 - any failure to reach it is the condition's message
            return False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"

    def _ensure_node(self, advertisement: dict[str, Any], *, reachable: bool, error: str) -> None:
        status = advertisement.get("status") or {}
        hard = {k: str(v) for k, v in ((advertisement["spec"].get("resourceQuota") or {}).get("hard") or {}).items()}
        reason: NodeReadyReason
        if self.provider.credentials is None:
            ready, reason, message = False, "InvalidCredentials", self._refusal_message()
        elif not status.get("remoteRemappedPodCIDR"):
            ready, reason, message = False, "PodCIDRNotSet", "waiting for the network module's PodCIDR remapping"
        elif not reachable:
            ready, reason, message = False, "ProviderUnreachable", f"provider {self.config.provider_id}: {error}"
        else:
            ready, reason, message = True, "KubeletReady", f"pods run in provider {self.config.provider_id}"
        now = format_rfc3339(utcnow())
        if self._ready_since is None or self._ready_since[:2] != (ready, reason):
            existing = ignore_not_found(self.core.read_node, self.node)
            conditions = (existing.status.conditions if existing and existing.status else None) or []
            old = next((c for c in conditions if c.type == "Ready"), None)
            kept = old.last_transition_time if old and (old.status == "True") == ready and old.reason == reason else None
            since = format_rfc3339(kept) if kept else now
            self._ready_since = (ready, reason, since)
        body = virtual_node(provider_id=self.config.provider_id, resources=hard, ready=ready, reason=reason,
                            message=message, heartbeat=now, transition=self._ready_since[2],
                            address=self.config.node_ip, kubelet_port=self.config.kubelet_port)  # fmt: skip
        labels, status = body["metadata"]["labels"], body["status"]
        if self._node_missing:
            self._node_missing, self._reported = False, None
        previous = self._reported
        if node_status_report_due(None if previous is None else previous[1], status,
                                  since_last_report=time.monotonic() - self._reported_at,
                                  report_every=NODE_STATUS_REPORT_SECONDS):  # fmt: skip
            self._report_node(body, labels_changed=previous is None or previous[0] != labels)
        self._renew_lease()

    def _refusal_message(self) -> str:
        kept = "its previous credentials are kept" if self.provider.credentials else "nothing was loaded"
        return (f"the kubeconfig provider {self.config.provider_id} wrote (Secret "
                f"{SYSTEM_NAMESPACE}/{credentials_secret_name(self.config.provider_id)}) was refused: "
                f"{self.provider.refusal}; {kept}")

    def _say_refusal(self) -> None:
        """A Warning Event on the node, once per refusal, naming the field: a provider's kubeconfig that would
        run a program here, read a file or skip TLS is never loaded, and its owner should know why."""
        refusal = self.provider.refusal
        said, self._refusal_said = self._refusal_said, None if refusal is None else str(refusal)
        if refusal is None or str(refusal) == said:
            return
        message = self._refusal_message()
        log.warning("%s", message)
        try:
            record_event(self.consumer, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node}},
                         reason="InvalidCredentials", message=message, warning=True)  # fmt: skip
        except ApiException as e:
            self._refusal_said = said  # said again at the next pass
            log.warning("event not recorded: %s %s", e.status, e.reason)

    def _report_node(self, body: dict[str, Any], *, labels_changed: bool) -> None:
        if self._reported is None:  # first report of this process: register (or adopt) the node
            try:
                self.core.create_node(k8s.V1Node.model_validate(body))
                log.info("registered node %s with %s", self.node, body["status"]["capacity"])
            except ApiException as e:
                if not already_exists(e):
                    raise
        if labels_changed:
            self.core.patch_node(self.node, {"metadata": {"labels": body["metadata"]["labels"]}})
        try:
            # A strategic merge keeps list entries it is not told to drop: an older address would stay first.
            addresses = [{"$patch": "replace"}, *body["status"]["addresses"]]
            self.core.patch_node_status(self.node, {"status": {**body["status"], "addresses": addresses}})
        except ApiException as e:
            if e.status == 404:  # deleted by hand: register again on the next pass, as a kubelet does
                self._reported = None
            raise
        self._reported, self._reported_at = (body["metadata"]["labels"], body["status"]), time.monotonic()

    def _renew_lease(self) -> None:
        started = time.monotonic()
        if self._lease_renewed_at is not None and (
            started - self._lease_renewed_at < NODE_LEASE_RENEW_SECONDS - LEASE_RENEW_SLACK_SECONDS
        ):
            return  # a pass woken early by a pod event: the Lease is fresh enough
        renew_node_lease(self.consumer, self.node)
        self._lease_renewed_at = started

    def _renew_keepalive(self) -> None:
        if self._keepalive_renewed_at is not None and (
            time.monotonic() - self._keepalive_renewed_at
            < self.config.keepalive_renew_seconds - LEASE_RENEW_SLACK_SECONDS
        ):
            return
        try:
            renew_keepalive(self.provider, self.remote_namespace, holder=self.config.consumer_id,
                            every_seconds=self.config.keepalive_renew_seconds)  # fmt: skip
        except ApiException as e:
            if e.status != 403:  # the next pass tries again; the node and the reflection must not wait on it
                log.warning("keepalive not renewed: %s %s", e.status, e.reason)
                return
            # A provider of an earlier release grants no Lease: it cannot clean up after a consumer that is
            # gone, and nothing else depends on it. Said once per process.
            if self._keepalive_renewed_at is None:
                log.warning("the provider refuses our keepalive Lease (%s): it will not clean our copies by itself "
                            "if this cluster goes away", e.status)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - unreachable for a moment: the next pass tries again
            log.warning("keepalive not renewed: %s", type(e).__name__)
            return
        self._keepalive_renewed_at = time.monotonic()

    # Changes, as the informers see them: each queues the keys it may affect -------------------------
    def _pod_changed(self, key: PodKey, old: Obj | None, new: Obj | None) -> None:
        before = self._references(key[0], old)
        after = self._references(key[0], new)
        with self._index_lock:
            for ref in before - after:
                users = self._refs.get(ref, set())
                users.discard(key)
                if not users:
                    self._refs.pop(ref, None)
            for ref in after - before:
                self._refs.setdefault(ref, set()).add(key)
        self.config_queue.add_all(before ^ after)
        self.pod_queue.add(key)

    @staticmethod
    def _references(namespace: str, pod: Obj | None) -> set[ConfigKey]:
        return {(kind, namespace, name) for kind, name in (pod or {}).get("uses") or []}

    def _copy_changed(self, key: RemoteKey, old: Obj | None, new: Obj | None) -> None:
        if (origin := _origin(new or old)) is not None:
            self.pod_queue.add(origin)
            if new is None and key[0] != self.remote_namespace:  # a drain waits for its pods' copies to go
                self.namespace_queue.add(origin[0])

    def _config_map_changed(self, key: PodKey, _old: Obj | None, _new: Obj | None) -> None:
        with self._index_lock:
            used = ("ConfigMap", *key) in self._refs
        if used:  # the cluster's other ConfigMaps are none of ours
            self.config_queue.add(("ConfigMap", *key))

    def _config_copy_changed(self, kind: ConfigKind) -> Any:
        def changed(_key: RemoteKey, old: Obj | None, new: Obj | None) -> None:
            if (origin := _origin(new or old)) is not None:
                self.config_queue.add((kind, *origin))
        return changed

    def _event_changed(self, key: RemoteKey, _old: Obj | None, new: Obj | None) -> None:
        if new is not None:  # an Event that expires in the provider stays in the consumer until it expires there
            self.event_queue.add(key)

    def _service_copy_changed(self, _key: RemoteKey, old: Obj | None, new: Obj | None) -> None:
        if (origin := _origin(new or old)) is not None:
            self.service_queue.add(origin)

    @staticmethod
    def _offloading_key(obj: Obj) -> str | None:
        meta = obj["metadata"]
        return meta["namespace"] if meta.get("name") == NAMESPACE_OFFLOADING_NAME else None  # one per namespace

    def _offloading(self, obj: Obj) -> Obj:
        """What is kept of a NamespaceOffloading: its spec, whether it is going, and this provider's entry."""
        meta = obj["metadata"]
        clusters = (obj.get("status") or {}).get("clusters") or []
        entry = next((c for c in clusters if c.get("clusterId") == self.config.provider_id), None)
        return {"metadata": {k: meta[k] for k in ("name", "namespace", "deletionTimestamp") if k in meta},
                "spec": obj.get("spec") or {}, "entry": entry}  # fmt: skip

    def _offloading_changed(self, namespace: str, _old: Obj | None, _new: Obj | None) -> None:
        self.namespace_queue.add(namespace)

    def _request_changed(self, name: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:  # the provider deleted its namespace: nothing more to watch there
            self._watches.drop(name)
        for request in (old, new):
            if (namespace := _consumer_namespace(request)) is not None:
                self.namespace_queue.add(namespace)

    def _provider_listed(self, namespace: str, resource: str) -> None:
        """A provider namespace's copies of one kind are known: what waited for them is queued."""
        if namespace == self.remote_namespace:
            self._wake.set()  # the pass starts reflecting once the control namespace has listed
            return
        request = self.remote_namespaces.get(namespace)
        consumer_namespace = _consumer_namespace(request)
        if consumer_namespace is None:
            return
        match resource:
            case "pods":
                self.pod_queue.add_all([k for k in self.pods.keys() if k[0] == consumer_namespace])
                self.namespace_queue.add(consumer_namespace)
            case "configmaps" | "secrets":
                kind: ConfigKind = "ConfigMap" if resource == "configmaps" else "Secret"
                with self._index_lock:
                    refs = [ref for ref in self._refs if ref[0] == kind and ref[1] == consumer_namespace]
                self.config_queue.add_all(refs)
            case "services":
                self.service_queue.add_all([k for k in self.services.keys() if k[0] == consumer_namespace])

    # Offloaded namespaces -----------------------------------------------------------------------------
    def _reconcile_namespace(self, namespace: str) -> None:
        """A consumer namespace offloaded to this provider has its RemoteNamespace asked for and this provider's
        entry in its NamespaceOffloading's status; one no longer offloaded here (its NamespaceOffloading
        deleted, or no longer selecting this node) is drained: its pods' copies deleted, then its
        RemoteNamespace, then the entry."""
        if not (self._reflecting.is_set() and self._request_informer.wait_synced(0)) or self._node_labels is None:
            return  # queued again, all of them, once both are known
        offloading = self.offloadings.get(namespace)
        wanted = self._wanted_remote(namespace, offloading)
        target: RemoteTarget | None = None
        if wanted is not None:
            request = self.remote_namespaces.get(wanted)
            if request is None:
                self._request_remote(namespace, wanted)
            target = remote_target(request, remote=wanted, consumer_namespace=namespace)
            if request is None and (error := self._request_errors.get(namespace)):
                target = target._replace(message=error)
            if target.phase in ("Ready", "Deleting") and _consumer_namespace(request) == namespace:
                self._watches.ensure(wanted)
        self._set_target(namespace, target)  # first: nothing is copied any more where the namespace is going
        going = [self._drain(name, request) for name, request in self._requests_of(namespace) if name != wanted]
        draining = next((t for t in going if t is not None), None)
        entry_target = target or draining
        entry = None if entry_target is None else offloading_entry(provider_id=self.config.provider_id,
                                                                   target=entry_target)  # fmt: skip
        if offloading is not None and offloading.get("entry") != entry:
            self._write_entry(namespace, entry)

    def _wanted_remote(self, namespace: str, offloading: Obj | None) -> str | None:
        if offloading is None or offloading["metadata"].get("deletionTimestamp"):
            return None
        try:
            spec = NamespaceOffloadingSpec.model_validate(offloading["spec"])
        except ValidationError as e:  # the CRD's schema refuses it; an older one may not
            log.warning("namespace %s: its NamespaceOffloading is not valid, not offloaded here: %s", namespace,
                        str(e).splitlines()[0])  # fmt: skip
            return None
        if not selects(spec.cluster_selector, self._node_labels or {}):
            return None
        return remote_namespace_name(spec, consumer_cluster_id=self.config.consumer_id, namespace=namespace)

    def _requests_of(self, namespace: str) -> list[tuple[str, Obj]]:
        return [(r["metadata"]["name"], r) for r in self.remote_namespaces.values() if _consumer_namespace(r) == namespace]

    def _request_remote(self, namespace: str, remote: str) -> None:
        body = remote_namespace_request(remote=remote, consumer_namespace=namespace, consumer_id=self.config.consumer_id)
        try:
            k8s.CustomObjectsApi(self.provider).create_namespaced_custom_object(
                GROUP, VERSION, self.remote_namespace, REMOTE_NAMESPACES, body)  # fmt: skip
            self._request_errors.pop(namespace, None)
            log.info("namespace %s: asked provider %s for remote namespace %s", namespace, self.config.provider_id,
                     remote)  # fmt: skip
        except ApiException as e:
            if already_exists(e):
                return  # its watch tells whose it is
            # A provider of an earlier release serves no RemoteNamespaces (404), or does not let us ask (403).
            said = refusal(e.status, e.body)
            self._request_errors[namespace] = (f"provider {self.config.provider_id} did not take the request: "
                                               f"{said.message if said else f'{e.status} {e.reason}'}")  # fmt: skip
            if e.status not in (403, 404):
                raise

    def _set_target(self, namespace: str, target: RemoteTarget | None) -> None:
        with self._index_lock:
            before = self._targets.get(namespace)
            if target is None:
                self._targets.pop(namespace, None)
            else:
                self._targets[namespace] = target
        if before == target:
            return
        # What the namespace's pods, ConfigMaps, Secrets and Services do follows: queued.
        self.pod_queue.add_all([k for k in self.pods.keys() if k[0] == namespace])
        with self._index_lock:
            refs = [ref for ref in self._refs if ref[1] == namespace]
        self.config_queue.add_all(refs)
        if self.config.service_workers:
            self.service_queue.add_all([k for k in self.services.keys() if k[0] == namespace])

    def _drain(self, remote: str, request: Obj) -> RemoteTarget | None:
        """One step of a remote namespace's removal, pods' copies first, gracefully (the consumer's controller
        deletes their pods, which their own controllers make again at home); then its RemoteNamespace, after
        which the provider deletes the namespace with what is left in it. What it waits for, or None once the
        RemoteNamespace is gone."""
        where = f"remote namespace {remote} in provider {self.config.provider_id}"
        if request["status"].get("phase") in ("Ready", "Deleting"):  # a namespace there, maybe copies in it
            self._watches.ensure(remote)
            if not self._watches.listed(remote):
                return RemoteTarget(remote, "Deleting", f"listing the pods' copies in {where}")
            copies = [c for key, c in self._items_in(self.copies, remote)]
            for copy in copies:
                self._delete_remote(self.remote.delete_namespaced_pod, copy)
            if copies:
                return RemoteTarget(remote, "Deleting", f"deleting {len(copies)} pods' copies in {where}")
        if not request["metadata"].get("deletionTimestamp"):
            ignore_not_found(k8s.CustomObjectsApi(self.provider).delete_namespaced_custom_object,
                             GROUP, VERSION, self.remote_namespace, REMOTE_NAMESPACES, remote)  # fmt: skip
            log.info("remote namespace %s: deleted its RemoteNamespace", remote)
        return RemoteTarget(remote, "Deleting", f"waiting for provider {self.config.provider_id} to delete {where}")

    def _write_entry(self, namespace: str, entry: dict[str, str] | None) -> None:
        """This provider's entry in the NamespaceOffloading's status.clusters, by server-side apply under a field
        manager of its own: an apply without it removes it, and no other provider's entry is touched."""
        body = {"apiVersion": API_VERSION, "kind": "NamespaceOffloading",
                "metadata": {"name": NAMESPACE_OFFLOADING_NAME, "namespace": namespace},
                "status": {"clusters": [entry] if entry else []}}  # fmt: skip
        ignore_not_found(k8s.CustomObjectsApi(self.consumer).patch_namespaced_custom_object_status,
                         GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME, body,
                         field_manager=f"tidepool-vk-{self.config.provider_id}", force=True,
                         _content_type="application/apply-patch+yaml")  # fmt: skip

    @staticmethod
    def _items_in(store: Store[RemoteKey, Obj], namespace: str) -> list[tuple[RemoteKey, Obj]]:
        return [(key, obj) for key in store.keys() if key[0] == namespace and (obj := store.get(key)) is not None]

    def _target(self, namespace: str) -> RemoteTarget | None:
        with self._index_lock:
            return self._targets.get(namespace)

    def _ready_remote(self, namespace: str, resource: str = "pods") -> str | None:
        """The namespace's remote namespace if it is Ready and its copies of `resource` are known; else None."""
        target = self._target(namespace)
        if target is None or target.phase != "Ready" or not self._watches.listed(target.remote, resource):
            return None
        return target.remote

    def _draining_copies(self, key: PodKey) -> list[Obj]:
        """The pod's copies in remote namespaces of its namespace other than its target (being drained)."""
        target = self._target(key[0])
        return [copy for remote, _ in self._requests_of(key[0]) if target is None or remote != target.remote
                if (copy := self.copies.get((remote, key[1]))) is not None and _origin(copy) == key]

    def _legacy_copy(self, key: PodKey) -> Obj | None:
        """The pod's copy of the single-namespace layout, in the control namespace, if there is one."""
        copy = self.copies.get((self.remote_namespace, reflected_name(*key)))
        return copy if copy is not None and _origin(copy) == key else None

    def _copy_of(self, key: PodKey) -> Obj | None:
        """The copy that stands for the pod now: the old layout's while there is one, else its remote namespace's."""
        if (legacy := self._legacy_copy(key)) is not None:
            return legacy
        target = self._target(key[0])
        return None if target is None else self.copies.get((target.remote, key[1]))

    def copy_locations(self, namespace: str, pod: str) -> list[CopyRef]:
        """Where the kubelet API looks for a pod's copy, in order: the old layout's (which the pod reports while
        it is there), then its remote namespace's."""
        found = []
        if self._legacy_copy((namespace, pod)) is not None:
            found.append(CopyRef(self.remote_namespace, reflected_name(namespace, pod)))
        if (target := self._target(namespace)) is not None:
            found.append(CopyRef(target.remote, pod))
        return found

    # Pods ---------------------------------------------------------------------------------------------
    def _reconcile_pod(self, key: PodKey) -> None:
        if not self._reflecting.is_set():
            return  # queued again, all of them, when reflection resumes
        pod, legacy = self.pods.get(key), self._legacy_copy(key)
        target = self._target(key[0])
        remote = target.remote if target is not None and target.phase == "Ready" else None
        if remote is not None and not self._watches.listed(remote):
            if legacy is None:
                return  # queued again once its copies are listed
            remote = None  # the old copy is reported meanwhile
        copy = self.copies.get((remote, key[1])) if remote is not None else None
        if copy is not None and _origin(copy) != key:
            copy = None  # not a copy of this pod's (the provider's own, or from a namespace there before)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            # Its copies go, wherever they are: a namespace being drained has its copies in a remote namespace that
            # is no longer its target. A pod being deleted is finished once none is left, as a kubelet would.
            copies = [c for c in (copy, legacy, *self._draining_copies(key)) if c is not None]
            for going in copies:
                self._delete_remote(self.remote.delete_namespaced_pod, going)
            if pod is None:
                self._event_budget.forget(key)
                self._foreign_ip_warnings.forget(key)
            elif not copies:
                meta = pod["metadata"]
                ignore_not_found(self.core.delete_namespaced_pod, meta["name"], meta["namespace"], grace_period_seconds=0)
            return
        meta = pod["metadata"]
        stale = [c for c in (copy, legacy) if c is not None and (c["metadata"].get("annotations") or {}).get(ORIGIN_UID) != meta["uid"]]
        for c in stale:  # an earlier pod's of the same name
            self._delete_remote(self.remote.delete_namespaced_pod, c)
        if stale:
            return
        if legacy is not None and (remote is None or copy is None and not moves_to_remote_namespace(pod["restartPolicy"])):
            self._report(pod, legacy)  # the old layout's copy runs on: until it moves, or its pod goes
            return
        if remote is None:
            if target is None and (self._node_labels is None or self._wanted_remote(key[0], self.offloadings.get(key[0]))):
                self.namespace_queue.add(key[0])  # not reconciled yet (a restart): it queues its pods when it is
                return
            self._namespace_not_ready(pod, target)
            return
        if copy is None:
            self._copy_missing(pod, remote, moving=legacy is not None)
            if legacy is not None:
                self._report(pod, legacy)
            return
        if legacy is not None:
            if not legacy_copy_may_go(_status(copy), restart_policy=pod["restartPolicy"]):
                self._report(pod, legacy)  # its new copy does not run yet: the old one stands for the pod
                return
            self._delete_remote(self.remote.delete_namespaced_pod, legacy)
            log.info("pod %s/%s moved to remote namespace %s: its old copy %s deleted", *key, remote,
                     legacy["metadata"]["name"])  # fmt: skip
        self._report(pod, copy)

    def _report(self, pod: Obj, copy: Obj) -> None:
        """The copy's labels follow the pod's; the pod shows the copy's status."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        labels = copy_labels(consumer_id=self.config.consumer_id, namespace=key[0], labels=meta.get("labels"))
        have = copy["metadata"].get("labels") or {}
        if have != labels:  # the consumer's labels changed (Services select by them), or an older copy's
            self.remote.patch_namespaced_pod(copy["metadata"]["name"], copy["metadata"]["namespace"], {"metadata": {
                "labels": {**{k: None for k in have if k not in labels}, **labels}}})  # fmt: skip
        provider_cidr, remapped_cidr = self._pod_cidrs
        wanted, foreign = status_for_consumer(_status(copy), shape=pod["shape"], provider_pod_cidr=provider_cidr,
                                              remapped_pod_cidr=remapped_cidr)  # fmt: skip
        if foreign and self._foreign_ip_warnings.due(key, foreign, now=time.monotonic()):
            log.warning("pod %s/%s: provider %s reported %s, outside its PodCIDR %s: not shown", *key,
                        self.config.provider_id, ", ".join(foreign), provider_cidr)  # fmt: skip
            record_event(self.consumer, {"apiVersion": "v1", "kind": "Pod", "metadata": meta},
                         reason="ProviderReportedForeignIP", warning=True, message=foreign_ip_message(
                             foreign, provider_id=self.config.provider_id, provider_pod_cidr=provider_cidr))  # fmt: skip
        shown = _status(pod)
        current = {k: shown.get(k) for k in wanted}
        if wanted and current != wanted:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], status_patch(wanted))
        if condition_of(shown, POD_PROVIDER_CONDITION) is not None:  # said before its copy ran (or was adopted)
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {"conditions": [
                {"$patch": "delete", "type": POD_PROVIDER_CONDITION}]}})  # fmt: skip

    def _copy_missing(self, pod: Obj, remote: str, *, moving: bool) -> None:
        meta = pod["metadata"]
        if _status(pod).get("phase") in ("Succeeded", "Failed"):
            return  # done: nothing runs again
        never_restarts = when_copy_lost(pod["restartPolicy"]) == "fail"
        if not never_restarts or moving:  # first or lost: a pod that restarts gets a copy either way
            self._create_copy(pod, remote, mark=False)
            return
        # A pod that never restarts is marked once its copy is made, so that a lost copy fails it.
        if not (meta.get("annotations") or {}).get(REFLECTED_ANNOTATION):
            self._create_copy(pod, remote, mark=True)
            return
        # The cache may lag behind a copy just made: only the provider's word says it is gone.
        if ignore_not_found(self.remote.read_namespaced_pod, meta["name"], remote) is None:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {
                "phase": "Failed", "reason": "ProviderPodDeleted", "message": "the pod was deleted in the provider cluster"}})  # fmt: skip

    def _create_copy(self, pod: Obj, remote: str, *, mark: bool) -> None:
        meta = pod["metadata"]
        namespace = meta["namespace"]
        for ref in self._references(namespace, pod):  # what it mounts must be there before it starts
            self._reconcile_config(ref)
        body = pod_copy({**pod, "spec": json.loads(pod["spec"])}, consumer_id=self.config.consumer_id)
        try:
            created: Any = self.remote.create_namespaced_pod(remote, k8s.V1Pod.model_validate(body),
                                                             _preload_content=False)  # fmt: skip
            self.copies.add_if_absent((remote, body["metadata"]["name"]), _provider_pod(raw_json(created)))
        except ApiException as e:
            if (refused := refusal(e.status, e.body)) is not None:
                self._refused(pod, refused)
                return
            if not already_exists(e):  # there already (a pass before a crash made it): the next pass adopts it
                raise
        if condition_of(_status(pod), POD_PROVIDER_CONDITION) is not None:  # refused before: no longer
            self.core.patch_namespaced_pod_status(meta["name"], namespace, {"status": {"conditions": [
                {"$patch": "delete", "type": POD_PROVIDER_CONDITION}]}})  # fmt: skip
        if mark:
            self.core.patch_namespaced_pod(meta["name"], namespace,
                                           {"metadata": {"annotations": {REFLECTED_ANNOTATION: "true"}}})  # fmt: skip
        log.info("pod %s/%s runs in provider %s, namespace %s", namespace, meta["name"], self.config.provider_id, remote)

    def _refused(self, pod: Obj, refused: Refusal) -> None:
        """The provider's API server refused the pod's copy: the pod says why (a condition, and a Warning Event
        when what it says changes). A final refusal (Pod Security, an admission policy) fails the pod, as a
        kubelet fails a pod it rejects at admission; a quota refusal leaves it Pending, and is tried again
        after the work queue's backoff (doubling to a minute), not at once."""
        message = f"provider {self.config.provider_id} refused the pod: {refused.message}"
        self._not_admitted(pod, "ProviderRefused", message, fail=refused.final)
        if not refused.final:
            raise ProviderRefusedPod(message)

    def _namespace_not_ready(self, pod: Obj, target: RemoteTarget | None) -> None:
        """A pod bound to the node whose namespace has no Ready remote namespace here: no copy; it stays Pending
        and says why (not offloaded, not selecting this provider, pending or refused in the provider)."""
        if _status(pod).get("phase") in ("Succeeded", "Failed"):
            return
        namespace = pod["metadata"]["namespace"]
        offloading = self.offloadings.get(namespace)
        offloaded = offloading is not None and not offloading["metadata"].get("deletionTimestamp")
        message = namespace_not_ready_message(namespace, provider_id=self.config.provider_id, target=target,
                                              offloaded=offloaded)  # fmt: skip
        self._not_admitted(pod, "NamespaceNotReady", message, fail=False)

    def _not_admitted(self, pod: Obj, reason: ProviderAdmittedReason, message: str, *, fail: bool) -> None:
        """Condition tidepool.io/ProviderAdmitted False with the reason, written when what it says changes (and a
        Warning Event then); `fail` fails the pod as well."""
        meta, status = pod["metadata"], _status(pod)
        said = condition_of(status, POD_PROVIDER_CONDITION)
        news = said is None or said.get("status") != "False" or (said.get("reason"), said.get("message")) != (reason, message)
        written = with_condition(condition(POD_PROVIDER_CONDITION, False, reason, message), [said] if said else [])
        patch: Obj = {"conditions": written}
        if fail:
            patch.update(phase="Failed", reason=reason, message=message)
        if news or fail:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": patch})
        if news:
            record_event(self.consumer, {"apiVersion": "v1", "kind": "Pod", "metadata": meta}, reason=reason,
                         message=message, warning=True)  # fmt: skip
            log.warning("pod %s/%s: %s", meta["namespace"], meta["name"], message)

    # ConfigMaps and Secrets ---------------------------------------------------------------------------
    def _reconcile_config(self, key: ConfigKey) -> None:
        """A ConfigMap or Secret an offloaded pod uses has a copy, under its own name in its namespace's remote
        namespace, made from its current version; one no pod uses any more, or deleted in the consumer, has
        none (pods running there keep what they mounted). A pod's worker calls it too, before making the pod's
        copy: one key at a time, or both find no copy and both create it (57% of the ConfigMaps of a
        10,000-pod run were created twice, the second answered 409, read and replaced)."""
        if not self._reflecting.is_set():
            return
        with self._config_locks[hash(key) % len(self._config_locks)]:
            self._reconcile_config_locked(key)

    def _reconcile_config_locked(self, key: ConfigKey) -> None:
        kind, namespace, name = key
        remote = self._ready_remote(namespace, "configmaps" if kind == "ConfigMap" else "secrets")
        if remote is None:
            return  # queued again when it is Ready and listed; a namespace going is drained whole
        with self._index_lock:
            used = key in self._refs
        copy = self.config_copies[kind].get((remote, name))
        api = self._config_apis[kind]
        source: Obj | None = None
        if used and kind == "Secret":  # no watch of Secrets (see SECRET_REREAD_SECONDS): read it
            source = api.source(namespace, name)
        elif used:
            source = self.config_maps.get((namespace, name))
        if source is None:
            if copy is not None:  # no pod uses it any more, or it was deleted in the consumer
                self._delete_remote(api.delete, copy)
            return
        if copy is not None and (copy["metadata"].get("annotations") or {}).get(ORIGIN_VERSION) == (
                source["metadata"]["resourceVersion"]):  # fmt: skip
            return
        if kind == "ConfigMap":  # the cache keeps its version only
            source = api.source(namespace, name)
            if source is None:
                return  # deleted meanwhile: its watch event queues it again
        body = config_copy(source, kind=kind, consumer_id=self.config.consumer_id)
        self._write_remote(api.create, api.replace, api.read_copy, body, namespace=remote, exists=copy is not None)
        self.config_copies[kind].add_if_absent((remote, body["metadata"]["name"]), _provider_copy(body))

    def _collect_legacy_copies(self) -> None:
        """The single-namespace layout's ConfigMaps, Secrets and Services in the control namespace serve its pods'
        copies there (not kept current any more): each goes once no pod copy of its namespace is left there."""
        control = self.remote_namespace
        pods_of = {origin[0] for _, c in self._items_in(self.copies, control) if (origin := _origin(c))}
        stores = [(self.config_copies["ConfigMap"], self._config_apis["ConfigMap"].delete),
                  (self.config_copies["Secret"], self._config_apis["Secret"].delete),
                  (self.service_copies, self.remote.delete_namespaced_service)]  # fmt: skip
        for store, delete in stores:
            for _, copy in self._items_in(store, control):
                origin = _origin(copy)
                if origin is not None and origin[0] not in pods_of:
                    self._delete_remote(delete, copy)

    # Services -----------------------------------------------------------------------------------------
    def _reconcile_service(self, key: PodKey) -> None:
        """Every Service of an offloaded namespace has its copy under its own name in the remote namespace (its
        DNS name works there unchanged), selecting the pods' copies."""
        if not (self._reflecting.is_set() and all(i.wait_synced(0) for i in self._service_informers)):
            return  # every Service is queued again once both sides have listed
        remote = self._ready_remote(key[0], "services")
        if remote is None:
            return  # queued again when it is Ready and listed
        service, copy = self.services.get(key), self.service_copies.get((remote, key[1]))
        desired = service_copy(service, consumer_id=self.config.consumer_id) if service else None
        if desired is None:
            if copy is not None:
                self._delete_remote(self.remote.delete_namespaced_service, copy)
            return
        digest = desired["metadata"]["annotations"][SOURCE_DIGEST]
        if copy is None or (copy["metadata"].get("annotations") or {}).get(SOURCE_DIGEST) != digest:
            # A PUT without a resourceVersion: the API server keeps the ClusterIP it allocated.
            self._write_remote(self.remote.create_namespaced_service, self.remote.replace_namespaced_service,
                               self.remote.read_namespaced_service, desired, namespace=remote,
                               exists=copy is not None)  # fmt: skip
            self.service_copies.add_if_absent((remote, desired["metadata"]["name"]), _provider_copy(desired))

    # Events -------------------------------------------------------------------------------------------
    def _reconcile_event(self, key: RemoteKey) -> None:
        """An Event about a pod's copy becomes an Event on the pod, once per change of the source Event."""
        if not self._reflecting.is_set():
            return
        event = self.events.get(key)
        if event is None or event.get("reason") in UNREFLECTED_EVENT_REASONS or not self._events_reflected.is_new(event):
            return
        involved = (event.get("involvedObject") or {}).get("name") or ""
        origin = _origin(self.copies.get((key[0], involved)))
        pod = self.pods.get(origin) if origin else None
        if origin is None or pod is None:
            return  # not a copy of ours, or its pod is gone
        labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: self.config.provider_id}
        now = time.monotonic()
        if self._event_budget.take(origin, now=now):
            self._write_event(event_for_origin(event, pod, labels=labels))
        elif self._event_budget.summary_due(origin, now=now):
            self._write_event(dropped_events_event(pod, dropped=self._event_budget.dropped(origin), labels=labels,
                                                   source=f"provider {self.config.provider_id}", now=format_rfc3339(utcnow())))  # fmt: skip
        self._events_reflected.remember(event)  # a dropped one too: the budget is spent, not deferred

    def _write_event(self, body: Obj) -> None:
        """Written again (a restarted virtual kubelet, a source Event that happened again), it updates."""
        namespace = body["metadata"]["namespace"]
        try:
            self.core.create_namespaced_event(namespace, k8s.CoreV1Event.model_validate(body))
        except ApiException as e:
            if not already_exists(e):
                raise
            self.core.patch_namespaced_event(body["metadata"]["name"], namespace,
                                             {k: body[k] for k in ("count", "message", "lastTimestamp") if k in body})  # fmt: skip

    # Writes in the provider that never touch what is not ours -----------------------------------------
    def _write_remote(self, create: Any, replace: Any, read: Any, body: Obj, *, namespace: str, exists: bool) -> None:
        name = body["metadata"]["name"]
        if exists:
            replace(name, namespace, body)
            return
        try:
            create(namespace, body)
        except ApiException as e:
            if not already_exists(e):
                raise
            current = read(name, namespace)
            labels = (current.metadata.labels if current.metadata else None) or {}
            if labels.get(LABEL_CONSUMER) != self.config.consumer_id:
                log.warning("%s %s/%s exists in the provider and is not ours: left alone", body["kind"], namespace,
                            name)  # fmt: skip
                return
            replace(name, namespace, body)

    def _delete_remote(self, delete: Any, copy: Obj) -> None:
        """Deletes the copy the cache holds, not whatever has its name now: the provider may have put an object of
        its own there since (the cache lagging behind), and the uid precondition leaves that one alone."""
        meta = copy["metadata"]
        if meta.get("deletionTimestamp"):
            return
        if not delete_exactly(delete, meta["name"], meta["namespace"], uid=meta.get("uid")):
            log.info("%s/%s: not deleted, it is another object than the copy made under that name", meta["namespace"], meta["name"])

    # Teardown -----------------------------------------------------------------------------------------
    def _teardown(self, advertisement: dict[str, Any] | None) -> bool:
        """Seed 000's order: the node goes first (the consumer's workflow deletes it); then everything
        this virtual kubelet made in the provider goes (the copies in the control namespace and in every
        remote namespace, then the RemoteNamespaces, the provider deleting their namespaces); then it says so
        on its Deployment, its entries gone from the NamespaceOffloadings' status."""
        if ignore_not_found(self.core.read_node, self.node) is not None:
            log.info("teardown: waiting for node %s to be deleted", self.node)
            return False
        try:
            self.remote.list_namespaced_pod(self.remote_namespace, limit=1)
        except ApiException as e:
            if e.status not in (401, 403, 404):
                raise
            annotations = ((advertisement or {}).get("metadata") or {}).get("annotations") or {}
            if PROVIDER_WITHDRAWN_ANNOTATION in annotations:
                # The provider withdrew first: it revoked these credentials and removed the namespaces.
                self._drop_entries()
                return self._report_clean()
            # Refused without a withdrawal (expired or revoked credentials): the copies may still run there.
            log.warning("teardown: the provider refuses our credentials (%s) and did not withdraw: its namespace "
                        "is not known to be clean", e.status)  # fmt: skip
            return False
        cleaning = delete_offloaded(self.provider, self.remote_namespace, self.config.consumer_id, now=utcnow())
        if cleaning.going:
            log.info("teardown: %d pods still going in the provider", cleaning.going)
            return False
        if cleaning.remote_namespaces:
            log.info("teardown: waiting for provider %s to delete %d remote namespaces", self.config.provider_id,
                     cleaning.remote_namespaces)  # fmt: skip
            return False
        self._drop_entries()
        drop_keepalive(self.provider, self.remote_namespace)
        return self._report_clean()

    def _drop_entries(self) -> None:
        """This provider is gone for every NamespaceOffloading: its entries go (their drains wait for no one)."""
        for namespace in self.offloadings.keys():
            offloading = self.offloadings.get(namespace)
            if offloading is not None and offloading.get("entry") is not None:
                self._write_entry(namespace, None)

    def _report_clean(self) -> bool:
        ignore_not_found(k8s.AppsV1Api(self.consumer).patch_namespaced_deployment,
                         virtual_kubelet_name(self.config.provider_id), self.config.namespace,
                         {"metadata": {"annotations": {VK_CLEAN_ANNOTATION: "clean"}}})  # fmt: skip
        log.info("teardown: provider namespace %s is clean", self.remote_namespace)
        return True


class _ConfigApi:
    """The calls for one of ConfigMap and Secret: read in the consumer, write in the provider."""

    def __init__(self, consumer: k8s.CoreV1Api, provider: k8s.CoreV1Api, kind: ConfigKind) -> None:
        suffix = "secret" if kind == "Secret" else "config_map"
        self._read_source = getattr(consumer, f"read_namespaced_{suffix}")
        self.read_copy = getattr(provider, f"read_namespaced_{suffix}")
        self.create = getattr(provider, f"create_namespaced_{suffix}")
        self.replace = getattr(provider, f"replace_namespaced_{suffix}")
        self.delete = getattr(provider, f"delete_namespaced_{suffix}")

    def source(self, namespace: str, name: str) -> Obj | None:
        """The consumer's object as the API server serves it; None when it is gone."""
        response = ignore_not_found(self._read_source, name, namespace, _preload_content=False)
        return None if response is None else raw_json(response)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    vk = VirtualKubelet(VirtualKubeletProcessSettings.from_env(os.environ))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: vk.stop())
    return vk.run()


if __name__ == "__main__":
    sys.exit(main())

