"""The home cluster's capacity, kept current by watching nodes and pods: one aggregate per worker,
shared by every peering, so that a push reads a few totals instead of listing every pod of the cluster
(100,000 pods take 31 s to deserialise with the Kubernetes client). Built by the worker; read by
activities/peering.py, which also records here the spare capacity each push used; its change callback
and `spares` let workers/early_push.py push early when a consumer's offer moves."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from kube.informer import Informer
from models.names import LABEL_CONSUMER, MADE_FOR_CONSUMERS_SELECTOR
from models.resources import Resources
from models.sharing import CapacityAggregate, PodHold, node_fields, pod_hold, spare

SYNC_TIMEOUT_SECONDS = 120


class OfferInputs(NamedTuple):
    allocatable: Resources  # of the physical nodes
    used: Resources  # requests of the pods that count against the offer: every pod but the consumer's own
    consumer_own: Resources  # requests of the consumer's own offloaded pods (left out of `used`)


class HomeCapacity:
    def __init__(self, api: k8s.ApiClient, *, on_change: Callable[[], None] | None = None):
        """`on_change` is called in an informer thread after every node or pod event and relist: it must
        be cheap (mark something dirty), an informer relisting 100,000 pods calls it once per relist but
        a storm of events calls it once per event."""
        core = k8s.CoreV1Api(api)
        self._lock = threading.Lock()
        self._aggregate = CapacityAggregate()
        self._pushed: dict[str, Resources] = {}  # consumer -> the spare capacity its last push used
        self._on_change = on_change
        # Each object is reduced to what the aggregate reads as its page is parsed: memory is the aggregate's
        # plus one page, not the cluster's pods.
        self._nodes = Informer("nodes", core.list_node, on_sync=self._sync_nodes, on_event=self._node_event,
                               transform=node_fields)  # fmt: skip
        self._pods = Informer("pods", core.list_pod_for_all_namespaces, on_sync=self._sync_pods,
                              on_event=self._pod_event, transform=lambda pod: pod_hold(pod, self._made_for))  # fmt: skip
        # The namespaces made for consumers' RemoteNamespaces (issue 35), name -> consumer: a pod there is that
        # consumer's, as one in its control namespace is. Listed before the pods (a namespace exists before
        # its pods do), so that no pod is counted as the provider's own for want of it.
        self._made_for: dict[str, str] = {}
        self._namespaces = Informer("consumer-namespaces", core.list_namespace, on_sync=self._sync_namespaces,
                                    on_event=self._namespace_event, label_selector=MADE_FOR_CONSUMERS_SELECTOR)  # fmt: skip
        self._pods_started = threading.Event()

    def start(self) -> HomeCapacity:
        self._nodes.start()
        self._namespaces.start()  # the pods' informer starts once they are listed
        return self

    def stop(self) -> None:
        self._nodes.stop()
        self._namespaces.stop()
        self._pods.stop()

    def _sync_namespaces(self, namespaces: list[dict[str, Any]]) -> None:
        self._made_for = {name: consumer for ns in namespaces if (name := (ns.get("metadata") or {}).get("name"))
                          and (consumer := ((ns.get("metadata") or {}).get("labels") or {}).get(LABEL_CONSUMER))}  # fmt: skip
        if not self._pods_started.is_set():
            self._pods_started.set()
            self._pods.start()

    def _namespace_event(self, kind: str, namespace: dict[str, Any]) -> None:
        meta = namespace.get("metadata") or {}
        name, consumer = meta.get("name"), (meta.get("labels") or {}).get(LABEL_CONSUMER)
        if not name:
            return
        made_for = dict(self._made_for)  # replaced whole: the pods' informer thread reads it without a lock
        if kind == "DELETED" or not consumer:
            made_for.pop(name, None)
        else:
            made_for[name] = consumer
        self._made_for = made_for

    def snapshot(self, consumer: str) -> OfferInputs:
        """What the offer to `consumer` is computed from, read at one instant."""
        for informer in (self._nodes, self._pods):
            if not informer.wait_synced(SYNC_TIMEOUT_SECONDS):
                raise ApplicationError(f"the home cluster's {informer.name} are not listed yet", type="NotSynced")
        with self._lock:
            aggregate = self._aggregate
            return OfferInputs(aggregate.allocatable(), aggregate.used_for(consumer), aggregate.offloaded_by(consumer))

    def pushed(self, consumer: str, spare_capacity: Resources) -> None:
        """Record the spare capacity (before the percentage) a push to `consumer` advertised: the baseline
        an early push compares with. Called by this replica's pushes and, for every replica's, by the
        leading replica's decision watch, which reads it off the Advertisement."""
        with self._lock:
            self._pushed[consumer] = spare_capacity

    def seed(self, consumer: str, spare_capacity: Resources) -> None:
        """A baseline for a consumer no push of this process has recorded yet (after a restart)."""
        with self._lock:
            self._pushed.setdefault(consumer, spare_capacity)

    def baselines(self) -> dict[str, Resources]:
        """The spare capacity of each consumer's last push seen by this replica, or what was spare when the
        early push watch first saw it (after a restart)."""
        with self._lock:
            return dict(self._pushed)

    def spares(self, consumers: Iterable[str]) -> dict[str, Resources]:
        """The spare capacity of each consumer now; empty while nodes or pods are not listed yet (a partial
        list is no figure to compare)."""
        if not (self._nodes.wait_synced(0) and self._pods.wait_synced(0)):
            return {}
        with self._lock:
            allocatable = self._aggregate.allocatable()
            return {c: spare(allocatable=allocatable, used=self._aggregate.used_for(c)) for c in consumers}

    def _sync_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self._lock:
            self._aggregate.reset_nodes(nodes)
        self._changed()

    def _sync_pods(self, pods: list[PodHold]) -> None:
        with self._lock:
            self._aggregate.reset_holds(pods)
        self._changed()

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        with self._lock:
            self._aggregate.apply_node(kind, node)
        self._changed()

    def _pod_event(self, kind: str, pod: PodHold) -> None:
        with self._lock:
            self._aggregate.apply_hold(kind, pod)
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()
