"""The virtual kubelet: `python -m workers.virtual_kubelet`, the program of the Deployment the consumer
creates for an accepted Advertisement. It stands for the provider as one node of the consumer cluster:

- registers the virtual node (capacity = the Advertisement's, kept current), renews its Lease, and says
  in the Ready condition why it is not ready (NodeReadyReason: PodCIDRNotSet, ProviderUnreachable). Like a
  kubelet, the Lease (renewed every LEASE_RENEW_SECONDS) is the heartbeat; the node's status is patched
  when something in it changes, and otherwise every NODE_STATUS_REPORT_SECONDS;
- talks to the provider with the credentials of its mounted kubeconfig as they are renewed (the file is
  followed, kube/ KubeconfigFileClient): a rotation needs no restart;
- runs the pods bound to that node in the provider's namespace for this consumer (with the ConfigMaps
  and Secrets they use), and brings their status back;
- on teardown (the Advertisement Deleting, its node deleted) deletes all it created in the provider,
  marks its Deployment `tidepool.io/provider-namespace: clean`, and exits 0. Credentials refused (401)
  mean clean only when the provider marked its Advertisement withdrawn (it deleted the namespace itself);
  otherwise the provider side is not known to be clean, and the consumer's teardown timeout decides.

Level-triggered: every pass compares both sides in full, so a restart never leaves a duplicate or an
orphan. Watches wake it early; a pass runs at least every RESYNC seconds (the Lease needs it anyway).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.common import MetricMeter

from kube.clients import client_from_kubeconfig_file
from kube.informer import Informer
from kube.metrics import Metrics
from kube.objects import ignore_not_found, read_cluster_object
from models.api.conditions import NodeReadyReason
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_OFFLOADED,
    PROVIDER_WITHDRAWN_ANNOTATION,
    SYSTEM_NAMESPACE,
    VK_CLEAN_ANNOTATION,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.pods import copied_status as status_for_consumer
from models.virtual_kubelet import (
    ORIGIN_NAME,
    ORIGIN_NAMESPACE,
    ORIGIN_UID,
    REFLECTED_ANNOTATION,
    node_status_report_due,
    overdue_for_force_delete,
    referenced_objects,
    reflected_name,
    safe_pod_spec,
    virtual_node,
)
from workers.metrics import metrics_runtime

log = logging.getLogger("tidepool.virtual_kubelet")
RESYNC_SECONDS = 10
LEASE_SECONDS = 40
# A kubelet's defaults: the Lease is the heartbeat (renewed every 10 s, a quarter of its duration); the
# node's status is written when it changes, and at least every 5 minutes (nodeStatusReportFrequency).
LEASE_RENEW_SECONDS = 10
NODE_STATUS_REPORT_SECONDS = 300
# Passes run every RESYNC_SECONDS or sooner when woken: renew a little early rather than skip a period.
LEASE_RENEW_SLACK_SECONDS = 1


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

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ
        return cls(
            provider_id=env["TIDEPOOL_VK_PROVIDER_ID"],
            consumer_id=env["TIDEPOOL_VK_CONSUMER_ID"],
            advertisement=env["TIDEPOOL_VK_ADVERTISEMENT"],
            namespace=env.get("TIDEPOOL_VK_NAMESPACE", SYSTEM_NAMESPACE),
            provider_kubeconfig=env["TIDEPOOL_VK_PROVIDER_KUBECONFIG"],
            consumer_kubeconfig=env.get("TIDEPOOL_VK_CONSUMER_KUBECONFIG"),
            metrics_port=int(env.get("TIDEPOOL_VK_METRICS_PORT") or 0),
        )


class VirtualKubelet:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.node = virtual_node_name(config.provider_id)
        self.consumer = client_from_kubeconfig_file(config.consumer_kubeconfig)
        self.provider = client_from_kubeconfig_file(config.provider_kubeconfig)
        self.remote_namespace = _context_namespace(config.provider_kubeconfig)
        self.core, self.remote = k8s.CoreV1Api(self.consumer), k8s.CoreV1Api(self.provider)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready_since: tuple[bool, NodeReadyReason, str] | None = None  # (ready, reason, lastTransitionTime)
        # What this process last wrote of its node (labels, status), when, and when it last renewed the Lease.
        self._reported: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._node_missing = False  # set by the node's watch; the next pass registers it again
        self._reported_at = 0.0
        self._lease_renewed_at: float | None = None
        # No Temporal client here: the runtime only serves the Prometheus endpoint.
        self._runtime = metrics_runtime(config.metrics_port)
        self._metrics = Metrics(self._runtime.metric_meter if self._runtime else MetricMeter.noop)
        self._informers = [
            Informer("vk-consumer-pods", self.core.list_pod_for_all_namespaces,
                     field_selector=f"spec.nodeName={self.node}", on_sync=self._poke, on_event=self._poke),
            Informer("vk-provider-pods", self.remote.list_namespaced_pod, namespace=self.remote_namespace,
                     label_selector=self._offloaded_selector, on_sync=self._poke, on_event=self._poke),
            # Its own node: one deleted by hand is registered again at once (its pods would otherwise be
            # garbage-collected as orphans before the next periodic status report).
            Informer("vk-node", self.core.list_node, field_selector=f"metadata.name={self.node}",
                     on_sync=self._node_listed, on_event=self._node_event),
        ]  # fmt: skip

    @property
    def _offloaded_selector(self) -> str:
        return f"{LABEL_OFFLOADED}=true,{LABEL_CONSUMER}={self.config.consumer_id}"

    def _poke(self, *_: Any) -> None:
        self._wake.set()

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
        for informer in self._informers:
            informer.start()
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
            for informer in self._informers:
                informer.stop()

    # One pass -----------------------------------------------------------------------------------------
    def reconcile(self) -> bool:
        """One level-triggered pass; True once teardown is complete (the program then exits 0)."""
        advertisement = read_cluster_object(self.consumer, ADVERTISEMENTS, self.config.advertisement)
        phase = ((advertisement or {}).get("status") or {}).get("phase")
        if advertisement is None or phase == "Deleting" or (advertisement["metadata"].get("deletionTimestamp")):
            return self._teardown(advertisement)
        if phase != "Accepted":
            return False  # not ours to run yet (or refused): nothing to register
        reachable, error = self._provider_reachable()
        self._ensure_node(advertisement, reachable=reachable, error=error)
        if reachable:
            self._reflect_pods()
        return False

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
        if not status.get("remoteRemappedPodCIDR"):
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
                            message=message, heartbeat=now, transition=self._ready_since[2])  # fmt: skip
        labels, status = body["metadata"]["labels"], body["status"]
        if self._node_missing:
            self._node_missing, self._reported = False, None
        previous = self._reported
        if node_status_report_due(None if previous is None else previous[1], status,
                                  since_last_report=time.monotonic() - self._reported_at,
                                  report_every=NODE_STATUS_REPORT_SECONDS):  # fmt: skip
            self._report_node(body, labels_changed=previous is None or previous[0] != labels)
        self._renew_lease()

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
            self.core.patch_node_status(self.node, {"status": body["status"]})
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
        leases = k8s.CoordinationV1Api(self.consumer)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}
        try:
            leases.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            leases.create_namespaced_lease("kube-node-lease",
                                           k8s.V1Lease.model_validate({"metadata": {"name": self.node}, "spec": spec}))
        self._lease_renewed_at = started

    # Pods ---------------------------------------------------------------------------------------------
    def _reflect_pods(self) -> None:
        local = {p["metadata"]["uid"]: p for p in _items(self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", _preload_content=False))}  # fmt: skip
        remote = {p["metadata"]["annotations"].get(ORIGIN_UID): p for p in _items(self.remote.list_namespaced_pod(
            self.remote_namespace, label_selector=self._offloaded_selector, _preload_content=False))}  # fmt: skip
        for uid, pod in local.items():
            meta = pod["metadata"]
            copy = remote.get(uid)
            if meta.get("deletionTimestamp"):
                if copy is not None:
                    ignore_not_found(self.remote.delete_namespaced_pod, copy["metadata"]["name"], self.remote_namespace)
                else:  # the provider side is gone: finish the deletion, as a kubelet would
                    ignore_not_found(self.core.delete_namespaced_pod, meta["name"], meta["namespace"],
                                     grace_period_seconds=0)  # fmt: skip
            elif copy is None:
                if (meta.get("annotations") or {}).get(REFLECTED_ANNOTATION) and pod["status"].get("phase") not in (
                    "Succeeded", "Failed"
                ):
                    self._fail(pod, "ProviderPodDeleted", "the pod was deleted in the provider cluster")
                elif not (meta.get("annotations") or {}).get(REFLECTED_ANNOTATION):
                    self._create_copy(pod)
            else:
                wanted = status_for_consumer(copy.get("status") or {})
                current = {k: pod.get("status", {}).get(k) for k in wanted}
                if wanted and current != wanted:
                    self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": wanted})
        for uid, copy in remote.items():
            if uid not in local:  # the consumer pod is gone: so goes its copy
                ignore_not_found(self.remote.delete_namespaced_pod, copy["metadata"]["name"], self.remote_namespace)
        self._metrics.reflected_pods(provider=self.config.provider_id, count=sum(1 for uid in remote if uid in local))
        self._collect_orphaned_objects(local.values())

    def _create_copy(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        namespace = meta["namespace"]
        config_maps, secrets = referenced_objects(pod["spec"])
        for name in config_maps:
            self._reflect_object("ConfigMap", namespace, name)
        for name in secrets:
            self._reflect_object("Secret", namespace, name)
        body = {
            "metadata": {
                "name": reflected_name(namespace, meta["name"]),
                "labels": {**(meta.get("labels") or {}), LABEL_OFFLOADED: "true", LABEL_CONSUMER: self.config.consumer_id},
                "annotations": {ORIGIN_NAMESPACE: namespace, ORIGIN_NAME: meta["name"], ORIGIN_UID: meta["uid"]},
            },
            "spec": safe_pod_spec(pod["spec"], namespace),
        }  # fmt: skip
        try:
            self.remote.create_namespaced_pod(self.remote_namespace, k8s.V1Pod.model_validate(body))
        except ApiException as e:
            if e.status != 409:  # already there (a pass before a crash made it): the next pass adopts it
                raise
        self.core.patch_namespaced_pod(meta["name"], namespace,
                                       {"metadata": {"annotations": {REFLECTED_ANNOTATION: "true"}}})  # fmt: skip
        log.info("pod %s/%s runs in provider %s", namespace, meta["name"], self.config.provider_id)

    def _reflect_object(self, kind: str, namespace: str, name: str) -> None:
        source: k8s.V1ConfigMap | k8s.V1Secret | None
        patch: Callable[..., object]
        if kind == "Secret":
            source = ignore_not_found(self.core.read_namespaced_secret, name, namespace)
            patch = self.remote.patch_namespaced_secret
        else:
            source = ignore_not_found(self.core.read_namespaced_config_map, name, namespace)
            patch = self.remote.patch_namespaced_config_map
        if source is None:
            return  # the pod will not start in the provider either; its status says why
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": kind,
            "metadata": {"name": reflected_name(namespace, name),
                         "labels": {LABEL_OFFLOADED: "true", LABEL_CONSUMER: self.config.consumer_id},
                         "annotations": {ORIGIN_NAMESPACE: namespace, ORIGIN_NAME: name}},
            "data": source.data or {},
        }  # fmt: skip
        if isinstance(source, k8s.V1Secret):
            body["type"] = source.type or "Opaque"
        else:
            body["binaryData"] = source.binary_data or None
        patch(body["metadata"]["name"], self.remote_namespace, body, field_manager="tidepool-virtual-kubelet",
              force=True, _content_type="application/apply-patch+yaml")  # fmt: skip

    def _collect_orphaned_objects(self, pods: Any) -> None:
        used: set[str] = set()
        for pod in pods:
            config_maps, secrets = referenced_objects(pod["spec"])
            used |= {reflected_name(pod["metadata"]["namespace"], n) for n in config_maps | secrets}
        for lister, deleter in ((self.remote.list_namespaced_config_map, self.remote.delete_namespaced_config_map),
                                (self.remote.list_namespaced_secret, self.remote.delete_namespaced_secret)):
            for obj in lister(self.remote_namespace, label_selector=self._offloaded_selector).items:
                name = obj.metadata.name if obj.metadata else None
                if name is not None and name not in used:
                    ignore_not_found(deleter, name, self.remote_namespace)

    def _fail(self, pod: dict[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                              {"status": {"phase": "Failed", "reason": reason, "message": message}})

    # Teardown -----------------------------------------------------------------------------------------
    def _teardown(self, advertisement: dict[str, Any] | None) -> bool:
        """Seed 000's order: the node goes first (the consumer's workflow deletes it); then everything
        this virtual kubelet made in the provider goes; then it says so on its Deployment."""
        if ignore_not_found(self.core.read_node, self.node) is not None:
            log.info("teardown: waiting for node %s to be deleted", self.node)
            return False
        selector = self._offloaded_selector
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
        for deleter in (self.remote.delete_collection_namespaced_pod, self.remote.delete_collection_namespaced_config_map,
                        self.remote.delete_collection_namespaced_secret):
            deleter(self.remote_namespace, label_selector=selector)
        remaining = self.remote.list_namespaced_pod(self.remote_namespace, label_selector=selector).items
        now = datetime.now(UTC)
        for pod in remaining:
            meta = pod.metadata
            if meta is not None and meta.name and overdue_for_force_delete(meta.deletion_timestamp, now=now):
                log.warning("teardown: %s still terminating past its grace period; deleting it at once", meta.name)
                ignore_not_found(self.remote.delete_namespaced_pod, meta.name, self.remote_namespace,
                                 grace_period_seconds=0)  # fmt: skip
        if remaining:
            log.info("teardown: %d pods still going in the provider", len(remaining))
            return False
        return self._report_clean()

    def _report_clean(self) -> bool:
        ignore_not_found(k8s.AppsV1Api(self.consumer).patch_namespaced_deployment,
                         virtual_kubelet_name(self.config.provider_id), self.config.namespace,
                         {"metadata": {"annotations": {VK_CLEAN_ANNOTATION: "clean"}}})  # fmt: skip
        log.info("teardown: provider namespace %s is clean", self.remote_namespace)
        return True


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data).get("items", []))


def _context_namespace(kubeconfig: str) -> str:
    with open(kubeconfig) as f:
        config = yaml.safe_load(f)
    current = config.get("current-context")
    context = next(c["context"] for c in config["contexts"] if c["name"] == current)
    return str(context.get("namespace") or "default")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    vk = VirtualKubelet(Config.from_env())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: vk.stop())
    return vk.run()


if __name__ == "__main__":
    sys.exit(main())

