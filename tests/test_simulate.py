"""models/simulate.py: recorded pushes replayed at another percentage, checked against hand-computed offers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.admission import decide, live_entries
from models.explain import Fact
from models.simulate import AdmissionSimulation, simulate_admission, simulate_peering
from tests.test_admission import adv, applied, snapshot

pytestmark = pytest.mark.explain

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _push(minutes: int, *, used_cpu: str, offered_cpu: str, percent: int = 50) -> Fact:
    value = {"advertised": {"cpu": offered_cpu, "memory": "4Gi"}, "allocatable": {"cpu": "8", "memory": "16Gi"},
             "used": {"cpu": used_cpu, "memory": "8Gi"}, "sharing_percentage": percent}  # fmt: skip
    return Fact(at=T0 + timedelta(minutes=minutes), kind="push", value=value)


def test_each_recorded_push_is_recomputed_from_its_own_inputs_and_the_summary_counts_and_averages() -> None:
    facts = [_push(10, used_cpu="2", offered_cpu="3"),  # (8 − 2) × 50% = 3; at 25%: 1.5
             _push(20, used_cpu="7", offered_cpu="500m"),  # (8 − 7) × 50%; at 25%: 250m
             Fact(at=T0, kind="signal", name="set_sharing_percentage", value=25)]  # fmt: skip
    simulation = simulate_peering("peering with c", facts, percent=25)
    assert [(p.offered["cpu"], p.would_offer["cpu"]) for p in simulation.pushes] == [("3", "1500m"), ("500m", "250m")]
    assert [p.would_offer["memory"] for p in simulation.pushes] == ["2Gi", "2Gi"]  # (16Gi − 8Gi) × 25%
    assert simulation.differing == 2
    assert simulation.offered_mean == {"cpu": "1750m", "memory": "4096Mi"}
    assert simulation.would_offer_mean == {"cpu": "875m", "memory": "2048Mi"}
    assert "2 pushes replayed, 2 would have offered otherwise" in simulation.render()


def test_since_leaves_out_older_pushes_and_the_recorded_percentage_gives_back_what_was_offered() -> None:
    facts = [_push(10, used_cpu="2", offered_cpu="3"), _push(20, used_cpu="7", offered_cpu="500m")]
    same = simulate_peering("p", facts, percent=50, since=T0 + timedelta(minutes=15))
    assert [p.at for p in same.pushes] == [T0 + timedelta(minutes=20)] and same.differing == 0
    with pytest.raises(ValueError, match="between 0 and 100"):
        simulate_peering("p", facts, percent=101)


# simulate admission ----------------------------------------------------------------------------------
_OFFERS = {"p0": "1", "p1": "2", "p2": "3", "p3": "4"}


def _pass(minutes: int, live: list[tuple[str, str, str]], accepted_now: tuple[str, ...] = ()) -> Fact:
    """An admission pass's result: every live Advertisement (provider, phase, reason) as it left them, in
    arrival order (p0 first), and the acceptances it wrote."""
    return Fact(at=T0 + timedelta(minutes=minutes), kind="admission", value={
        "policy": "AutoAcceptMax", "maximum": 2,
        "records": [{"advertisement": f"advertisement-{p}", "phase": "Accepted"} for p in accepted_now],
        "live": [{"advertisement": f"advertisement-{p}", "provider": p, "arrived": T0 + timedelta(minutes=int(p[1:])),
                  "phase": phase, "reason": reason, "offer": {"cpu": _OFFERS[p], "memory": "1Gi"}}
                 for p, phase, reason in live],
    })  # fmt: skip


A, MR, DENIED = ("Accepted", "WithinMaximum"), ("Refused", "MaxReached"), ("Refused", "Denied")
# Recorded under a maximum of 2: p0 and p1 accepted as they came, p2 refused until p0 left, p3 denied.
RECORDED = [
    _pass(0, [("p0", *A)], ("p0",)),
    _pass(1, [("p0", *A), ("p1", *A)], ("p1",)),
    _pass(2, [("p0", *A), ("p1", *A), ("p2", *MR)]),
    _pass(3, [("p0", *A), ("p1", *A), ("p2", *MR), ("p3", *DENIED)]),
    _pass(4, [("p1", *A), ("p2", *A), ("p3", *DENIED)], ("p2",)),  # p0 deleted: p2 takes its place
]


def _outcomes(simulation: AdmissionSimulation) -> dict[str, tuple[str, int | None]]:
    return {a.provider: (a.would, None if a.would_accepted_at is None else int((a.would_accepted_at - T0).total_seconds() // 60))
            for a in simulation.advertisements}  # fmt: skip


def test_the_recorded_maximum_replays_every_decision_as_it_was_made() -> None:
    simulation = simulate_admission("admission on b", RECORDED, maximum=2)
    assert simulation.passes == 5 and simulation.differing == 0
    assert [(a.then, a.would) for a in simulation.advertisements] == [
        ("Accepted (WithinMaximum)", "Accepted (WithinMaximum)"), ("Accepted (WithinMaximum)", "Accepted (WithinMaximum)"),
        ("Accepted (WithinMaximum)", "Accepted (WithinMaximum)"), ("Refused (Denied)", "Refused (Denied)")]  # fmt: skip
    assert [a.then_accepted_at == a.would_accepted_at for a in simulation.advertisements] == [True] * 4
    assert simulation.advertisements[0].left == T0 + timedelta(minutes=4)
    assert (simulation.accepted_then, simulation.accepted_would) == (2, 2)


def test_a_lower_maximum_accepts_the_next_in_arrival_order_only_when_a_place_frees() -> None:
    simulation = simulate_admission("admission on b", RECORDED, maximum=1)
    # p0 alone; p1 waits for p0 to leave (minute 4) and then goes before p2, which arrived after it.
    assert _outcomes(simulation) == {"p0": ("Accepted (WithinMaximum)", 0), "p1": ("Accepted (WithinMaximum)", 4),
                                     "p2": ("Refused (MaxReached)", None), "p3": ("Refused (Denied)", None)}  # fmt: skip
    assert [a.provider for a in simulation.advertisements if a.differs] == ["p1", "p2"]
    assert (simulation.accepted_then, simulation.accepted_would) == (2, 1)
    assert simulation.capacity_then == {"cpu": "5", "memory": "2Gi"}  # p1 (2) and p2 (3)
    assert simulation.capacity_would == {"cpu": "2", "memory": "1Gi"}
    text = simulation.render()
    assert "5 passes replayed, 2 of 4 Advertisements would have been decided otherwise" in text
    assert "accepted at the last pass: 2 → 1; capacity cpu 5 → 2, memory 2Gi → 1Gi" in text


def test_a_higher_maximum_accepts_at_arrival_and_the_lists_still_refuse() -> None:
    simulation = simulate_admission("admission on b", RECORDED, maximum=3)
    assert _outcomes(simulation)["p2"] == ("Accepted (WithinMaximum)", 2)  # at its arrival, not when p0 left
    assert _outcomes(simulation)["p3"] == ("Refused (Denied)", None)  # rule 3 holds whatever the maximum
    assert [a.provider for a in simulation.advertisements if a.differs] == ["p2"]
    assert simulate_admission("admission on b", RECORDED, maximum=0).accepted_would == 0


def test_a_manual_policy_replayed_as_auto_accept_keeps_the_manual_decisions() -> None:
    pending, by_hand = ("Pending", "AwaitingManualDecision"), ("Accepted", "ManuallyAccepted")
    recorded = [_pass(0, [("p0", *pending)]), _pass(1, [("p0", *pending), ("p1", *by_hand)], ("p1",)),
                _pass(2, [("p0", "Refused", "DecisionTimedOut"), ("p1", *by_hand), ("p2", "Refused", "ManuallyRefused")])]  # fmt: skip
    simulation = simulate_admission("admission on b", recorded, maximum=1)
    # p0 takes the one place; p1's acceptance by hand is not bound by the maximum; p2's refusal stands.
    assert _outcomes(simulation) == {"p0": ("Accepted (WithinMaximum)", 0), "p1": ("Accepted (ManuallyAccepted)", 1),
                                     "p2": ("Refused (ManuallyRefused)", None)}  # fmt: skip
    assert simulation.accepted_would == 2 and simulation.accepted_then == 1


def test_a_virtual_node_never_ready_frees_its_place_in_the_replay_too() -> None:
    recorded = [_pass(0, [("p0", *A), ("p1", *MR)], ("p0",)),
                _pass(1, [("p0", "Refused", "VirtualNodeNotReady"), ("p1", *A)], ("p1",))]  # fmt: skip
    simulation = simulate_admission("admission on b", recorded, maximum=1)
    assert _outcomes(simulation) == {"p0": ("Refused (VirtualNodeNotReady)", None), "p1": ("Accepted (WithinMaximum)", 1)}
    assert simulation.differing == 0


def test_passes_without_their_inputs_are_counted_and_since_starts_from_what_was_accepted_then() -> None:
    older = Fact(at=T0 - timedelta(minutes=1), kind="admission", value={"policy": "AutoAcceptMax", "maximum": 2, "records": []})
    simulation = simulate_admission("admission on b", [older, *RECORDED], maximum=1)
    assert simulation.not_replayable == 1 and simulation.passes == 5
    assert "1 passes recorded without their inputs, not replayed" in simulation.render()
    # From minute 2: p0 and p1 were accepted before it, and stay so even above a maximum of 1.
    since = simulate_admission("admission on b", RECORDED, maximum=1, since=T0 + timedelta(minutes=2))
    assert _outcomes(since) == {"p0": ("Accepted (WithinMaximum)", None), "p1": ("Accepted (WithinMaximum)", None),
                                "p2": ("Refused (MaxReached)", None), "p3": ("Refused (Denied)", None)}  # fmt: skip
    assert [a.provider for a in since.advertisements if a.differs] == ["p2"]


def test_a_maximum_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="maxAcceptableAdvertisements must be between 0 and 1000000"):
        simulate_admission("admission on b", RECORDED, maximum=-1)


def _world(events: list[tuple[str, int]], maximum: int) -> list[Fact]:
    """The admission passes the real policy (models.admission.decide) makes under AutoAcceptMax at `maximum`,
    one pass after each event (`arrive` or `leave` of provider pN; p9 is denied), recorded as
    activities/consumer.py records them."""
    live: list[dict[str, Any]] = []
    facts: list[Fact] = []
    for minute, (event, number) in enumerate(events):
        provider = f"p{number}"
        if event == "arrive" and all(a["spec"]["clusterId"] != provider for a in live):
            live.append(adv(provider, order=minute))
        elif event == "leave":
            live = [a for a in live if a["spec"]["clusterId"] != provider]
        taken = snapshot(live, acceptPolicy="AutoAcceptMax", maxAcceptableAdvertisements=maximum, deniedClusters=["p9"])
        decisions = decide(taken)
        facts.append(Fact(at=T0 + timedelta(minutes=minute), kind="admission", value={
            "records": [{"advertisement": d.name, "phase": d.phase} for d in decisions],
            "live": [e.model_dump(mode="json") for e in live_entries(taken, decisions) or []]}))  # fmt: skip
        live = applied(live, decisions)
    return facts


_EVENTS = st.lists(st.tuples(st.sampled_from(["arrive", "arrive", "leave"]), st.sampled_from([0, 1, 2, 3, 4, 9])),
                   min_size=1, max_size=25)  # fmt: skip


@given(events=_EVENTS, recorded=st.integers(0, 4), other=st.integers(0, 4))
@settings(max_examples=200, deadline=None)
def test_a_replay_at_another_maximum_decides_as_the_policy_itself_would_have(
    events: list[tuple[str, int]], recorded: int, other: int
) -> None:
    """Replaying what happened under one maximum at another gives what the real policy decides, pass by pass,
    had the other maximum been set: the same outcome and the same pass of acceptance for each Advertisement."""
    replay = simulate_admission("admission on b", _world(events, recorded), maximum=other)
    truth = simulate_admission("admission on b", _world(events, other), maximum=other)
    assert truth.differing == 0  # replaying a history at its own maximum changes nothing
    assert [(a.provider, a.would, a.would_accepted_at, a.left) for a in replay.advertisements] == \
        [(a.provider, a.then, a.then_accepted_at, a.left) for a in truth.advertisements]  # fmt: skip
    assert (replay.accepted_would, replay.capacity_would) == (truth.accepted_then, truth.capacity_then)
