"""The consumer's acceptance policy, as a pure function of a snapshot of the cluster's Advertisements
and its ClusterConfig (seeds 000/003, and their future work: manual acceptance, allow/deny lists).
Called by activities/consumer.py in the admission pass of the one AdmissionWorkflow per cluster.

The number accepted is always counted from the Advertisements themselves, never kept as a counter
(Liqo's counter was never decremented, so deleted Advertisements held their places forever). Only one
admission workflow per cluster calls `decide`, one pass at a time, so twenty arrivals at once cannot
overshoot the maximum.

Rules, in the order they apply to every Advertisement that is not Accepted and not being deleted:

1. invalid (`validate_advertisement`) → Refused/Invalid, with every problem in the message: what the model
   that generates the CRD refuses (models/api/advertisement.py, read leniently: an older CRD, or none, lets
   more through), among them a spec.network.podCIDR that no pod can have or that is too wide
   (`network.pod_cidr_problem`: loopback, link-local, multicast, unspecified, reserved, IPv4-mapped; wider than
   /8 for IPv4, /32 for IPv6); then a name other than its provider's, an offer of nothing, an expired timeToLive;
2. spec.kubeConfigRef not the Secret the protocol assigns the provider (names.credentials_secret_name in
   names.SYSTEM_NAMESPACE), or missing or unreadable (and nothing else wrong) → Refused/UnexpectedCredentials:
   a provider must not point its virtual kubelet at another provider's credentials (activities/consumer.py
   never follows the ref either);
3. provider in deniedClusters → Refused/Denied (deny wins over allow);
4. allowedClusters not empty and provider not in it → Refused/NotAllowed;
5. a price in spec.prices above the cap for its resource in maxPrices → Refused/PriceTooHigh (a resource
   without a cap is not capped; a capped one the provider gives no price for is free, within any cap);
6. a manual decision (annotation names.DECISION_ANNOTATION = accept|refuse, written by kubectl or by
   the Advertisement workflow's accept/refuse update) → Accepted/ManuallyAccepted or
   Refused/ManuallyRefused, under either policy: a person's explicit word wins over the automatic
   policy, though not over the rules above: the lists and the caps are the same person's word, and a
   manual acceptance is not bound by maxAcceptableAdvertisements (it may take the accepted count above it);
   without one, a refusal by hand kept from an earlier Advertisement of the provider (below) →
   Refused/ManuallyRefused, saying so and how to lift it;
6¾ (applied after 6). its provider was torn down as unreachable (ProviderUnreachable) again and again → Refused/
   UnreachableBackoff until its back-off ends (1 min doubling to 1 h per teardown in a row, kept by the
   admission workflow, since the Advertisement itself is deleted at each teardown): a consumer whose virtual
   kubelet cannot reach a provider that still reaches it does not re-accept its re-push at once, for ever;
6½. refused because its virtual node never became Ready (the Advertisement workflow refuses it, with
   names.REFUSED_OFFER_ANNOTATION) and offering the same as then → stays Refused/VirtualNodeNotReady; a
   changed offer is decided afresh, and a manual acceptance clears the annotation; the same offer refused so
   on an earlier Advertisement of the provider (kept, below) → Refused/VirtualNodeNotReady too, saying so,
   unless this one is accepted by hand;
7. acceptPolicy Manual → Pending/AwaitingManualDecision; with manualDecisionTimeoutSeconds, until
   status.decisionDeadline (set when it starts waiting, quoted in the message), then Refused/DecisionTimedOut,
   which sticks until a person decides (rule 6), the timeout is unset or the policy turns automatic;
8. AutoAcceptMax → Accepted/WithinMaximum in arrival order (creationTimestamp, then name) while the
   accepted count is below maxAcceptableAdvertisements, else Refused/MaxReached.

The consumer's refusals outlive the Advertisement that carried them (`kept_refusals`): the provider may delete
its Advertisement (withdrawing is its right) and push a new one, which carries none of the consumer's
annotations. Each pass records, per provider, the uid of the Advertisement annotated refuse (and its reason)
and of the one whose offer was refused as never Ready (and the offer); the admission workflow keeps the
records and hands them to the next pass, and a NEW Advertisement of that provider (another uid) is decided
as if it still carried them. A decision annotation updates the record (refuse → this uid; accept → cleared,
both refusals); the recorded Advertisement found without the annotation → someone removed it → cleared; an
Accepted Advertisement of the provider clears the refused offer (holding one drops the annotation). At
most MAX_KEPT_REFUSALS providers are kept, the least recently changed dropped first: only the consumer's own
annotations make records (the provider cannot write them, docs/threat-model.md), a provider id is one record,
and a dropped one only makes its provider's next Advertisement decided afresh, as before records were kept
(deniedClusters refuses for good).

Accepted Advertisements stay accepted whatever changes (a lowered maximum, a new deny entry, a lowered
price cap or a raised price, an edited kubeConfigRef, an expired timeToLive): only their deletion ends them, through the ordered teardown, which is also how a
cluster is revoked. A Deleting Advertisement holds no place. Rules are re-applied to Refused ones at
every pass, so a raised maximum accepts MaxReached ones in arrival order, and a cluster taken off the
deny list, or an Advertisement its provider has corrected, is reconsidered like a new arrival. A decision
is written when the phase, the reason or the message differs from the Accepted condition's, so a moved
maximum rewrites the MaxReached messages that quote it; every message is a function of the snapshot
alone (MaxReached's quotes the maximum, not the accepted count), so a written one is never rewritten
until the snapshot moves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from models.api import ClusterConfig
from models.api.advertisement import Advertisement, AdvertisementPhase, read_advertisement
from models.api.conditions import AcceptedReason, AdmissionReason, PendingReason, RefusedReason
from models.api.reading import Reading
from models.explain import MAX_ADMISSION_ENTRIES, AdmissionEntry, as_mapping
from models.names import (
    DECISION_ANNOTATION,
    DECISION_REASON_ANNOTATION,
    REFUSED_OFFER_ANNOTATION,
    SYSTEM_NAMESPACE,
    advertisement_name,
    credentials_secret_name,
)
from models.prices import format_price, price_unit
from models.resources import Resources
from models.times import format_rfc3339, parse_rfc3339

Policy = Literal["AutoAcceptMax", "Manual"]
ManualVerdict = Literal["accept", "refuse"]
# The closed set of reasons (the Accepted condition's, in models/api/conditions.py), grouped by the phase
# they come with.
REASONS: Final[Mapping[str, frozenset[str]]] = {
    "Accepted": frozenset(get_args(AcceptedReason)),
    "Refused": frozenset(get_args(RefusedReason)),
    "Pending": frozenset(get_args(PendingReason)),
}

KUBE_CONFIG_REF: Final = "spec.kubeConfigRef"
# Where an Advertisement without a readable creationTimestamp queues: last (the API server always
# sets one, so only hand-made objects get here).
_NEVER = datetime.max.replace(tzinfo=UTC)


# Providers whose refusals the admission workflow keeps past their Advertisements; see the module docstring
# for why dropping the least recently changed beyond it is safe.
MAX_KEPT_REFUSALS: Final = 100
MAX_KEPT_REASON: Final = 256  # the reason given with a refusal by hand, as kept (the update allows 256)


class RefusalOnRecord(BaseModel):
    """One of the consumer's refusals of a provider, and the Advertisement that carried it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    uid: str = Field(min_length=1, max_length=128)  # metadata.uid of the Advertisement
    # By hand: the reason given (names.DECISION_REASON_ANNOTATION); never Ready: the offer refused.
    detail: str = Field(default="", max_length=MAX_KEPT_REASON)


