"""The acceptance policy as a pure function of the cluster's Advertisements and its ClusterConfig."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from models.admission import (
    MAX_KEPT_REFUSALS,
    NOT_READY_MESSAGE,
    REASONS,
    AdmissionSnapshot,
    Decision,
    KeptRefusals,
    RefusalOnRecord,
    decide,
    kept_refusals,
    next_decision_deadline,
    offer_fingerprint,
    validate_advertisement,
)
from models.api import Advertisement, ClusterConfig
from models.api.conditions import REASON_PATTERN
from models.consumer import (
    UNREACHABLE_MEMORY,
    UnreachableTeardowns,
    record_unreachable,
)
from models.names import (
    DECISION_ANNOTATION,
    DECISION_REASON_ANNOTATION,
    REFUSED_OFFER_ANNOTATION,
    SYSTEM_NAMESPACE,
    advertisement_name,
    credentials_secret_name,
)
from models.times import format_rfc3339

pytestmark = pytest.mark.consumer
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def adv(provider: str, *, order: int = 0, phase: str | None = None, reason: str | None = None,
        hard: Any = None, ttl: Any = timedelta(minutes=30), decision: str | None = None, why: str | None = None,
        deleting: bool = False, name: str | None = None, message: str | None = None, ref: Any = None,
        prices: Any = None, uid: str | None = None, refused_offer: str | None = None) -> dict[str, Any]:  # fmt: skip
    """An Advertisement as the API server lists it; `order` is its arrival (creationTimestamp, seconds);
    `message` the Accepted condition's, `ref` its kubeConfigRef (the protocol's Secret by default), `uid`
    its metadata.uid (`uid-<provider>` by default)."""
    annotations = {DECISION_ANNOTATION: decision} if decision else {}
    if why:
        annotations[DECISION_REASON_ANNOTATION] = why
    if refused_offer:
        annotations[REFUSED_OFFER_ANNOTATION] = refused_offer
    created = NOW - timedelta(hours=1) + timedelta(seconds=order)
    meta: dict[str, Any] = {"name": name or f"advertisement-{provider}", "annotations": annotations,
                            "uid": uid or f"uid-{provider}",
                            "creationTimestamp": format_rfc3339(created)}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = format_rfc3339(NOW)
    status: dict[str, Any] = {"phase": phase, "reason": reason} if phase else {}
    if message is not None:
        status["conditions"] = [{"type": "Accepted", "status": str(phase == "Accepted"), "reason": reason,
                                 "message": message}]  # fmt: skip
    spec_prices = {} if prices is None else {"prices": prices}
    return {
        "apiVersion": "tidepool.io/v1alpha1", "kind": "Advertisement", "metadata": meta,
        "spec": {"clusterId": provider, "resourceQuota": {"hard": {"cpu": "1", "memory": "1Gi"} if hard is None else hard},
                 "network": {"podCIDR": "10.1.0.0/16"},
                 "kubeConfigRef": {"name": credentials_secret_name(provider), "namespace": SYSTEM_NAMESPACE} if ref is None else ref,
                 "timestamp": (NOW - timedelta(minutes=1)).isoformat(),
                 "timeToLive": (NOW + ttl).isoformat() if isinstance(ttl, timedelta) else ttl, **spec_prices},
        "status": status,
    }  # fmt: skip


def snapshot(advertisements: list[dict[str, Any]], now: datetime = NOW, **incoming: Any) -> AdmissionSnapshot:
    config = ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {"incoming": incoming}})
    return AdmissionSnapshot.from_kubernetes(config=config, advertisements=advertisements, now=now)


def outcome(advertisements: list[dict[str, Any]], **incoming: Any) -> dict[str, tuple[str, str]]:
    """The decisions, by provider: (phase, reason)."""
    return {d.provider: (d.phase, d.reason) for d in decide(snapshot(advertisements, **incoming))}


def applied(advertisements: list[dict[str, Any]], decisions: list[Decision]) -> list[dict[str, Any]]:
    """The Advertisements after the admission pass wrote its decisions (as activities/consumer.py does:
    phase, reason, and the Accepted condition with the message)."""
    by_name = {d.name: d for d in decisions}
    result = []
    for a in advertisements:
        d = by_name.get(a["metadata"]["name"])
        if d is None:
            result.append(a)
            continue
        condition = {"type": "Accepted", "status": str(d.phase == "Accepted"), "reason": d.reason, "message": d.message}
        status: dict[str, Any] = {"phase": d.phase, "reason": d.reason, "conditions": [condition]}
        if d.decision_deadline is not None:
            status["decisionDeadline"] = format_rfc3339(d.decision_deadline)
        result.append({**a, "status": status})
    return result


def settled(advertisements: list[dict[str, Any]], **incoming: Any) -> list[dict[str, Any]]:
    """The Advertisements once a pass under `incoming` has written its decisions."""
    return applied(advertisements, decide(snapshot(advertisements, **incoming)))


def accepted(advertisements: list[dict[str, Any]], **incoming: Any) -> set[str]:
    """Who is accepted once this pass's decisions are written."""
    after = applied(advertisements, decide(snapshot(advertisements, **incoming)))
    return {a["spec"]["clusterId"] for a in after if (a.get("status") or {}).get("phase") == "Accepted"}


# AutoAcceptMax ------------------------------------------------------------------------------------------


def test_twenty_arriving_at_once_with_a_maximum_of_five_accept_exactly_the_first_five() -> None:
    arriving = [adv(f"p{i:02d}", order=i) for i in range(20)]
    random.Random(7).shuffle(arriving)  # the list order of the API server is not the arrival order
    decisions = outcome(arriving, maxAcceptableAdvertisements=5)
    assert {p for p, (phase, _) in decisions.items() if phase == "Accepted"} == {f"p{i:02d}" for i in range(5)}
    assert {p: d for p, d in decisions.items() if d[0] != "Accepted"} == {f"p{i:02d}": ("Refused", "MaxReached")
                                                                          for i in range(5, 20)}  # fmt: skip
    assert decide(snapshot(applied(arriving, decide(snapshot(arriving, maxAcceptableAdvertisements=5))),
                           maxAcceptableAdvertisements=5)) == []  # fmt: skip


def test_arrivals_in_the_same_second_are_ordered_by_name() -> None:
    same_second = [adv("b", order=1), adv("a", order=1), adv("c", order=0)]
    assert accepted(same_second, maxAcceptableAdvertisements=2) == {"a", "c"}


@pytest.mark.parametrize(
    ("maximum", "expected"),
    [
        pytest.param(3, {"a", "c", "b"}, id="raised by one accepts the earliest refused for lack of room"),
        pytest.param(10, {"a", "c", "b", "d"}, id="raised well above accepts every one refused for lack of room"),
        pytest.param(2, {"a", "c"}, id="unchanged accepts nobody"),
    ],
)
def test_a_raised_maximum_accepts_refused_ones_in_arrival_order(maximum: int, expected: set[str]) -> None:
    state = [adv("a", order=1, phase="Accepted", reason="WithinMaximum"),
             adv("d", order=4, phase="Refused", reason="MaxReached"),
             adv("b", order=3, phase="Refused", reason="MaxReached"),
             adv("c", order=2, phase="Accepted", reason="WithinMaximum"),
             adv("x", order=0, phase="Refused", reason="Denied"),
             adv("y", order=0, phase="Refused", reason="Invalid", hard={}),
             adv("z", order=0, phase="Refused", reason="ManuallyRefused", decision="refuse")]  # fmt: skip
    assert accepted(state, maxAcceptableAdvertisements=maximum, deniedClusters=["x"]) == expected


def test_a_lowered_maximum_keeps_every_accepted_one_and_refuses_new_arrivals() -> None:
    state = [adv(p, order=i, phase="Accepted", reason="WithinMaximum") for i, p in enumerate("abc")]
    state = settled([*state, adv("e", order=10)], maxAcceptableAdvertisements=1) + [adv("d", order=9)]
    assert outcome(state, maxAcceptableAdvertisements=1) == {"d": ("Refused", "MaxReached")}
    assert accepted(state, maxAcceptableAdvertisements=1) == {"a", "b", "c"}


