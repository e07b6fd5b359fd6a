"""The consumer's acceptance policy, as a pure function of a snapshot of the cluster's Advertisements
and its ClusterConfig (seeds 000/003, and their future work: manual acceptance, allow/deny lists).

The number accepted is always counted from the Advertisements themselves, never kept as a counter
(Liqo's counter was never decremented). Only one admission workflow per cluster calls `decide`, one
pass at a time, so concurrent arrivals cannot overshoot the maximum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from models.api import ClusterConfig
from models.names import DECISION_ANNOTATION, DECISION_REASON_ANNOTATION
from models.quantities import QuantityError, parse_quantity

Phase = Literal["Pending", "Accepted", "Refused", "Deleting"]
# The closed set of reasons, one per outcome.
ACCEPTED_REASONS = ("WithinMaximum", "ManuallyAccepted")
REFUSED_REASONS = ("MaxReached", "Denied", "NotAllowed", "Invalid", "ManuallyRefused")
PENDING_REASONS = ("AwaitingManualDecision",)


@dataclass(frozen=True)
class Candidate:
    name: str
    provider: str
    phase: Phase | None
    reason: str | None
    arrival: tuple[str, str]  # (creationTimestamp, name): arrival order
    problems: tuple[str, ...] = ()
    manual: Literal["accept", "refuse"] | None = None
    manual_reason: str = ""
    deleting: bool = False


@dataclass(frozen=True)
class Decision:
    name: str
    provider: str
    phase: Phase
    reason: str
    message: str


@dataclass(frozen=True)
class AdmissionSnapshot:
    policy: Literal["AutoAcceptMax", "Manual"]
    maximum: int
    allowed: frozenset[str]
    denied: frozenset[str]
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)

    @classmethod
    def from_kubernetes(cls, *, config: ClusterConfig, advertisements: Iterable[Mapping[str, Any]],
                        now: datetime) -> AdmissionSnapshot:  # fmt: skip
        incoming = config.spec.incoming
        return cls(
            policy=incoming.accept_policy,
            maximum=incoming.max_acceptable_advertisements,
            allowed=frozenset(incoming.allowed_clusters),
            denied=frozenset(incoming.denied_clusters),
            candidates=tuple(candidate(a, now) for a in advertisements),
        )


def validate_advertisement(adv: Mapping[str, Any], now: datetime) -> list[str]:
    """Why an arriving Advertisement cannot be accepted; empty when it can. Never raises: a foreign
    cluster may write anything the CRD lets through (and an older CRD lets through more)."""
    problems: list[str] = []
    spec = adv.get("spec")
    if not isinstance(spec, Mapping):
        return ["spec is missing"]
    if not isinstance(spec.get("clusterId"), str) or not spec.get("clusterId"):
        problems.append("spec.clusterId is missing")
    hard = (spec.get("resourceQuota") or {}).get("hard") if isinstance(spec.get("resourceQuota"), Mapping) else None
    if not isinstance(hard, Mapping) or not hard:
        problems.append("spec.resourceQuota.hard offers no resources")
    else:
        for name, value in hard.items():
            try:
                if parse_quantity(value) < 0:
                    problems.append(f"spec.resourceQuota.hard.{name} is negative ({value})")
            except QuantityError:
                problems.append(f"spec.resourceQuota.hard.{name} is not a quantity ({value!r})")
        if not problems and all(parse_quantity(v) == 0 for v in hard.values()):
            problems.append("spec.resourceQuota.hard offers no resources (all zero)")
    ttl = spec.get("timeToLive")
    try:
        expires = datetime.fromisoformat(str(ttl).replace("Z", "+00:00"))
        if expires <= now:
            problems.append(f"spec.timeToLive {ttl} has passed")
    except ValueError:
        problems.append(f"spec.timeToLive is not a time ({ttl!r})")
    return problems


def candidate(adv: Mapping[str, Any], now: datetime) -> Candidate:
    meta = adv.get("metadata") or {}
    status = adv.get("status") or {}
    annotations = meta.get("annotations") or {}
    manual = annotations.get(DECISION_ANNOTATION)
    spec = adv.get("spec") if isinstance(adv.get("spec"), Mapping) else {}
    return Candidate(
        name=str(meta.get("name", "")),
        provider=str(spec.get("clusterId") or ""),
        phase=status.get("phase"),
        reason=status.get("reason"),
        arrival=(str(meta.get("creationTimestamp") or ""), str(meta.get("name", ""))),
        problems=tuple(validate_advertisement(adv, now)),
        manual=manual if manual in ("accept", "refuse") else None,
        manual_reason=str(annotations.get(DECISION_REASON_ANNOTATION) or ""),
        deleting=bool(meta.get("deletionTimestamp")) or status.get("phase") == "Deleting",
    )


def decide(snapshot: AdmissionSnapshot) -> list[Decision]:
    """The changes to make, in arrival order. Accepted ones stay accepted (a lowered maximum applies to
    new arrivals only); refused-for-room ones are accepted in arrival order when room appears."""
    wanted: dict[str, tuple[Phase, str, str]] = {}
    ordered = sorted((c for c in snapshot.candidates if not c.deleting), key=lambda c: c.arrival)
    accepted = sum(1 for c in ordered if c.phase == "Accepted")
    for c in ordered:
        if c.phase == "Accepted":
            continue  # once accepted, only teardown ends it
        if c.problems:
            wanted[c.name] = ("Refused", "Invalid", "; ".join(c.problems))
        elif c.provider in snapshot.denied:
            wanted[c.name] = ("Refused", "Denied", f"cluster {c.provider} is in deniedClusters")
        elif snapshot.allowed and c.provider not in snapshot.allowed:
            wanted[c.name] = ("Refused", "NotAllowed", f"cluster {c.provider} is not in allowedClusters")
        elif snapshot.policy == "Manual":
            if c.manual == "accept":
                wanted[c.name] = ("Accepted", "ManuallyAccepted", c.manual_reason or "accepted by hand")
                accepted += 1
            elif c.manual == "refuse":
                wanted[c.name] = ("Refused", "ManuallyRefused", c.manual_reason or "refused by hand")
            else:
                wanted[c.name] = ("Pending", "AwaitingManualDecision",
                                  "acceptPolicy is Manual: accept or refuse it (update or annotation)")  # fmt: skip
        elif accepted < snapshot.maximum:
            wanted[c.name] = ("Accepted", "WithinMaximum",
                              f"accepted as number {accepted + 1} of at most {snapshot.maximum}")  # fmt: skip
            accepted += 1
        else:
            wanted[c.name] = ("Refused", "MaxReached",
                              f"{accepted} Advertisements accepted, maxAcceptableAdvertisements is {snapshot.maximum}")
    by_name = {c.name: c for c in ordered}
    return [
        Decision(name=name, provider=by_name[name].provider, phase=phase, reason=reason, message=message)
        for name, (phase, reason, message) in wanted.items()
        if (by_name[name].phase, by_name[name].reason) != (phase, reason)
    ]
