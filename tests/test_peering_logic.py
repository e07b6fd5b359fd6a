"""The peering's pure decisions (push or withdraw, who owns the percentage, when to wake, how to back off,
what the Web UI shows) and which credential failures are permanent."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import TypeAdapter
from temporalio.exceptions import ApplicationError

from kube.clients import PeerSecretClients
from models.peering import (
    ForeignDecision,
    PeeringState,
    Push,
    PushDecision,
    PushResult,
    Withdraw,
    backoff_seconds,
    decide_push,
    foreign_decision,
    jittered_period,
    next_wait,
    phase_after_push,
    render_details,
    sharing_percentage_problem,
)
from models.resources import Resources

pytestmark = pytest.mark.provider
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("draw", "seconds"), [(0.0, 600), (0.5, 570), (0.999, 540.06)])
def test_a_push_comes_at_most_a_tenth_of_a_period_early_never_late(draw: float, seconds: float) -> None:
    assert jittered_period(600, draw).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("draw", [-0.1, 1.0, 2.0])
def test_a_draw_outside_the_unit_interval_is_refused(draw: float) -> None:
    with pytest.raises(ValueError, match="draw must be in"):
        jittered_period(600, draw)


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [pytest.param(0, 0, id="no failure no wait"), pytest.param(1, 5, id="first retry after 5 s"),
     pytest.param(3, 20, id="doubling"), pytest.param(30, 300, id="never above the ceiling")],
)  # fmt: skip
def test_backoff_doubles_up_to_its_ceiling(failures: int, seconds: int) -> None:
    assert backoff_seconds(failures, ceiling=300) == seconds


def test_an_unreachable_cluster_is_retried_after_the_backoff_not_in_a_tight_loop() -> None:
    state = PeeringState(consecutive_failures=2, phase="Unreachable")
    wait = next_wait(state=state, now=NOW, next_push=NOW - timedelta(minutes=5), unreachable_max_seconds=300)
    assert wait == timedelta(seconds=10)


def test_an_unreachable_cluster_is_retried_at_least_once_a_period() -> None:
    push = PushResult(advertisement="a", advertised=Resources(), allocatable=Resources(), used=Resources(),
                      consumer_own=Resources(), sharing_percentage=30, config_generation=1, period_seconds=10,
                      capacity_change_threshold_percent=10, timestamp=NOW, time_to_live=NOW)  # fmt: skip
    state = PeeringState(consecutive_failures=6, phase="Unreachable", last_push=push)
    wait = next_wait(state=state, now=NOW, next_push=NOW, unreachable_max_seconds=300)
    assert wait == timedelta(seconds=10)  # not the 160 s the backoff alone would give


def test_a_decided_peering_sleeps_until_the_next_push() -> None:
    state = PeeringState(phase="Accepted")
    wait = next_wait(state=state, now=NOW, next_push=NOW + timedelta(minutes=10), unreachable_max_seconds=300)
    assert wait == timedelta(minutes=10)


@pytest.mark.parametrize(
    ("decision", "phase"),
    [pytest.param(None, "Advertised", id="no decision yet"),
     pytest.param(ForeignDecision(phase="Accepted"), "Accepted", id="accepted"),
     pytest.param(ForeignDecision(phase="Refused"), "Refused", id="refused"),
     pytest.param(ForeignDecision(phase="Pending"), "Advertised", id="pending is still advertised")],
)  # fmt: skip
def test_the_phase_follows_the_foreign_decision(decision: ForeignDecision | None, phase: str) -> None:
    assert phase_after_push(decision) == phase


def test_the_details_say_the_phase_the_decision_and_the_last_error() -> None:
    state = PeeringState(phase="Unreachable", sharing_percentage_override=40, consecutive_failures=2,
                         last_error="connection refused", foreign=ForeignDecision(phase="Accepted"))  # fmt: skip
    details = render_details(state, foreign_cluster_id="b")
    assert "phase **Unreachable**" in details and "40%" in details
    assert "connection refused" in details and "foreign decision: Accepted" in details


@pytest.mark.parametrize(
    ("state", "shown"),
    [pytest.param(PeeringState(), "- sharing percentage: 30% (the ClusterConfig's)", id="no override"),
     pytest.param(PeeringState(sharing_percentage_override=50), "- sharing percentage: 30% (this peering's override, 50%)",
                  id="an override not pushed yet")],
)  # fmt: skip
def test_the_details_show_the_pushed_percentage_and_who_owns_it(state: PeeringState, shown: str) -> None:
    state.last_push = PushResult(
        advertisement="a", advertised=Resources(), allocatable=Resources(), used=Resources(), consumer_own=Resources(),
        sharing_percentage=30, config_generation=1, period_seconds=10, capacity_change_threshold_percent=10,
        timestamp=NOW, time_to_live=NOW,
    )  # fmt: skip
    assert shown in render_details(state, foreign_cluster_id="b")


@pytest.mark.federation
@pytest.mark.parametrize(
    ("value", "refused"),
    [pytest.param(None, False, id="null drops the override"), pytest.param(0, False, id="zero"),
     pytest.param(100, False, id="a hundred"), pytest.param(101, True, id="above a hundred"),
     pytest.param(True, True, id="a boolean"), pytest.param("50", True, id="a string")],
)  # fmt: skip
def test_an_override_is_an_integer_from_0_to_100_or_null(value: object, refused: bool) -> None:
    assert (sharing_percentage_problem(value) is not None) == refused


@pytest.mark.steady
def test_a_watched_peering_with_a_pending_decision_sleeps_until_the_next_push() -> None:
    state = PeeringState(phase="Advertised")
    wait = next_wait(state=state, now=NOW, next_push=NOW + timedelta(minutes=10), unreachable_max_seconds=300)
    assert wait == timedelta(minutes=10)  # the watch's signal wakes it sooner, not a poll


def _advertisement(**status: str) -> dict[str, Any]:
    return {"metadata": {"name": "advertisement-a", "resourceVersion": "7"},
            "spec": {"timestamp": "2026-11-22T12:00:00Z", "timeToLive": "2026-11-22T12:30:00Z"}, "status": status}  # fmt: skip


@pytest.mark.steady
@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        pytest.param(_advertisement(), {**_advertisement(), "spec": {"timeToLive": "2026-11-22T12:40:00Z"}}, False,
                     id="a push that renews the TTL is no change"),
        pytest.param(_advertisement(phase="Accepted"), _advertisement(phase="Accepted", vkCreated="true"), False,
                     id="other status fields are no change"),
        pytest.param(_advertisement(phase="Refused", reason="MaxReached"), _advertisement(phase="Refused", reason="Denied"),
                     True, id="a new reason for the same phase is a change"),
        pytest.param(_advertisement(), _advertisement(phase="Accepted"), True, id="an acceptance is a change"),
        pytest.param(_advertisement(phase="Accepted"), _advertisement(phase="Accepted", remoteRemappedPodCIDR="None"),
                     True, id="the remapped PodCIDR is a change"),
        pytest.param(None, _advertisement(), True, id="an Advertisement that appears is a change"),
        pytest.param(_advertisement(phase="Refused"), None, True, id="one that goes is a change"),
    ],
)  # fmt: skip
def test_the_decision_watch_key_moves_only_with_what_the_peering_decides_on(
    before: dict[str, Any] | None, after: dict[str, Any] | None, changed: bool
) -> None:
    assert (foreign_decision(before) != foreign_decision(after)) is changed


def test_a_foreign_decision_is_hashable_and_reads_garbage_as_none() -> None:
    decision = foreign_decision({"status": {"phase": 7, "reason": ["x"], "remoteRemappedPodCIDR": "10.1.0.0/16"}})
    assert decision == ForeignDecision(remote_remapped_pod_cidr="10.1.0.0/16")
    assert hash(decision) == hash(ForeignDecision(remote_remapped_pod_cidr="10.1.0.0/16"))


def test_a_push_that_reads_a_forced_deletion_withdraws_as_forced() -> None:
    # `tidepool unpeer --force` marks the request before deleting it; a push that reads the deletion before the
    # watcher's signal arrives must not start the withdrawal that waits on the consumer.
    decision = decide_push(peering_request_gone=True, forced=True, broadcaster_enabled=True, requested_percentage=None,
                           configured_percentage=40)  # fmt: skip
    assert decision == Withdraw(reason="Forced")


@pytest.mark.parametrize(
    ("gone", "enabled", "requested", "decision"),
    [pytest.param(True, True, 70, Withdraw(reason="PeeringRequestDeleted"), id="a deleted request withdraws"),
     pytest.param(True, False, None, Withdraw(reason="PeeringRequestDeleted"), id="the request's deletion comes first"),
     pytest.param(False, False, 70, Withdraw(reason="BroadcasterDisabled"), id="a disabled broadcaster withdraws"),
     pytest.param(False, True, None, Push(sharing_percentage=40), id="the cluster config's percentage by default"),
     pytest.param(False, True, 0, Push(sharing_percentage=0), id="the workflow's percentage wins, zero included")],
)  # fmt: skip
def test_a_push_pushes_unless_the_request_is_gone_or_the_broadcaster_disabled(
    gone: bool, enabled: bool, requested: int | None, decision: PushDecision
) -> None:
    assert decide_push(peering_request_gone=gone, broadcaster_enabled=enabled, requested_percentage=requested,
                       configured_percentage=40) == decision  # fmt: skip


def test_a_push_answer_decodes_as_the_withdraw_or_the_push_result_it_was() -> None:
    answer = TypeAdapter(PushResult | Withdraw)
    pushed = PushResult(advertisement="a", advertised=Resources(), allocatable=Resources(), used=Resources(),
                        consumer_own=Resources(), sharing_percentage=0, config_generation=1, period_seconds=600,
                        capacity_change_threshold_percent=10, timestamp=NOW, time_to_live=NOW)  # fmt: skip
    assert answer.validate_json(answer.dump_json(pushed)) == pushed
    assert answer.validate_json(answer.dump_json(Withdraw(reason="BroadcasterDisabled"))) == Withdraw(
        reason="BroadcasterDisabled"
    )


class _Secrets:
    def __init__(self, secret: k8s.V1Secret | None) -> None:
        self._secret = secret

    def read_namespaced_secret(self, name: str, namespace: str) -> k8s.V1Secret:
        if self._secret is None:
            raise ApiException(status=404)
        return self._secret


@pytest.mark.parametrize(
    ("secret", "kind", "retryable"),
    [pytest.param(None, "MissingCredentials", True, id="a missing Secret may still appear"),
     pytest.param(k8s.V1Secret(metadata=k8s.V1ObjectMeta(resource_version="1"), data={}), "MissingCredentials", True,
                  id="a Secret without the key may still get it"),
     pytest.param(k8s.V1Secret(metadata=k8s.V1ObjectMeta(resource_version="1"),
                               data={"kubeconfig": base64.b64encode(b"clusters: [ {").decode()}),
                  "InvalidCredentials", False, id="a kubeconfig that does not parse never will")],
)  # fmt: skip
def test_credentials_that_cannot_work_are_permanent_and_missing_ones_retried(
    secret: k8s.V1Secret | None, kind: str, retryable: bool
) -> None:
    clients = PeerSecretClients(k8s.ApiClient())
    clients._core = _Secrets(secret)  # type: ignore[assignment]
    with pytest.raises(ApplicationError) as raised:
        clients.get(name="creds", namespace="tidepool-system")
    assert (raised.value.type, raised.value.non_retryable) == (kind, not retryable)