def test_a_lowered_maximum_accepts_again_only_once_below_it() -> None:
    state = [adv(p, order=i, phase="Accepted", reason="WithinMaximum") for i, p in enumerate("abc")]
    state = settled([*state, adv("d", order=9)], maxAcceptableAdvertisements=2)
    state[0] = adv("a", order=0, phase="Accepted", reason="WithinMaximum", deleting=True)
    assert outcome(state, maxAcceptableAdvertisements=2) == {}  # b and c still fill both places
    state[1] = adv("b", order=1, phase="Deleting", reason="WithinMaximum", deleting=True)
    assert outcome(state, maxAcceptableAdvertisements=2) == {"d": ("Accepted", "WithinMaximum")}


@pytest.mark.parametrize(
    "going",
    [
        pytest.param(
            adv("a", order=1, phase="Accepted", reason="WithinMaximum", deleting=True),
            id="an accepted Advertisement with a deletion timestamp frees its place",
        ),
        pytest.param(
            adv("a", order=1, phase="Deleting", reason="WithinMaximum"), id="a Deleting Advertisement frees its place"
        ),
    ],
)
def test_a_deleting_advertisement_does_not_hold_a_place(going: dict[str, Any]) -> None:
    state = [going, adv("b", order=2, phase="Refused", reason="MaxReached")]
    assert outcome(state, maxAcceptableAdvertisements=1) == {"b": ("Accepted", "WithinMaximum")}


def test_a_deleting_advertisement_is_never_decided_on() -> None:
    assert outcome([adv("a", order=1, deleting=True)], maxAcceptableAdvertisements=5) == {}


def test_an_accepted_advertisement_stays_accepted_when_it_expires_or_its_cluster_is_denied() -> None:
    state = [adv("a", order=1, phase="Accepted", reason="WithinMaximum", ttl=timedelta(minutes=-5))]
    assert outcome(state, deniedClusters=["a"], allowedClusters=["b"], maxAcceptableAdvertisements=0) == {}


def test_an_unchanged_decision_is_not_written_again() -> None:
    state = settled([adv("a", order=1), adv("b", order=2), adv("c", order=0)], maxAcceptableAdvertisements=1,
                    deniedClusters=["b"])  # fmt: skip
    assert [a["status"]["reason"] for a in state] == ["MaxReached", "Denied", "WithinMaximum"]
    assert outcome(state, maxAcceptableAdvertisements=1, deniedClusters=["b"]) == {}


def test_a_changed_reason_is_written_even_when_the_phase_stays() -> None:
    state = [adv("a", order=1, phase="Refused", reason="MaxReached")]
    assert outcome(state, maxAcceptableAdvertisements=0, deniedClusters=["a"]) == {"a": ("Refused", "Denied")}


# Lists and policies -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("incoming", "advertisement", "expected"),
    [
        pytest.param({"deniedClusters": ["x"], "allowedClusters": ["x"]}, adv("x"), ("Refused", "Denied"),
                     id="deny wins over allow"),
        pytest.param({"allowedClusters": ["y"]}, adv("x"), ("Refused", "NotAllowed"), id="an allow list refuses the others"),
        pytest.param({"allowedClusters": ["x"]}, adv("x"), ("Accepted", "WithinMaximum"), id="an allowed cluster is accepted"),
        pytest.param({"deniedClusters": ["y"]}, adv("x"), ("Accepted", "WithinMaximum"),
                     id="a deny list leaves the others alone"),
        pytest.param({"maxAcceptableAdvertisements": 0}, adv("x"), ("Refused", "MaxReached"),
                     id="a maximum of zero refuses every arrival"),
        pytest.param({"acceptPolicy": "Manual"}, adv("x"), ("Pending", "AwaitingManualDecision"),
                     id="the manual policy waits for a decision"),
        pytest.param({"acceptPolicy": "Manual"}, adv("x", phase="Refused", reason="MaxReached"),
                     ("Pending", "AwaitingManualDecision"),
                     id="under the manual policy one refused for lack of room waits for a decision"),
        pytest.param({"acceptPolicy": "Manual", "maxAcceptableAdvertisements": 0}, adv("x", decision="accept"),
                     ("Accepted", "ManuallyAccepted"), id="a manual acceptance is not bound by the maximum"),
        pytest.param({"acceptPolicy": "Manual"}, adv("x", decision="refuse"), ("Refused", "ManuallyRefused"),
                     id="a manual refusal is applied under the manual policy"),
        pytest.param({}, adv("x", decision="refuse"), ("Refused", "ManuallyRefused"),
                     id="a manual refusal is applied under AutoAcceptMax too"),
        pytest.param({"maxAcceptableAdvertisements": 0}, adv("x", decision="accept", phase="Refused", reason="MaxReached"),
                     ("Accepted", "ManuallyAccepted"), id="a manual acceptance overrides AutoAcceptMax's maximum"),
        pytest.param({"acceptPolicy": "Manual", "deniedClusters": ["x"]}, adv("x", decision="accept"),
                     ("Refused", "Denied"), id="a manual acceptance does not override the deny list"),
        pytest.param({"acceptPolicy": "Manual"}, adv("x", decision="accept", hard={}), ("Refused", "Invalid"),
                     id="a manual acceptance does not make an invalid Advertisement valid"),
        pytest.param({"acceptPolicy": "Manual"}, adv("x", decision="maybe"), ("Pending", "AwaitingManualDecision"),
                     id="a decision annotation other than accept or refuse is no decision"),
        pytest.param({"deniedClusters": []}, adv("x", phase="Refused", reason="Denied"), ("Accepted", "WithinMaximum"),
                     id="a cluster taken off the deny list is reconsidered"),
    ],
)  # fmt: skip
def test_lists_and_policies(incoming: dict[str, Any], advertisement: dict[str, Any], expected: tuple[str, str]) -> None:
    assert outcome([advertisement], **incoming)["x"] == expected


@pytest.mark.parametrize(
    ("decision", "phase", "reason"),
    [pytest.param("accept", "Accepted", "ManuallyAccepted", id="accepted by annotation with its reason"),
     pytest.param("refuse", "Refused", "ManuallyRefused", id="refused by annotation with its reason")],
)  # fmt: skip
def test_a_manual_decision_is_recorded_with_its_reason(decision: str, phase: str, reason: str) -> None:
    decisions = decide(
        snapshot([adv("x", decision=decision, why="capacity for the batch jobs")], acceptPolicy="Manual")
    )
    assert [(d.name, d.provider, d.phase, d.reason) for d in decisions] == [("advertisement-x", "x", phase, reason)]
    assert "capacity for the batch jobs" in decisions[0].message


def test_manual_acceptances_count_against_the_maximum_when_the_policy_turns_automatic() -> None:
    state = [adv("a", order=1, phase="Accepted", reason="ManuallyAccepted"), adv("b", order=2, phase="Pending",
             reason="AwaitingManualDecision"), adv("c", order=3, phase="Pending", reason="AwaitingManualDecision")]  # fmt: skip
    assert outcome(state, maxAcceptableAdvertisements=2) == {"b": ("Accepted", "WithinMaximum"),
                                                             "c": ("Refused", "MaxReached")}  # fmt: skip


# Deadlines on manual decisions (issue 20) ------------------------------------------------------------------

HOUR: dict[str, Any] = {"acceptPolicy": "Manual", "manualDecisionTimeoutSeconds": 3600}


def _pass(advertisements: list[dict[str, Any]], now: datetime, **incoming: Any) -> tuple[list[Decision], list[dict[str, Any]], datetime | None]:
    """One admission pass at `now`: its decisions, the Advertisements once written, the next deadline."""
    snap = snapshot(advertisements, now=now, **incoming)
    decisions = decide(snap)
    return decisions, applied(advertisements, decisions), next_decision_deadline(snap, decisions)


