"""PodCIDR remapping, the pure part of the local network module: a provider whose PodCIDR overlaps none of
the consumer's own networks (its PodCIDR, its Service CIDRs, its nodes' addresses) keeps it ("None": no
remapping); one that overlaps any gets the first free block of the same size in 100.64.0.0/10 (shared
address space, never routed on the internet). Every decision is for one advertised PodCIDR: the network
module records it beside the remapping (status.remappedForPodCIDR), and the virtual kubelet shows pod IPs
only inside that one, so a provider that edits spec.network.podCIDR after acceptance gains nothing.

`pod_cidr_problem` is what admission (and the Advertisement's model) refuses outright: addresses no pod
of a peer's can have, and blocks so wide that they can only be meant to cover someone else's."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

NO_REMAPPING = "None"
REMAP_POOL = ipaddress.ip_network("100.64.0.0/10")
# The widest PodCIDR a provider may advertise. IPv4: 10.0.0.0/8, the widest private block and the widest any
# cluster uses; wider spans several /8s of others' addresses (and, overlapping, could never be remapped into
# the /10 pool). IPv6: node IPAM splits a cluster CIDR into at most 2^16 node blocks, so even /48 per node
# (far beyond the usual /64) fits a /32, the size of a whole operator's allocation.
WIDEST_PREFIX = {4: 8, 6: 32}
# Addresses no peer's pod has, whatever the network module says: a pod IP there would reach the consumer's
# own host (loopback, "this network", IPv4 in IPv6), its link (link-local: cloud metadata services among
# them), a group (multicast) or nothing routable (reserved, broadcast).
UNUSABLE = {
    "0.0.0.0/8": "unspecified", "127.0.0.0/8": "loopback", "169.254.0.0/16": "link-local",
    "224.0.0.0/4": "multicast", "240.0.0.0/4": "reserved",
    "::/128": "unspecified", "::1/128": "loopback", "::ffff:0:0/96": "IPv4-mapped", "fe80::/10": "link-local",
    "ff00::/8": "multicast",
}  # fmt: skip


class RemapError(ValueError):
    """The advertised PodCIDR is unusable, or no block of its size is free."""


def pod_cidr_problem(value: object) -> str | None:
    """Why `value` cannot be an advertised PodCIDR (a sentence naming spec.network.podCIDR), or None."""
    if not isinstance(value, str) or not value:
        return f"spec.network.podCIDR must be a CIDR such as 10.1.0.0/16, got {value!r}"
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        return f"spec.network.podCIDR {value[:64]!r} is not a CIDR: {e}"
    for block, kind in UNUSABLE.items():
        if network.overlaps(ipaddress.ip_network(block)):
            return f"spec.network.podCIDR {network} overlaps {block} ({kind}): no pod has such an address"
    if network.prefixlen < WIDEST_PREFIX[network.version]:
        return (f"spec.network.podCIDR {network} is wider than /{WIDEST_PREFIX[network.version]}, the widest "
                f"PodCIDR accepted for IPv{network.version}")
    return None


def remap_pod_cidr(advertised: str, *, local: Iterable[str], taken: Iterable[str]) -> str:
    """The remapping of `advertised`: NO_REMAPPING when it overlaps none of the `local` networks (the
    consumer's PodCIDR, Service CIDRs and node addresses) nor the blocks `taken` by other providers."""
    if problem := pod_cidr_problem(advertised):
        raise RemapError(problem)
    network = ipaddress.ip_network(advertised, strict=True)
    used = [ipaddress.ip_network(c, strict=False) for c in (*local, *taken) if c and c != NO_REMAPPING]
    if not any(network.overlaps(u) for u in used):
        return NO_REMAPPING
    if network.version != 4 or network.prefixlen < REMAP_POOL.prefixlen:
        raise RemapError(f"spec.network.podCIDR {advertised} overlaps ours and cannot be remapped into {REMAP_POOL}")
    for candidate in REMAP_POOL.subnets(new_prefix=network.prefixlen):
        if not any(candidate.overlaps(u) for u in used):
            return str(candidate)
    raise RemapError(f"no free /{network.prefixlen} left in {REMAP_POOL}")
