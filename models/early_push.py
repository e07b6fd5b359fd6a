"""Which peerings to push early: a consumer's spare capacity (before the percentage: the threshold is
relative, so the percentage does not matter) moved past the ClusterConfig's threshold since the last push
to it, whatever moved it (nodes or pods). Pure; workers/early_push.py evaluates it at most once per
second after capacity changes and signals `capacity_changed` to the peerings it names.

Rules, in the order of the code:
1. a consumer without a baseline has nothing to compare with (workers/early_push.py seeds one with what
   is spare at its first evaluation after a restart; the next push replaces it);
2. a spare within the threshold of the baseline (`models.sharing.capacity_changed`) needs nothing;
3. past it, signal at most once per minimum interval per peering, so that pod churn cannot spend the
   action budget (each early push costs a signal, an activity and a timer); a consumer held back is
   looked at again when its interval ends, so that the last move is not lost.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from models.resources import Resources
from models.sharing import capacity_changed


class EarlyPushes(BaseModel):
    """The consumers to signal now, and when to evaluate again without a new change (None: only on one)."""

    model_config = ConfigDict(frozen=True)

    signal: tuple[str, ...] = ()
    look_again_at: float | None = None


def plan_early_pushes(
    *,
    baselines: Mapping[str, Resources],
    spares: Mapping[str, Resources],
    last_signals: Mapping[str, float],
    now: float,
    threshold_percent: int,
    min_interval_seconds: float,
) -> EarlyPushes:
    """`spares`: the live peerings' consumers and their spare capacity now; `baselines`: the spare each
    consumer's last push used; `last_signals`: when each consumer was last signalled (seconds on the
    caller's monotonic clock, like `now`)."""
    signal: list[str] = []
    look_again_at: float | None = None
    for consumer in sorted(spares):
        baseline = baselines.get(consumer)
        if baseline is None or not capacity_changed(baseline, spares[consumer], threshold_percent):
            continue
        last = last_signals.get(consumer)
        if last is None or now - last >= min_interval_seconds:
            signal.append(consumer)
            continue
        allowed_at = last + min_interval_seconds
        look_again_at = allowed_at if look_again_at is None else min(look_again_at, allowed_at)
    return EarlyPushes(signal=tuple(signal), look_again_at=look_again_at)