def test_a_manual_decision_nobody_makes_in_time_is_refused_and_stays_refused_until_someone_decides() -> None:
    state = [adv("x", ttl=timedelta(days=2))]
    decisions, state, deadline = _pass(state, NOW, **HOUR)
    assert [(d.phase, d.reason, d.decision_deadline) for d in decisions] == [
        ("Pending", "AwaitingManualDecision", NOW + timedelta(hours=1))]
    assert "until 2026-11-22T13:00:00Z (manualDecisionTimeoutSeconds)" in decisions[0].message
    assert deadline == NOW + timedelta(hours=1)
    decisions, state, deadline = _pass(state, NOW + timedelta(minutes=59), **HOUR)
    assert (decisions, deadline) == ([], NOW + timedelta(hours=1))  # still waiting: nothing written
    decisions, state, deadline = _pass(state, NOW + timedelta(hours=1), **HOUR)
    assert [(d.phase, d.reason, d.decision_deadline) for d in decisions] == [("Refused", "DecisionTimedOut", None)]
    assert "manualDecisionTimeoutSeconds (3600 s)" in decisions[0].message and deadline is None
    decisions, state, deadline = _pass(state, NOW + timedelta(hours=5), **HOUR)
    assert (decisions, deadline) == ([], None)  # the refusal sticks and arms nothing
    state[0]["metadata"]["annotations"][DECISION_ANNOTATION] = "accept"
    decisions, state, _ = _pass(state, NOW + timedelta(hours=6), **HOUR)
    assert [(d.phase, d.reason) for d in decisions] == [("Accepted", "ManuallyAccepted")]


def test_a_timeout_set_while_one_waits_starts_its_clock_then_and_unsetting_it_waits_again_without_end() -> None:
    waiting = settled([adv("x", ttl=timedelta(days=2))], acceptPolicy="Manual")
    assert waiting[0]["status"]["reason"] == "AwaitingManualDecision" and "decisionDeadline" not in waiting[0]["status"]
    later = NOW + timedelta(hours=3)
    decisions, state, deadline = _pass(waiting, later, **HOUR)
    assert [(d.reason, d.decision_deadline) for d in decisions] == [("AwaitingManualDecision", later + timedelta(hours=1))]
    _, state, _ = _pass(state, later + timedelta(hours=1), **HOUR)
    assert state[0]["status"]["reason"] == "DecisionTimedOut"
    decisions, state, deadline = _pass(state, later + timedelta(hours=2), acceptPolicy="Manual")
    assert [(d.phase, d.reason, d.decision_deadline) for d in decisions] == [("Pending", "AwaitingManualDecision", None)]
    assert deadline is None


def test_the_earliest_deadline_is_next_and_the_other_rules_still_come_first() -> None:
    state = [adv("a", order=1, ttl=timedelta(days=2)), adv("b", order=2, ttl=timedelta(days=2))]
    _, state, _ = _pass(state, NOW, **HOUR)
    state.append(adv("c", order=3, ttl=timedelta(days=2)))
    _, state, deadline = _pass(state, NOW + timedelta(minutes=10), **HOUR)
    assert deadline == NOW + timedelta(hours=1)  # a and b's, not c's
    decisions, _, deadline = _pass(state, NOW + timedelta(hours=1), deniedClusters=["a"], **HOUR)
    assert {d.provider: d.reason for d in decisions} == {"a": "Denied", "b": "DecisionTimedOut"}
    assert deadline == NOW + timedelta(minutes=70)  # c's


def _refused_not_ready(advertisement: dict[str, Any]) -> dict[str, Any]:
    """As the Advertisement workflow leaves one whose virtual node never became Ready."""
    annotations = {**advertisement["metadata"]["annotations"],
                   REFUSED_OFFER_ANNOTATION: offer_fingerprint(advertisement["spec"])}  # fmt: skip
    condition = {"type": "Accepted", "status": "False", "reason": "VirtualNodeNotReady", "message": NOT_READY_MESSAGE}
    return {**advertisement, "metadata": {**advertisement["metadata"], "annotations": annotations},
            "status": {"phase": "Refused", "reason": "VirtualNodeNotReady", "conditions": [condition]}}  # fmt: skip


@pytest.mark.parametrize("decision", [None, "accept"])
def test_a_refusal_for_a_virtual_node_never_ready_holds_until_the_offer_changes(decision: str | None) -> None:
    """Under either policy, and even with an old manual acceptance on it: no re-accept loop."""
    refused = _refused_not_ready(adv("x", decision=decision))
    assert outcome([refused]) == {} and outcome([refused], acceptPolicy="Manual") == {}
    new_offer = {**refused, "spec": {**refused["spec"], "resourceQuota": {"hard": {"cpu": "2", "memory": "1Gi"}}}}
    assert outcome([new_offer])["x"] == ("Accepted", "ManuallyAccepted" if decision else "WithinMaximum")
    lifted = {**refused, "metadata": {**refused["metadata"], "annotations": {
        k: v for k, v in refused["metadata"]["annotations"].items() if k != REFUSED_OFFER_ANNOTATION}}}
    assert outcome([lifted])["x"][0] == "Accepted"  # the annotation removed, as a manual acceptance does
    assert outcome([refused], deniedClusters=["x"])["x"] == ("Refused", "Denied")  # the lists still come first


@pytest.mark.parametrize(("until", "expected"), [
    pytest.param(NOW + timedelta(minutes=2), ("Refused", "UnreachableBackoff"), id="backing off: refused"),
    pytest.param(NOW, ("Accepted", "WithinMaximum"), id="the back-off over: accepted"),
])  # fmt: skip
def test_a_provider_torn_down_as_unreachable_is_refused_until_its_backoff_ends(
    until: datetime, expected: tuple[str, str]
) -> None:
    """Issue 34: its re-pushed Advertisement is a new arrival, so the back-off lives in the admission workflow."""
    config = ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {}})
    backed_off = AdmissionSnapshot.from_kubernetes(config=config, advertisements=[adv("x"), adv("y", order=1)],
                                                   now=NOW, backoffs={"x": (3, until)})  # fmt: skip
    decisions = {d.provider: d for d in decide(backed_off)}
    assert (decisions["x"].phase, decisions["x"].reason) == expected
    assert decisions["y"].reason == "WithinMaximum"  # only that provider
    if expected[1] == "UnreachableBackoff":
        assert decisions["x"].message == ("cluster 'x' was torn down 3 times in a row because this cluster's virtual "
                                          "kubelet could not reach it: not accepted again before 2026-11-22T12:02:00Z "
                                          "(backing off, doubling up to an hour)")  # fmt: skip
        manual = AdmissionSnapshot.from_kubernetes(config=config, advertisements=[adv("x", decision="accept")],
                                                   now=NOW, backoffs={"x": (3, until)})  # fmt: skip
        assert decide(manual)[0].reason == "ManuallyAccepted"  # a person's word wins


@pytest.mark.parametrize(("teardowns", "backoff"), [
    pytest.param(1, timedelta(minutes=1), id="first: a minute"),
    pytest.param(3, timedelta(minutes=4), id="third in a row: four minutes"),
    pytest.param(8, timedelta(hours=1), id="eighth: an hour at most"),
    pytest.param(1000, timedelta(hours=1), id="thousandth: still an hour"),
])  # fmt: skip
def test_the_unreachable_backoff_doubles_from_a_minute_to_an_hour(teardowns: int, backoff: timedelta) -> None:
    record = UnreachableTeardowns(count=teardowns, last=NOW)
    assert record.until - NOW == backoff


def test_teardowns_as_unreachable_count_in_a_row_and_old_ones_are_forgotten() -> None:
    records = record_unreachable({}, "x", NOW)
    records = record_unreachable(records, "x", NOW + timedelta(minutes=5))
    assert records["x"].count == 2
    later = NOW + timedelta(minutes=5) + UNREACHABLE_MEMORY + timedelta(seconds=1)
    records = record_unreachable(records, "y", later)
    assert set(records) == {"y"}, "x was not torn down for longer than the memory: forgotten"
    assert record_unreachable(records, "x", later)["x"].count == 1


