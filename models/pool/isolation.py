"""What keeps a tenant's pods inside their namespace in a super cluster, pure: the syncer
(workers/syncer.py) builds a super cluster's namespaces, pod copies and quota copies with these.

1. Pod Security: every tenant namespace enforces its SuperCluster's spec.podSecurity (baseline or
   restricted; never privileged, which would open the node, and every tenant on it).
2. Priority (`tenant_priority_class`): a tenant pod keeps a priorityClassName its SuperCluster allows
   (spec.priorityClasses.allowed); any other, or none, gets the default class (or none). The priority
   number and preemption policy the tenant's admission resolved are never copied: the super cluster's
   admission resolves them from the class, so no tenant preempts another's pods with a class of its own
   making, nor with the super cluster's system- classes (the schema refuses them).
3. Tolerations (`tenant_tolerations`): a tenant pod keeps only the tolerations of taints its SuperCluster
   allows (spec.tolerations.allowed); the super cluster's own admission adds its defaults (not-ready,
   unreachable). So no tenant pod runs on the nodes the super cluster's owner keeps apart with taints (its
   control plane, system or other dedicated nodes), and those nodes are not counted as the pool's capacity
   (models/pool/health.py).
4. Quota (`quota_share`): a namespace placed over several super clusters gets, in each, the share of its
   quota placed there, its slice times the slices it holds there (`slices_held_here`), so that all copies
   together allow what the tenant's quota allows, not that many times over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from models.api.supercluster import SuperClusterPodSecurity, SuperClusterSpec
from models.pool.moves import draining_of, holding, scheduled_of
from models.pool.namespaces import held_slice, placement_of
from models.quantities import QuantityError, format_quantity, parse_quantity
from models.resources import Resources

# Quota keys count a resource's requests under either name, or its limits.
_QUOTA_PREFIXES = ("requests.", "limits.")


@dataclass(frozen=True)
class SuperClusterSettings:
    """What a syncer enforces on the tenants' objects in its super cluster, from its SuperCluster's spec.
    The defaults are a SuperCluster that sets nothing."""

    pod_security: SuperClusterPodSecurity = "baseline"
    """The Pod Security level of every tenant namespace there."""
    allowed_priority_classes: frozenset[str] = field(default_factory=frozenset)
    """Priority class names a tenant pod keeps there."""
    default_priority_class: str | None = None
    """The class of every other tenant pod there; None: the super cluster's global default."""
    allowed_taints: frozenset[str] = field(default_factory=frozenset)
    """Taint keys a tenant pod's tolerations may name there."""

    @classmethod
    def of(cls, spec: SuperClusterSpec) -> SuperClusterSettings:
        return cls(pod_security=spec.pod_security, allowed_priority_classes=frozenset(spec.priority_classes.allowed),
                   default_priority_class=spec.priority_classes.default,
                   allowed_taints=frozenset(spec.tolerations.allowed))  # fmt: skip


def tenant_priority_class(requested: str | None, settings: SuperClusterSettings) -> str | None:
    """The priorityClassName of a tenant pod's copy."""
    if requested is not None and requested in settings.allowed_priority_classes:
        return requested
    return settings.default_priority_class


def tenant_tolerations(requested: object, settings: SuperClusterSettings) -> list[dict[str, object]]:
    """The tolerations of a tenant pod's copy: those whose key the SuperCluster allows (a toleration without a
    key, of every taint, never)."""
    if not isinstance(requested, list):
        return []
    return [t for t in requested if isinstance(t, dict) and t.get("key") in settings.allowed_taints]


@dataclass(frozen=True)
class QuotaShare:
    """What a namespace holds in one super cluster: `slices` slices of `slice_`."""

    slice_: Resources
    slices: int


def slices_held_here(annotations: Mapping[str, str], cluster: str) -> QuotaShare | None:
    """The share of a tenant namespace's quota that a super cluster holds: the slices of its placement
    there, plus those still draining from there (their pods still run); while a user's edit of the
    placement waits for the scheduler, the slices it last scheduled there. None when the slice cannot be
    read (the namespace's own decision says why): its quota is copied whole."""
    slice_ = held_slice(annotations)
    if slice_ is None:
        return None
    held = holding(placement_of(annotations), draining_of(annotations)).get(cluster, 0)
    return QuotaShare(slice_, held or scheduled_of(annotations).get(cluster, 0))


def quota_share(hard: Mapping[str, str], share: QuotaShare) -> dict[str, str]:
    """A ResourceQuota's spec.hard as one super cluster enforces it: every key of a sliced resource
    (cpu, requests.cpu, limits.cpu, and memory alike) is the share, never more than the tenant's own
    value (a last slice may be partly beyond the quota); other keys (counts of pods, Services, ...) are
    kept as they are: a count cannot be split by slices, and each copy bounds it as the tenant does."""
    result = dict(hard)
    for key, value in hard.items():
        name = key.removeprefix(_QUOTA_PREFIXES[0]).removeprefix(_QUOTA_PREFIXES[1])
        if name not in share.slice_:
            continue
        try:
            tenants = parse_quantity(value)
        except QuantityError:
            continue  # the tenant's API server accepted it: its own spelling is kept, the copy refuses alike
        result[key] = format_quantity(min(share.slice_[name] * Decimal(share.slices), tenants))
    return result
