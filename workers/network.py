"""A minimal network module for clusters that have none (the local environment, the demo): for every
accepted Advertisement without a remapping it writes status.remoteRemappedPodCIDR ("None" when the
provider's PodCIDR does not overlap ours). Production clusters run their real network module, which
writes the same field; tidepool only waits for it.

`python -m workers.network` with TIDEPOOL_CLUSTER_KUBECONFIG and TIDEPOOL_CLUSTER_POD_CIDR."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes import client as k8s

from kube.clients import client_from_own_kubeconfig_file
from kube.informer import Informer
from kube.objects import list_cluster_objects, patch_cluster_object_status, record_event
from kube.process import wait_for_termination
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
            taken = [_effective_cidr(o) for o in objects]
            for obj in objects:
                status = obj.get("status") or {}
                if status.get("phase") != "Accepted" or status.get("remoteRemappedPodCIDR"):
                    continue
                advertised = str(((obj.get("spec") or {}).get("network") or {}).get("podCIDR") or "")
                try:
                    remapped = remap_pod_cidr(advertised, local=[self._local], taken=taken)
                except RemapError as e:
                    record_event(self._api, obj, reason="PodCIDRNotRemapped", message=str(e), warning=True)
                    continue
                patch_cluster_object_status(self._api, ADVERTISEMENTS, obj["metadata"]["name"],
                                            {"remoteRemappedPodCIDR": remapped})  # fmt: skip
                taken.append(remapped)
                log.info("%s: PodCIDR %s remapped to %s", obj["metadata"]["name"], advertised, remapped)


def _effective_cidr(obj: dict[str, Any]) -> str:
    """The block a provider's pods are reached at here: its remapping, or its own PodCIDR when none."""
    remapped = str((obj.get("status") or {}).get("remoteRemappedPodCIDR") or "")
    if remapped and remapped != NO_REMAPPING:
        return remapped
    return str(((obj.get("spec") or {}).get("network") or {}).get("podCIDR") or "") if remapped else ""


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = WorkerSettings.from_env()
    module = NetworkModule(client_from_own_kubeconfig_file(settings.cluster.kubeconfig),
                           local_pod_cidr=settings.cluster.pod_cidr).start()  # fmt: skip
    wait_for_termination()
    module.stop()


if __name__ == "__main__":
    main()