# Validation ------------------------------------------------------------------------------------------------


def test_a_well_formed_advertisement_is_valid() -> None:
    assert validate_advertisement(adv("x"), NOW) == []


def with_spec(**spec: Any) -> dict[str, Any]:
    a = adv("x")
    a["spec"] = {**a["spec"], **spec}
    return a


@pytest.mark.parametrize(
    ("advertisement", "problem"),
    [
        pytest.param(adv("x", hard={}), "spec.resourceQuota.hard is empty", id="no resources offered"),
        pytest.param(with_spec(resourceQuota={}), "spec.resourceQuota.hard is missing", id="no hard at all"),
        pytest.param(with_spec(resourceQuota=["cpu"]), "spec.resourceQuota must be an object", id="a quota that is a list"),
        pytest.param(adv("x", hard=["cpu", "1"]), "spec.resourceQuota.hard must be an object, got list", id="hard that is a list"),
        pytest.param(adv("x", hard={"cpu": "-1"}), "spec.resourceQuota.hard.cpu must not be negative",
                     id="a negative resource"),
        pytest.param(adv("x", hard={"cpu": "lots"}), "spec.resourceQuota.hard.cpu: 'lots' is not a quantity",
                     id="an unparsable quantity"),
        pytest.param(adv("x", hard={"cpu": 1.5}), "spec.resourceQuota.hard.cpu: 1.5 is not a quantity",
                     id="a float that has lost its exact value"),
        pytest.param(adv("x", hard={"cpu": None}), "spec.resourceQuota.hard.cpu is missing", id="a null quantity"),
        pytest.param(adv("x", hard={"cpu": "0", "memory": "0"}), "every amount is zero", id="only zeros offered"),
        pytest.param(adv("x", ttl=timedelta(seconds=-1)), "spec.timeToLive", id="an expired timeToLive"),
        pytest.param(adv("x", ttl=timedelta(0)), "has passed", id="a timeToLive of exactly now has passed"),
        pytest.param(adv("x", ttl=None), "spec.timeToLive is missing", id="no timeToLive"),
        pytest.param(adv("x", ttl="tomorrow"), "spec.timeToLive must be an RFC 3339 time", id="a timeToLive that is no time"),
        pytest.param(adv("x", ttl="2099-01-01T00:00:00"), "with a zone", id="a timeToLive without a zone"),
        pytest.param(adv("x", ttl=1700000000), "spec.timeToLive must be an RFC 3339 time", id="a timeToLive that is a number"),
        pytest.param(with_spec(clusterId=None), "spec.clusterId is missing", id="no clusterId"),
        pytest.param(with_spec(clusterId=""), "spec.clusterId must not be empty", id="an empty clusterId"),
        pytest.param(with_spec(clusterId=42), "spec.clusterId must be a string", id="a clusterId that is a number"),
        pytest.param(adv("Bad_Id", name="advertisement-Bad_Id"), "must be a DNS-1123 label", id="a clusterId that is no DNS label"),
        pytest.param(adv("x", name="advertisement-y"), "metadata.name 'advertisement-y' must be 'advertisement-x'",
                     id="a name that does not match the clusterId"),
        pytest.param(with_spec(network=None), "spec.network is missing", id="no network"),
        pytest.param(with_spec(network="10.1.0.0/16"), "spec.network must be an object", id="a network that is a string"),
        pytest.param(with_spec(network={}), "spec.network.podCIDR is missing", id="no podCIDR"),
        pytest.param(with_spec(network={"podCIDR": "10.1.0.1/16"}), "spec.network.podCIDR '10.1.0.1/16' is not a CIDR",
                     id="a podCIDR with host bits set"),
        pytest.param(with_spec(network={"podCIDR": "127.0.0.0/8"}), "(loopback)", id="a loopback podCIDR"),
        pytest.param(with_spec(network={"podCIDR": "169.254.0.0/16"}), "(link-local)",
                     id="a link-local podCIDR (cloud metadata services)"),
        pytest.param(with_spec(network={"podCIDR": "0.0.0.0/0"}), "(unspecified)", id="every address at once"),
        pytest.param(with_spec(network={"podCIDR": "224.0.0.0/8"}), "(multicast)", id="a multicast podCIDR"),
        pytest.param(with_spec(network={"podCIDR": "240.0.0.0/8"}), "(reserved)", id="a reserved podCIDR"),
        pytest.param(with_spec(network={"podCIDR": "::1/128"}), "(loopback)", id="the IPv6 loopback"),
        pytest.param(with_spec(network={"podCIDR": "::ffff:127.0.0.0/104"}), "(IPv4-mapped)",
                     id="IPv4 loopback written as IPv6"),
        pytest.param(with_spec(network={"podCIDR": "fe80::/64"}), "(link-local)", id="an IPv6 link-local podCIDR"),
        pytest.param(with_spec(network={"podCIDR": "8.0.0.0/7"}), "wider than /8", id="an IPv4 podCIDR wider than /8"),
        pytest.param(with_spec(network={"podCIDR": "2001::/16"}), "wider than /32", id="an IPv6 podCIDR wider than /32"),
        pytest.param({"metadata": {"name": "advertisement-x"}}, "spec is missing", id="no spec"),
        pytest.param({"metadata": {"name": "advertisement-x"}, "spec": "nonsense"}, "spec must be an object",
                     id="a spec that is not an object"),
    ],
)  # fmt: skip
def test_invalid_advertisements_are_refused_with_their_reason(advertisement: dict[str, Any], problem: str) -> None:
    problems = validate_advertisement(advertisement, NOW)
    assert any(problem in p for p in problems), problems
    decisions = decide(snapshot([advertisement]))
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "Invalid")]
    assert problem in decisions[0].message


@pytest.mark.parametrize("pod_cidr", [
    pytest.param("10.0.0.0/8", id="the widest IPv4 PodCIDR is accepted"),
    pytest.param("10.96.0.0/12", id="a consumer's Service CIDR passes admission: the network module remaps it"),
    pytest.param("fd00:10:244::/48", id="an IPv6 PodCIDR is accepted"),
    pytest.param("2001:db8::/32", id="the widest IPv6 PodCIDR is accepted"),
])  # fmt: skip
def test_usable_pod_cidrs_are_valid(pod_cidr: str) -> None:
    assert validate_advertisement(with_spec(network={"podCIDR": pod_cidr}), NOW) == []


def test_every_problem_is_reported_at_once() -> None:
    problems = validate_advertisement(adv("x", hard={"cpu": "-1", "memory": "x"}, ttl=timedelta(hours=-1)), NOW)
    assert len(problems) == 3, problems


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
advertisement_keys = st.sampled_from(["metadata", "spec", "status"])
spec_keys = st.sampled_from(["clusterId", "resourceQuota", "timeToLive", "kubeConfigRef", "prices"])


@st.composite
def garbage(draw: st.DrawFn) -> Any:
    """Arbitrary JSON, often shaped like an Advertisement, with any part replaced by anything."""
    if draw(st.booleans()):
        return draw(json_values)
    a = adv(draw(st.sampled_from(["x", "y"])), order=draw(st.integers(0, 5)))
    for key in draw(st.lists(advertisement_keys, max_size=2)):
        a[key] = draw(json_values)
    if isinstance(a.get("spec"), dict):
        for key in draw(st.lists(spec_keys, max_size=2)):
            a["spec"][key] = draw(json_values)
    return a


@settings(max_examples=300, deadline=None)
@given(st.lists(garbage(), max_size=4))
def test_anything_never_raises_and_gets_a_reason_of_the_closed_set(advertisements: list[Any]) -> None:
    for a in advertisements:
        assert isinstance(validate_advertisement(a, NOW), list)
    for d in decide(snapshot(advertisements)):
        assert d.reason in REASONS[d.phase]


