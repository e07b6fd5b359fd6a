"""`tidepool explain` (issue 20): the decisions behind a peering, an Advertisement or a pool placement,
told from the workflows' histories rather than guessed from the objects as they are now.

The decisions are recorded where they are made, in results the histories already hold (no extra billable
action): a push's `PushResult` carries the offer's derivation, an admission pass's `AdmissionResult` one
`AdmissionRecord` per decision it wrote, a pool pass's `PoolDecision` the slice, count and mandatory
entries beside each cluster's reason. workers/explain.py reads the histories and hands this module
`Fact`s in time order; `peering_story`, `advertisement_story`, `namespace_story` and `pod_story` turn them
into a `Story` of dated entries, each saying what was decided and from what (models/simulate.py replays
the same facts). Two clusters never share a workflow: a consumer
explains its offer from the derivation the provider wrote into the Advertisement (`OfferDerivation`, as
the annotation names.OFFER_DERIVATION_ANNOTATION), which its observations record.

Nothing here reads a secret: the facts are decisions, quantities, phases and reasons.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal
from typing import Any, Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from models.names import LABEL_NODE_TYPE, LABEL_PROVIDER, VIRTUAL_NODE_TYPE
from models.peering import sharing_percentage_problem
from models.quantities import format_quantity
from models.resources import Resources
from models.sharing import spare
from models.times import parse_rfc3339

# At most this many admission records in one pass's result: a burst of a thousand arrivals must not make
# one history event of megabytes. The rest are counted (AdmissionResult.records_omitted).
MAX_ADMISSION_RECORDS = 100
# At most this many live Advertisements in one pass's inputs (AdmissionResult.live): `simulate admission`
# replays a pass only when all of them were recorded.
MAX_ADMISSION_ENTRIES = 500
# A derivation of a dozen resources is well under this; a larger annotation is not read.
MAX_DERIVATION_BYTES = 4096


class OfferDerivation(BaseModel):
    """How one offer was computed (seed 001): floor((allocatable − used) × percentage) per resource, where
    `used` leaves out the consumer's own offloaded pods (`consumer_own`), which run on its share."""

    model_config = ConfigDict(extra="ignore", frozen=True,
                              alias_generator=AliasGenerator(serialization_alias=to_camel, validation_alias=to_camel),
                              populate_by_name=True)  # fmt: skip

    allocatable: Resources
    used: Resources
    consumer_own: Resources = Field(default_factory=Resources)
    sharing_percentage: int = Field(ge=0, le=100)
    advertised: Resources

    def to_annotation(self) -> str:
        return json.dumps({"allocatable": self.allocatable.to_kubernetes(), "used": self.used.to_kubernetes(),
                           "consumerOwn": self.consumer_own.to_kubernetes(),
                           "sharingPercentage": self.sharing_percentage,
                           "advertised": self.advertised.to_kubernetes()}, sort_keys=True)  # fmt: skip

    @classmethod
    def from_annotation(cls, text: str | None) -> OfferDerivation | None:
        """None when absent, oversized or unreadable: a provider of an earlier release writes none, and a
        foreign annotation is never a reason to fail (nor to grow every observation recorded in history)."""
        if not text or len(text) > MAX_DERIVATION_BYTES:
            return None
        try:
            derivation = cls.model_validate(json.loads(text))
            derivation.to_annotation()  # a quantity that parses but cannot be written back fails here, not later
        except Exception:  # noqa: BLE001 - whatever a foreign cluster wrote: no derivation
            return None
        return derivation

    def lines(self) -> list[str]:
        """One line per resource: `cpu: (8 − 2) × 50% = 3`, saying where rounding down took something."""
        spare_capacity = spare(allocatable=self.allocatable, used=self.used)
        lines = []
        for name in sorted(self.allocatable):
            exact = spare_capacity.get_or_zero(name) * Decimal(self.sharing_percentage) / 100
            offered = self.advertised.get_or_zero(name)
            note = " (more is used than allocatable: none to share)" if self.used.get_or_zero(name) > self.allocatable[name] else (
                "" if exact == offered else f" (rounded down from {in_unit(name, exact)})")  # fmt: skip
            lines.append(f"{name}: ({format_quantity(self.allocatable[name])} − "
                         f"{format_quantity(self.used.get_or_zero(name))}) × {self.sharing_percentage}% = "
                         f"{format_quantity(offered)}{note}")  # fmt: skip
        if self.consumer_own:
            lines.append("not counted as used: the consumer's own offloaded pods, "
                         + resources_text(self.consumer_own))  # fmt: skip
        return lines


