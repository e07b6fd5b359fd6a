"""A minimal network module for clusters that have none (the local environment, the demo): for every
accepted Advertisement without a remapping for its current spec.network.podCIDR it writes
status.remoteRemappedPodCIDR ("None" when the provider's PodCIDR overlaps none of our networks: our
PodCIDR, our ServiceCIDRs and our nodes' addresses) and status.remappedForPodCIDR, the PodCIDR it decided
for. A provider that edits its PodCIDR after acceptance gets a new decision; until then the virtual kubelet
shows no IP outside the old one. Production clusters run their real network module, which writes the same
fields; tidepool only waits for them.

`python -m workers.network` with TIDEPOOL_CLUSTER_KUBECONFIG and TIDEPOOL_CLUSTER_POD_CIDR."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from kubernetes import client as k8s

from kube.clients import client_from_own_kubeconfig_file
from kube.informer import Informer
from kube.objects import list_cluster_objects, record_event
from kube.process import wait_for_termination
from kube.status import CustomObjectStatus, write_status
from models.names import ADVERTISEMENTS, GROUP, VERSION
from models.network import NO_REMAPPING, RemapError, remap_pod_cidr
from models.settings import WorkerSettings

log = logging.getLogger("tidepool.network")


class NetworkModule:
    def __init__(self, api: k8s.ApiClient, *, local_pod_cidr: str) -> None:
        self._api = api
        self._local = local_pod_cidr
        self._lock = threading.Lock()
        self._informer = Informer(
            "network-advertisements", k8s.CustomObjectsApi(api).list_cluster_custom_object,
            group=GROUP, version=VERSION, plural=ADVERTISEMENTS,
            on_sync=self._sync, on_event=lambda _kind, _obj: self._sync(None),
        )  # fmt: skip

    def start(self) -> NetworkModule:
        self._informer.start()
        return self

    def stop(self) -> None:
        self._informer.stop()

    def _sync(self, objects: list[dict[str, Any]] | None) -> None:
        with self._lock:
            if objects is None:
                objects = list_cluster_objects(self._api, ADVERTISEMENTS)
            undecided = [o for o in objects if _needs_decision(o)]
            if not undecided:
                return
            local = self._local_networks()
            for obj in undecided:
                name, advertised = obj["metadata"]["name"], _advertised(obj)
                taken = [_effective_cidr(o) for o in objects if o["metadata"]["name"] != name]
                try:
                    remapped = remap_pod_cidr(advertised, local=local, taken=taken)
                except RemapError as e:
                    record_event(self._api, obj, reason="PodCIDRNotRemapped", message=str(e), warning=True)
                    continue
                decision = {"remoteRemappedPodCIDR": remapped, "remappedForPodCIDR": advertised}
                write_status(CustomObjectStatus(self._api, ADVERTISEMENTS), obj, fields=decision)
                obj["status"] = {**(obj.get("status") or {}), **decision}  # taken by the next ones
                log.info("%s: PodCIDR %s remapped to %s", name, advertised, remapped)

    def _local_networks(self) -> list[str]:
        """Every address range of ours a provider's PodCIDR must not shadow: a pod IP there, shown in one of
        our EndpointSlices, would send our Services' traffic to our own Services, nodes or pods."""
        service_cidrs = k8s.NetworkingV1Api(self._api).list_service_cidr().items
        nodes = k8s.CoreV1Api(self._api).list_node().items
        return [self._local, *(c for s in service_cidrs for c in ((s.spec.cidrs if s.spec else None) or [])),
                *(a.address for n in nodes for a in ((n.status.addresses if n.status else None) or [])
                  if a.type in ("InternalIP", "ExternalIP"))]  # fmt: skip


def _advertised(obj: dict[str, Any]) -> str:
    return str(((obj.get("spec") or {}).get("network") or {}).get("podCIDR") or "")


def _needs_decision(obj: dict[str, Any]) -> bool:
    """Accepted, and without a decision for the PodCIDR it advertises now."""
    status = obj.get("status") or {}
    return status.get("phase") == "Accepted" and not (
        status.get("remoteRemappedPodCIDR") and status.get("remappedForPodCIDR") == _advertised(obj))


def _effective_cidr(obj: dict[str, Any]) -> str:
    """The block a provider's pods are reached at here: its remapping, or, when none, the PodCIDR decided for."""
    status = obj.get("status") or {}
    remapped = str(status.get("remoteRemappedPodCIDR") or "")
    if remapped and remapped != NO_REMAPPING:
        return remapped
    return str(status.get("remappedForPodCIDR") or "") if remapped else ""


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = WorkerSettings.from_env(os.environ)
    module = NetworkModule(client_from_own_kubeconfig_file(settings.cluster.kubeconfig),
                           local_pod_cidr=settings.cluster.pod_cidr).start()  # fmt: skip
    wait_for_termination()
    module.stop()


if __name__ == "__main__":
    main()