def _not_a(kind: type) -> st.SearchStrategy[Any]:
    return json_values.filter(lambda value: not isinstance(value, kind))


# Ways to break an Advertisement for sure: each value makes validate_advertisement name a problem, whatever the
# rest holds (json_values' strings are at most 8 characters: never a name, clusterId or time that would fit).
BREAKS: dict[str, st.SearchStrategy[Any]] = {
    "the whole object": _not_a(dict),
    "metadata": json_values,  # its name is never advertisement-<clusterId>
    "spec": json_values,  # not an object, or one without a clusterId
    "spec.clusterId": json_values.filter(lambda value: value not in ("x", "y")),  # no other name fits
    "spec.resourceQuota": _not_a(dict),
    "spec.resourceQuota.hard": st.sampled_from([{}, {"cpu": "-1"}, {"cpu": "lots"}, {"cpu": "0"}]) | _not_a(dict),
    "spec.network": _not_a(dict),
    "spec.network.podCIDR": st.sampled_from(["127.0.0.0/8", "0.0.0.0/0", "8.0.0.0/7", "nonsense", None]),
    "spec.timeToLive": json_values | st.just((NOW - timedelta(minutes=1)).isoformat()),
    "spec.prices": st.sampled_from([{"cpu": "-1"}, {"cpu": "cheap"}]) | _not_a(dict).filter(lambda v: v is not None),
}  # fmt: skip


@st.composite
def broken(draw: st.DrawFn) -> Any:
    """Garbage that cannot be a valid Advertisement: `garbage` (a status of anything but Accepted or Deleting,
    which are kept as they are), then one of BREAKS on top."""
    a = adv(draw(st.sampled_from(["x", "y"])), order=draw(st.integers(0, 5)))
    for key in draw(st.lists(advertisement_keys, max_size=2)):
        a[key] = draw(json_values)
    if isinstance(a.get("status"), dict) and a["status"].get("phase") in ("Accepted", "Deleting"):
        a["status"] = {}
    if isinstance(a.get("spec"), dict):
        for key in draw(st.lists(spec_keys, max_size=2)):
            a["spec"][key] = draw(json_values)
    where = draw(st.sampled_from(sorted(BREAKS)))
    value = draw(BREAKS[where])
    if where == "the whole object":
        return value
    *path, last = where.split(".")
    parent = a
    for key in path:
        if not isinstance(parent.get(key), dict):
            return a  # the part that holds it is garbage already: invalid as it is
        parent = parent[key]
    parent[last] = value
    return a


@settings(max_examples=300, deadline=None)
@given(st.lists(broken(), min_size=1, max_size=4))
def test_garbage_never_raises_and_is_refused_as_invalid(advertisements: list[Any]) -> None:
    for a in advertisements:
        assert validate_advertisement(a, NOW), a  # the validator names a problem of each
    decisions = decide(snapshot(advertisements))
    # Every one is a new arrival: each gets its decision, a refusal as Invalid saying why.
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "Invalid")] * len(advertisements), advertisements
    for d in decisions:
        assert d.message.startswith("invalid Advertisement: ") and len(d.message) > len("invalid Advertisement: ")


HUGE = [
    pytest.param(adv("x", hard={"cpu": "9" * 5000}), "spec.resourceQuota.hard.cpu", id="a quantity of 5000 digits"),
    pytest.param(adv("x", hard={"cpu": 10**5000}), "spec.resourceQuota.hard.cpu", id="an integer too long to print"),
    pytest.param(adv("x", prices={"cpu": "1e99999999"}), "spec.prices.cpu", id="a price beyond any amount"),
    pytest.param(with_spec(timestamp="9999-12-31T23:59:59-23:59", timeToLive="0001-01-01T00:00:00+23:59"),
                 "spec: timeToLive must be later than timestamp", id="times at the ends of the calendar"),
    pytest.param(with_spec(clusterId="x" * 100_000), "spec.clusterId", id="a clusterId of 100000 characters"),
    pytest.param(with_spec(network={"podCIDR": "1" * 100_000}), "spec.network.podCIDR", id="a podCIDR of 100000 characters"),
    pytest.param(with_spec(timeToLive=[[[[["deep"]]]]]), "spec.timeToLive", id="a nested list for a time"),
]  # fmt: skip


@pytest.mark.parametrize(("advertisement", "field"), HUGE)
def test_huge_values_are_refused_naming_their_field_and_quoted_short(advertisement: dict[str, Any], field: str) -> None:
    problems = validate_advertisement(advertisement, NOW)
    assert any(p.startswith(field) for p in problems), problems
    assert all(len(p) < 400 for p in problems), problems
    assert [(d.phase, d.reason) for d in decide(snapshot([advertisement]))] == [("Refused", "Invalid")]


# The model (models/api/advertisement.py, which generates the CRD) and admission agree -------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # validated at: no time below has passed
_GOOD_REF = {"name": credentials_secret_name("x"), "namespace": SYSTEM_NAMESPACE}
# Per field, values the model holds and values it refuses (and, through `json_values`, anything).
FIELD_VALUES: dict[str, list[Any]] = {
    "clusterId": ["x", "prov-2", "Bad_Id", "-x", "", "a" * 64, 42, None],
    "resourceQuota": [{"hard": {"cpu": "1"}}, {"hard": {"cpu": "0", "memory": "1Gi"}}, {"hard": {"cpu": "0"}},
                      {"hard": {}}, {"hard": {"cpu": "-1"}}, {"hard": {"cpu": 2}}, {"hard": {"cpu": "lots"}},
                      {"hard": {"cpu": 1.5}}, {"hard": ["cpu"]}, {}, {"hard": {"cpu": "1"}, "soft": {}}],
    "prices": [{"cpu": "0.04"}, {"cpu": "40m", "memory": 0}, {"cpu": "-1"}, {"cpu": "cheap"}, {}, "cheap"],
    "network": [{"podCIDR": "10.1.0.0/16"}, {"podCIDR": "fd00:10:244::/48"}, {"podCIDR": "10.0.0.0/7"},
                {"podCIDR": "::ffff:127.0.0.0/104"}, {"podCIDR": "10.1.0.1/16"}, {"podCIDR": None}, {},
                {"podCIDR": "10.1.0.0/16", "gatewayIP": "10.1.0.1"}, {"podCIDR": "10.1.0.0/16", "gatewayIP": 7}],
    "kubeConfigRef": [_GOOD_REF, {"name": "s", "namespace": "n"}, {"name": "s", "namespace": "Bad_NS"},
                      {**_GOOD_REF, "key": "kubeconfig"}, {"name": ""}, "creds"],
    "timestamp": ["2026-11-22T11:59:00Z", "2026-11-22T11:59:00+01:00", "2026-11-22T11:59:00", 1700000000, "yesterday"],
    "timeToLive": ["2026-11-22T12:30:00Z", "2026-11-22T11:00:00Z", "2026-11-22T12:30:00.5+00:00", "2099-01-01",
                   "2026-11-22T12:30:00", "tomorrow"],
    "clusterName": ["cluster x", 5],
    "limitRange": [{"limits": []}, {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}, {"limits": "none"}],
    "extra": [True],  # a field the model does not have
}  # fmt: skip


@st.composite
def near_advertisements(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed Advertisement with some spec fields replaced by values either side of the model's rules, or
    by anything, or dropped; named for its clusterId when it has one (the name rule is admission's own)."""
    a = adv("x")
    for key in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=3, unique=True)):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            a["spec"].pop(key, None)
        else:
            a["spec"][key] = draw(json_values) if choice == 1 else draw(st.sampled_from(FIELD_VALUES[key]))
    provider = a["spec"].get("clusterId")
    a["metadata"]["name"] = advertisement_name(provider) if isinstance(provider, str) else "advertisement-x"
    return a


