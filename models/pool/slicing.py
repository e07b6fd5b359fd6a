"""A tenant namespace's quota, divided into slices (virtualcluster's scheme, without its bugs: exact
milli-CPU, a default slice that is never mutated and adapts to small quotas, errors that say which rule)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from models.names import SLICE_ANNOTATION
from models.quantities import QuantityError
from models.resources import Resources

SLICED = ("cpu", "memory")


def default_slice() -> Resources:
    return Resources(cpu="2", memory="4Gi")  # a new object each time: callers cannot mutate a shared one


def has_slice_annotation(annotation: str | None) -> bool:
    return annotation is not None and bool(annotation.strip())


def default_slice_for(quota: Resources, *, placed: Resources | None = None) -> Resources:
    """The slice of a namespace without the slice annotation. The slice it was placed with while that still
    divides its quota: a grown quota adds slices instead of resizing them (a resized slice needs a new
    placement). Otherwise the default slice over the quota's resources, each capped at the quota: every slice
    must fit in one super cluster, and a namespace whose quota is smaller than the default is one slice of
    it in that resource (the default vector, with virtualcluster's count, the largest over resources)."""
    if placed is not None:
        try:
            slice_count(quota, placed)
        except SliceError:
            pass
        else:
            return placed
    return Resources({name: min(size, quota[name]) for name, size in default_slice().items() if name in quota})


def namespace_slices(*, annotation: str | None, quota: Resources, placed: Resources | None) -> tuple[Resources, int]:
    """A namespace's slice and how many of them its quota takes: the annotation's, else the default
    (`default_slice_for`, given the slice it was `placed` with). A refusal of the default says it is one."""
    if has_slice_annotation(annotation):
        slice_ = parse_slice(annotation)
        return slice_, slice_count(quota, slice_)
    slice_ = default_slice_for(quota, placed=placed)
    try:
        return slice_, slice_count(quota, slice_)
    except SliceError as e:
        raise SliceError(f"{e} (no {SLICE_ANNOTATION} annotation: the slice is the default, "
                         f"{_text(default_slice())} capped at the quota)") from e  # fmt: skip


def _text(resources: Resources) -> str:
    return json.dumps(resources.to_kubernetes(), sort_keys=True)


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
    """The slice annotation's; absent, the default slice before it adapted to the quota: what a namespace
    placed before the placed-slice annotation existed holds."""
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
