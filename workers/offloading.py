"""The consumer's offloading controller (issue 35): for each NamespaceOffloading, run by the leading replica
of the consumer's worker beside its other watchers (workers/consumer.py).

- It holds the object with the finalizer tidepool.io/drain and mirrors spec.podOffloadingStrategy into the
  namespace's label tidepool.io/offloading, which the consumer's admission policies read
  (deploy/base/consumer-offloading.yaml); the label goes when the object is being deleted or is gone.
- It writes Ready from the virtual nodes the clusterSelector selects and the status.clusters entries their
  virtual kubelets write (models/offloading.py: ready_condition).
- On deletion it drains (models/offloading.py: drain): the label first (no new pod binds to a virtual node),
  then every pod of the namespace on a virtual node is deleted gracefully (its controller recreates it at
  home); the finalizer goes once none is left and every virtual kubelet removed its entry. Meanwhile Ready is
  False DrainBlocked, naming what it waits for.

Informers and one work queue keyed by namespace, as the virtual kubelet's reflection (workers/
virtual_kubelet.py): an event carries only the namespace, the handler re-reads the stores. Pods are watched
cluster-wide but kept only when on a virtual node, reduced to what the drain reads, so that neither a pod's
status nor a pod elsewhere wakes anything.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client as k8s
from pydantic import ValidationError

from kube.informer import Informer, Store
from kube.objects import finalizers_after, ignore_not_found
from kube.status import CustomObjectStatus, write_status
from kube.workqueue import WorkQueue
from models.api.conditions import ConditionValue
from models.api.offloading import NamespaceOffloading
from models.names import (
    GROUP,
    LABEL_NODE_TYPE,
    LABEL_OFFLOADING,
    LABEL_PROVIDER,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    OFFLOADING_FINALIZER,
    VERSION,
    VIRTUAL_NODE_TYPE,
)
from models.offloading import drain, namespace_label, on_virtual_node, ready_condition, selected_providers

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# Namespaces are independent: a few at a time, so that one slow drain does not hold the others.
WORKERS = 2


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _offloading_key(obj: Obj) -> str | None:
    """One per namespace, by name (the CRD refuses any other name; an older object is ignored)."""
    meta = _meta(obj)
    return meta.get("namespace") if meta.get("name") == NAMESPACE_OFFLOADING_NAME else None


def _pod(obj: Obj) -> Obj:
    """What the drain reads of a pod: where it is bound and whether it is terminating."""
    meta, spec = _meta(obj), obj.get("spec") or {}
    return {"metadata": {"namespace": meta.get("namespace"), "name": meta.get("name"),
                         "terminating": bool(meta.get("deletionTimestamp"))},
            "spec": {"nodeName": spec.get("nodeName")}}  # fmt: skip


def _pod_key(obj: Obj) -> tuple[str, str] | None:
    meta = _meta(obj)
    return (meta["namespace"], meta["name"]) if on_virtual_node((obj.get("spec") or {}).get("nodeName")) else None


def _node(obj: Obj) -> Obj:
    return {"metadata": {"name": _meta(obj).get("name"), "labels": _meta(obj).get("labels") or {}}}


def _namespace(obj: Obj) -> Obj:
    return {"metadata": {"name": _meta(obj).get("name"), "labels": _meta(obj).get("labels") or {}}}


class OffloadingController:
    def __init__(self, home: k8s.ApiClient, *, workers: int = WORKERS) -> None:
        self.custom, self.core = k8s.CustomObjectsApi(home), k8s.CoreV1Api(home)
        self._status = CustomObjectStatus(home, NAMESPACE_OFFLOADINGS, missing_ok=True)
        self.queue: WorkQueue[str] = WorkQueue("offloading", self._reconcile, workers=workers)
        self.offloadings: Store[str, Obj] = Store(_offloading_key, lambda ns, _old, _new: self.queue.add(ns))
        # Virtual nodes and labelled namespaces are few; any change of one may change any namespace's answer.
        self.nodes: Store[str, Obj] = Store(lambda o: _meta(o).get("name"), lambda *_: self._all())
        self.namespaces: Store[str, Obj] = Store(lambda o: _meta(o).get("name"), lambda ns, _old, _new: self.queue.add(ns))
        self.pods: Store[tuple[str, str], Obj] = Store(_pod_key, lambda key, _old, _new: self._pod_changed(key[0]))
        self._informers: list[Informer[Obj]] = [
            Informer("offloadings", self.custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=NAMESPACE_OFFLOADINGS, on_sync=self.offloadings.sync, on_event=self.offloadings.event),
            Informer("offloading-nodes", self.core.list_node, label_selector=f"{LABEL_NODE_TYPE}={VIRTUAL_NODE_TYPE}",
                     on_sync=self.nodes.sync, on_event=self.nodes.event, transform=_node),
            # Namespaces that carry the label: one left behind (its NamespaceOffloading gone while no worker
            # ran, its finalizer removed by hand) loses it.
            Informer("offloading-namespaces", self.core.list_namespace, label_selector=LABEL_OFFLOADING,
                     on_sync=self.namespaces.sync, on_event=self.namespaces.event, transform=_namespace),
            Informer("offloading-pods", self.core.list_pod_for_all_namespaces, on_sync=self.pods.sync,
                     on_event=self.pods.event, transform=_pod),
        ]  # fmt: skip

    def start(self) -> OffloadingController:
        self.queue.start()
        for informer in self._informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()
        self.queue.stop()

    def _all(self) -> None:
        self.queue.add_all(self.offloadings.keys())

    def _pod_changed(self, namespace: str) -> None:
        if self.offloadings.get(namespace) is not None:
            self.queue.add(namespace)

    # One namespace ---------------------------------------------------------------------------------------
    def _reconcile(self, namespace: str) -> None:
        obj = self.offloadings.get(namespace)
        try:
            offloading = NamespaceOffloading.from_kubernetes(obj) if obj is not None else None
        except ValidationError as e:  # the CRD's schema holds it; an older version's object may not
            log.warning("NamespaceOffloading %s/%s is not valid, left alone: %s", namespace, NAMESPACE_OFFLOADING_NAME, e)
            return
        self._label(namespace, namespace_label(offloading))
        if offloading is None or obj is None:
            return
        if offloading.metadata.deletion_timestamp is not None:
            self._drain(namespace, offloading)
            return
        added = finalizers_after(offloading.metadata.finalizers, OFFLOADING_FINALIZER, present=True)
        if added is not None:
            self._patch(namespace, {"metadata": {"finalizers": added,
                                                 "resourceVersion": offloading.metadata.resource_version}})  # fmt: skip
        providers = {(_meta(n)["labels"]).get(LABEL_PROVIDER, ""): _meta(n)["labels"] for n in self.nodes.values()}
        providers.pop("", None)
        selected = selected_providers(offloading.spec.cluster_selector, providers)
        status = offloading.status
        self._condition(obj, ready_condition(status.clusters if status else [], selected))

    def _drain(self, namespace: str, offloading: NamespaceOffloading) -> None:
        if OFFLOADING_FINALIZER not in offloading.metadata.finalizers:
            return  # not ours to hold
        pods = {key[1]: bool(_meta(pod)["terminating"]) for key in self.pods.keys() if key[0] == namespace
                and (pod := self.pods.get(key)) is not None}  # fmt: skip
        step = drain(pods=pods, clusters=offloading.status.clusters if offloading.status else [])
        for name in step.delete:  # the default grace period: the virtual kubelet deletes the copy first
            ignore_not_found(self.core.delete_namespaced_pod, name, namespace)
        if step.done:
            kept = finalizers_after(offloading.metadata.finalizers, OFFLOADING_FINALIZER, present=False)
            self._patch(namespace, {"metadata": {"finalizers": kept,
                                                 "resourceVersion": offloading.metadata.resource_version}})  # fmt: skip
            log.info("namespace %s unoffloaded: drained", namespace)
        elif step.blocked is not None:
            obj = self.offloadings.get(namespace)
            if obj is not None:
                self._condition(obj, step.blocked)

    # Writes ----------------------------------------------------------------------------------------------
    def _label(self, namespace: str, value: str | None) -> None:
        """The namespace's LABEL_OFFLOADING as `value` (None: removed); the namespaces store has every
        labelled one."""
        current = (_meta(self.namespaces.get(namespace) or {}).get("labels") or {}).get(LABEL_OFFLOADING)
        if current == value:
            return
        try:
            self.core.patch_namespace(namespace, {"metadata": {"labels": {LABEL_OFFLOADING: value}}})
        except k8s.ApiException as e:
            if e.status != 404:  # a namespace being deleted with its NamespaceOffloading: nothing to label
                raise

    def _patch(self, namespace: str, patch: Obj) -> None:
        # A merge patch with the resourceVersion: a concurrent change is a 409, and the key is retried.
        ignore_not_found(self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS,
                         NAMESPACE_OFFLOADING_NAME, patch)  # fmt: skip

    def _condition(self, obj: Obj, value: ConditionValue) -> None:
        """Ready as `value`, written only when it says something else (status, reason or message) or the
        generation it answers moved; status.clusters is the virtual kubelets' (server-side apply), not touched."""
        write_status(self._status, obj, fields={"observedGeneration": _meta(obj).get("generation")}, conditions=[value])
