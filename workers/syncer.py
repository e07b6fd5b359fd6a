"""The pool's syncer, one per super cluster: `python -m workers.syncer`. It copies every object of the
tenant namespaces placed on its cluster down (ConfigMaps, Secrets, Services, ServiceAccounts,
ResourceQuotas and the namespace itself, prefixed with the tenant's name), only the pods placed on its
cluster, and pod status back up. A namespace whose placement no longer names this cluster, and that no
longer drains from it, is deleted here; a pod moved away keeps its copy here, silent, until its move ends
(models/pool/moves.py). Behind the feature gate SuperClusterPooling; with the gate off it syncs everything, as
virtualcluster's syncer does without a pool.

Level-triggered: watches wake it, and each pass compares both sides in full."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clients import client_from_kubeconfig_file
from kube.informer import Informer
from kube.metadata import served_metadata
from kube.objects import APPLY, ignore_not_found
from kube.process import wait_for_termination
from models.names import (
    FEATURE_SUPER_CLUSTER_POOLING,
    LABEL_MANAGED_BY,
    LABEL_TENANT_NAMESPACE,
    MANAGED_BY,
    MOVED_FROM_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    super_cluster_namespace,
)
from models.pods import copied_status
from models.pool.moves import draining_of, scheduled_of
from models.pool.namespaces import SYSTEM_NAMESPACES, placement_of
from models.pool.sync import (
    SYNCED_KINDS,
    copy_for_super,
    copy_stays_here,
    in_scope,
    pod_for_super,
    pod_goes_here,
)

log = logging.getLogger("tidepool.syncer")
RESYNC_SECONDS = 10
FIELD_MANAGER = "tidepool-syncer"


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data).get("items", []))


class Syncer:
    def __init__(self, *, tenant: k8s.ApiClient, super_cluster: k8s.ApiClient, cluster: str, tenant_name: str,
                 pooling: bool = True) -> None:  # fmt: skip
        self.cluster, self.tenant_name, self.pooling = cluster, tenant_name, pooling
        self.up, self.down = k8s.CoreV1Api(tenant), k8s.CoreV1Api(super_cluster)
        self._wake, self._stop = threading.Event(), threading.Event()
        managed = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT_NAMESPACE}"
        self._informers = [
            Informer(f"syncer-{cluster}-namespaces", self.up.list_namespace, on_sync=self._poke, on_event=self._poke),
            Informer(f"syncer-{cluster}-pods", self.up.list_pod_for_all_namespaces, on_sync=self._poke, on_event=self._poke),
            Informer(f"syncer-{cluster}-configmaps", self.up.list_config_map_for_all_namespaces, on_sync=self._poke,
                     on_event=self._poke),
            Informer(f"syncer-{cluster}-secrets", self.up.list_secret_for_all_namespaces, on_sync=self._poke,
                     on_event=self._poke),
            Informer(f"syncer-{cluster}-super-pods", self.down.list_pod_for_all_namespaces, label_selector=managed,
                     on_sync=self._poke, on_event=self._poke),
        ]  # fmt: skip
        self._thread = threading.Thread(target=self._loop, name=f"syncer-{cluster}", daemon=True)

    def _poke(self, *_: Any) -> None:
        self._wake.set()

    def start(self) -> Syncer:
        for informer in self._informers:
            informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for informer in self._informers:
            informer.stop()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.reconcile()
            except Exception as e:  # noqa: BLE001 - the next pass tries again
                log.warning("syncer %s: pass failed: %s", self.cluster, e)
            self._wake.wait(RESYNC_SECONDS)

    def reconcile(self) -> None:
        wanted: dict[str, str] = {}  # tenant namespace -> super namespace
        for ns in map(served_metadata, self.up.list_namespace().items):
            name = ns.name
            if name in SYSTEM_NAMESPACES or name.startswith("kube-") or ns.deleting:
                continue
            if in_scope(placement_of(ns.annotations), self.cluster, pooling=self.pooling,
                        scheduled=scheduled_of(ns.annotations),
                        draining=draining_of(ns.annotations)):  # fmt: skip
                wanted[name] = super_cluster_namespace(self.tenant_name, name)
        for tenant_ns, target in wanted.items():
            self._sync_namespace(tenant_ns, target)
        for copy in map(served_metadata, self.down.list_namespace(label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}").items):
            origin = copy.labels.get(LABEL_TENANT_NAMESPACE)
            if origin and origin not in wanted and not copy.deleting:
                log.info("syncer %s: %s left the placement, deleting %s", self.cluster, origin, copy.name)
                ignore_not_found(self.down.delete_namespace, copy.name)

    def _sync_namespace(self, tenant_ns: str, target: str) -> None:
        labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT_NAMESPACE: tenant_ns}
        self.down.patch_namespace(target, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": target, "labels": labels}},
                                  field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)  # fmt: skip
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        for kind in SYNCED_KINDS:
            api = _kind_api(self.up, self.down, kind)
            sources = _items(api["list"](self.up)(tenant_ns, _preload_content=False))
            copies = {o["metadata"]["name"] for o in _items(api["list"](self.down)(target, label_selector=selector,
                                                                                    _preload_content=False))}
            keep = set()
            for obj in sources:
                body = copy_for_super(kind, obj, target_namespace=target, tenant_namespace=tenant_ns)
                if body is None:
                    continue
                keep.add(body["metadata"]["name"])
                api["patch"](self.down)(body["metadata"]["name"], target, body, field_manager=FIELD_MANAGER,
                                        force=True, _content_type=APPLY)  # fmt: skip
            for stale in copies - keep:
                ignore_not_found(api["delete"](self.down), stale, target)
        self._sync_pods(tenant_ns, target)

    def _sync_pods(self, tenant_ns: str, target: str) -> None:
        tenant_pods = _items(self.up.list_namespaced_pod(tenant_ns, _preload_content=False))
        super_pods = {p["metadata"]["name"]: p for p in _items(self.down.list_namespaced_pod(
            target, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}", _preload_content=False))}  # fmt: skip
        mine = set()
        for pod in tenant_pods:
            meta = pod["metadata"]
            annotations = meta.get("annotations") or {}
            copy = super_pods.get(meta["name"])
            if copy_stays_here(annotations.get(MOVED_FROM_ANNOTATION), self.cluster, pooling=self.pooling):
                if not meta.get("deletionTimestamp"):
                    mine.add(meta["name"])
                continue
            if not pod_goes_here(annotations.get(POD_CLUSTER_ANNOTATION), self.cluster, pooling=self.pooling):
                continue
            mine.add(meta["name"])
            if meta.get("deletionTimestamp"):
                if copy is not None:
                    ignore_not_found(self.down.delete_namespaced_pod, meta["name"], target)
                else:
                    ignore_not_found(self.up.delete_namespaced_pod, meta["name"], tenant_ns, grace_period_seconds=0)
            elif copy is None:
                try:
                    self.down.create_namespaced_pod(target, k8s.V1Pod.model_validate(pod_for_super(
                        pod, target_namespace=target, tenant_namespace=tenant_ns)))  # fmt: skip
                except ApiException as e:
                    if e.status != 409:
                        raise
            else:
                status = copied_status(copy.get("status") or {})
                if {k: pod.get("status", {}).get(k) for k in status} != status:
                    self._push_status(pod, tenant_ns, status)
        for name in set(super_pods) - mine:
            ignore_not_found(self.down.delete_namespaced_pod, name, target)

    def _push_status(self, pod: dict[str, Any], tenant_ns: str, status: dict[str, Any]) -> None:
        """Only onto the pod as it was read: if the pool scheduler moved it meanwhile (another cluster's
        copy owns its status now), the write is refused and the next pass reads it anew."""
        meta = pod["metadata"]
        try:
            self.up.patch_namespaced_pod_status(meta["name"], tenant_ns, {
                "metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status})  # fmt: skip
        except ApiException as e:
            if e.status != 409:
                raise


def _kind_api(up: k8s.CoreV1Api, down: k8s.CoreV1Api, kind: str) -> dict[str, Any]:
    snake = {"ConfigMap": "config_map", "Secret": "secret", "Service": "service",
             "ServiceAccount": "service_account", "ResourceQuota": "resource_quota"}[kind]  # fmt: skip
    return {
        "list": lambda api: getattr(api, f"list_namespaced_{snake}"),
        "patch": lambda api: getattr(api, f"patch_namespaced_{snake}"),
        "delete": lambda api: getattr(api, f"delete_namespaced_{snake}"),
    }


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workers.syncer", description=__doc__)
    parser.add_argument("--tenant-kubeconfig", required=True)
    parser.add_argument("--super-kubeconfig", required=True)
    parser.add_argument("--cluster", required=True, help="this super cluster's name in the pool (its SuperCluster)")
    parser.add_argument("--tenant-name", default="tenant", help="prefix of the namespaces it creates")
    parser.add_argument("--feature-gates", default=f"{FEATURE_SUPER_CLUSTER_POOLING}=true")
    args = parser.parse_args()
    gates = dict(item.split("=", 1) for item in args.feature_gates.split(",") if "=" in item)
    syncer = Syncer(tenant=client_from_kubeconfig_file(args.tenant_kubeconfig),
                    super_cluster=client_from_kubeconfig_file(args.super_kubeconfig), cluster=args.cluster,
                    tenant_name=args.tenant_name, pooling=gates.get(FEATURE_SUPER_CLUSTER_POOLING, "true") == "true").start()
    wait_for_termination()
    syncer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