class AdmissionRecord(BaseModel):
    """One decision an admission pass wrote on an Advertisement, with what it was decided from."""

    model_config = ConfigDict(extra="forbid")

    advertisement: str
    provider: str
    phase: str
    reason: str
    message: str
    position: int = Field(description="Its place in arrival order among the live Advertisements (1 = first).")
    arrived: datetime | None = Field(default=None, description="Its creationTimestamp: what arrival order sorts by.")


class AdmissionEntry(BaseModel):
    """One live Advertisement as an admission pass left it: the inputs `tidepool simulate admission` replays."""

    model_config = ConfigDict(extra="forbid")

    advertisement: str
    provider: str
    arrived: datetime | None = Field(default=None, description="Its creationTimestamp: what arrival order sorts by.")
    phase: str | None = Field(default=None, description="After the pass's decisions; None: never decided.")
    reason: str | None = None
    offer: dict[str, str] = Field(default_factory=dict, description="spec.resourceQuota.hard; empty when invalid.")


FactKind = Literal["started", "signal", "update", "push", "push_failed", "decision", "withdrawn",
                   "admission", "observed", "step", "completed", "pool", "move"]  # fmt: skip


class Fact(BaseModel):
    """One event of a history, decoded: `value` is the activity result, signal or update argument,
    workflow input or result as JSON (never a secret: see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    at: datetime
    kind: FactKind
    name: str = ""
    value: Any = None
    workflow_id: str = ""


class Entry(BaseModel):
    at: datetime
    what: str
    why: list[str] = Field(default_factory=list)


class Story(BaseModel):
    subject: str
    cluster_id: str
    workflows: list[str]
    at: datetime | None = Field(default=None, description="Told as of then (--at); None: up to now.")
    retention_days: float | None = Field(default=None, description="How far back the Temporal namespace keeps histories.")
    truncated: bool = Field(default=False, description="Older runs were left unread (workers/explain.MAX_RUNS).")
    entries: list[Entry] = Field(default_factory=list)
    now: list[str] = Field(default_factory=list, description="Where things stand at the end of the story.")

    def render(self) -> str:
        head = [f"{self.subject} (cluster {self.cluster_id})"]
        head.append("workflows: " + (", ".join(self.workflows) or "none found"))
        if self.at is not None:
            head.append(f"as of {_time(self.at)}")
        if self.truncated:
            head.append("only the newest runs of a workflow were read: older decisions are not told")
        if self.retention_days is not None:
            days = f"{self.retention_days:g} day" + ("" if self.retention_days == 1 else "s")
            head.append(f"history kept {days} (the Temporal namespace's retention): nothing older can be explained")
        lines = head + [""]
        for entry in self.entries:
            lines.append(f"{_time(entry.at)}  {entry.what}")
            lines += [f"    {why}" for why in entry.why]
        if self.now:
            lines += ["", "now:"] + [f"    {line}" for line in self.now]
        return "\n".join(lines) + "\n"


def peering_story(subject: str, cluster_id: str, workflows: list[str], facts: Iterable[Fact]) -> Story:
    """The provider's side: what was offered at each push and why, what changed the percentage, what the
    foreign cluster decided, and how it ended. Pushes that offered the same as the one before are counted,
    not repeated."""
    story = Story(subject=subject, cluster_id=cluster_id, workflows=workflows)
    last_offer: tuple[Any, ...] | None = None
    repeats, repeated_at = 0, None
    foreign_phase: str | None = None
    last: dict[str, Any] | None = None
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind == "started" and fact.name == "PeeringWorkflow" and not value.get("state"):
            percentage = value.get("sharing_percentage")
            story.entries.append(Entry(at=fact.at, what="peering started", why=[
                f"sharing percentage: {percentage}% (its own)" if percentage is not None
                else "sharing percentage: the ClusterConfig's"]))  # fmt: skip
        elif fact.kind in ("signal", "update") and fact.name in ("set_sharing_percentage", "update_sharing_percentage"):
            by = f"by {fact.kind} {fact.name}"
            problem = sharing_percentage_problem(fact.value)
            story.entries.append(Entry(at=fact.at, what=f"ignored: {problem} ({by})" if problem else
                                       f"sharing percentage set to {fact.value}% {by}" if fact.value is not None else
                                       f"sharing percentage follows the ClusterConfig again {by}"))  # fmt: skip
        elif fact.kind == "signal" and fact.name == "cluster_config_changed":
            story.entries.append(Entry(at=fact.at, what="the ClusterConfig changed: push at once"))
        elif fact.kind == "signal" and fact.name == "withdraw":
            story.entries.append(Entry(at=fact.at, what=f"withdrawal asked: {fact.value or 'Requested'}"))
        elif fact.kind == "push":
            if "advertised" not in value:  # push_advertisement answered `Withdraw`: nothing was pushed
                continue
            last = dict(value)
            offer = (json.dumps(value.get("advertised"), sort_keys=True), value.get("sharing_percentage"),
                     json.dumps(value.get("allocatable"), sort_keys=True), json.dumps(value.get("used"), sort_keys=True))  # fmt: skip
            if offer == last_offer:
                repeats, repeated_at = repeats + 1, fact.at
            else:
                if repeats:
                    story.entries.append(Entry(at=repeated_at or fact.at, what=_repeated(repeats)))
                repeats, last_offer = 0, offer
                story.entries.append(Entry(at=fact.at, what="offered " + resources_text(value.get("advertised") or {}),
                                           why=_push_why(value)))  # fmt: skip
            phase = value.get("foreign_phase")
            if phase != foreign_phase:
                foreign_phase = phase
                story.entries.append(Entry(at=fact.at, what=f"the foreign cluster's decision: {phase or 'none yet'}"))
        elif fact.kind == "push_failed":
            story.entries.append(Entry(at=fact.at, what="push failed", why=[str(fact.value)[:300]]))
        elif fact.kind == "decision":
            phase = value.get("phase") if value.get("exists", True) else "gone (deleted or expired there)"
            if phase != foreign_phase:
                foreign_phase = phase
                reason = f" ({value['reason']})" if value.get("reason") else ""
                story.entries.append(Entry(at=fact.at, what=f"the foreign cluster's decision: {phase}{reason}"))
        elif fact.kind == "completed" and fact.name == "PeeringWorkflow":
            story.entries.append(Entry(at=fact.at, what="peering withdrawn",
                                       why=[f"{k}: {v}" for k, v in value.items() if v not in ("", None)]))  # fmt: skip
            last, story.now = None, [f"withdrawn {_time(fact.at)}: nothing offered any more"]
    if repeats:
        story.entries.append(Entry(at=repeated_at or story.entries[-1].at, what=_repeated(repeats)))
    story.entries.sort(key=lambda e: e.at)  # stable: a run of repeats is told when it ends, and dated then
    if last is not None:
        story.now = ["offer: " + resources_text(last.get("advertised") or {}),
                     f"foreign decision: {foreign_phase or 'none yet'}",
                     f"last push {_time(parse_rfc3339(last.get('timestamp')))}, "
                     f"expires there {_time(parse_rfc3339(last.get('time_to_live')))} unless pushed again"]  # fmt: skip
    return story


def _repeated(pushes: int) -> str:
    return f"(then {pushes} more push{'es' if pushes > 1 else ''} offering the same, the last at this time)"


def _push_why(push: Mapping[str, Any]) -> list[str]:
    derivation = OfferDerivation(allocatable=Resources(push["allocatable"]), used=Resources(push["used"]),
                                 consumer_own=Resources(push.get("consumer_own") or {}),
                                 sharing_percentage=push["sharing_percentage"],
                                 advertised=Resources(push["advertised"]))  # fmt: skip
    configured = push.get("configured_percentage")
    owner = ("the ClusterConfig's" if configured == push["sharing_percentage"]
             else f"the peering's own; the ClusterConfig says {configured}%")  # fmt: skip
    return [f"sharing percentage {push['sharing_percentage']}% ({owner})", *derivation.lines()]


def advertisement_story(subject: str, cluster_id: str, advertisement: str, workflows: list[str],
                        facts: Iterable[Fact]) -> Story:  # fmt: skip
    """The consumer's side: each admission decision on the Advertisement and its inputs, the offer as the
    provider derived it, the steps that built or tore down its virtual kubelet and node, and manual decisions."""
    story = Story(subject=subject, cluster_id=cluster_id, workflows=workflows)
    offer: str | None = None
    phase: str | None = None
    decided: str | None = None
    ended: datetime | None = None
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind == "admission":
            policy, maximum = value.get("policy"), value.get("maximum")
            records = [r for r in value.get("records") or [] if r.get("advertisement") == advertisement]
            if not records and value.get("records_omitted"):
                story.entries.append(Entry(at=fact.at, what=f"admission: {value['records_omitted']} decisions of this "
                                           f"pass not recorded (at most {MAX_ADMISSION_RECORDS} a pass): this "
                                           "Advertisement's may be among them"))  # fmt: skip
            for record in records:
                ended = None  # an Advertisement from the same provider again: a new lifecycle
                arrived = parse_rfc3339(record.get("arrived"))
                decided = f"{record['phase']} ({record['reason']})"
                story.entries.append(Entry(at=fact.at, what=f"admission: {decided}", why=[
                    record["message"],
                    f"policy {policy}, maxAcceptableAdvertisements {maximum}; "
                    f"number {record['position']} in arrival order" + (f" (arrived {_time(arrived)})" if arrived else ""),
                ]))  # fmt: skip
        elif fact.kind == "update" and fact.name in ("accept", "refuse"):
            by_hand = {"accept": "accepted", "refuse": "refused"}[fact.name]
            story.entries.append(Entry(at=fact.at, what=f"{by_hand} by hand (update {fact.name})",
                                       why=[f"reason: {fact.value or 'none given'}"]))  # fmt: skip
        elif fact.kind == "observed":
            if not value.get("exists", True):
                continue
            ended = None
            derivation = OfferDerivation.model_validate(value["offer"]) if value.get("offer") else None
            resources = resources_text(value.get("resources") or {})
            if resources != offer:
                offer = resources
                story.entries.append(Entry(at=fact.at, what=f"offer seen: {resources}", why=(
                    ["as the provider derived it:", *derivation.lines()] if derivation is not None
                    else ["the provider wrote no derivation (an earlier release)"])))  # fmt: skip
            seen = value.get("phase")
            if seen != phase:
                phase = seen
                if seen == "Deleting" or value.get("deleting"):
                    story.entries.append(Entry(at=fact.at, what="being deleted: the ordered teardown runs"))
        elif fact.kind == "step":
            story.entries.append(Entry(at=fact.at, what=f"step {fact.name}", why=_step_why(fact.name)))
        elif fact.kind == "completed" and fact.name == "AdvertisementWorkflow":
            deleted = value.get("deleted") or {}
            story.entries.append(Entry(at=fact.at, what="lifecycle ended", why=[
                f"teardown because {value.get('teardown')}" if value.get("teardown") else "nothing to tear down",
                *(f"{what} deleted {_time(parse_rfc3339(at))}" for what, at in sorted(deleted.items(), key=lambda kv: str(kv[1]))),
            ]))  # fmt: skip
            decided, offer, ended = None, None, fact.at
    story.now = ([f"lifecycle ended {_time(ended)}: no Advertisement, virtual kubelet or node left"] if ended else
                 [f"decision: {decided or 'none recorded'}", f"offer: {offer or 'none seen'}"])  # fmt: skip
    return story


class AmbiguousNamespace(LookupError):
    """A namespace name that several tenants' records have: `--tenant` must say whose."""


