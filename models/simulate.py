"""`tidepool simulate peering` (issue 20, part 2): the recorded pushes replayed under another sharing
percentage, through the same function that computed them (models.sharing.shared_resources) on the inputs
each push recorded (models/explain.py: its derivation). No cluster is touched.

Pushes recorded by a release before the derivation was (no `used`) cannot be replayed: they are counted,
not guessed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, Field

from models.explain import Fact, in_unit
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