@settings(max_examples=400, deadline=None)
@given(near_advertisements())
def test_what_the_model_reads_cleanly_admission_finds_valid_and_nothing_else(advertisement: dict[str, Any]) -> None:
    """Admission's problems are the model's (plus an offer of nothing, which the model holds well formed: a
    provider sharing 0% writes it), so the CRD, the provider's own check before it pushes and the consumer's
    admission cannot drift apart."""
    try:
        model: Advertisement | None = Advertisement.from_kubernetes(
            {k: v for k, v in advertisement.items() if k != "status"})  # fmt: skip
    except ValidationError:
        model = None
    offers = model is not None and any(amount > 0 for amount in model.spec.resource_quota.hard.values())
    problems = validate_advertisement(advertisement, EPOCH)
    assert (problems == []) == offers, (problems, model)
    if model is None:
        assert problems, "admission finds a problem in what the model refuses"


# Properties of every pass ------------------------------------------------------------------------------------

PHASES = [(None, None), ("Pending", "AwaitingManualDecision"), ("Accepted", "WithinMaximum"),
          ("Accepted", "ManuallyAccepted"), ("Refused", "MaxReached"), ("Refused", "Denied"),
          ("Refused", "NotAllowed"), ("Refused", "ManuallyRefused"), ("Refused", "Invalid")]  # fmt: skip
advertisement_states = st.lists(
    st.tuples(
        st.integers(0, 9),
        st.sampled_from(PHASES),
        st.sampled_from([None, "accept", "refuse"]),
        st.booleans(),
        st.booleans(),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(advertisement_states, st.sampled_from(["AutoAcceptMax", "Manual"]), st.integers(0, 6),
       st.lists(st.sampled_from([f"p{i}" for i in range(12)]), max_size=3),
       st.lists(st.sampled_from([f"p{i}" for i in range(12)]), max_size=3))  # fmt: skip
def test_a_pass_is_final_bounded_and_fair(states: list[Any], policy: str, maximum: int, denied: list[str],
                                          allowed: list[str]) -> None:  # fmt: skip
    advertisements = [adv(f"p{i}", order=order, phase=phase, reason=reason, decision=verdict, deleting=deleting,
                          hard={"cpu": "-1"} if invalid else None)
                      for i, (order, (phase, reason), verdict, deleting, invalid) in enumerate(states)]  # fmt: skip
    incoming: dict[str, Any] = {"acceptPolicy": policy, "maxAcceptableAdvertisements": maximum, "deniedClusters": denied,
                "allowedClusters": allowed}  # fmt: skip
    decisions = decide(snapshot(advertisements, **incoming))
    after = applied(advertisements, decisions)
    live = [a for a in after if "deletionTimestamp" not in a["metadata"]]

    # Final: a second pass over what the first wrote changes nothing.
    assert decide(snapshot(after, **incoming)) == []
    # Only changes are returned, each with a reason of its phase's closed set, CamelCase.
    for d in decisions:
        before = next(a for a in advertisements if a["metadata"]["name"] == d.name).get("status") or {}
        message = next((c["message"] for c in before.get("conditions", []) if c["type"] == "Accepted"), None)
        assert (before.get("phase"), before.get("reason"), message) != (d.phase, d.reason, d.message)
        assert d.reason in REASONS[d.phase] and re.fullmatch(REASON_PATTERN, d.reason) and d.message
    # Accepted ones stay accepted; Deleting ones are never decided on.
    assert all(d.name not in {a["metadata"]["name"] for a in advertisements
                              if a["status"].get("phase") == "Accepted" or "deletionTimestamp" in a["metadata"]}
               for d in decisions)  # fmt: skip
    # Bounded: the policy accepts only into the room the maximum leaves (manual ones may exceed it).
    held = sum(1 for a in advertisements
               if a["status"].get("phase") == "Accepted" and "deletionTimestamp" not in a["metadata"])  # fmt: skip
    newly_auto = [d for d in decisions if d.reason == "WithinMaximum"]
    assert len(newly_auto) <= max(0, maximum - held)
    # Fair: nobody refused for lack of room arrived before one accepted for being within it this pass.
    if newly_auto:
        last_in = max(next(a for a in after if a["metadata"]["name"] == d.name)["metadata"]["creationTimestamp"]
                      for d in newly_auto)  # fmt: skip
        assert all(
            a["metadata"]["creationTimestamp"] >= last_in for a in live if a["status"].get("reason") == "MaxReached"
        )
    # Work-conserving: room left means nobody waits for room.
    accepted_now = sum(1 for a in live if a["status"].get("phase") == "Accepted")
    if accepted_now < maximum:
        assert not [a for a in live if a["status"].get("reason") == "MaxReached"]


# The maximum quoted in refusals (issue 15, item 8b) -----------------------------------------------------------


def _messages(advertisements: list[dict[str, Any]]) -> dict[str, str]:
    return {a["spec"]["clusterId"]: next(c["message"] for c in a["status"]["conditions"] if c["type"] == "Accepted")
            for a in advertisements if a.get("status")}  # fmt: skip


def test_a_moved_maximum_rewrites_the_refusals_that_quote_it_and_nothing_else() -> None:
    state = settled([adv("a", order=1), adv("b", order=2), adv("c", order=3)], maxAcceptableAdvertisements=1)
    assert "maxAcceptableAdvertisements is 1" in _messages(state)["b"]
    # Raised to 2: b is accepted in its turn, and c's refusal now quotes 2.
    decisions = decide(snapshot(state, maxAcceptableAdvertisements=2))
    assert [(d.provider, d.phase, d.reason) for d in decisions] == [("b", "Accepted", "WithinMaximum"),
                                                                    ("c", "Refused", "MaxReached")]  # fmt: skip
    assert "maxAcceptableAdvertisements is 2" in decisions[1].message
    # Lowered to 0: the accepted stay, the refusal is rewritten once, and a second pass writes nothing.
    state = applied(state, decisions)
    lowered = decide(snapshot(state, maxAcceptableAdvertisements=0))
    assert [(d.provider, d.reason) for d in lowered] == [("c", "MaxReached")]
    assert "maxAcceptableAdvertisements is 0" in lowered[0].message
    assert decide(snapshot(applied(state, lowered), maxAcceptableAdvertisements=0)) == []


def test_an_unchanged_maximum_writes_nothing_when_an_accepted_one_goes() -> None:
    state = settled([adv("a", order=1), adv("b", order=2), adv("c", order=3)], maxAcceptableAdvertisements=1)
    state = settled(state, maxAcceptableAdvertisements=0)  # a stays accepted above the lowered maximum
    state[0] = adv("a", order=1, phase="Deleting", reason="WithinMaximum", deleting=True)
    assert decide(snapshot(state, maxAcceptableAdvertisements=0)) == []  # refusals do not quote the count


def test_a_refusal_written_with_another_message_is_rewritten() -> None:
    state = [adv("a", order=1, phase="Refused", reason="MaxReached",
                 message="2 Advertisements are accepted and maxAcceptableAdvertisements is 2")]  # fmt: skip
    decisions = decide(snapshot(state, maxAcceptableAdvertisements=0))
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "MaxReached")]
    assert "maxAcceptableAdvertisements is 0" in decisions[0].message


# Credentials: only the protocol's Secret (issue 15, item 4) -------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "found"),
    [
        pytest.param({"name": credentials_secret_name("a"), "namespace": SYSTEM_NAMESPACE},
                     f"names Secret {SYSTEM_NAMESPACE}/{credentials_secret_name('a')}", id="another provider's Secret"),
        pytest.param({"name": credentials_secret_name("x"), "namespace": "kube-system"},
                     f"names Secret kube-system/{credentials_secret_name('x')}", id="its own Secret name in another namespace"),
        pytest.param({}, "is missing", id="no kubeConfigRef"),
        pytest.param("creds", "is missing", id="a kubeConfigRef that is not an object"),
        pytest.param({"name": 7, "namespace": SYSTEM_NAMESPACE}, "is missing", id="a Secret name that is not a string"),
    ],
)  # fmt: skip
def test_a_kube_config_ref_other_than_the_protocols_is_refused_naming_what_it_said_and_what_is_expected(
    ref: Any, found: str
) -> None:
    decisions = decide(snapshot([adv("x", ref=ref)]))
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "UnexpectedCredentials")]
    assert f"spec.kubeConfigRef {found}" in decisions[0].message
    assert f"{SYSTEM_NAMESPACE}/{credentials_secret_name('x')}" in decisions[0].message.split("assigns")[1]


