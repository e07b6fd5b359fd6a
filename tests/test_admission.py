"""The acceptance policy as a pure function of the cluster's Advertisements and its ClusterConfig."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from models.admission import AdmissionSnapshot, decide, validate_advertisement
from models.api import ClusterConfig

pytestmark = pytest.mark.consumer
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def adv(provider: str, *, order: int, phase: str | None = None, reason: str | None = None,
        hard: dict[str, Any] | None = None, ttl: timedelta = timedelta(minutes=30), decision: str | None = None,
        deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": f"advertisement-{provider}", "creationTimestamp": f"2026-11-22T11:{order:02d}:00Z",
                            "annotations": {"tidepool.io/decision": decision} if decision else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    return {"metadata": meta,
            "spec": {"clusterId": provider, "resourceQuota": {"hard": hard if hard is not None else {"cpu": "1"}},
                     "timeToLive": (NOW + ttl).isoformat()},
            "status": {"phase": phase, "reason": reason} if phase else {}}  # fmt: skip


def snapshot(advertisements: list[dict[str, Any]], **incoming: Any) -> AdmissionSnapshot:
    config = ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {"incoming": incoming}})
    return AdmissionSnapshot.from_kubernetes(config=config, advertisements=advertisements, now=NOW)


def outcome(advertisements: list[dict[str, Any]], **incoming: Any) -> dict[str, tuple[str, str]]:
    return {d.provider: (d.phase, d.reason) for d in decide(snapshot(advertisements, **incoming))}


def test_auto_accept_max_accepts_in_arrival_order_up_to_the_maximum() -> None:
    arriving = [adv(f"p{i}", order=i) for i in range(20)]
    decisions = outcome(arriving, maxAcceptableAdvertisements=5)
    assert {p for p, (phase, _) in decisions.items() if phase == "Accepted"} == {f"p{i}" for i in range(5)}
    assert all(decisions[f"p{i}"] == ("Refused", "MaxReached") for i in range(5, 20))


def test_a_raised_maximum_accepts_refused_ones_in_arrival_order() -> None:
    state = [adv("a", order=1, phase="Accepted", reason="WithinMaximum"),
             adv("b", order=3, phase="Refused", reason="MaxReached"),
             adv("c", order=2, phase="Refused", reason="MaxReached")]  # fmt: skip
    assert outcome(state, maxAcceptableAdvertisements=2) == {"c": ("Accepted", "WithinMaximum")}


def test_a_lowered_maximum_keeps_the_accepted_and_refuses_new_arrivals() -> None:
    state = [adv(p, order=i, phase="Accepted", reason="WithinMaximum") for i, p in enumerate("abc")]
    assert outcome([*state, adv("d", order=9)], maxAcceptableAdvertisements=1) == {"d": ("Refused", "MaxReached")}


def test_a_deleting_advertisement_frees_its_place() -> None:
    state = [adv("a", order=1, phase="Deleting", reason="Deleted", deleting=True),
             adv("b", order=2, phase="Refused", reason="MaxReached")]  # fmt: skip
    assert outcome(state, maxAcceptableAdvertisements=1) == {"b": ("Accepted", "WithinMaximum")}


@pytest.mark.parametrize(
    ("incoming", "provider", "expected"),
    [
        pytest.param({"deniedClusters": ["x"], "allowedClusters": ["x"]}, "x", ("Refused", "Denied"), id="deny wins over allow"),
        pytest.param({"allowedClusters": ["y"]}, "x", ("Refused", "NotAllowed"), id="an allow list refuses the others"),
        pytest.param({"allowedClusters": ["x"]}, "x", ("Accepted", "WithinMaximum"), id="an allowed cluster is accepted"),
        pytest.param({"acceptPolicy": "Manual"}, "x", ("Pending", "AwaitingManualDecision"), id="manual waits"),
    ],
)  # fmt: skip
def test_lists_and_policies(incoming: dict[str, Any], provider: str, expected: tuple[str, str]) -> None:
    assert outcome([adv(provider, order=1)], **incoming)[provider] == expected


@pytest.mark.parametrize(
    ("decision", "expected"),
    [pytest.param("accept", ("Accepted", "ManuallyAccepted"), id="accepted by annotation"),
     pytest.param("refuse", ("Refused", "ManuallyRefused"), id="refused by annotation")],
)  # fmt: skip
def test_a_manual_decision_is_applied_under_the_manual_policy(decision: str, expected: tuple[str, str]) -> None:
    assert outcome([adv("x", order=1, decision=decision)], acceptPolicy="Manual")["x"] == expected


@pytest.mark.parametrize(
    ("advertisement", "problem"),
    [
        pytest.param(adv("x", order=1, hard={}), "offers no resources", id="no resources"),
        pytest.param(adv("x", order=1, hard={"cpu": "-1"}), "is negative", id="negative resources"),
        pytest.param(adv("x", order=1, hard={"cpu": "lots"}), "is not a quantity", id="garbage quantity"),
        pytest.param(adv("x", order=1, hard={"cpu": "0"}), "all zero", id="only zeros"),
        pytest.param(adv("x", order=1, ttl=timedelta(seconds=-1)), "has passed", id="expired"),
        pytest.param({"metadata": {"name": "advertisement-x"}, "spec": "nonsense"}, "spec is missing", id="a spec that is not one"),
    ],
)  # fmt: skip
def test_invalid_advertisements_are_refused_with_their_reason_and_never_crash(advertisement: dict[str, Any],
                                                                             problem: str) -> None:  # fmt: skip
    assert any(problem in p for p in validate_advertisement(advertisement, NOW))
    decisions = decide(snapshot([advertisement]))
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "Invalid")]


def test_an_unchanged_decision_is_not_written_again() -> None:
    assert outcome([adv("a", order=1, phase="Refused", reason="MaxReached")], maxAcceptableAdvertisements=0) == {}
