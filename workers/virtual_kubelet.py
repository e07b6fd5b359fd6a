"""The virtual kubelet: `python -m workers.virtual_kubelet`, the program of the Deployment the consumer
creates for an accepted Advertisement. It stands for the provider as one node of the consumer cluster:

- registers the virtual node (capacity = the Advertisement's, kept current), renews its Lease, and says
  in the Ready condition why it is not ready (NodeReadyReason: PodCIDRNotSet, ProviderUnreachable,
  InvalidCredentials). Like a kubelet, the Lease (renewed every LEASE_RENEW_SECONDS) is the heartbeat;
  the node's status is patched when something in it changes, and otherwise every NODE_STATUS_REPORT_SECONDS;
- renews a keepalive Lease in the provider namespace (kube/copies.py, every KEEPALIVE_RENEW_SECONDS):
  should this cluster go away, the provider deletes the copies itself once it has lapsed;
- talks to the provider with the credentials of its mounted kubeconfig as they are renewed (the file is
  followed, kube/clients.py PeerKubeconfigFileClient): a rotation needs no restart. The provider wrote
  that file: only its server, CA, token and namespace are used (models/kubeconfig.py); one that says more
  is refused, the last accepted credentials kept, and a Warning Event InvalidCredentials on the node names
  the field (with none accepted yet, the node is NotReady, InvalidCredentials);
- reflects, in the provider's namespace for this consumer: the pods bound to its node (and brings their
  status back, their IPs through the PodCIDR remapping, so that the consumer's EndpointSlices list them
  beside local pods); the ConfigMaps and Secrets those pods use, edits and deletions included; the
  Services of the namespaces those pods are in (the provider's own controllers give each copy the pods'
  copies as endpoints). The provider's Events about the pods' copies come back as Events on the pods, within
  a budget per pod (models/pods.py: EventBudget); what the provider reports is bounded, and a pod IP outside
  its advertised PodCIDR is never shown (models/virtual_kubelet.py: status_for_consumer);
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
provider that does not carry its labels (models/virtual_kubelet.copy_labels).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.common import MetricMeter

from kube.clients import client_from_own_kubeconfig_file, client_from_peer_kubeconfig_file
from kube.copies import KEEPALIVE_RENEW_SECONDS, copies_selector, delete_copies, drop_keepalive, renew_keepalive
from kube.informer import Informer, Store
from kube.lease import renew_lease
from kube.metrics import Metrics
from kube.objects import ignore_not_found, raw_json, read_cluster_object, record_event, with_condition
from kube.workqueue import WorkQueue
from models.api.conditions import POD_PROVIDER_CONDITION, NodeReadyReason, condition
from models.enforcement import Refusal, refusal
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    LABEL_PROVIDER,
    MANAGED_BY,
    PROVIDER_WITHDRAWN_ANNOTATION,
    SYSTEM_NAMESPACE,
    VK_CLEAN_ANNOTATION,
    credentials_secret_name,
    foreign_namespace,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.pods import (
    COPIED_STATUS,
    EventBudget,
    ReflectedEvents,
    Throttle,
    clipped,
    condition_of,
    dropped_events_event,
    event_for_origin,
    status_patch,
    status_shape,
)
from models.virtual_kubelet import (
    FOREIGN_IP_WARNING_SECONDS,
    ORIGIN_NAME,
    ORIGIN_NAMESPACE,
    ORIGIN_UID,
    ORIGIN_VERSION,
    REFLECTED_ANNOTATION,
    SOURCE_DIGEST,
    config_copy,
    copy_labels,
    foreign_ip_message,
    node_status_report_due,
    pod_copy,
    referenced_objects,
    reflected_name,
    service_copy,
    status_for_consumer,
    virtual_node,
    when_copy_lost,
)
from workers.kubelet_api import KubeletApi
from workers.metrics import metrics_runtime

log = logging.getLogger("tidepool.virtual_kubelet")
RESYNC_SECONDS = 10
# Every key of every kind is reconciled again this often, whatever the watches said: a safety net, as
# controller-runtime's resync; the caches make a pass that finds nothing to do cost no API call.
REFLECTION_RESYNC_SECONDS = 300
# Secrets are not watched (the virtual kubelet may read the Secrets it is told of, not list them all, as
# a kubelet): the ones offloaded pods use are read again this often, kubelet's TTL cache strategy.
SECRET_REREAD_SECONDS = 60
LEASE_SECONDS = 40
# A kubelet's defaults: the Lease is the heartbeat (renewed every 10 s, a quarter of its duration); the
# node's status is written when it changes, and at least every 5 minutes (nodeStatusReportFrequency).
LEASE_RENEW_SECONDS = 10
NODE_STATUS_REPORT_SECONDS = 300
# Passes run every RESYNC_SECONDS or sooner when woken: renew a little early rather than skip a period.
LEASE_RENEW_SLACK_SECONDS = 1
# The provider's own "Scheduled" names a node of the provider; the consumer's scheduler has said where
# the pod is (the virtual node).
UNREFLECTED_EVENT_REASONS = {"Scheduled"}

Obj = dict[str, Any]
PodKey = tuple[str, str]  # the consumer pod's (namespace, name)
ConfigKind = Literal["ConfigMap", "Secret"]
ConfigKey = tuple[ConfigKind, str, str]  # (kind, namespace, name) in the consumer
CONFIG_KINDS: tuple[ConfigKind, ...] = ("ConfigMap", "Secret")


class ProviderRefusedPod(Exception):
    """A pod's copy the provider refuses for now (its quota): the work queue tries it again after its backoff."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Config:
    provider_id: str
    consumer_id: str
    advertisement: str
    namespace: str
    provider_kubeconfig: str
    consumer_kubeconfig: str | None
    metrics_port: int = 0
    node_ip: str | None = None
    kubelet_port: int = 0
    pod_workers: int = 8
    config_workers: int = 4
    service_workers: int = 2
    event_workers: int = 2

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ

        def number(name: str, default: int) -> int:
            return int(env.get(f"TIDEPOOL_VK_{name}") or default)

        return cls(
            provider_id=env["TIDEPOOL_VK_PROVIDER_ID"],
            consumer_id=env["TIDEPOOL_VK_CONSUMER_ID"],
            advertisement=env["TIDEPOOL_VK_ADVERTISEMENT"],
            namespace=env.get("TIDEPOOL_VK_NAMESPACE", SYSTEM_NAMESPACE),
            provider_kubeconfig=env["TIDEPOOL_VK_PROVIDER_KUBECONFIG"],
            consumer_kubeconfig=env.get("TIDEPOOL_VK_CONSUMER_KUBECONFIG"),
            metrics_port=number("METRICS_PORT", 0),
            node_ip=env.get("TIDEPOOL_VK_NODE_IP") or None,
            kubelet_port=number("KUBELET_PORT", 0),
            pod_workers=max(number("POD_WORKERS", 8), 1),
            config_workers=max(number("CONFIG_WORKERS", 4), 1),
            service_workers=number("SERVICE_WORKERS", 2),
            event_workers=number("EVENT_WORKERS", 2),
        )


