"""`tidepool simulate` (issue 20, part 2): recorded decisions replayed under another policy. No cluster is
touched, and a pass recorded without its inputs (too large to record) is counted, not guessed.

- `simulate_peering`: the recorded pushes at another sharing percentage, through the same function that
  computed them (models.sharing.shared_resources) on each push's recorded derivation (models/explain.py).
- `simulate_admission`: the recorded admission passes under AutoAcceptMax with another maximum. Each pass
  records every live Advertisement as it left it (`AdmissionResult.live`). What the rules before the
  maximum decided (validity, credentials, the lists, prices, a virtual node never Ready, a manual decision:
  models/admission.py, rules 1–6½) does not depend on the maximum and is taken as recorded; rule 8 is
  applied again: in arrival order, while fewer than the maximum are accepted, and an accepted one stays
  accepted until it leaves (or its virtual node is found never Ready).
- `simulate_pool`: the recorded pool passes with another pool policy. Each pass records its super clusters
  and every namespace with a quota (`PoolPassResult.snapshot` and `live`); the replay places them through
  the scheduler's own `schedule`, keeping what users chose and refusals no policy changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import cast

from pydantic import BaseModel, Field

from models.api.clusterconfig import MAX_ACCEPTABLE_ADVERTISEMENTS
from models.explain import AdmissionEntry, Fact, as_mapping, in_unit, resources_text
from models.pool.health import HealthState
from models.pool.namespaces import POLICIES, held_by_others, namespace_policy
from models.pool.placement import ClusterSnapshot, PlacementRequest, Policy, schedule
from models.pool.result import PoolClusterRecord, PoolNamespaceEntry
from models.resources import Resources
from models.sharing import shared_resources


class SimulatedPush(BaseModel):
    at: datetime
    sharing_percentage: int
    offered: dict[str, str]
    would_offer: dict[str, str]


class Simulation(BaseModel):
    subject: str
    sharing_percentage: int
    since: datetime | None = None
    pushes: list[SimulatedPush] = Field(default_factory=list)
    offered_mean: dict[str, str] = Field(default_factory=dict)
    would_offer_mean: dict[str, str] = Field(default_factory=dict)
    differing: int = 0

    def render(self) -> str:
        names = sorted({n for p in self.pushes for n in (*p.offered, *p.would_offer)})
        lines = [f"{self.subject}: the recorded pushes at {self.sharing_percentage}%"
                 + (f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""), ""]  # fmt: skip
        header = ["time", "then", *(f"{n} offered → would" for n in names)]
        rows = [[f"{p.at:%Y-%m-%d %H:%M:%S}", f"{p.sharing_percentage}%",
                 *(f"{p.offered.get(n, '0')} → {p.would_offer.get(n, '0')}" for n in names)] for p in self.pushes]  # fmt: skip
        lines += _table(header, rows)
        lines += ["", f"{len(self.pushes)} pushes replayed, {self.differing} would have offered otherwise"]
        if self.pushes:
            lines.append("mean offer: " + ", ".join(f"{n} {self.offered_mean.get(n, '0')} → {self.would_offer_mean.get(n, '0')}"
                                                    for n in names))  # fmt: skip
        return "\n".join(lines) + "\n"


def simulate_peering(subject: str, facts: Iterable[Fact], *, percent: int, since: datetime | None = None) -> Simulation:
    """Every recorded push (after `since`) recomputed at `percent`, beside what it offered."""
    if not 0 <= percent <= 100:
        raise ValueError(f"sharing percentage must be between 0 and 100, got {percent}")
    simulation = Simulation(subject=subject, sharing_percentage=percent, since=since)
    offered_total: dict[str, Decimal] = {}
    would_total: dict[str, Decimal] = {}
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind != "push" or "advertised" not in value or (since is not None and fact.at < since):
            continue
        offered = Resources(value["advertised"])
        would = shared_resources(allocatable=Resources(value["allocatable"]), used=Resources(value["used"]), percent=percent)
        simulation.pushes.append(SimulatedPush(at=fact.at, sharing_percentage=value["sharing_percentage"],
                                               offered=offered.to_kubernetes(), would_offer=would.to_kubernetes()))  # fmt: skip
        simulation.differing += offered != would
        for totals, resources in ((offered_total, offered), (would_total, would)):
            for name, amount in resources.items():
                totals[name] = totals.get(name, Decimal(0)) + amount
    count = len(simulation.pushes)
    if count:
        simulation.offered_mean = _mean(offered_total, count)
        simulation.would_offer_mean = _mean(would_total, count)
    return simulation


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, as `kubectl get` prints them."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def _mean(totals: Mapping[str, Decimal], count: int) -> dict[str, str]:
    # A mean is no offer: in the offers' unit, with decimals (pods 40.5, not 40).
    return {name: in_unit(name, totals[name] / count) for name in sorted(totals)}


# The reasons of rules 7 and 8: what the policy and the maximum decided, and a replay decides again.
_BY_THE_MAXIMUM = frozenset({"WithinMaximum", "MaxReached", "AwaitingManualDecision", "DecisionTimedOut"})
_NOT_READY = "VirtualNodeNotReady"  # the Advertisement workflow's refusal of an accepted one


class SimulatedAdvertisement(BaseModel):
    advertisement: str
    provider: str
    arrived: datetime | None = None
    left: datetime | None = Field(default=None, description="The first pass that no longer listed it.")
    then: str = Field(description="Its phase and reason at the last pass that listed it, as recorded.")
    then_accepted_at: datetime | None = Field(default=None, description="The pass that accepted it; None: not accepted, or before the first pass replayed.")
    would: str
    would_accepted_at: datetime | None = None
    differs: bool = Field(default=False, description="Its phase differed at some pass.")


class AdmissionSimulation(BaseModel):
    subject: str
    maximum: int
    since: datetime | None = None
    passes: int = 0
    not_replayable: int = Field(default=0, description="Passes recorded without their inputs (more than MAX_ADMISSION_ENTRIES live).")
    advertisements: list[SimulatedAdvertisement] = Field(default_factory=list)
    differing: int = 0
    accepted_then: int = 0
    accepted_would: int = 0
    capacity_then: dict[str, str] = Field(default_factory=dict, description="The offers accepted at the last pass replayed, summed.")
    capacity_would: dict[str, str] = Field(default_factory=dict)

    def render(self) -> str:
        lines = [f"{self.subject}: the recorded passes under AutoAcceptMax, maxAcceptableAdvertisements {self.maximum}"
                 + (f", since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""), ""]  # fmt: skip
        header = ["provider", "arrived", "left", "then", "would"]
        rows = [[a.provider, _at(a.arrived), _at(a.left), _outcome(a.then, a.then_accepted_at),
                 _outcome(a.would, a.would_accepted_at)] for a in self.advertisements]  # fmt: skip
        lines += _table(header, rows)
        lines += ["", f"{self.passes} passes replayed, {self.differing} of {len(self.advertisements)} Advertisements "
                      "would have been decided otherwise"
                      + (f"; {self.not_replayable} passes recorded without their inputs, not replayed" if self.not_replayable else "")]  # fmt: skip
        if self.passes:
            names = sorted({*self.capacity_then, *self.capacity_would})
            lines.append(f"accepted at the last pass: {self.accepted_then} → {self.accepted_would}"
                         + ("; capacity " + ", ".join(f"{n} {self.capacity_then.get(n, '0')} → {self.capacity_would.get(n, '0')}"
                                                     for n in names) if names else ""))  # fmt: skip
        lines.append("as recorded: validity, credentials, allowed and denied clusters, prices, a virtual node never "
                     "Ready and manual decisions (the rules before the maximum)")  # fmt: skip
        return "\n".join(lines) + "\n"


def _at(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment is not None else "-"


def _outcome(outcome: str, accepted_at: datetime | None) -> str:
    return outcome + (f" at {accepted_at:%H:%M:%S}" if accepted_at is not None else "")


def simulate_admission(subject: str, facts: Iterable[Fact], *, maximum: int,
                       since: datetime | None = None) -> AdmissionSimulation:  # fmt: skip
    """Every recorded admission pass (after `since`) replayed under AutoAcceptMax at `maximum`, beside what
    it decided. The replay starts from what was accepted before its first pass."""
    if not 0 <= maximum <= MAX_ACCEPTABLE_ADVERTISEMENTS:
        raise ValueError(f"maxAcceptableAdvertisements must be between 0 and {MAX_ACCEPTABLE_ADVERTISEMENTS}, got {maximum}")
    simulation = AdmissionSimulation(subject=subject, maximum=maximum, since=since)
    rows: dict[str, SimulatedAdvertisement] = {}  # by Advertisement name: the latest lifecycle of each
    accepted: set[str] = set()  # accepted in the replay
    last: list[AdmissionEntry] = []
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind != "admission" or (since is not None and fact.at < since):
            continue
        if value.get("live") is None:
            simulation.not_replayable += 1
            continue
        entries = [AdmissionEntry.model_validate(e) for e in value["live"]]
        listed = {e.advertisement for e in entries}
        for name, seen in rows.items():
            if name not in listed and seen.left is None:
                seen.left = fact.at
        if not simulation.passes:  # what this pass found accepted, not what it accepted itself
            accepted_now = {r.get("advertisement") for r in value.get("records") or [] if r.get("phase") == "Accepted"}
            accepted = {e.advertisement for e in entries if e.phase == "Accepted" and e.advertisement not in accepted_now}
        simulation.passes += 1
        accepted = {name for name in accepted if name in listed}  # left: it holds no place
        accepted -= {e.advertisement for e in entries if e.reason == _NOT_READY}
        count = len(accepted)
        for e in entries:
            row = rows.get(e.advertisement)
            if row is None or row.left is not None:  # a new arrival, or the same name back: a new lifecycle
                before = e.advertisement in accepted  # only in the first pass: accepted before it
                row = SimulatedAdvertisement(advertisement=e.advertisement, provider=e.provider, arrived=e.arrived,
                                             then=_phase(e) if before else "", would=_phase(e) if before else "")  # fmt: skip
                rows[e.advertisement] = row
            if e.phase == "Accepted" and not row.then.startswith("Accepted"):
                row.then_accepted_at = fact.at
            row.then = _phase(e)
            if e.advertisement in accepted:
                pass  # accepted stays accepted
            elif e.reason not in _BY_THE_MAXIMUM and e.phase is not None:  # rules 1–6½: the same under any maximum
                if e.phase == "Accepted":
                    accepted.add(e.advertisement)
                    count += 1
                row.would, row.would_accepted_at = _phase(e), fact.at if e.phase == "Accepted" else None
            elif count < maximum:
                accepted.add(e.advertisement)
                count += 1
                row.would, row.would_accepted_at = "Accepted (WithinMaximum)", fact.at
            else:
                row.would, row.would_accepted_at = "Refused (MaxReached)", None
            if row.then.partition(" ")[0] != row.would.partition(" ")[0]:
                row.differs = True
        last = entries
    simulation.advertisements = sorted(rows.values(), key=lambda a: (a.arrived is None, a.arrived or datetime.min, a.advertisement))
    simulation.differing = sum(a.differs for a in simulation.advertisements)
    then_accepted = [e for e in last if e.phase == "Accepted"]
    would_accepted = [e for e in last if e.advertisement in accepted]
    simulation.accepted_then, simulation.accepted_would = len(then_accepted), len(would_accepted)
    simulation.capacity_then = _sum(e.offer for e in then_accepted)
    simulation.capacity_would = _sum(e.offer for e in would_accepted)
    return simulation


def _phase(entry: AdmissionEntry) -> str:
    return f"{entry.phase} ({entry.reason})" if entry.phase else "undecided"


def _sum(offers: Iterable[Mapping[str, str]]) -> dict[str, str]:
    return Resources.total(Resources(offer) for offer in offers).to_kubernetes()


class SimulatedNamespace(BaseModel):
    tenant: str | None = Field(default=None, description="Whose namespace; None: a pass of 0.1, which named no tenant.")
    namespace: str = Field(description="Its name in its tenant's control plane.")
    slices: int = 0
    slice: dict[str, str] = Field(default_factory=dict)
    then: str = Field(description="Its placement at the last pass that listed it, as recorded, or why it had none.")
    would: str
    then_placement: dict[str, int] = Field(default_factory=dict, description="Slices per super cluster, as recorded.")
    would_placement: dict[str, int] = Field(default_factory=dict)
    differs: bool = Field(default=False, description="Its placement differed at some pass.")


class PoolSimulation(BaseModel):
    subject: str
    policy: str
    since: datetime | None = None
    passes: int = 0
    not_replayable: int = Field(default=0, description="Passes recorded without their inputs (more than MAX_POOL_ENTRIES namespaces).")
    namespaces: list[SimulatedNamespace] = Field(default_factory=list)
    differing: int = 0
    placed_then: int = 0
    placed_would: int = 0
    quota_then: dict[str, str] = Field(default_factory=dict, description="The quota of the placed namespaces at the last pass, summed.")
    quota_would: dict[str, str] = Field(default_factory=dict)
    clusters_then: int = Field(default=0, description="Super clusters holding slices at the last pass.")
    clusters_would: int = 0

    def render(self) -> str:
        lines = [f"{self.subject}: the recorded passes under policy {self.policy}"
                 + (f", since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""), ""]  # fmt: skip
        tenants = any(n.tenant for n in self.namespaces)  # a tenant column once passes name them
        header = ["tenant"] * tenants + ["namespace", "slices", "then", "would"]
        rows = [[n.tenant or "-"] * tenants + [n.namespace, f"{n.slices} × {resources_text(n.slice)}" if n.slices else "-",
                                               n.then, n.would] for n in self.namespaces]  # fmt: skip
        lines += _table(header, rows)
        lines += ["", f"{self.passes} passes replayed, {self.differing} of {len(self.namespaces)} namespaces would "
                      "have been placed otherwise"
                      + (f"; {self.not_replayable} passes recorded without their inputs, not replayed" if self.not_replayable else "")]  # fmt: skip
        if self.passes:
            names = sorted({*self.quota_then, *self.quota_would})
            lines.append(f"placed at the last pass: {self.placed_then} → {self.placed_would} namespaces"
                         + ("; quota " + ", ".join(f"{n} {self.quota_then.get(n, '0')} → {self.quota_would.get(n, '0')}"
                                                   for n in names) if names else "")
                         + f"; super clusters in use {self.clusters_then} → {self.clusters_would}")  # fmt: skip
        lines.append("as recorded: each pass's super clusters (health, allocatable, headroom), the namespaces' slices, "
                     "the placements users chose, namespaces' own policies, and refusals no policy changes")  # fmt: skip
        return "\n".join(lines) + "\n"


def simulate_pool(subject: str, facts: Iterable[Fact], *, policy: Policy, since: datetime | None = None) -> PoolSimulation:
    """Every recorded pool pass (after `since`) replayed with `policy` as the pool's, through the scheduler's
    own `schedule` (models/pool/placement.py) on each pass's recorded clusters and namespaces, beside what it
    placed. As the scheduler: a placement with the right count on clusters that do not drain stays, a user's
    edit holds as written and its entries are kept, a cleared one is placed anew, a refused namespace and one
    that no longer fits keep what they held, and nothing is placed while an unprobed cluster might take it.
    Moves are instant in the replay (no draining). It starts from what was placed before its first pass."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(sorted(POLICIES))}, got {policy!r}")
    simulation = PoolSimulation(subject=subject, policy=policy, since=since)
    rows: dict[str, SimulatedNamespace] = {}
    placed: dict[str, dict[str, int]] = {}  # the replay's placements
    sizes: dict[str, Resources] = {}  # the replay's slices, of the placed namespaces
    edits: set[str] = set()  # namespaces whose user edit stands in the replay (not placed by it since)
    seen_edits: dict[str, dict[str, int]] = {}  # the edit each namespace's last record showed
    last: list[PoolNamespaceEntry] = []
    for fact in facts:
        value = as_mapping(fact.value)
        if fact.kind != "pool" or (since is not None and fact.at < since):
            continue
        if value.get("live") is None or value.get("snapshot") is None:
            simulation.not_replayable += 1
            continue
        entries = [PoolNamespaceEntry.model_validate(e) for e in value["live"]]
        clusters = [ClusterSnapshot(c.name, cast(HealthState, c.health), Resources(c.allocatable), Resources(c.headroom),
                                    Resources()) for c in map(PoolClusterRecord.model_validate, value["snapshot"])]  # fmt: skip
        listed = {e.namespace for e in entries}
        if not simulation.passes:  # what this pass found placed, not what it placed itself
            decided = {d.get("namespace") for d in value.get("decisions") or []}
            placed = {e.namespace: dict(e.placement) for e in entries if e.placement and e.namespace not in decided}
            sizes = {e.namespace: Resources(e.slice) for e in entries if e.namespace in placed}
        simulation.passes += 1
        placed = {name: p for name, p in placed.items() if name in listed}  # gone: it holds nothing
        staying = {c.name for c in clusters if not c.drains}
        for e in entries:  # what users wrote since the last pass holds from the pass's start, as the scheduler reads it
            if e.cleared:
                placed.pop(e.namespace, None)
            # An edit stands until the scheduler places the namespace; the record shows it for as long as it
            # stood where it was recorded, which is longer where it did not fit.
            new_edit = e.edit != seen_edits.get(e.namespace, {})
            seen_edits[e.namespace] = e.edit
            if e.edit and e.slice and (new_edit or e.namespace in edits):
                placed[e.namespace], sizes[e.namespace] = dict(e.edit), Resources(e.slice)
                edits.add(e.namespace)
            elif not e.edit:
                edits.discard(e.namespace)
        for e in entries:
            row = rows.setdefault(e.namespace, _simulated(e.namespace))
            row.slices, row.slice, row.then_placement = e.slices, e.slice, dict(e.placement)
            row.then = _placed(e.placement, e.slices, refused=e.refused)
            if e.refused is not None:  # the same under any policy; it holds what it held (as the scheduler's do)
                row.would_placement = dict(placed.get(e.namespace, {}))
                row.would = _placed(row.would_placement, e.slices, refused=e.refused)
                row.differs |= row.would_placement != e.placement
                continue
            current, size = placed.get(e.namespace, {}), Resources(e.slice)
            edited = e.namespace in edits
            kept = (not edited and current and sum(current.values()) == e.slices and set(current) <= staying
                    and sizes.get(e.namespace) == size)  # fmt: skip
            if not kept:
                others = [ClusterSnapshot(c.name, c.health, c.allocatable, c.headroom,
                                          held_by_others(c.name, e.namespace, placed, sizes)) for c in clusters]  # fmt: skip
                own = namespace_policy(e.policy, pool=policy) or policy
                request = PlacementRequest(namespace=e.namespace, slice=size, count=e.slices, policy=own,
                                           mandatory=e.mandatory, previous={} if edited else current)  # fmt: skip
                outcome = schedule(request, others)
                if outcome.placement is not None:
                    placed[e.namespace], sizes[e.namespace] = outcome.placement, size
                    edits.discard(e.namespace)
            row.would_placement = dict(placed.get(e.namespace, {}))
            row.would = _placed(row.would_placement, e.slices)
            row.differs |= row.would_placement != e.placement
        last = entries
    simulation.namespaces = sorted(rows.values(), key=lambda n: (n.tenant or "", n.namespace))
    simulation.differing = sum(n.differs for n in simulation.namespaces)

    def complete(placement: Mapping[str, int], entry: PoolNamespaceEntry) -> bool:
        return entry.refused is None and entry.slices > 0 and sum(placement.values()) == entry.slices

    placed_then = [e for e in last if complete(e.placement, e)]
    placed_would = [e for e in last if complete(placed.get(e.namespace, {}), e)]
    simulation.placed_then, simulation.placed_would = len(placed_then), len(placed_would)
    simulation.quota_then = _quota(placed_then)
    simulation.quota_would = _quota(placed_would)
    simulation.clusters_then = len({c for e in last for c, n in e.placement.items() if n})
    simulation.clusters_would = len({c for e in last for c, n in placed.get(e.namespace, {}).items() if n})
    return simulation


def _simulated(namespace_id: str) -> SimulatedNamespace:
    """A row for a recorded id: `<tenant>/<namespace>`, or a bare name a pass of 0.1 recorded."""
    tenant, _, name = namespace_id.rpartition("/")
    return SimulatedNamespace(tenant=tenant or None, namespace=name, then="", would="")


def _placed(placement: Mapping[str, int], slices: int, *, refused: str | None = None) -> str:
    text = ", ".join(f"{cluster} {count}" for cluster, count in sorted(placement.items()))
    if refused is not None:
        return f"refused ({refused})" + (f", holds {text}" if text else "")
    if not placement:
        return "not placed"
    return text if sum(placement.values()) == slices else f"{text} (of {slices})"


def _quota(entries: Iterable[PoolNamespaceEntry]) -> dict[str, str]:
    return Resources.total(Resources({k: v * e.slices for k, v in Resources(e.slice).items()}) for e in entries).to_kubernetes()