class PoolNamespace(BaseModel):
    """A namespace as the pool's records name it: a pass of 0.1 by its bare name, a later one by its id
    `<tenant>/<namespace>` (models/pool/tenancy.py)."""

    tenant: str | None = Field(default=None, description="None: no tenant's records found, only bare ones or none.")
    name: str
    ids: frozenset[str] = Field(description="The ids its story reads: its tenant's, and the bare name of 0.1's passes.")

    @property
    def subject(self) -> str:
        return f"{self.tenant}/{self.name}" if self.tenant else self.name


def pool_namespace(facts: Iterable[Fact], name: str, *, tenant: str | None = None) -> PoolNamespace:
    """Which records tell of namespace `name`: with `tenant`, that tenant's only. Without, the one tenant whose
    records have it (AmbiguousNamespace naming them when several do), and the bare records of 0.1's passes,
    which had one tenant and no ids: they are the same namespace before the upgrade."""
    if tenant is not None:
        return PoolNamespace(tenant=tenant, name=name, ids=frozenset({f"{tenant}/{name}"}))
    tenants = sorted({owner for owner, namespace in map(_owner, _recorded_ids(facts)) if owner and namespace == name})
    if len(tenants) > 1:
        raise AmbiguousNamespace(f"--tenant is required: {name} is a namespace of tenants {', '.join(tenants)}")
    owner = tenants[0] if tenants else None
    return PoolNamespace(tenant=owner, name=name, ids=frozenset({name} | ({f"{owner}/{name}"} if owner else set())))