@pytest.mark.parametrize(
    ("incoming", "advertisement", "expected"),
    [
        pytest.param({"acceptPolicy": "Manual"}, adv("x", decision="accept", ref={"name": "s", "namespace": "n"}),
                     "UnexpectedCredentials", id="a manual acceptance does not override the credentials rule"),
        pytest.param({}, adv("x", ref={"name": "s", "namespace": "n"}, hard={}), "Invalid",
                     id="an invalid Advertisement is refused as invalid first"),
        pytest.param({"deniedClusters": ["x"]}, adv("x", ref={"name": "s", "namespace": "n"}), "UnexpectedCredentials",
                     id="the credentials rule comes before the lists"),
        pytest.param({}, adv("x", phase="Refused", reason="UnexpectedCredentials", message="old"), "WithinMaximum",
                     id="an Advertisement its provider corrected is reconsidered"),
    ],
)  # fmt: skip
def test_the_credentials_rule_in_the_order_of_rules(incoming: dict[str, Any], advertisement: dict[str, Any],
                                                    expected: str) -> None:  # fmt: skip
    assert outcome([advertisement], **incoming)["x"][1] == expected


# Prices (issue 15, item 9) -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prices", "caps", "expected"),
    [
        pytest.param({"cpu": "0.05"}, {"cpu": "0.04"}, ("Refused", "PriceTooHigh"), id="a price above its cap"),
        pytest.param({"cpu": "0.04"}, {"cpu": "0.04"}, ("Accepted", "WithinMaximum"), id="a price equal to its cap"),
        pytest.param({"cpu": "40m"}, {"cpu": "0.04"}, ("Accepted", "WithinMaximum"),
                     id="a price in quantity form compares by value"),
        pytest.param({"cpu": "0.03", "memory": "9"}, {"cpu": "0.04"}, ("Accepted", "WithinMaximum"),
                     id="a priced resource without a cap is not capped"),
        pytest.param({"cpu": "0.03"}, {"cpu": "0.04", "memory": "0.001"}, ("Accepted", "WithinMaximum"),
                     id="a capped resource without a price is free"),
        pytest.param(None, {"cpu": "0"}, ("Accepted", "WithinMaximum"), id="no prices at all are within any cap"),
        pytest.param({"cpu": "5"}, None, ("Accepted", "WithinMaximum"), id="no caps accept any price"),
        pytest.param({"cpu": "0.001"}, {"cpu": "0"}, ("Refused", "PriceTooHigh"), id="a cap of zero takes only free offers"),
    ],
)  # fmt: skip
def test_prices_against_the_consumers_caps(prices: Any, caps: Any, expected: tuple[str, str]) -> None:
    incoming = {} if caps is None else {"maxPrices": caps}
    assert outcome([adv("x", prices=prices)], **incoming)["x"] == expected


def test_a_price_too_high_is_refused_with_both_figures_for_every_resource_above_its_cap() -> None:
    decisions = decide(snapshot([adv("x", prices={"cpu": "0.05", "memory": "20m", "pods": "1"})],
                                maxPrices={"cpu": "0.04", "memory": "0.01", "pods": "1"}))  # fmt: skip
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "PriceTooHigh")]
    assert decisions[0].message == ("spec.prices.cpu is 0.05 per CPU, above maxPrices.cpu 0.04; "
                                    "spec.prices.memory is 0.02 per Gi, above maxPrices.memory 0.01")  # fmt: skip


@pytest.mark.parametrize(
    ("incoming", "advertisement", "expected"),
    [
        pytest.param({"acceptPolicy": "Manual", "maxPrices": {"cpu": "1"}}, adv("x", decision="accept", prices={"cpu": "2"}),
                     ("Refused", "PriceTooHigh"), id="a manual acceptance does not override a cap"),
        pytest.param({"deniedClusters": ["x"], "maxPrices": {"cpu": "1"}}, adv("x", prices={"cpu": "2"}),
                     ("Refused", "Denied"), id="the lists come before the caps"),
        pytest.param({"maxPrices": {"cpu": "3"}}, adv("x", prices={"cpu": "2"}, phase="Refused", reason="PriceTooHigh",
                     message="old"), ("Accepted", "WithinMaximum"), id="a raised cap reconsiders a refused offer"),
        pytest.param({"maxPrices": {"cpu": "1"}}, adv("x", prices={"cpu": "2"}, phase="Accepted", reason="WithinMaximum"),
                     None, id="an accepted offer stays accepted when its price goes above the cap"),
        pytest.param({}, adv("x", phase="Accepted", reason="WithinMaximum", ref={"name": "s", "namespace": "n"}),
                     None, id="an accepted offer stays accepted when its kubeConfigRef is edited"),
    ],
)  # fmt: skip
def test_the_price_rule_in_the_order_of_rules(incoming: dict[str, Any], advertisement: dict[str, Any],
                                              expected: tuple[str, str] | None) -> None:  # fmt: skip
    assert outcome([advertisement], **incoming).get("x") == expected


@pytest.mark.parametrize(
    ("prices", "problem"),
    [
        pytest.param({"cpu": "-1"}, "spec.prices.cpu must not be negative", id="a negative price"),
        pytest.param({"cpu": "cheap"}, "spec.prices.cpu: 'cheap' is not a quantity", id="a price that is no number"),
        pytest.param({"cpu": 0.5}, "spec.prices.cpu: 0.5 is not a quantity", id="a float price"),
        pytest.param(["cpu"], "spec.prices must be an object, got list", id="prices that are a list"),
    ],
)  # fmt: skip
def test_garbage_prices_make_an_advertisement_invalid(prices: Any, problem: str) -> None:
    decisions = decide(snapshot([adv("x", prices=prices)], maxPrices={"cpu": "1"}))
    assert [(d.phase, d.reason) for d in decisions] == [("Refused", "Invalid")]
    assert problem in decisions[0].message


# What docs/peering.md states (issue 15, item 8d) ----------------------------------------------------------------


def test_a_manual_acceptance_may_take_the_accepted_count_above_the_maximum() -> None:
    state = settled([adv("a", order=1), adv("b", order=2)], maxAcceptableAdvertisements=2)
    state.append(adv("c", order=3, decision="accept"))
    assert accepted(state, maxAcceptableAdvertisements=2) == {"a", "b", "c"}
    state = settled(state, maxAcceptableAdvertisements=2) + [adv("d", order=4)]
    assert outcome(state, maxAcceptableAdvertisements=2) == {"d": ("Refused", "MaxReached")}


# The consumer's refusals kept past the Advertisement that carried them (issue 34: the provider may delete
# its Advertisement and push a new one, which carries none of the consumer's annotations).
EARLIER = NOW - timedelta(hours=3)
OFFER = offer_fingerprint(adv("x")["spec"])


def by_hand(uid: str = "uid-1", reason: str = "noisy neighbour", changed: datetime = EARLIER) -> KeptRefusals:
    return KeptRefusals(by_hand=RefusalOnRecord(uid=uid, detail=reason), changed=changed)


def not_ready(uid: str = "uid-1", offer: str = OFFER, changed: datetime = EARLIER) -> KeptRefusals:
    return KeptRefusals(not_ready=RefusalOnRecord(uid=uid, detail=offer), changed=changed)