class KeptRefusals(BaseModel):
    """The consumer's refusals of one provider that outlive its Advertisement (the admission workflow keeps
    them, carried over continue-as-new)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    by_hand: RefusalOnRecord | None = None  # names.DECISION_ANNOTATION = refuse
    not_ready: RefusalOnRecord | None = None  # names.REFUSED_OFFER_ANNOTATION: detail is the offer_fingerprint
    changed: datetime  # the pass that last changed it: the least recently changed is dropped first


@dataclass(frozen=True)
class Candidate:
    """One Advertisement as admission sees it."""

    name: str
    provider: str  # spec.clusterId ("" when missing)
    phase: str | None  # status.phase as found (None for a new arrival)
    reason: str | None  # status.reason as found
    message: str | None  # the Accepted condition's message as found
    arrival: tuple[datetime, str]  # (creationTimestamp, name): arrival order
    problems: tuple[str, ...] = ()  # why it is invalid; empty when valid
    manual: ManualVerdict | None = None
    manual_reason: str = ""
    deleting: bool = False
    credentials: tuple[str, str] | None = None  # spec.kubeConfigRef as found: (namespace, name)
    prices: Resources = field(default_factory=Resources)  # spec.prices (empty when it has none)
    decision_deadline: datetime | None = None  # status.decisionDeadline as found
    offer: str = ""  # offer_fingerprint of its spec
    refused_offer: str | None = None  # names.REFUSED_OFFER_ANNOTATION
    resources: Resources = field(default_factory=Resources)  # spec.resourceQuota.hard (empty when it is none)
    uid: str = ""  # metadata.uid: which Advertisement of its provider this is


@dataclass(frozen=True)
class Decision:
    """A change to write on an Advertisement's status: phase and reason, and a sentence for people
    (the Accepted condition's message and the Event)."""

    name: str
    provider: str
    phase: AdvertisementPhase
    reason: AdmissionReason
    message: str
    decision_deadline: datetime | None = None  # status.decisionDeadline to write (None clears it)


@dataclass(frozen=True)
class AdmissionSnapshot:
    policy: Policy
    maximum: int
    allowed: frozenset[str]
    denied: frozenset[str]
    candidates: tuple[Candidate, ...] = ()
    max_prices: Resources = field(default_factory=Resources)
    decision_timeout: timedelta | None = None  # manualDecisionTimeoutSeconds
    now: datetime = _NEVER  # the pass's time: when a wait for a manual decision starts, and whether it ended
    # Providers torn down as unreachable again and again, backing off (rule 6¾): provider -> (teardowns in a
    # row, not accepted again before). The admission workflow keeps them: their Advertisements are deleted.
    backoffs: Mapping[str, tuple[int, datetime]] = field(default_factory=dict)
    # The consumer's refusals kept from earlier passes, by provider (`kept_refusals`); the admission workflow
    # keeps them: a provider may delete the Advertisement that carried them.
    kept: Mapping[str, KeptRefusals] = field(default_factory=dict)

    @cached_property  # read by `decide`, the pass's records and `live_entries`; the snapshot never changes
    def live(self) -> tuple[Candidate, ...]:
        """The Advertisements that hold or may take a place (not being deleted), in arrival order."""
        return tuple(sorted((c for c in self.candidates if not c.deleting), key=lambda c: c.arrival))

    @classmethod
    def from_kubernetes(cls, *, config: ClusterConfig, advertisements: Iterable[Mapping[str, Any]], now: datetime,
                        backoffs: Mapping[str, tuple[int, datetime]] | None = None,
                        kept: Mapping[str, KeptRefusals] | None = None) -> AdmissionSnapshot:  # fmt: skip
        """From the ClusterConfig and the Advertisements as the API server lists them (JSON dicts)."""
        incoming = config.spec.incoming
        return cls(
            policy=incoming.accept_policy,
            maximum=incoming.max_acceptable_advertisements,
            allowed=frozenset(incoming.allowed_clusters),
            denied=frozenset(incoming.denied_clusters),
            candidates=tuple(candidate(a, now) for a in advertisements),
            max_prices=incoming.max_prices or Resources(),
            decision_timeout=timedelta(seconds=incoming.manual_decision_timeout_seconds)
            if incoming.manual_decision_timeout_seconds is not None else None,
            now=now,
            backoffs={p: b for p, b in (backoffs or {}).items() if b[1] > now},
            kept=dict(kept or {}),
        )  # fmt: skip


def validate_advertisement(adv: Any, now: datetime) -> list[str]:
    """Why an arriving Advertisement cannot be accepted, one sentence per problem naming the field and the rule;
    empty when it can. Never raises: a foreign cluster may write anything the CRD lets through (and an
    older CRD, or none, lets through more). `now` must carry a time zone."""
    return _timeless_problems(read_advertisement(adv)) + _expiry_problems(adv, now)


def _expiry_problems(adv: Any, now: datetime) -> list[str]:
    """The one problem the clock finds: a readable spec.timeToLive that has passed (read by the codec its field
    type reads it with, models.times.ZonedTime)."""
    ttl = as_mapping(as_mapping(adv).get("spec")).get("timeToLive")
    expires = parse_rfc3339(ttl)
    return [f"spec.timeToLive {ttl} has passed"] if expires is not None and expires <= now else []


def _timeless_problems(reading: Reading[Advertisement]) -> list[str]:
    """Every problem of `validate_advertisement` but the clock's (`_expiry_problems`), which comes last: the
    model's (models.api.advertisement, which generates the CRD), then what is no structure (a name other than its
    provider's, an offer of nothing), checked on the fields the model read soundly: every problem named at once."""
    problems = reading.sentences
    provider, name = reading.sound("spec", "clusterId"), reading.sound("metadata", "name")
    # One Advertisement per provider: its name is derived from the id, so a second object claiming the same
    # provider cannot exist, and two virtual kubelets never fight over one virtual node.
    if isinstance(provider, str) and not reading.unsound("metadata", "name") and name != advertisement_name(provider):
        problems.append(f"metadata.name {name!r} must be {advertisement_name(provider)!r} for clusterId {provider!r}")
    # Well formed though it offers nothing (a provider sharing 0% writes it): nothing to accept.
    hard = reading.sound("spec", "resourceQuota", "hard")
    if isinstance(hard, Mapping) and not hard:
        problems.append("spec.resourceQuota.hard is empty: an Advertisement must offer resources")
    elif isinstance(hard, Mapping) and all(amount == 0 for amount in Resources(hard).values()):
        problems.append("spec.resourceQuota.hard offers nothing: every amount is zero")
    return problems


def _unreadable_credentials_only(c: Candidate) -> bool:
    """Whether c's only problems are a spec.kubeConfigRef missing or unreadable: the credentials rule (2) says so,
    naming the Secret the protocol assigns, rather than rule 1."""
    return c.credentials is None and all(p.startswith((f"{KUBE_CONFIG_REF} ", f"{KUBE_CONFIG_REF}.")) for p in c.problems)


@dataclass(frozen=True)
class AdmissionView:
    """What admission decides from in one Advertisement, minus the clock: `candidate` adds the clock and
    what only the pass's records read, and the consumer's watcher keys on this (hashable), so that what
    wakes admission and what admission decides on cannot drift apart. Left out:
    - the problem only the clock finds (`_expiry_problems`): a push renews spec.timeToLive, no news, except
      to one refused as Invalid (its timeToLive may have passed: a renewal may make it valid); that it
      passes is the AdvertisementWorkflow's business (it deletes an expired one, and the deletion is news);
    - the offered resources, which only `live_entries` records (for `tidepool simulate`): a push that
      offers more or less is no news to admission;
    - the offer's fingerprint, unless a refusal for a virtual node never Ready may hold for it (rule 6½)."""

    candidate: Candidate
    renewal: str | None  # spec.timeToLive while refused as Invalid


def admission_view(adv: Mapping[str, Any]) -> AdmissionView:
    """The view of an Advertisement as the API server serves it, read without ever raising."""
    whole = _candidate(as_mapping(adv))
    ttl = as_mapping(as_mapping(adv).get("spec")).get("timeToLive")
    refused = (whole.phase, whole.reason)
    offer_matters = whole.refused_offer is not None or refused == ("Refused", "VirtualNodeNotReady")
    return AdmissionView(candidate=replace(whole, resources=Resources(), offer=whole.offer if offer_matters else ""),
                         renewal=str(ttl) if refused == ("Refused", "Invalid") and ttl is not None else None)  # fmt: skip


def candidate(adv: Mapping[str, Any], now: datetime) -> Candidate:
    """An Advertisement as the API server serves it at `now`, read without ever raising: its view, what the
    clock says of its timeToLive, and what the view leaves out."""
    whole = _candidate(as_mapping(adv))
    return replace(admission_view(adv).candidate, problems=whole.problems + tuple(_expiry_problems(adv, now)),
                   resources=whole.resources, offer=whole.offer)  # fmt: skip


def _candidate(adv: Mapping[str, Any]) -> Candidate:
    """`candidate` blind to the clock: every field read, none left out."""
    reading = read_advertisement(adv)
    meta, status, spec = as_mapping(adv.get("metadata")), as_mapping(adv.get("status")), as_mapping(adv.get("spec"))
    annotations = as_mapping(meta.get("annotations"))
    name = str(meta.get("name") or "")
    verdict = annotations.get(DECISION_ANNOTATION)
    phase, reason = status.get("phase"), status.get("reason")
    conditions = status.get("conditions")
    accepted = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Accepted"), None) \
        if isinstance(conditions, list) else None  # fmt: skip
    message = as_mapping(accepted).get("message")
    ref = as_mapping(spec.get("kubeConfigRef"))
    namespace, secret = ref.get("namespace"), ref.get("name")
    return Candidate(
        name=name,
        provider=spec["clusterId"] if isinstance(spec.get("clusterId"), str) else "",
        phase=phase if isinstance(phase, str) else None,
        reason=reason if isinstance(reason, str) else None,
        message=message if isinstance(message, str) else None,
        arrival=(parse_rfc3339(meta.get("creationTimestamp")) or _NEVER, name),
        problems=tuple(_timeless_problems(reading)),
        manual=verdict if verdict in ("accept", "refuse") else None,
        manual_reason=str(annotations.get(DECISION_REASON_ANNOTATION) or ""),
        deleting=bool(meta.get("deletionTimestamp")) or phase == "Deleting",
        credentials=(namespace, secret) if isinstance(namespace, str) and isinstance(secret, str) else None,
        prices=_sound_resources(reading, "spec", "prices"),
        resources=_sound_resources(reading, "spec", "resourceQuota", "hard"),
        decision_deadline=parse_rfc3339(status.get("decisionDeadline")),
        offer=offer_fingerprint(spec),
        refused_offer=str(annotations[REFUSED_OFFER_ANNOTATION]) if annotations.get(REFUSED_OFFER_ANNOTATION) else None,
        uid=meta["uid"] if isinstance(meta.get("uid"), str) else "",
    )


NOT_READY_MESSAGE: Final = ("its virtual node was not Ready within virtualNodeReadyTimeoutSeconds: refused until the "
                            "offer changes or someone accepts it by hand")  # fmt: skip


def offer_fingerprint(spec: Mapping[str, Any]) -> str:
    """What the provider offers (resources and prices), as a short digest: a refusal for a virtual node that
    never became Ready holds while it is the same."""
    offer = {"resourceQuota": spec.get("resourceQuota"), "prices": spec.get("prices")}
    try:
        text = json.dumps(offer, sort_keys=True, default=str)
    except (TypeError, ValueError):  # keys of mixed types, an integer past 4300 digits: only in hand-made objects
        text = repr(type(offer["resourceQuota"])) + repr(type(offer["prices"]))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sound_resources(reading: Reading[Advertisement], *path: str) -> Resources:
    """spec.prices or spec.resourceQuota.hard as the model reads them; empty when there are none (or when they
    are unsound: the Advertisement is invalid then, and `validate_advertisement` says why)."""
    value = reading.sound(*path)
    return Resources(value) if isinstance(value, Mapping) else Resources()


def decide(snapshot: AdmissionSnapshot) -> list[Decision]:
    """The changes to make, in arrival order: only the Advertisements whose phase, reason or message
    differs from what they have (see the module docstring for the rules)."""
    ordered = snapshot.live
    accepted = sum(1 for c in ordered if c.phase == "Accepted")
    decisions: list[Decision] = []
    for c in ordered:
        if c.phase == "Accepted":
            continue
        phase, reason, message, deadline = _rule(snapshot, c, accepted)
        if phase == "Accepted":
            accepted += 1
        if (c.phase, c.reason, c.message, c.decision_deadline) != (phase, reason, message, deadline):
            decisions.append(Decision(name=c.name, provider=c.provider, phase=phase, reason=reason, message=message,
                                      decision_deadline=deadline))  # fmt: skip
    return decisions


def live_entries(snapshot: AdmissionSnapshot, decisions: Iterable[Decision]) -> list[AdmissionEntry] | None:
    """Every live Advertisement in arrival order as the pass leaves it (`decisions` written): what `tidepool
    simulate admission` replays. None beyond MAX_ADMISSION_ENTRIES: one history event stays small."""
    ordered = snapshot.live
    if len(ordered) > MAX_ADMISSION_ENTRIES:
        return None
    written = {d.name: d for d in decisions}
    return [AdmissionEntry(
        advertisement=c.name, provider=c.provider, arrived=c.arrival[0] if c.arrival[0] != _NEVER else None,
        phase=written[c.name].phase if c.name in written else c.phase,
        reason=written[c.name].reason if c.name in written else c.reason,
        offer=c.resources.to_kubernetes(),
    ) for c in ordered]  # fmt: skip


def next_decision_deadline(snapshot: AdmissionSnapshot, decisions: Iterable[Decision]) -> datetime | None:
    """The earliest deadline of a manual decision still awaited once `decisions` are written: when the
    admission workflow passes again unasked."""
    written = {d.name: d for d in decisions}
    deadlines = [d.decision_deadline for d in written.values() if d.decision_deadline is not None]
    deadlines += [c.decision_deadline for c in snapshot.candidates if c.name not in written and not c.deleting
                  and c.phase == "Pending" and c.decision_deadline is not None]  # fmt: skip
    return min(deadlines, default=None)


def _rule(snapshot: AdmissionSnapshot, c: Candidate,
          accepted: int) -> tuple[AdvertisementPhase, AdmissionReason, str, datetime | None]:  # fmt: skip
    """(phase, reason, message, decisionDeadline): the deadline only while a manual decision is awaited under
    manualDecisionTimeoutSeconds (rule 7)."""
    phase, reason, message = _decision(snapshot, c, accepted)
    timeout = snapshot.decision_timeout
    if reason != "AwaitingManualDecision" or timeout is None:
        return phase, reason, message, None
    seconds = int(timeout.total_seconds())
    if (c.phase, c.reason) == ("Refused", "DecisionTimedOut"):
        return "Refused", "DecisionTimedOut", _timed_out(seconds), None
    waiting = (c.phase, c.reason) == ("Pending", "AwaitingManualDecision")
    deadline = c.decision_deadline if waiting and c.decision_deadline is not None else (snapshot.now + timeout).replace(microsecond=0)
    if snapshot.now >= deadline:
        return "Refused", "DecisionTimedOut", _timed_out(seconds), None
    return phase, reason, f"{message}, until {format_rfc3339(deadline)} (manualDecisionTimeoutSeconds)", deadline


# How a person lifts a refusal kept from an earlier Advertisement: an acceptance by hand on this one.
_LIFT: Final = (f"annotate it {DECISION_ANNOTATION}=accept, or use the Advertisement workflow's accept update")


def _kept_for(snapshot: AdmissionSnapshot, c: Candidate) -> tuple[RefusalOnRecord | None, RefusalOnRecord | None]:
    """(by hand, never Ready): the refusals kept from an EARLIER Advertisement of c's provider (another uid) that
    hold for c. What c's own annotations say is for the rules to read; an acceptance by hand on c lifts both."""
    kept = snapshot.kept.get(c.provider)
    if kept is None or not c.uid or c.name != advertisement_name(c.provider) or c.manual == "accept":
        return None, None
    return (kept.by_hand if kept.by_hand is not None and kept.by_hand.uid != c.uid else None,
            kept.not_ready if kept.not_ready is not None and kept.not_ready.uid != c.uid else None)  # fmt: skip


def kept_refusals(snapshot: AdmissionSnapshot) -> dict[str, KeptRefusals]:
    """The refusals to keep once this pass is done (module docstring): snapshot.kept updated from every
    Advertisement of the snapshot, deleting ones included (an operator's refusal is not lost to a withdrawal that
    raced the pass), the least recently changed dropped beyond MAX_KEPT_REFUSALS. Only an Advertisement named for
    its provider counts: another object claiming the provider's id neither carries nor lifts its refusals."""
    kept = dict(snapshot.kept)
    for c in snapshot.candidates:
        if not 0 < len(c.uid) <= 128 or not c.provider or c.name != advertisement_name(c.provider):
            continue
        before = kept.get(c.provider)
        by_hand = _recorded(before.by_hand if before else None, c, RefusalOnRecord(
            uid=c.uid, detail=c.manual_reason[:MAX_KEPT_REASON]) if c.manual == "refuse" else None)  # fmt: skip
        # An accepted one lifts a refused offer, as holding it drops the annotation (ensure_finalizer).
        not_ready = None if c.phase == "Accepted" and c.refused_offer is None else _recorded(
            before.not_ready if before else None, c,
            RefusalOnRecord(uid=c.uid, detail=c.refused_offer[:MAX_KEPT_REASON]) if c.refused_offer is not None else None)  # fmt: skip
        if by_hand is None and not_ready is None:
            kept.pop(c.provider, None)
        elif before is None or (before.by_hand, before.not_ready) != (by_hand, not_ready):
            kept[c.provider] = KeptRefusals(by_hand=by_hand, not_ready=not_ready, changed=snapshot.now)
    newest = sorted(kept.items(), key=lambda item: (item[1].changed, item[0]), reverse=True)[:MAX_KEPT_REFUSALS]
    return dict(sorted(newest))


def _recorded(before: RefusalOnRecord | None, c: Candidate, carried: RefusalOnRecord | None) -> RefusalOnRecord | None:
    """One refusal of c's provider as kept after seeing c: the one c carries; none once c is accepted by hand or
    c is the recorded Advertisement and no longer carries it (someone removed the annotation); else as before."""
    if carried is not None:
        return carried
    if c.manual == "accept" or (before is not None and before.uid == c.uid):
        return None
    return before


def _timed_out(seconds: int) -> str:
    return (f"nobody accepted or refused it within manualDecisionTimeoutSeconds ({seconds} s); "
            "accept it by hand to take it")  # fmt: skip


def _decision(snapshot: AdmissionSnapshot, c: Candidate, accepted: int) -> tuple[AdvertisementPhase, AdmissionReason, str]:
    who = f"cluster {c.provider!r}"
    if c.problems and not _unreadable_credentials_only(c):
        return "Refused", "Invalid", "invalid Advertisement: " + "; ".join(c.problems)
    expected = (SYSTEM_NAMESPACE, credentials_secret_name(c.provider))
    if c.credentials != expected:
        found = "is missing" if c.credentials is None else f"names Secret {'/'.join(c.credentials)}"
        return ("Refused", "UnexpectedCredentials",
                f"spec.kubeConfigRef {found}; the protocol assigns {who} the Secret {'/'.join(expected)}")  # fmt: skip
    if c.provider in snapshot.denied:
        return "Refused", "Denied", f"{who} is in deniedClusters"
    if snapshot.allowed and c.provider not in snapshot.allowed:
        return "Refused", "NotAllowed", f"{who} is not in allowedClusters"
    too_high = [name for name in sorted(snapshot.max_prices) if c.prices.get_or_zero(name) > snapshot.max_prices[name]]
    if too_high:
        return "Refused", "PriceTooHigh", "; ".join(
            f"spec.prices.{name} is {format_price(c.prices[name])} per {price_unit(name)}, above maxPrices.{name} "
            f"{format_price(snapshot.max_prices[name])}" for name in too_high)  # fmt: skip
    by_hand, not_ready = _kept_for(snapshot, c)
    if c.refused_offer is not None and c.refused_offer == c.offer:
        return "Refused", "VirtualNodeNotReady", NOT_READY_MESSAGE
    if c.refused_offer is None and not_ready is not None and not_ready.detail == c.offer:
        return ("Refused", "VirtualNodeNotReady",
                f"the virtual node of an earlier Advertisement of {who} (uid {not_ready.uid}) with the same offer was "
                f"not Ready within virtualNodeReadyTimeoutSeconds: refused until the offer changes or someone accepts "
                f"it by hand ({_LIFT})")  # fmt: skip
    if c.manual == "accept":
        return "Accepted", "ManuallyAccepted", f"accepted by hand: {c.manual_reason or 'no reason given'}"
    if c.manual == "refuse":
        return "Refused", "ManuallyRefused", f"refused by hand: {c.manual_reason or 'no reason given'}"
    if by_hand is not None:
        return ("Refused", "ManuallyRefused",
                f"refused by hand on an earlier Advertisement of {who} (uid {by_hand.uid}): "
                f"{by_hand.detail or 'no reason given'}; this one stays refused until someone accepts it ({_LIFT})")  # fmt: skip
    backoff = snapshot.backoffs.get(c.provider)
    if backoff is not None:
        teardowns, until = backoff
        return ("Refused", "UnreachableBackoff",
                f"{who} was torn down {teardowns} time{'s' * (teardowns != 1)} in a row because this cluster's virtual "
                f"kubelet could not reach it: not accepted again before {format_rfc3339(until)} (backing off, "
                "doubling up to an hour)")  # fmt: skip
    if snapshot.policy == "Manual":
        return ("Pending", "AwaitingManualDecision",
                f"acceptPolicy is Manual: waiting for someone to accept or refuse the offer of {who}")  # fmt: skip
    if accepted < snapshot.maximum:
        return ("Accepted", "WithinMaximum",
                f"accepted as number {accepted + 1} of at most {snapshot.maximum} (maxAcceptableAdvertisements)")  # fmt: skip
    # The maximum, not the accepted count: a deletion among the accepted must not rewrite every refusal.
    return ("Refused", "MaxReached",
            f"every place is taken: maxAcceptableAdvertisements is {snapshot.maximum}")  # fmt: skip
