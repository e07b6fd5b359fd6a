"""The home cluster's capacity, kept current by watching nodes and pods: one aggregate per worker,
shared by every peering, so that a push reads two totals instead of listing every pod of the cluster
(100,000 pods take 31 s to deserialise with the Kubernetes client). Built by the worker; read by
activities/peering.py; its change callback lets the worker push early when allocatable moves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from kube.informer import Informer
from models.resources import Resources
from models.sharing import CapacityAggregate

SYNC_TIMEOUT_SECONDS = 120


class HomeCapacity:
    def __init__(self, api: k8s.ApiClient, *, on_allocatable_change: Callable[[Resources], None] | None = None):
        core = k8s.CoreV1Api(api)
        self._lock = threading.Lock()
        self._aggregate = CapacityAggregate()
        self._on_allocatable_change = on_allocatable_change
        self._nodes = Informer("nodes", core.list_node, on_sync=self._sync_nodes, on_event=self._node_event)
        self._pods = Informer(
            "pods", core.list_pod_for_all_namespaces, on_sync=self._sync_pods, on_event=self._pod_event
        )

    def start(self) -> HomeCapacity:
        self._nodes.start()
        self._pods.start()
        return self

    def stop(self) -> None:
        self._nodes.stop()
        self._pods.stop()

    def snapshot(self) -> tuple[Resources, Resources]:
        """(allocatable of physical nodes, requests of the pods that count against them)."""
        for informer in (self._nodes, self._pods):
            if not informer.wait_synced(SYNC_TIMEOUT_SECONDS):
                raise ApplicationError(f"the home cluster's {informer.name} are not listed yet", type="NotSynced")
        with self._lock:
            return self._aggregate.allocatable(), self._aggregate.used()

    def _sync_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self._lock:
            self._aggregate.reset_nodes(nodes)
        self._allocatable_may_have_changed()

    def _sync_pods(self, pods: list[dict[str, Any]]) -> None:
        with self._lock:
            self._aggregate.reset_pods(pods)

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        with self._lock:
            self._aggregate.apply_node(kind, node)
        self._allocatable_may_have_changed()

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        with self._lock:
            self._aggregate.apply_pod(kind, pod)

    def _allocatable_may_have_changed(self) -> None:
        if self._on_allocatable_change is not None:
            with self._lock:
                allocatable = self._aggregate.allocatable()
            self._on_allocatable_change(allocatable)
