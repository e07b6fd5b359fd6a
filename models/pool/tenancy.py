"""Many tenants in one pass (activities/pool.py): a namespace is known to the pool by its tenant and name,
`<tenant>/<namespace>` (its id: a "/" is in neither name), in the pass's books, its results and the moves the workflow
runs. What each tenant's slices hold is summed per super cluster for its Tenant's status, and a tenant whose
control plane does not answer is counted at what that status last said: its slices stay held, so no other
tenant is promised the same capacity."""

from __future__ import annotations

from collections.abc import Mapping

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