def _recorded_ids(facts: Iterable[Fact]) -> set[str]:
    """Every namespace id the pool's passes and moves recorded."""
    ids: set[str] = set()
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind == "pool":
            ids |= {str(d.get("namespace")) for d in value.get("decisions") or [] if isinstance(d, Mapping)}
            ids |= {str(e.get("namespace")) for e in value.get("live") or [] if isinstance(e, Mapping)}
            ids |= set(as_mapping(value.get("draining")))
            ids |= {_pod_key(key)[0] for key in (*as_mapping(value.get("pods_placed")), *as_mapping(value.get("pods_unplaced")))}
        elif fact.kind == "move" and value.get("namespace"):
            ids.add(str(value["namespace"]))
    return ids


def _owner(namespace_id: str) -> tuple[str | None, str]:
    """(tenant, namespace) of an id; (None, name) of a bare name of 0.1."""
    tenant, _, name = namespace_id.rpartition("/")
    return tenant or None, name


def _pod_key(key: str) -> tuple[str, str]:
    """(namespace id, pod) of a pod's key, `<namespace id>/<pod>`: a pod's name has no '/'."""
    namespace, _, pod = key.rpartition("/")
    return namespace, pod


def namespace_story(subject: str, namespace: PoolNamespace, workflows: list[str], facts: Iterable[Fact]) -> Story:
    """The pool's side: each placement of the namespace's quota slices (or why none), with the slice, the
    user's mandatory entries and every other cluster's filter or score reason; its moves; where its pods went."""
    story = Story(subject=subject, cluster_id="pool", workflows=workflows)
    ids = namespace.ids
    told: str | None = None
    placed: dict[str, str] = {}
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind == "pool":
            for decision in value.get("decisions") or []:
                if decision.get("namespace") not in ids:
                    continue
                said = json.dumps({**decision, "namespace": None}, sort_keys=True)  # the same decision again: told once
                if said != told:
                    told = said
                    story.entries.append(_placement_entry(fact.at, decision, value.get("clusters") or {}))
            for key, cluster in sorted((value.get("pods_placed") or {}).items()):
                pod_namespace, pod = _pod_key(key)
                if pod_namespace in ids and placed.get(pod) != cluster:
                    placed[pod] = cluster
                    story.entries.append(Entry(at=fact.at, what=f"pod {pod} → {cluster}"))
            for key, why in sorted((value.get("pods_unplaced") or {}).items()):
                pod_namespace, pod = _pod_key(key)
                if pod_namespace in ids:
                    story.entries.append(Entry(at=fact.at, what=f"pod {pod} not placed", why=[why]))
        elif fact.kind == "move" and value.get("namespace") in ids:
            for pod, where in (value.get("moved") or {}).items():  # "old → new"
                placed[pod] = str(where).rpartition(" → ")[2]
            moved = [f"{pod}: {where}" for pod, where in sorted((value.get("moved") or {}).items())]
            stuck = [f"{pod} stuck: {why}" for pod, why in sorted((value.get("stuck") or {}).items())]
            if moved or stuck:
                story.entries.append(Entry(at=fact.at, what=f"{fact.name}: pods moved off draining clusters",
                                           why=moved + stuck))  # fmt: skip
    last = next((e for e in reversed(story.entries) if e.what.startswith(("slices placed", "not placed"))), None)
    story.now = [last.what if last else "no placement recorded", *(f"pod {p} on {c}" for p, c in sorted(placed.items()))]
    return story