def kept_pass(kept: dict[str, KeptRefusals], advertisements: list[dict[str, Any]],
              **incoming: Any) -> tuple[dict[str, tuple[str, str]], dict[str, KeptRefusals]]:  # fmt: skip
    """One admission pass given what the workflow kept: (decisions by provider, what it keeps next)."""
    config = ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {"incoming": incoming}})
    shot = AdmissionSnapshot.from_kubernetes(config=config, advertisements=advertisements, now=NOW, kept=kept)
    return {d.provider: (d.phase, d.reason) for d in decide(shot)}, kept_refusals(shot)


@pytest.mark.parametrize(("kept", "advertisement", "incoming", "decided", "kept_next"), [
    pytest.param({}, adv("x", uid="uid-1", decision="refuse", why="noisy neighbour"), {},
                 ("Refused", "ManuallyRefused"), {"x": by_hand(changed=NOW)},
                 id="a refusal by hand is kept with the uid of its Advertisement and the reason given"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-2"), {}, ("Refused", "ManuallyRefused"), {"x": by_hand()},
                 id="a new Advertisement of a provider refused by hand is refused by hand too"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-2"), {"acceptPolicy": "Manual"}, ("Refused", "ManuallyRefused"),
                 {"x": by_hand()}, id="under acceptPolicy Manual too, rather than waiting for a person again"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-1"), {}, ("Accepted", "WithinMaximum"), {},
                 id="the refused Advertisement itself found without the annotation is decided afresh and forgotten"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-2", decision="accept", why="ok now"), {},
                 ("Accepted", "ManuallyAccepted"), {}, id="an acceptance by hand on the new Advertisement lifts the refusal"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-2", decision="refuse", why="still no"), {},
                 ("Refused", "ManuallyRefused"), {"x": by_hand(uid="uid-2", reason="still no", changed=NOW)},
                 id="a refusal by hand on the new Advertisement replaces the one kept"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-2"), {"deniedClusters": ["x"]}, ("Refused", "Denied"),
                 {"x": by_hand()}, id="the deny list still comes first"),
    pytest.param({"x": by_hand()}, adv("y", uid="uid-2"), {}, ("Accepted", "WithinMaximum"), {"x": by_hand()},
                 id="another provider is decided by the policy"),
    pytest.param({"x": by_hand()}, adv("x", uid="uid-2", name="advertisement-y"), {}, ("Refused", "Invalid"),
                 {"x": by_hand()}, id="an object claiming the provider's id under another name neither carries nor lifts it"),
    pytest.param({}, adv("x", uid="uid-1", decision="refuse", why="noisy neighbour", deleting=True), {}, None,
                 {"x": by_hand(changed=NOW)},
                 id="a refusal by hand on an Advertisement being deleted is kept: the withdrawal raced the pass"),
    pytest.param({}, adv("x", uid="uid-1", refused_offer=OFFER, phase="Refused", reason="VirtualNodeNotReady",
                         message=NOT_READY_MESSAGE), {}, None, {"x": not_ready(changed=NOW)},
                 id="an offer refused because its virtual node was never Ready is kept with its uid"),
    pytest.param({"x": not_ready()}, adv("x", uid="uid-2"), {}, ("Refused", "VirtualNodeNotReady"), {"x": not_ready()},
                 id="a new Advertisement with the offer whose virtual node was never Ready stays refused"),
    pytest.param({"x": not_ready()}, adv("x", uid="uid-2", hard={"cpu": "2", "memory": "1Gi"}), {},
                 ("Accepted", "WithinMaximum"), {"x": not_ready()},
                 id="a new Advertisement with a changed offer is decided afresh, the refused offer still kept"),
    pytest.param({"x": not_ready()}, adv("x", uid="uid-2", hard={"cpu": "2", "memory": "1Gi"}, phase="Accepted",
                                         reason="WithinMaximum"), {}, None, {},
                 id="once its new Advertisement is accepted the refused offer is lifted, as holding one drops the annotation"),
    pytest.param({"x": not_ready()}, adv("x", uid="uid-2", decision="accept", why="try again"), {},
                 ("Accepted", "ManuallyAccepted"), {}, id="an acceptance by hand lifts a refused offer kept"),
    pytest.param({"x": not_ready()}, adv("x", uid="uid-1"), {}, ("Accepted", "WithinMaximum"), {},
                 id="the refused offer's own Advertisement found without the annotation is decided afresh and forgotten"),
    pytest.param({"x": not_ready()}, adv("x", uid="uid-2", decision="refuse", why="no"), {},
                 ("Refused", "VirtualNodeNotReady"),
                 {"x": KeptRefusals(by_hand=RefusalOnRecord(uid="uid-2", detail="no"),
                                    not_ready=RefusalOnRecord(uid="uid-1", detail=OFFER), changed=NOW)},
                 id="a refusal by hand on the new Advertisement is kept beside the refused offer, which comes first"),
])  # fmt: skip
def test_the_consumer_s_refusals_outlive_the_advertisement_that_carried_them(
    kept: dict[str, KeptRefusals], advertisement: dict[str, Any], incoming: dict[str, Any],
    decided: tuple[str, str] | None, kept_next: dict[str, KeptRefusals],
) -> None:
    decisions, after = kept_pass(kept, [advertisement], **incoming)
    provider = advertisement["spec"]["clusterId"]
    assert decisions.get(provider) == decided
    assert after == kept_next


def test_a_refusal_kept_from_an_earlier_advertisement_says_so_and_how_to_lift_it() -> None:
    config = ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {}})
    refused = decide(AdmissionSnapshot.from_kubernetes(config=config, advertisements=[adv("x", uid="uid-2")], now=NOW,
                                                       kept={"x": by_hand()}))  # fmt: skip
    assert refused[0].message == (
        "refused by hand on an earlier Advertisement of cluster 'x' (uid uid-1): noisy neighbour; this one stays "
        "refused until someone accepts it (annotate it tidepool.io/decision=accept, or use the Advertisement "
        "workflow's accept update)")  # fmt: skip
    not_ready_again = decide(AdmissionSnapshot.from_kubernetes(config=config, advertisements=[adv("x", uid="uid-2")],
                                                               now=NOW, kept={"x": not_ready()}))  # fmt: skip
    assert not_ready_again[0].message == (
        "the virtual node of an earlier Advertisement of cluster 'x' (uid uid-1) with the same offer was not Ready "
        "within virtualNodeReadyTimeoutSeconds: refused until the offer changes or someone accepts it by hand "
        "(annotate it tidepool.io/decision=accept, or use the Advertisement workflow's accept update)")  # fmt: skip


def test_a_provider_that_withdraws_and_pushes_again_stays_refused_until_someone_accepts_it() -> None:
    """Pass after pass, as the admission workflow runs them, handing each the records of the one before."""
    decisions, kept = kept_pass({}, [adv("x", uid="uid-1", decision="refuse", why="no")], maxAcceptableAdvertisements=1)
    assert decisions["x"] == ("Refused", "ManuallyRefused")
    for uid in ("uid-2", "uid-3"):  # withdrawn and pushed again, twice
        decisions, kept = kept_pass(kept, [adv("x", uid=uid)], maxAcceptableAdvertisements=1)
        assert decisions["x"] == ("Refused", "ManuallyRefused")
    decisions, kept = kept_pass(kept, [adv("x", uid="uid-3", decision="accept")], maxAcceptableAdvertisements=1)
    assert decisions["x"] == ("Accepted", "ManuallyAccepted") and kept == {}
    decisions, kept = kept_pass(kept, [adv("x", uid="uid-4")], maxAcceptableAdvertisements=1)
    assert decisions["x"] == ("Accepted", "WithinMaximum")  # an acceptance is not kept: the policy decides


def test_the_kept_refusals_are_bounded_the_least_recently_changed_dropped_first() -> None:
    old = {f"p{i:03d}": by_hand(changed=EARLIER + timedelta(seconds=i)) for i in range(MAX_KEPT_REFUSALS)}
    _, kept = kept_pass(old, [adv("new", uid="uid-new", decision="refuse", why="no")])
    assert len(kept) == MAX_KEPT_REFUSALS
    assert "new" in kept and "p000" not in kept and "p001" in kept

