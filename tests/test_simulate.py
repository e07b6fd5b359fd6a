"""models/simulate.py: recorded pushes replayed at another percentage, checked against hand-computed offers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from models.explain import Fact
from models.simulate import simulate_peering

pytestmark = pytest.mark.explain

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _push(minutes: int, *, used_cpu: str | None, offered_cpu: str, percent: int = 50) -> Fact:
    value = {"advertised": {"cpu": offered_cpu, "memory": "4Gi"}, "allocatable": {"cpu": "8", "memory": "16Gi"},
             "sharing_percentage": percent}  # fmt: skip
    if used_cpu is not None:
        value["used"] = {"cpu": used_cpu, "memory": "8Gi"}
    return Fact(at=T0 + timedelta(minutes=minutes), kind="push", value=value)


def test_each_recorded_push_is_recomputed_from_its_own_inputs_and_the_summary_counts_and_averages() -> None:
    facts = [_push(0, used_cpu=None, offered_cpu="3"),  # an earlier release's record: not replayed
             _push(10, used_cpu="2", offered_cpu="3"),  # (8 − 2) × 50% = 3; at 25%: 1.5
             _push(20, used_cpu="7", offered_cpu="500m"),  # (8 − 7) × 50%; at 25%: 250m
             Fact(at=T0, kind="signal", name="set_sharing_percentage", value=25)]  # fmt: skip
    simulation = simulate_peering("peering with c", facts, percent=25)
    assert [(p.offered["cpu"], p.would_offer["cpu"]) for p in simulation.pushes] == [("3", "1500m"), ("500m", "250m")]
    assert [p.would_offer["memory"] for p in simulation.pushes] == ["2Gi", "2Gi"]  # (16Gi − 8Gi) × 25%
    assert (simulation.not_replayable, simulation.differing) == (1, 2)
    assert simulation.offered_mean == {"cpu": "1750m", "memory": "4096Mi"}
    assert simulation.would_offer_mean == {"cpu": "875m", "memory": "2048Mi"}
    assert "2 pushes replayed, 2 would have offered otherwise; 1 recorded without their derivation" in simulation.render()


def test_since_leaves_out_older_pushes_and_the_recorded_percentage_gives_back_what_was_offered() -> None:
    facts = [_push(10, used_cpu="2", offered_cpu="3"), _push(20, used_cpu="7", offered_cpu="500m")]
    same = simulate_peering("p", facts, percent=50, since=T0 + timedelta(minutes=15))
    assert [p.at for p in same.pushes] == [T0 + timedelta(minutes=20)] and same.differing == 0
    with pytest.raises(ValueError, match="between 0 and 100"):
        simulate_peering("p", facts, percent=101)