@dataclass(frozen=True)
class PlacedPod:
    """What the tenant's control plane says of a pool pod: its super cluster (the pool's annotation) and the
    `Scheduled` Event of the pod placer that put it there (workers/pod_placer.py), which no history holds."""

    cluster: str
    at: datetime | None
    message: str


def pod_story(subject: str, namespace: PoolNamespace, pod: str, workflows: list[str], facts: Iterable[Fact],
              placed: PlacedPod | None = None) -> Story:  # fmt: skip
    """One pod of the pool: its namespace's placements (the clusters it may go to), where it went, its moves.
    The scheduler's passes record the pods they place; a pod the pod placer placed is told from `placed`."""
    whole = namespace_story(subject, namespace, workflows, facts)
    entries = []
    for entry in whole.entries:
        if entry.what.startswith(("slices placed", "not placed", f"pod {pod} ")):
            entries.append(entry)
        elif (lines := [w for w in entry.why if w.startswith((f"{pod}: ", f"{pod} stuck"))]) and "moved" in entry.what:
            entries.append(entry.model_copy(update={"why": lines}))
    now = [whole.now[0], *(line for line in whole.now[1:] if line.startswith(f"pod {pod} "))]
    if placed is not None and not any(e.what.startswith(f"pod {pod} → ") for e in entries):
        if placed.at is not None:
            entries.append(Entry(at=placed.at, what=f"pod {pod} → {placed.cluster}", why=[placed.message]))
            entries.sort(key=lambda e: e.at)
        now = [now[0], f"pod {pod} on {placed.cluster}", *(line for line in now[1:] if not line.startswith(f"pod {pod} on "))]
    return whole.model_copy(update={"entries": entries, "now": now})


