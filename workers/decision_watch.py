"""The provider's watch on its Advertisement in one foreign cluster (seed 001 step 8: "create the
Advertisement on the foreign cluster and start watching it"). workers/provider.py keeps one per live
PeeringRequest and turns `on_change` into the peering workflow's `foreign_changed` signal.

It calls back only when what the peering decides on moves (`models.peering.decision_key`: existence,
phase, remote remapped PodCIDR), never on the timestamp and TTL that every push rewrites. Every push it
sees hands the spare capacity that push was computed from (its annotation) to `on_pushed`: the early-push
baseline of the leading replica, whichever replica pushed. The foreign
credentials come from the PeeringRequest's kubeconfig Secret and are looked up again on every list and
watch, so rotated ones are picked up. A foreign cluster that cannot be reached is retried with backoff.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from kube.clients import SecretClients
from kube.informer import WATCH_TIMEOUT_SECONDS, Informer
from models.api.common import SecretReference
from models.keys import KeyMemory
from models.names import ADVERTISEMENTS, GROUP, SPARE_CAPACITY_ANNOTATION, VERSION
from models.peering import backoff_seconds, decision_key
from models.resources import Resources

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 10
# A list of one object answers in well under this; a watch is closed by the server after
# WATCH_TIMEOUT_SECONDS, so a read silent for longer means a connection that hangs.
LIST_READ_TIMEOUT_SECONDS = 30
WATCH_READ_TIMEOUT_SECONDS = WATCH_TIMEOUT_SECONDS + 30
# A worker that starts (or a replica that takes the Lease) with a thousand PeeringRequests starts a thousand
# watches at once, each list a TLS handshake to a foreign cluster: they went out together and starved the
# first pushes of the same moment (load average 176 on 2 cores). The process lists a few at a time; a
# decision already there is only told that much later, and the first push reads it anyway.
LISTS_AT_ONCE = 8
_listing = threading.BoundedSemaphore(LISTS_AT_ONCE)


class DecisionWatch:
    def __init__(self, *, foreign_cluster_id: str, kube_config_ref: SecretReference, advertisement: str,
                 secrets: SecretClients, on_change: Callable[[], None], backoff_max_seconds: int,
                 on_pushed: Callable[[Resources], None] = lambda _spare: None) -> None:  # fmt: skip
        self.kube_config_ref = kube_config_ref
        self._on_pushed = on_pushed
        self._secrets = secrets
        self._on_change = on_change
        self._backoff_max_seconds = backoff_max_seconds
        self._stop = threading.Event()
        self._failures = 0
        # A new watch assumes what the workflow assumes before its first push: nothing there yet. A decision
        # already there (the worker restarted) is then a change, and told once.
        self._advertisement = advertisement
        self._keys = KeyMemory(decision_key)
        self._last_spare: str | None = None  # the annotation last handed to on_pushed, as written
        self._informer = Informer(
            f"decision-{foreign_cluster_id}", self._call, group=GROUP, version=VERSION, plural=ADVERTISEMENTS,
            field_selector=f"metadata.name={advertisement}", on_sync=self._sync, on_event=self._event,
        )  # fmt: skip

    def start(self) -> DecisionWatch:
        self._informer.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop()

    def _call(self, **kwargs: Any) -> Any:
        """The informer's list and watch call against the foreign cluster, with the credentials of now."""
        watching = bool(kwargs.get("watch"))
        if not watching and self._failures:
            # The informer retries a failed list after a fixed 2 s: stretch that to a backoff.
            self._stop.wait(backoff_seconds(self._failures, ceiling=self._backoff_max_seconds))
            if self._stop.is_set():
                raise RuntimeError("stopped")
        read_timeout = WATCH_READ_TIMEOUT_SECONDS if watching else LIST_READ_TIMEOUT_SECONDS
        try:
            with contextlib.nullcontext() if watching else _listing:
                api = self._secrets.get(name=self.kube_config_ref.name, namespace=self.kube_config_ref.namespace)
                response = k8s.CustomObjectsApi(api).list_cluster_custom_object(
                    _request_timeout=(CONNECT_TIMEOUT_SECONDS, read_timeout), **kwargs
                )
        except Exception:
            self._failures += 1  # the informer logs the error, which names no credential
            raise
        if watching:
            self._failures = 0  # a list and a watch went through: the cluster is back
        return response

    def _sync(self, objects: list[dict[str, Any]]) -> None:
        if objects:
            self._pushed(objects[0])
        self._see(decision_key(objects[0] if objects else None))

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._pushed(obj)
        self._see(None if kind == "DELETED" else decision_key(obj))

    def _pushed(self, advertisement: dict[str, Any]) -> None:
        annotation = ((advertisement.get("metadata") or {}).get("annotations") or {}).get(SPARE_CAPACITY_ANNOTATION)
        if annotation is None:
            return  # written by a release before the annotation: this replica's own pushes are the baseline
        if annotation == self._last_spare:
            return  # the baseline already holds it: most pushes find the same spare capacity
        self._last_spare = annotation
        try:
            self._on_pushed(Resources(json.loads(annotation)))
        except (ValueError, TypeError) as e:
            log.warning("ignored the spare capacity on %s: %s", self._advertisement, e)

    def forget(self) -> None:
        """The signal for the last change did not get through: the next list or event tells it again."""
        self._keys.forget(self._advertisement)

    def _see(self, key: tuple[str | None, str | None] | None) -> None:
        if self._keys.see(self._advertisement, key):
            self._on_change()
