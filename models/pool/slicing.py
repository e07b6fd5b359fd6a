"""A tenant namespace's quota, divided into slices (virtualcluster's scheme, without its bugs: exact
milli-CPU, a default slice that is never mutated, errors that say which rule)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from models.quantities import QuantityError
from models.resources import Resources

SLICED = ("cpu", "memory")


def default_slice() -> Resources:
    return Resources(cpu="2", memory="4Gi")  # a new object each time: callers cannot mutate a shared one


class SliceError(ValueError):
    """A slice or quota that cannot be scheduled, with the rule it breaks."""


def namespace_quota(hards: Iterable[Mapping[str, Any]]) -> Resources:
    """The largest spec.hard cpu and memory over a namespace's ResourceQuotas (either key form)."""
    best: dict[str, Any] = {}
    for hard in hards:
        quota = Resources({k.removeprefix("limits.").removeprefix("requests."): v for k, v in hard.items()
                           if k.removeprefix("limits.").removeprefix("requests.") in SLICED})  # fmt: skip
        for name in SLICED:
            if name in quota and quota[name] > best.get(name, -1):
                best[name] = quota[name]
    return Resources(best)


def parse_slice(annotation: str | None) -> Resources:
    if annotation is None or not annotation.strip():
        return default_slice()
    try:
        raw = json.loads(annotation)
        if not isinstance(raw, dict):
            raise SliceError(f"the slice annotation must be a JSON object of quantities, got {annotation!r}")
        return Resources(raw)
    except (json.JSONDecodeError, QuantityError) as e:
        raise SliceError(f"the slice annotation is not a JSON ResourceList: {e}") from e


def slice_count(quota: Resources, slice_: Resources) -> int:
    """max over resources of ceil(quota / slice), with exact decimals."""
    if not quota:
        raise SliceError("the namespace has no ResourceQuota with cpu or memory")
    missing = [n for n in slice_ if n not in quota]
    if missing:
        raise SliceError(f"slice resource {', '.join(missing)} is not in the namespace's quota")
    extra = [n for n in slice_ if n not in SLICED]
    if extra:
        raise SliceError(f"slice resource {', '.join(extra)} cannot be sliced (only cpu and memory)")
    unsliced = [n for n in quota if n not in slice_]
    if unsliced:
        raise SliceError(f"the quota's {', '.join(unsliced)} has no slice size")
    for name, size in slice_.items():
        if size <= 0:
            raise SliceError(f"slice {name} must be positive, got {size}")
        if size > quota[name]:
            raise SliceError(f"slice {name} ({size}) is bigger than the quota ({quota[name]})")
    return max(math.ceil(quota[name] / size) for name, size in slice_.items())