def virtual_node_provider(node: Mapping[str, Any] | None) -> str | None:
    """The provider behind a virtual node ("" when its label is missing); None for any other node."""
    labels = as_mapping(as_mapping(as_mapping(node).get("metadata")).get("labels"))
    return str(labels.get(LABEL_PROVIDER) or "") if labels.get(LABEL_NODE_TYPE) == VIRTUAL_NODE_TYPE else None


def offloaded_pod_story(subject: str, cluster_id: str, pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
                        offer: Story | None, *, provider: str | None, at: datetime | None = None) -> Story:  # fmt: skip
    """A consumer's pod: the node it was scheduled to and, on a virtual node, the provider behind it and the
    story of that provider's Advertisement (`offer`: its offer and how it was derived, its admission), then
    the pod's Events in time order, the provider copy's among them (the virtual kubelet reflects them,
    labelled with the provider): why a pod is Pending over there. Events are the API server's, kept about
    an hour; the Advertisement's story is the history's. `provider`: `virtual_node_provider` of its node."""
    meta, spec, status = (as_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
    node_name = str(spec.get("nodeName") or "")
    story = Story(subject=subject, cluster_id=cluster_id, workflows=offer.workflows if offer else [])
    created = parse_rfc3339(meta.get("creationTimestamp"))
    if created is not None:
        story.entries.append(Entry(at=created, what="pod created"))
    if offer is not None:
        story.entries += [Entry(at=e.at, what=f"Advertisement from {provider}: {e.what}", why=e.why) for e in offer.entries]
    for event in events:
        when = parse_rfc3339(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))
        if when is None or (at is not None and when > at):
            continue
        reflected = as_mapping(as_mapping(event.get("metadata")).get("labels")).get(LABEL_PROVIDER)
        count = event.get("count") or 1
        why = [str(event.get("message") or "")]
        if count > 1:
            why.append(f"{count} times since {_time(parse_rfc3339(event.get('firstTimestamp')))}")
        story.entries.append(Entry(at=when, what=f"{event.get('type') or 'Normal'} {event.get('reason')}"
                                   + (f" (its copy in {reflected})" if reflected else ""), why=why))  # fmt: skip
    story.entries.sort(key=lambda e: e.at)
    phase = str(status.get("phase") or "Unknown")
    unscheduled = next((c for c in status.get("conditions") or [] if as_mapping(c).get("type") == "PodScheduled"
                        and as_mapping(c).get("status") == "False"), None)  # fmt: skip
    if not node_name:
        where = "not scheduled" + (f": {unscheduled.get('message')}" if unscheduled else "")
    elif provider is not None:
        where = f"on virtual node {node_name}: runs in provider {provider or '(unknown)'}"
    else:
        where = f"on node {node_name}, one of this cluster's own: not offloaded"
    reason = f" ({status['reason']})" if status.get("reason") else ""
    story.now = [f"phase {phase}{reason}", where]
    if provider is not None and phase == "Pending":
        story.now.append("the provider's Events on its copy above say why it is not running there")
    if offer is not None and offer.now:
        story.now += [f"its Advertisement: {line}" for line in offer.now]
    return story


