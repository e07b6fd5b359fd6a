"""`tidepool simulate` (issue 20, part 2): recorded decisions replayed under another policy. No cluster is
touched, and what an earlier release did not record is counted, not guessed.

- `simulate_peering`: the recorded pushes at another sharing percentage, through the same function that
  computed them (models.sharing.shared_resources) on each push's recorded derivation (models/explain.py).
- `simulate_admission`: the recorded admission passes under AutoAcceptMax with another maximum. Each pass
  records every live Advertisement as it left it (`AdmissionResult.live`). What the rules before the
  maximum decided (validity, credentials, the lists, prices, a virtual node never Ready, a manual decision:
  models/admission.py, rules 1–6½) does not depend on the maximum and is taken as recorded; rule 8 is
  applied again: in arrival order, while fewer than the maximum are accepted, and an accepted one stays
  accepted until it leaves (or its virtual node is found never Ready)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, Field

from models.api.clusterconfig import MAX_ACCEPTABLE_ADVERTISEMENTS
from models.explain import AdmissionEntry, Fact, in_unit
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
    not_replayable: int = Field(default=0, description="Pushes recorded without their derivation (earlier releases).")
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
        widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
        lines += ["", f"{len(self.pushes)} pushes replayed, {self.differing} would have offered otherwise"
                      + (f"; {self.not_replayable} recorded without their derivation, not replayed" if self.not_replayable else "")]  # fmt: skip
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
        value: Mapping[str, Any] = fact.value if isinstance(fact.value, Mapping) else {}
        if fact.kind != "push" or "advertised" not in value or (since is not None and fact.at < since):
            continue
        if value.get("used") is None:
            simulation.not_replayable += 1
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
    not_replayable: int = Field(default=0, description="Passes recorded without their inputs (earlier releases, or more than MAX_ADMISSION_ENTRIES live).")
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
        widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
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
        value: Mapping[str, Any] = fact.value if isinstance(fact.value, Mapping) else {}
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
