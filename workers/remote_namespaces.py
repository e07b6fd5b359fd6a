"""The provider's RemoteNamespace controller (issue 35): a consumer asks for a namespace of its own by creating a
RemoteNamespace in its control namespace `tidepool-foreign-<consumer>`; this makes it (or refuses it, saying
why in the status), and deletes it when the request goes. Run by the leading replica beside the provider's
watchers (workers/provider.py); decisions in models/remote_namespaces.py, calls in activities/remote_namespaces.py.

Level-triggered, as the virtual kubelet's reflection: informers feed stores, stores feed work queues of keys,
handlers re-read what they decide on. Four informers:
- RemoteNamespaces in every namespace; only those in a consumer's control namespace count, and only for a
  consumer with a PeeringRequest here (a deleting one is still released, whoever asked);
- the namespaces tidepool made for consumers (labels): the control namespace carries the Pod Security level
  every remote namespace copies, and a remote namespace's deletion releases its request's finalizer;
- the consumers' offer quotas: a usage that moves splits that consumer's offer again (models/enforcement.py);
- PeeringRequests: which consumers count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from activities.remote_namespaces import (
    delete_namespace,
    ensure_remote_namespace,
    patch_remote_namespace,
    read_namespace,
    split_consumer_offer,
)
from kube.informer import Informer, Obj, Store
from kube.objects import finalizers_after
from kube.status import CustomObjectStatus, write_status
from kube.workqueue import WorkQueue, namespace_of
from models.api.conditions import RemoteNamespaceReadyReason, condition
from models.api.offloading import RemoteNamespacePhase
from models.enforcement import QUOTA_NAME
from models.names import (
    GROUP,
    LABEL_CONSUMER,
    MADE_FOR_CONSUMERS_SELECTOR,
    PEERING_REQUESTS,
    REMOTE_NAMESPACE_FINALIZER,
    REMOTE_NAMESPACES,
    VERSION,
    foreign_cluster_of_namespace,
    foreign_namespace,
)
from models.remote_namespaces import owned_by, pod_security_level, refusal

log = logging.getLogger(__name__)

RequestKey = tuple[str, str]  # (control namespace, name)
# Few: a request is a handful of calls, and a consumer asks for a namespace per offloaded namespace.
REQUEST_WORKERS = 2
SPLIT_WORKERS = 1


def _request_key(obj: Obj) -> RequestKey | None:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    return (namespace, meta["name"]) if foreign_cluster_of_namespace(namespace) else None  # elsewhere: ignored


def _request(obj: Obj) -> Obj:
    """What a decision reads: no resourceVersion or managed fields, so that only a change of these wakes it."""
    meta = obj.get("metadata") or {}
    kept = {
        k: meta[k] for k in ("name", "namespace", "uid", "generation", "deletionTimestamp", "finalizers") if k in meta
    }
    return {"metadata": kept, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


def _namespace(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {"name": meta.get("name"), "labels": meta.get("labels") or {},
            "deleting": bool(meta.get("deletionTimestamp"))}  # fmt: skip


def _quota(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {"namespace": meta.get("namespace"), "consumer": (meta.get("labels") or {}).get(LABEL_CONSUMER),
            "used": (obj.get("status") or {}).get("used") or {}}  # fmt: skip


def _peering_request(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    consumer = ((obj.get("spec") or {}).get("clusterIdentity") or {}).get("clusterId")
    return {"name": meta.get("name"), "consumer": consumer, "live": not meta.get("deletionTimestamp")}


class RemoteNamespaces:
    def __init__(self, home: k8s.ApiClient) -> None:
        self._home = home
        self._status = CustomObjectStatus(home, REMOTE_NAMESPACES)
        core, custom = k8s.CoreV1Api(home), k8s.CustomObjectsApi(home)
        self.requests: Store[RequestKey, Obj] = Store(_request_key, self._request_changed)
        self.namespaces: Store[str, Obj] = Store(lambda o: o["name"], self._namespace_changed)
        self.quotas: Store[str, Obj] = Store(lambda o: o["namespace"], self._quota_changed)
        self.peerings: Store[str, Obj] = Store(lambda o: o["name"], self._peering_changed)
        self.request_queue: WorkQueue[RequestKey] = WorkQueue("remote-namespaces", self._reconcile,
                                                              workers=REQUEST_WORKERS, owner=namespace_of)  # fmt: skip
        self.split_queue: WorkQueue[str] = WorkQueue("offer-split", self._split, workers=SPLIT_WORKERS)
        # What a request's answer reads besides the request: until both are listed, no answer is given (a Pending
        # said at each start-up for want of a list would flap every request's status). Their first list brings
        # every request concerned back.
        self._listed_kinds: set[str] = set()
        self._informers: list[Informer[Any]] = [
            Informer("remotenamespaces", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=REMOTE_NAMESPACES, on_sync=self.requests.sync, on_event=self.requests.event,
                     transform=_request),
            Informer("consumer-namespaces", core.list_namespace, label_selector=MADE_FOR_CONSUMERS_SELECTOR,
                     on_sync=self._listed("namespaces", self.namespaces), on_event=self.namespaces.event,
                     transform=_namespace),
            Informer("consumer-quotas", core.list_resource_quota_for_all_namespaces,
                     label_selector=MADE_FOR_CONSUMERS_SELECTOR, field_selector=f"metadata.name={QUOTA_NAME}",
                     on_sync=self.quotas.sync, on_event=self.quotas.event, transform=_quota),
            Informer("remote-namespace-peerings", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=PEERING_REQUESTS, on_sync=self._listed("peerings", self.peerings),
                     on_event=self.peerings.event, transform=_peering_request),
        ]  # fmt: skip

    def start(self) -> RemoteNamespaces:
        self.request_queue.start()
        self.split_queue.start()
        for informer in self._informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()
        self.request_queue.stop()
        self.split_queue.stop()

    def _listed(self, kind: str, store: Store[str, Obj]) -> Callable[[list[Obj]], None]:
        def sync(objects: list[Obj]) -> None:
            self._listed_kinds.add(kind)  # before the store's callbacks, which bring the requests back
            store.sync(objects)

        return sync

    # What wakes whom --------------------------------------------------------------------------------------
    def _request_changed(self, key: RequestKey, old: Obj | None, new: Obj | None) -> None:
        # Its status is this controller's own answer: writing it wakes nothing.
        if old is None or new is None or {**old, "status": None} != {**new, "status": None}:
            self.request_queue.add(key)

    def _requests_of(self, consumer: str) -> None:
        control = foreign_namespace(consumer)
        self.request_queue.add_all([key for key in self.requests.keys() if key[0] == control])

    def _namespace_changed(self, name: str, old: Obj | None, new: Obj | None) -> None:
        consumer = ((new or old or {}).get("labels") or {}).get(LABEL_CONSUMER)
        if not consumer:
            return
        if name == foreign_namespace(consumer):  # its Pod Security level, or made at last: every request of it
            self._requests_of(consumer)
        else:
            self.request_queue.add((foreign_namespace(consumer), name))

    def _quota_changed(self, _namespace: str, old: Obj | None, new: Obj | None) -> None:
        consumer = (new or old or {}).get("consumer")
        if consumer and (old is None or new is None or old["used"] != new["used"]):
            self.split_queue.add(consumer)

    def _peering_changed(self, _name: str, old: Obj | None, new: Obj | None) -> None:
        for obj in (old, new):
            if obj is not None and obj.get("consumer"):
                self._requests_of(obj["consumer"])

    def _peered(self, consumer: str) -> bool:
        return any(p["consumer"] == consumer and p["live"] for p in self.peerings.values())

    # Handlers ----------------------------------------------------------------------------------------------
    def _split(self, consumer: str) -> None:
        split_consumer_offer(self._home, consumer, offered=None)

    def _reconcile(self, key: RequestKey) -> None:
        obj = self.requests.get(key)
        control, name = key
        consumer = foreign_cluster_of_namespace(control)
        if obj is None or consumer is None:
            return  # gone: its namespace went before its finalizer was released
        if self._listed_kinds != {"namespaces", "peerings"}:
            return  # their first list brings it back
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            self._release(obj, consumer)
            return
        if not self._peered(consumer):
            return  # not (or no longer) a consumer of this cluster: its withdrawal deletes the control namespace
        consumer_namespace = str(obj["spec"].get("consumerNamespace") or "")
        existing = read_namespace(self._home, name)
        labels = existing.metadata.labels if existing is not None and existing.metadata is not None else None
        refused = refusal(name, consumer=consumer, existing_labels=labels, exists=existing is not None)
        if refused is not None:
            self._answer(obj, "Refused", refused.reason, refused.message)
            return
        if existing is not None and existing.metadata is not None and existing.metadata.deletion_timestamp:
            self._answer(
                obj, "Pending", "Pending", f"namespace {name} is still being deleted: it is made again once gone"
            )
            return  # its deletion's event brings the request back
        level = pod_security_level((self.namespaces.get(control) or {}).get("labels"))
        if level is None:
            self._answer(obj, "Pending", "Pending", f"namespace {control} has no Pod Security level yet (no push)")
            return  # the push that labels it brings the request back
        self._hold(obj)
        ensure_remote_namespace(self._home, consumer=consumer, name=name, consumer_namespace=consumer_namespace,
                                level=level)  # fmt: skip
        self._answer(
            obj, "Ready", "Created", f"namespace {name} is ready for {consumer}'s namespace {consumer_namespace}"
        )

    def _release(self, obj: Obj, consumer: str) -> None:
        """A request going: the namespace made for it first (its pods end gracefully with it), then the finalizer."""
        meta = obj["metadata"]
        if REMOTE_NAMESPACE_FINALIZER not in (meta.get("finalizers") or []):
            return
        name = meta["name"]
        existing = read_namespace(self._home, name)
        if existing is not None and existing.metadata is not None and owned_by(existing.metadata.labels, consumer):
            if not existing.metadata.deletion_timestamp:
                delete_namespace(self._home, name)
            self._answer(obj, "Deleting", "Deleting", f"namespace {name} is being deleted")
            return  # its deletion's event brings the request back
        finalizers = finalizers_after(meta.get("finalizers"), REMOTE_NAMESPACE_FINALIZER, present=False)
        patch_remote_namespace(self._home, meta["namespace"], name, {"metadata": {"finalizers": finalizers}})

    def _hold(self, obj: Obj) -> None:
        """The finalizer before the namespace: a request deleted meanwhile still has its namespace deleted."""
        meta = obj["metadata"]
        finalizers = finalizers_after(meta.get("finalizers"), REMOTE_NAMESPACE_FINALIZER, present=True)
        if finalizers is not None:
            patch_remote_namespace(
                self._home, meta["namespace"], meta["name"], {"metadata": {"finalizers": finalizers}}
            )

    def _answer(self, obj: Obj, phase: RemoteNamespacePhase, reason: RemoteNamespaceReadyReason, message: str) -> None:
        """The status, written only when it says something new (each write is an event for the consumer)."""
        write_status(self._status, obj, fields={"phase": phase, "message": message},
                     conditions=[condition("Ready", phase == "Ready", reason, message)])