def as_mapping(value: Any) -> Mapping[str, Any]:
    """A field of an API object or of a recorded result as a mapping, {} if it is missing or anything else:
    what is read from an API server or a history may be of a release before, or malformed."""
    return value if isinstance(value, Mapping) else {}


def _placement_entry(at: datetime, decision: Mapping[str, Any], clusters: Mapping[str, str]) -> Entry:
    placement = decision.get("placement")
    why = [str(decision.get("reason", ""))]
    if decision.get("slices"):
        why.append(f"{decision['slices']} slices of {resources_text(decision.get('slice') or {})}")
    if decision.get("mandatory"):
        why.append("the placement annotation asks for " + _counts(decision["mandatory"]))
    why += [f"{cluster}: {reason}" for cluster, reason in sorted((decision.get("diagnosis") or {}).items())]
    why += [f"{cluster} was {state}" for cluster, state in sorted(clusters.items())]
    what = f"slices placed: {_counts(placement)}" if placement else "not placed"
    return Entry(at=at, what=what, why=why)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))


_STEP_WHY = {
    "EnsureFinalizer": "accepted: hold the Advertisement until its teardown is done",
    "EnsureVirtualKubelet": "accepted and the PodCIDR remapped: the virtual kubelet carries the offer as its node",
    "MarkDeleting": "teardown begins: the provider and the virtual kubelet see phase Deleting",
    "DeleteVirtualNode": "teardown 1: the virtual node first, so that nothing more is scheduled on it",
    "DeleteVirtualKubelet": "teardown 2: the virtual kubelet, once the provider namespace is clean (or the wait ran out)",
    "ReleaseAdvertisement": "teardown 3: the finalizer goes, and with it the Advertisement",
    "RefuseNotReady": "the virtual node was never Ready within virtualNodeReadyTimeoutSeconds",
    "DeleteExpired": "its timeToLive passed before anyone accepted it",
    "CleanProvider": "after a forced unpeer: the provider reached, to delete the copies of this cluster's pods there "
                     "(the lifecycle's end says how it went)",
    "DeleteProviderCredentials": "after a forced unpeer: the credentials the provider gave this cluster deleted",
}


def _step_why(step: str) -> list[str]:
    return [_STEP_WHY[step]] if step in _STEP_WHY else []


def resources_text(resources: Mapping[str, Any]) -> str:
    """`cpu 2, memory 4Gi`: a resource list as the stories and simulations print it."""
    return ", ".join(f"{name} {value}" for name, value in sorted(Resources(resources).to_kubernetes().items())) or "nothing"


def in_unit(name: str, value: Decimal) -> str:
    """An amount in the unit offers of `name` are written in (m of CPU, Mi of bytes, whole units), with up
    to two decimals: what an exact share or a mean is, beside offers rounded to that unit."""
    if name == "cpu":
        amount, suffix = value * 1000, "m"
    elif name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        amount, suffix = value / 2**20, "Mi"
    else:
        amount, suffix = value, ""
    return f"{amount.quantize(Decimal('0.01'), rounding=ROUND_FLOOR).normalize():f}{suffix}"


def _time(at: datetime | None) -> str:
    return "—" if at is None else f"{at:%Y-%m-%d %H:%M:%S} UTC"