# What the caches keep of each object: what the reconcilers compare, so that a change elsewhere in an
# object (managedFields, a kubelet's heartbeat) queues nothing. A pod's spec and status are kept as compact
# JSON, parsed when used (a copy made, a status compared): as dicts they would hold a 10,000-pod node's
# memory several times over.
def _consumer_pod(pod: Obj) -> Obj:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    config_maps, secrets = referenced_objects(spec)
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels", "annotations",
                                               "deletionTimestamp") if k in meta},
            "spec": _compact(spec), "status": _compact(_copied(pod.get("status"))),
            "restartPolicy": spec.get("restartPolicy"), "shape": status_shape(spec),
            "uses": sorted([*(("ConfigMap", n) for n in config_maps), *(("Secret", n) for n in secrets)])}  # fmt: skip


def _provider_copy(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "labels", "annotations", "deletionTimestamp") if k in meta}}


def _provider_pod(pod: Obj) -> Obj:
    return {**_provider_copy(pod), "status": _compact(_copied(pod.get("status")))}


def _copied(status: Obj | None) -> Obj:
    return {k: v for k, v in (status or {}).items() if k in COPIED_STATUS}


def _compact(obj: Obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _status(obj: Obj) -> Obj:
    return dict(json.loads(obj.get("status") or "{}"))


def _version_only(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")}}


def _service(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace") if k in meta}, "spec": obj.get("spec") or {}}


def _event(obj: Obj) -> Obj:
    kept: Obj = {k: obj[k] for k in ("metadata", "involvedObject", "reason", "message", "type", "count", "source",
                                     "reportingComponent", "firstTimestamp", "lastTimestamp", "eventTime") if k in obj}  # fmt: skip
    return {**kept, **{k: clipped(k, kept[k]) for k in ("reason", "message") if k in kept}}  # the provider's sizes


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _origin(obj: Obj | None) -> tuple[str, str] | None:
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    namespace, name = annotations.get(ORIGIN_NAMESPACE), annotations.get(ORIGIN_NAME)
    return (namespace, name) if namespace and name else None


class VirtualKubelet:
    def __init__(self, config: Config) -> None:
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
        self._runtime = metrics_runtime(config.metrics_port)
        self._metrics = Metrics(self._runtime.metric_meter if self._runtime else MetricMeter.noop)

        # Reflection: set while the Advertisement is Accepted and the provider answers; workers drop keys
        # while it is clear, and every key is queued again when it is set.
        self._reflecting = threading.Event()
        self._resynced_at = self._secrets_read_at = 0.0
        self._synced_kinds: tuple[bool, ...] = ()  # which of (pods and config, Services, Events) have listed
        self._pod_cidrs: tuple[str | None, str | None] = (None, None)  # (the provider's, as remapped here)
        self._index_lock = threading.Lock()
        self._refs: dict[ConfigKey, set[PodKey]] = {}  # which pods use each ConfigMap and Secret
        self._pods_in: Counter[str] = Counter()  # pods per consumer namespace: its Services are reflected
        self._events_reflected = ReflectedEvents()
        # What the provider reports is bounded per consumer pod (forgotten when the pod goes): Events reflected
        # (models/pods.py: EventBudget), and Warnings about addresses outside its PodCIDR.
        self._event_budget: EventBudget[PodKey] = EventBudget()
        self._foreign_ip_warnings: Throttle[PodKey] = Throttle(FOREIGN_IP_WARNING_SECONDS)
        self.pods: Store[PodKey, Obj] = Store(_key, self._pod_changed)
        self.copies: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._copy_changed)
        self.config_maps: Store[PodKey, Obj] = Store(_key, self._config_map_changed)
        self.config_copies = {kind: Store(lambda o: o["metadata"]["name"], self._config_copy_changed(kind))
                              for kind in CONFIG_KINDS}  # fmt: skip
        self.services: Store[PodKey, Obj] = Store(_key, lambda key, _old, _new: self.service_queue.add(key))
        self.service_copies: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._service_copy_changed)
        self.events: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._event_changed)
        self.pod_queue: WorkQueue[PodKey] = WorkQueue("pods", self._reconcile_pod, workers=config.pod_workers)
        self.config_queue: WorkQueue[ConfigKey] = WorkQueue("config", self._reconcile_config,
                                                            workers=config.config_workers)  # fmt: skip
        self.service_queue: WorkQueue[PodKey] = WorkQueue("services", self._reconcile_service,
                                                          workers=config.service_workers)  # fmt: skip
        self.event_queue: WorkQueue[str] = WorkQueue("events", self._reconcile_event, workers=config.event_workers)

        mine = copies_selector(config.consumer_id)
        remote_ns = {"namespace": self.remote_namespace}
        self._informers: list[Informer[Any]] = [
            self._informer("vk-consumer-pods", self.pods, self.core.list_pod_for_all_namespaces, _consumer_pod,
                           field_selector=f"spec.nodeName={self.node}"),
            self._informer("vk-provider-pods", self.copies, self.remote.list_namespaced_pod, _provider_pod,
                           label_selector=mine, **remote_ns),
            self._informer("vk-consumer-configmaps", self.config_maps, self.core.list_config_map_for_all_namespaces,
                           _version_only),
            self._informer("vk-provider-configmaps", self.config_copies["ConfigMap"],
                           self.remote.list_namespaced_config_map, _provider_copy, label_selector=mine, **remote_ns),
            self._informer("vk-provider-secrets", self.config_copies["Secret"], self.remote.list_namespaced_secret,
                           _provider_copy, label_selector=mine, **remote_ns),
            # Its own node: one deleted by hand is registered again at once (its pods would otherwise be
            # garbage-collected as orphans before the next periodic status report).
            Informer("vk-node", self.core.list_node, field_selector=f"metadata.name={self.node}",
                     on_sync=self._node_listed, on_event=self._node_event),
        ]  # fmt: skip
        # Pods wait for none of these: a provider whose tidepool is older may not let this one list Events,
        # and its Services and Events follow as soon as their own informers have listed.
        self._service_informers = [
            self._informer("vk-consumer-services", self.services, self.core.list_service_for_all_namespaces, _service),
            self._informer("vk-provider-services", self.service_copies, self.remote.list_namespaced_service,
                           _provider_copy, label_selector=mine, **remote_ns),
        ] if config.service_workers else []  # fmt: skip
        self._event_informers = [
            self._informer("vk-provider-events", self.events, self.remote.list_namespaced_event, _event,
                           field_selector="involvedObject.kind=Pod", **remote_ns),
        ] if config.event_workers else []  # fmt: skip
        self._config_apis = {kind: _ConfigApi(self.core, self.remote, kind) for kind in CONFIG_KINDS}
        self._queues: list[WorkQueue[Any]] = [self.pod_queue, self.config_queue, self.service_queue, self.event_queue]
        # The kubelet API (kubectl logs, exec, attach, port-forward), where the node says it is.
        self._kubelet_api = KubeletApi(host=config.node_ip, port=config.kubelet_port, provider=self.provider,
                                       remote_namespace=self.remote_namespace, consumer=self.consumer,
                                       node_name=self.node) if config.node_ip and config.kubelet_port else None  # fmt: skip

    @staticmethod
    def _informer(name: str, store: Store[Any, Obj], list_call: Any, transform: Any, **kwargs: Any) -> Informer[Obj]:
        return Informer(name, list_call, on_sync=store.sync, on_event=store.event, transform=transform, **kwargs)

    def _node_listed(self, nodes: list[dict[str, Any]]) -> None:
        if not nodes:
            self._node_event("DELETED", {})

    def _node_event(self, kind: str, _node: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._node_missing = True
            self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> int:
        for informer in [*self._informers, *self._service_informers, *self._event_informers]:
            informer.start()
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
            for informer in [*self._informers, *self._service_informers, *self._event_informers]:
                informer.stop()

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
        state = tuple(all(i.wait_synced(0) for i in informers)
                      for informers in (self._informers, self._service_informers, self._event_informers))  # fmt: skip
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
        self._metrics.reflected_pods(provider=self.config.provider_id, count=sum(
            1 for key in self.pods.keys() if self.copies.get(reflected_name(*key)) is not None))  # fmt: skip
        return False

    def _resync(self) -> None:
        self._resynced_at = time.monotonic()
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
        now = _now()
        if self._ready_since is None or self._ready_since[:2] != (ready, reason):
            existing = ignore_not_found(self.core.read_node, self.node)
            conditions = (existing.status.conditions if existing and existing.status else None) or []
            old = next((c for c in conditions if c.type == "Ready"), None)
            kept = old.last_transition_time if old and (old.status == "True") == ready and old.reason == reason else None
            since = kept.strftime("%Y-%m-%dT%H:%M:%SZ") if kept else now
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
                if e.status != 409:
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
            started - self._lease_renewed_at < LEASE_RENEW_SECONDS - LEASE_RENEW_SLACK_SECONDS
        ):
            return  # a pass woken early by a pod event: the Lease is fresh enough
        renew_lease(self.consumer, "kube-node-lease", self.node, holder=self.node, duration_seconds=LEASE_SECONDS)
        self._lease_renewed_at = started

    def _renew_keepalive(self) -> None:
        if self._keepalive_renewed_at is not None and (
            time.monotonic() - self._keepalive_renewed_at < KEEPALIVE_RENEW_SECONDS - LEASE_RENEW_SLACK_SECONDS
        ):
            return
        try:
            renew_keepalive(self.provider, self.remote_namespace, holder=self.config.consumer_id)
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
            namespace_changed, first_or_last = (old is None) != (new is None), False
            if namespace_changed:
                self._pods_in[key[0]] += 1 if new is not None else -1
                first_or_last = self._pods_in[key[0]] in (0, 1)
                if self._pods_in[key[0]] <= 0:
                    del self._pods_in[key[0]]
        self.config_queue.add_all(before ^ after)
        if namespace_changed and first_or_last and self.config.service_workers:
            self.service_queue.add_all([k for k in self.services.keys() if k[0] == key[0]])
        self.pod_queue.add(key)

    @staticmethod
    def _references(namespace: str, pod: Obj | None) -> set[ConfigKey]:
        return {(kind, namespace, name) for kind, name in (pod or {}).get("uses") or []}

    def _copy_changed(self, _name: str, old: Obj | None, new: Obj | None) -> None:
        if (origin := _origin(new or old)) is not None:
            self.pod_queue.add(origin)

    def _config_map_changed(self, key: PodKey, _old: Obj | None, _new: Obj | None) -> None:
        with self._index_lock:
            used = ("ConfigMap", *key) in self._refs
        if used:  # the cluster's other ConfigMaps are none of ours
            self.config_queue.add(("ConfigMap", *key))

    def _config_copy_changed(self, kind: ConfigKind) -> Any:
        def changed(_name: str, old: Obj | None, new: Obj | None) -> None:
            if (origin := _origin(new or old)) is not None:
                self.config_queue.add((kind, *origin))
        return changed

    def _event_changed(self, name: str, _old: Obj | None, new: Obj | None) -> None:
        if new is not None:  # an Event that expires in the provider stays in the consumer until it expires there
            self.event_queue.add(name)

    def _service_copy_changed(self, _name: str, old: Obj | None, new: Obj | None) -> None:
        if (origin := _origin(new or old)) is not None:
            self.service_queue.add(origin)

    # Pods ---------------------------------------------------------------------------------------------
    def _reconcile_pod(self, key: PodKey) -> None:
        if not self._reflecting.is_set():
            return  # queued again, all of them, when reflection resumes
        pod, copy = self.pods.get(key), self.copies.get(reflected_name(*key))
        if pod is None:  # the consumer pod is gone: so goes its copy
            self._event_budget.forget(key)
            self._foreign_ip_warnings.forget(key)
            if copy is not None:
                self._delete_remote(self.remote.delete_namespaced_pod, copy)
            return
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            if copy is not None:
                self._delete_remote(self.remote.delete_namespaced_pod, copy)
            else:  # the provider side is gone: finish the deletion, as a kubelet would
                ignore_not_found(self.core.delete_namespaced_pod, meta["name"], meta["namespace"], grace_period_seconds=0)
            return
        if copy is not None and (copy["metadata"].get("annotations") or {}).get(ORIGIN_UID) != meta["uid"]:
            self._delete_remote(self.remote.delete_namespaced_pod, copy)  # an earlier pod's of the same name
            return
        if copy is None:
            self._copy_missing(pod)
            return
        labels = copy_labels(consumer_id=self.config.consumer_id, namespace=key[0], labels=meta.get("labels"))
        have = copy["metadata"].get("labels") or {}
        if have != labels:  # the consumer's labels changed (Services select by them), or an older copy's
            self.remote.patch_namespaced_pod(copy["metadata"]["name"], self.remote_namespace, {"metadata": {
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

    def _copy_missing(self, pod: Obj) -> None:
        meta = pod["metadata"]
        if _status(pod).get("phase") in ("Succeeded", "Failed"):
            return  # done: nothing runs again
        never_restarts = when_copy_lost(pod["restartPolicy"]) == "fail"
        if not never_restarts:  # first or lost: a pod that restarts gets a copy either way
            self._create_copy(pod, mark=False)
            return
        # A pod that never restarts is marked once its copy is made, so that a lost copy fails it.
        if not (meta.get("annotations") or {}).get(REFLECTED_ANNOTATION):
            self._create_copy(pod, mark=True)
            return
        # The cache may lag behind a copy just made: only the provider's word says it is gone.
        name = reflected_name(meta["namespace"], meta["name"])
        if ignore_not_found(self.remote.read_namespaced_pod, name, self.remote_namespace) is None:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {
                "phase": "Failed", "reason": "ProviderPodDeleted", "message": "the pod was deleted in the provider cluster"}})  # fmt: skip

    def _create_copy(self, pod: Obj, *, mark: bool) -> None:
        meta = pod["metadata"]
        namespace = meta["namespace"]
        for ref in self._references(namespace, pod):  # what it mounts must be there before it starts
            self._reconcile_config(ref)
        body = pod_copy({**pod, "spec": json.loads(pod["spec"])}, consumer_id=self.config.consumer_id)
        try:
            created: Any = self.remote.create_namespaced_pod(self.remote_namespace, k8s.V1Pod.model_validate(body),
                                                             _preload_content=False)  # fmt: skip
            self.copies.add_if_absent(body["metadata"]["name"], _provider_pod(raw_json(created)))
        except ApiException as e:
            if (refused := refusal(e.status, e.body)) is not None:
                self._refused(pod, refused)
                return
            if e.status != 409:  # already there (a pass before a crash made it): the next pass adopts it
                raise
        if condition_of(_status(pod), POD_PROVIDER_CONDITION) is not None:  # refused before: no longer
            self.core.patch_namespaced_pod_status(meta["name"], namespace, {"status": {"conditions": [
                {"$patch": "delete", "type": POD_PROVIDER_CONDITION}]}})  # fmt: skip
        if mark:
            self.core.patch_namespaced_pod(meta["name"], namespace,
                                           {"metadata": {"annotations": {REFLECTED_ANNOTATION: "true"}}})  # fmt: skip
        log.info("pod %s/%s runs in provider %s", namespace, meta["name"], self.config.provider_id)

    def _refused(self, pod: Obj, refused: Refusal) -> None:
        """The provider's API server refused the pod's copy: the pod says why (a condition, and a Warning Event
        when what it says changes). A final refusal (Pod Security, an admission policy) fails the pod, as a
        kubelet fails a pod it rejects at admission; a quota refusal leaves it Pending, and is tried again
        after the work queue's backoff (doubling to a minute), not at once."""
        meta, status = pod["metadata"], _status(pod)
        message = f"provider {self.config.provider_id} refused the pod: {refused.message}"
        said = condition_of(status, POD_PROVIDER_CONDITION)
        news = said is None or said.get("status") != "False" or said.get("message") != message
        written = with_condition(condition(POD_PROVIDER_CONDITION, False, "ProviderRefused", message),
                                 [said] if said else [])  # fmt: skip
        patch: Obj = {"conditions": written}
        if refused.final:
            patch.update(phase="Failed", reason="ProviderRefused", message=message)
        if news or refused.final:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": patch})
        if news:
            record_event(self.consumer, {"apiVersion": "v1", "kind": "Pod", "metadata": meta}, reason="ProviderRefused",
                         message=message, warning=True)  # fmt: skip
            log.warning("pod %s/%s: %s", meta["namespace"], meta["name"], message)
        if not refused.final:
            raise ProviderRefusedPod(message)

    # ConfigMaps and Secrets ---------------------------------------------------------------------------
    def _reconcile_config(self, key: ConfigKey) -> None:
        """A ConfigMap or Secret an offloaded pod uses has a copy made from its current version; one no pod
        uses any more, or deleted in the consumer, has none (pods running there keep what they mounted)."""
        if not self._reflecting.is_set():
            return
        kind, namespace, name = key
        with self._index_lock:
            used = key in self._refs
        copy = self.config_copies[kind].get(reflected_name(namespace, name))
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
        self._write_remote(api.create, api.replace, api.read_copy, body, exists=copy is not None)
        self.config_copies[kind].add_if_absent(body["metadata"]["name"], _provider_copy(body))

    # Services -----------------------------------------------------------------------------------------
    def _reconcile_service(self, key: PodKey) -> None:
        if not (self._reflecting.is_set() and all(i.wait_synced(0) for i in self._service_informers)):
            return  # every Service is queued again once both sides have listed
        with self._index_lock:
            offloaded = self._pods_in.get(key[0], 0) > 0
        service, copy = self.services.get(key), self.service_copies.get(reflected_name(*key))
        desired = service_copy(service, consumer_id=self.config.consumer_id) if service and offloaded else None
        if desired is None:
            if copy is not None:
                self._delete_remote(self.remote.delete_namespaced_service, copy)
            return
        digest = desired["metadata"]["annotations"][SOURCE_DIGEST]
        if copy is None or (copy["metadata"].get("annotations") or {}).get(SOURCE_DIGEST) != digest:
            # A PUT without a resourceVersion: the API server keeps the ClusterIP it allocated.
            self._write_remote(self.remote.create_namespaced_service, self.remote.replace_namespaced_service,
                               self.remote.read_namespaced_service, desired, exists=copy is not None)  # fmt: skip
            self.service_copies.add_if_absent(desired["metadata"]["name"], _provider_copy(desired))

    # Events -------------------------------------------------------------------------------------------
    def _reconcile_event(self, name: str) -> None:
        """An Event about a pod's copy becomes an Event on the pod, once per change of the source Event."""
        if not self._reflecting.is_set():
            return
        event = self.events.get(name)
        if event is None or event.get("reason") in UNREFLECTED_EVENT_REASONS or not self._events_reflected.is_new(event):
            return
        origin = _origin(self.copies.get((event.get("involvedObject") or {}).get("name") or ""))
        pod = self.pods.get(origin) if origin else None
        if origin is None or pod is None:
            return  # not a copy of ours, or its pod is gone
        labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: self.config.provider_id}
        now = time.monotonic()
        if self._event_budget.take(origin, now=now):
            self._write_event(event_for_origin(event, pod, labels=labels))
        elif self._event_budget.summary_due(origin, now=now):
            self._write_event(dropped_events_event(pod, dropped=self._event_budget.dropped(origin), labels=labels,
                                                   source=f"provider {self.config.provider_id}", now=_now()))  # fmt: skip
        self._events_reflected.remember(event)  # a dropped one too: the budget is spent, not deferred

    def _write_event(self, body: Obj) -> None:
        """Written again (a restarted virtual kubelet, a source Event that happened again), it updates."""
        namespace = body["metadata"]["namespace"]
        try:
            self.core.create_namespaced_event(namespace, k8s.CoreV1Event.model_validate(body))
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.patch_namespaced_event(body["metadata"]["name"], namespace,
                                             {k: body[k] for k in ("count", "message", "lastTimestamp") if k in body})  # fmt: skip

    # Writes in the provider that never touch what is not ours -----------------------------------------
    def _write_remote(self, create: Any, replace: Any, read: Any, body: Obj, *, exists: bool) -> None:
        name = body["metadata"]["name"]
        if exists:
            replace(name, self.remote_namespace, body)
            return
        try:
            create(self.remote_namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise
            current = read(name, self.remote_namespace)
            labels = (current.metadata.labels if current.metadata else None) or {}
            if labels.get(LABEL_CONSUMER) != self.config.consumer_id:
                log.warning("%s %s/%s exists in the provider and is not ours: left alone", body["kind"],
                            self.remote_namespace, name)  # fmt: skip
                return
            replace(name, self.remote_namespace, body)

    def _delete_remote(self, delete: Any, copy: Obj) -> None:
        if not copy["metadata"].get("deletionTimestamp"):
            ignore_not_found(delete, copy["metadata"]["name"], self.remote_namespace)

    # Teardown -----------------------------------------------------------------------------------------
    def _teardown(self, advertisement: dict[str, Any] | None) -> bool:
        """Seed 000's order: the node goes first (the consumer's workflow deletes it); then everything
        this virtual kubelet made in the provider goes; then it says so on its Deployment."""
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
                # The provider withdrew first: it revoked these credentials and removed the namespace.
                return self._report_clean()
            # Refused without a withdrawal (expired or revoked credentials): the copies may still run there.
            log.warning("teardown: the provider refuses our credentials (%s) and did not withdraw: its namespace "
                        "is not known to be clean", e.status)  # fmt: skip
            return False
        going = delete_copies(self.remote, self.remote_namespace, self.config.consumer_id, now=datetime.now(UTC)).going
        if going:
            log.info("teardown: %d pods still going in the provider", going)
            return False
        drop_keepalive(self.provider, self.remote_namespace)
        return self._report_clean()

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
    vk = VirtualKubelet(Config.from_env())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: vk.stop())
    return vk.run()


if __name__ == "__main__":
    sys.exit(main())

