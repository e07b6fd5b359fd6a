"""Many tenants in one pass (activities/pool.py): a namespace is known to the pool by its tenant and name,
`<tenant>/<namespace>` (its id: a "/" is in neither name), in the pass's books, its results and the moves the workflow
runs. What each tenant's slices hold is summed per super cluster for its Tenant's status, and a tenant whose
control plane does not answer is counted at what that status last said: its slices stay held, so no other
tenant is promised the same capacity."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from models.api.tenant import NamespacePlacement
from models.names import (
    DRAINING_ANNOTATION,
    MANDATORY_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    SCHEDULED_ANNOTATION,
)
from models.resources import Resources

# An entry of an unreachable tenant's recorded holding in the pass's books: no namespace name has an '@'.
RECORDED = "@"


def namespace_id(tenant: str, namespace: str) -> str:
    return f"{tenant}/{namespace}"


def split_namespace_id(key: str) -> tuple[str, str]:
    """(tenant, namespace) of a key; ValueError for a key without a tenant (one a 0.1 pass recorded)."""
    tenant, _, namespace = key.partition("/")
    if not tenant or not namespace:
        raise ValueError(f"{key!r} names no tenant: expected <tenant>/<namespace>")
    return tenant, namespace


_PLACEMENT = TypeAdapter(NamespacePlacement)
_RESOURCES = TypeAdapter(Resources)


def recorded_placements(tenant: Mapping[str, Any] | None) -> dict[str, NamespacePlacement]:
    """The pool's records of a tenant's namespaces, from its Tenant's status (the one reader: the pass, the
    moves and the syncers). Each entry is read on its own: one that does not read (written under an older
    schema) is left out, and nothing is copied for its namespace, while the others stand."""
    return _entries(tenant, "placements", _PLACEMENT)


def recorded_placement(tenant: Mapping[str, Any] | None, namespace: str) -> NamespacePlacement | None:
    """The record of one namespace (read alone: a syncer asks for it on every object it syncs)."""
    return _entries(tenant, "placements", _PLACEMENT, only=namespace).get(namespace)


def recorded_held(tenant: Mapping[str, Any] | None) -> dict[str, Resources]:
    """What a tenant's slices hold per super cluster, as its Tenant's status last said."""
    return _entries(tenant, "held", _RESOURCES)


def _entries(tenant: Mapping[str, Any] | None, field: str, adapter: TypeAdapter[Any], *,
             only: str | None = None) -> dict[str, Any]:  # fmt: skip
    found = ((tenant or {}).get("status") or {}).get(field)
    found = found if isinstance(found, Mapping) else {}
    read: dict[str, Any] = {}
    for key, value in (found.items() if only is None else [(only, found[only])] if only in found else []):
        try:
            read[str(key)] = adapter.validate_python(value)
        except ValidationError:
            continue
    return read


def holdings(held: Mapping[str, Mapping[str, int]], slices: Mapping[str, Resources]) -> dict[str, dict[str, Resources]]:
    """Per tenant, per super cluster: what its namespaces' slices hold (placement and draining)."""
    total: dict[str, dict[str, Resources]] = {}
    for key, placement in held.items():
        slice_ = slices.get(key)
        if slice_ is None:
            continue
        tenant = split_namespace_id(key)[0]
        for cluster, count in placement.items():
            if count > 0:
                clusters = total.setdefault(tenant, {})
                clusters[cluster] = clusters.get(cluster, Resources()) + Resources({k: v * count for k, v in slice_.items()})
    return total


def recorded_entries(tenant: str, recorded: Mapping[str, Resources]) -> tuple[dict[str, dict[str, int]], dict[str, Resources]]:
    """An unreachable tenant's recorded holding as entries of the pass's books (`held`, `slices`): one per
    cluster, one slice of exactly what it holds there."""
    keys = {cluster: namespace_id(tenant, f"{RECORDED}{cluster}") for cluster in recorded}
    return ({keys[c]: {c: 1} for c in recorded}, {keys[c]: amount for c, amount in recorded.items()})


# What only the pool writes of a namespace's placement: the tenant's copies of these annotations are shown to
# it, never read back. PLACEMENTS_ANNOTATION is the tenant's to edit (a placement it asks for).
POOL_OWNED = (SCHEDULED_ANNOTATION, PLACED_SLICE_ANNOTATION, DRAINING_ANNOTATION, MANDATORY_ANNOTATION)


def trusted_annotations(annotations: Mapping[str, str], record: NamespacePlacement | None, *,
                        edits: bool) -> dict[str, str]:  # fmt: skip
    """A tenant namespace's annotations with what the pool owns taken from its record (the Tenant's status in
    the management cluster), never from the namespace, whose annotations the tenant can write: a forged
    `scheduled`, slice or `draining` would have the syncers copy beyond what the scheduler placed, and the pass
    keep it. With `edits` (the scheduler's pass) the tenant's own placements annotation stays, as a request the
    pass weighs against capacity; without (the syncers), the placement is the record's alone."""
    trusted = {key: value for key, value in annotations.items() if key not in POOL_OWNED}
    if not edits or (PLACEMENTS_ANNOTATION in annotations and annotations[PLACEMENTS_ANNOTATION] ==
                     annotations.get(SCHEDULED_ANNOTATION) and record is None):  # fmt: skip
        # Not the tenant's request: the syncers follow the record alone, and a placement equal to `scheduled`
        # without a record is one the scheduler wrote and no longer holds (0.1's, or a record since dropped).
        trusted.pop(PLACEMENTS_ANNOTATION, None)
    if record is None or not (record.placement or record.draining):
        return trusted
    placement = json.dumps(record.placement, sort_keys=True)
    trusted[SCHEDULED_ANNOTATION] = placement
    trusted[PLACED_SLICE_ANNOTATION] = json.dumps(record.slice.to_kubernetes(), sort_keys=True)
    if record.draining:
        trusted[DRAINING_ANNOTATION] = json.dumps(record.draining, sort_keys=True)
    if record.mandatory:
        trusted[MANDATORY_ANNOTATION] = json.dumps(record.mandatory, sort_keys=True)
    if not edits:
        trusted[PLACEMENTS_ANNOTATION] = placement
    return trusted
