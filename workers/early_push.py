"""Early pushes: when a consumer's offer moves past the threshold, whatever moved it (nodes or pods),
signal `capacity_changed` to that consumer's peering only, debounced.

HomeCapacity marks `dirty` at every change (cheap: an Event's set). One thread evaluates EVALUATE_INTERVAL_SECONDS
after a change, at most once per that interval however many events arrived (a relist of 100,000 pods or a
burst of pods is one evaluation), and
again when a consumer held back by the minimum interval may be signalled (models/early_push.py decides).
The baselines are the spares the last pushes were computed from, whichever replica ran them (this one's
own, and the others' read off the Advertisement by the decision watch; after a restart, what was spare at
the first evaluation until a push is seen), so a periodic push resets them too and nothing drifts. Runs
in the leading replica only (kube/lease.py). Built by workers/provider.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kube.capacity import HomeCapacity
from models.api.clusterconfig import OutgoingConfig
from models.early_push import plan_early_pushes

log = logging.getLogger(__name__)

# Evaluating costs O(consumers × resources); once a second keeps an event storm from costing more than
# that while capacity taken by a burst of pods still reaches the consumers within seconds.
EVALUATE_INTERVAL_SECONDS = 1.0


class EarlyPushWatch:
    def __init__(
        self,
        *,
        capacity: HomeCapacity,
        dirty: threading.Event,
        live_consumers: Callable[[], set[str]],
        outgoing: Callable[[], OutgoingConfig],
        signal: Callable[[str], None],
    ) -> None:
        """`live_consumers`: the foreign clusters of the live peerings; `outgoing`: the ClusterConfig's
        current provider settings; `signal`: tell that consumer's peering `capacity_changed`."""
        self._capacity = capacity
        self._dirty = dirty
        self._live_consumers = live_consumers
        self._outgoing = outgoing
        self._signal = signal
        self._last_signals: dict[str, float] = {}  # consumer -> time.monotonic() of its last early push
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="early-push", daemon=True)

    def start(self) -> EarlyPushWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()  # wake the thread so that it sees the stop
        self._thread.join(timeout=5)

    def _run(self) -> None:
        look_again_at: float | None = None
        while not self._stop.is_set():
            timeout = None if look_again_at is None else max(0.0, look_again_at - time.monotonic())
            self._dirty.wait(timeout)
            # Let the rest of a burst arrive, so that one evaluation (and one push) covers all of it.
            if self._stop.wait(EVALUATE_INTERVAL_SECONDS):
                return
            self._dirty.clear()  # changes from here on mark it again and are seen by the next evaluation
            try:
                look_again_at = self._evaluate()
            except Exception as e:  # noqa: BLE001 - the watch must outlive any one failure; the period still pushes
                log.warning("early push evaluation failed: %s", e)
                look_again_at = None

    def _evaluate(self) -> float | None:
        outgoing = self._outgoing()
        now = time.monotonic()
        live = self._live_consumers()
        for gone in set(self._last_signals) - live:
            del self._last_signals[gone]
        spares = self._capacity.spares(live)
        for consumer in live - set(self._capacity.baselines()):
            if consumer in spares:
                # No push of this process yet (a restart): compare with what is spare now rather than wait
                # up to a period for the first push; that push replaces it.
                self._capacity.seed(consumer, spares[consumer])
        plan = plan_early_pushes(
            baselines=self._capacity.baselines(), spares=spares,
            last_signals=self._last_signals, now=now,
            threshold_percent=outgoing.capacity_change_threshold_percent,
            min_interval_seconds=outgoing.early_push_min_interval_seconds,
        )  # fmt: skip
        for consumer in plan.signal:
            self._last_signals[consumer] = now
            log.info("the offer to %s moved past %d%%: pushing early", consumer,
                     outgoing.capacity_change_threshold_percent)  # fmt: skip
            self._signal(consumer)
        return plan.look_again_at
