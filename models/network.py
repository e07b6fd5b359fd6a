"""PodCIDR remapping, the pure part of the local network module: a provider whose PodCIDR does not
overlap the consumer's keeps it ("None": no remapping); one that does gets the first free block of the
same size in 100.64.0.0/10 (shared address space, never routed on the internet)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

NO_REMAPPING = "None"
REMAP_POOL = ipaddress.ip_network("100.64.0.0/10")


class RemapError(ValueError):
    """The advertised PodCIDR is unusable, or no block of its size is free."""


def remap_pod_cidr(advertised: str, *, local: Iterable[str], taken: Iterable[str]) -> str:
    try:
        network = ipaddress.ip_network(advertised, strict=True)
    except ValueError as e:
        raise RemapError(f"network.podCIDR {advertised!r} is not a CIDR: {e}") from e
    used = [ipaddress.ip_network(c) for c in (*local, *taken) if c and c != NO_REMAPPING]
    if not any(network.overlaps(u) for u in used):
        return NO_REMAPPING
    if network.version != 4 or network.prefixlen < REMAP_POOL.prefixlen:
        raise RemapError(f"network.podCIDR {advertised} overlaps ours and cannot be remapped into {REMAP_POOL}")
    for candidate in REMAP_POOL.subnets(new_prefix=network.prefixlen):
        if not any(candidate.overlaps(u) for u in used):
            return str(candidate)
    raise RemapError(f"no free /{network.prefixlen} left in {REMAP_POOL}")
