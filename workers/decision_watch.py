"""The provider's watch on its Advertisement in one foreign cluster (seed 001 step 8: "create the
Advertisement on the foreign cluster and start watching it"). workers/provider.py keeps one per live
PeeringRequest and turns `on_change` into the peering workflow's `foreign_changed` signal.

It calls back only when what the peering decides on moves (`models.peering.foreign_decision`, what the
peering's activities read: existence, phase, its reason, remote remapped PodCIDR), never on the timestamp
and TTL that every push rewrites. Every push it
sees hands the spare capacity that push was computed from (its annotation) to `on_pushed`: the early-push
baseline of the leading replica, whichever replica pushed. The foreign
credentials come from the PeeringRequest's kubeconfig Secret and are looked up again on every list and
watch, so rotated ones are picked up. A foreign cluster that cannot be reached is retried with backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Callable
from typing import Any

from kube.clients import SecretClients
from kube.keys import KeyMemory
from kube.streams import Endpoint, StreamLoop, list_then_watch
from models.api.common import SecretReference
from models.names import ADVERTISEMENTS, GROUP, SPARE_CAPACITY_ANNOTATION, VERSION
from models.peering import ForeignDecision, backoff_seconds, foreign_decision
from models.resources import Resources

log = logging.getLogger(__name__)

# A worker that starts (or a replica that takes the Lease) with a thousand PeeringRequests starts a thousand
# watches at once, each list a TLS handshake to a foreign cluster: they went out together and starved the
# first pushes of the same moment (load average 176 on 2 cores). The process lists a few at a time; a
# decision already there is only told that much later, and the first push reads it anyway.
LISTS_AT_ONCE = 8
_listing = asyncio.Semaphore(LISTS_AT_ONCE)  # used on the streams' loop only


class DecisionWatch:
    """One stream on the process's shared StreamLoop (kube/streams.py): a thread per foreign cluster held
    5,000 threads at 5,000 peerings."""

    def __init__(self, *, foreign_cluster_id: str, kube_config_ref: SecretReference, advertisement: str,
                 secrets: SecretClients, on_change: Callable[[], None], backoff_max_seconds: int,
                 on_pushed: Callable[[Resources], None] = lambda _spare: None) -> None:  # fmt: skip
        self.kube_config_ref = kube_config_ref
        self._foreign_cluster_id = foreign_cluster_id
        self._on_pushed = on_pushed
        self._secrets = secrets
        self._on_change = on_change
        self._backoff_max_seconds = backoff_max_seconds
        self._endpoint: Endpoint | None = None
        self._running: concurrent.futures.Future[None] | None = None
        # A new watch assumes what the workflow assumes before its first push: nothing there yet. A decision
        # already there (the worker restarted) is then a change, and told once.
        self._advertisement = advertisement
        self._keys = KeyMemory(foreign_decision)
        self._last_spare: str | None = None  # the annotation last handed to on_pushed, as written

    def start(self) -> DecisionWatch:
        self._running = StreamLoop.shared().spawn(self._run())
        return self

    def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()  # cancels the task on the streams' loop: its connection is closed

    async def _run(self) -> None:
        await list_then_watch(
            f"decision-{self._foreign_cluster_id}", self._current_endpoint,
            f"/apis/{GROUP}/{VERSION}/{ADVERTISEMENTS}", {"fieldSelector": f"metadata.name={self._advertisement}"},
            on_sync=self._sync, on_event=self._event, on_failure=self._back_off, lists=_listing,
        )  # fmt: skip

    async def _current_endpoint(self) -> Endpoint:
        """The foreign cluster with the credentials of now: the Secret is read again (off the loop, as the
        client is synchronous) before every list and watch, so rotated ones are picked up."""
        ref = self.kube_config_ref
        api = await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._secrets.get(name=ref.name, namespace=ref.namespace)
        )
        if self._endpoint is None or self._endpoint.api is not api:
            self._endpoint = Endpoint(api, StreamLoop.shared().session())
        return self._endpoint

    async def _back_off(self, failures: int) -> None:
        await asyncio.sleep(backoff_seconds(failures, ceiling=self._backoff_max_seconds))

    def _sync(self, objects: list[dict[str, Any]]) -> None:
        if objects:
            self._pushed(objects[0])
        self._see(foreign_decision(objects[0]) if objects else None)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._pushed(obj)
        self._see(None if kind == "DELETED" else foreign_decision(obj))

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

    def _see(self, key: ForeignDecision | None) -> None:
        """`key`: None when the Advertisement is absent (KeyMemory remembers nothing for it)."""
        if self._keys.see(self._advertisement, key):
            self._on_change()
