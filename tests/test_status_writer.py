"""The one status writer (kube/status.py: write_status) against a recording server (tests/statuses.py) that
applies each status patch as the API server does: what a steady state writes (nothing), what one patch
carries, when a condition's lastTransitionTime moves, and when Events are recorded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kube.clock import utcnow
from kube.status import Event, merge_patched, replacing, write_status
from models.api.conditions import condition
from models.times import parse_rfc3339
from tests.statuses import RecordingServer

EARLIER = "2026-01-02T03:04:05Z"
ACCEPTED = condition("Accepted", True, "WithinMaximum", "within the maximum")


def _advertisement(status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "tidepool.io/v1alpha1", "kind": "Advertisement",
                           "metadata": {"name": "cluster-b"}}  # fmt: skip
    if status is not None:
        obj["status"] = status
    return obj


def _stored(type: str, status: str, reason: str, message: str, since: str = EARLIER) -> dict[str, Any]:
    return {"type": type, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}


ACCEPTED_STORED = _stored("Accepted", "True", "WithinMaximum", "within the maximum")
READY_STORED = _stored("Ready", "True", "Accepted", "peering is Accepted")


def test_a_status_that_already_says_it_makes_no_call() -> None:
    server = RecordingServer(_advertisement({"phase": "Accepted", "conditions": [ACCEPTED_STORED]}))
    written = write_status(server, server.read(), fields={"phase": "Accepted"}, conditions=[ACCEPTED])
    assert (written, server.calls) == (False, [])


def test_writing_the_same_status_again_on_what_was_read_back_patches_once() -> None:
    server = RecordingServer(_advertisement())
    for _ in range(3):
        write_status(server, server.read(), fields={"phase": "Accepted", "reason": "WithinMaximum"},
                     conditions=[ACCEPTED])  # fmt: skip
    assert len(server.patches) == 1


def test_fields_and_conditions_go_in_one_patch() -> None:
    server = RecordingServer(_advertisement({"phase": "Pending"}))
    before = utcnow().replace(microsecond=0)
    written = write_status(server, server.read(), fields={"phase": "Accepted", "reason": "WithinMaximum"},
                           conditions=[ACCEPTED, condition("VirtualKubeletReady", True, "Created")])  # fmt: skip
    assert written and len(server.calls) == 1
    [patch] = server.patches
    assert patch["phase"] == "Accepted" and patch["reason"] == "WithinMaximum"
    assert [(c["type"], c["status"], c["reason"]) for c in patch["conditions"]] == [
        ("Accepted", "True", "WithinMaximum"), ("VirtualKubeletReady", "True", "Created")]
    since = [parse_rfc3339(c["lastTransitionTime"]) for c in patch["conditions"]]
    assert all(t is not None and t >= before for t in since)


def test_last_transition_time_stays_when_only_the_reason_or_message_changes() -> None:
    server = RecordingServer(_advertisement({"conditions": [ACCEPTED_STORED]}))
    write_status(server, server.read(), conditions=[condition("Accepted", True, "ManuallyAccepted", "by hand")])
    [patch] = server.patches
    assert patch["conditions"] == [_stored("Accepted", "True", "ManuallyAccepted", "by hand", since=EARLIER)]


def test_last_transition_time_moves_when_the_status_changes() -> None:
    server = RecordingServer(_advertisement({"conditions": [ACCEPTED_STORED]}))
    before = utcnow() - timedelta(seconds=1)  # the stored time keeps seconds only
    write_status(server, server.read(), conditions=[condition("Accepted", False, "MaxReached", "full")])
    [written] = server.patches[0]["conditions"]
    since = parse_rfc3339(written["lastTransitionTime"])
    assert written["status"] == "False" and since is not None and since >= before


def test_a_condition_set_as_it_is_keeps_its_place_among_the_others_and_writes_nothing() -> None:
    # Moved last, it would make the list differ and every steady pass would write.
    server = RecordingServer(_advertisement({"conditions": [ACCEPTED_STORED, READY_STORED]}))
    write_status(server, server.read(), conditions=[ACCEPTED])
    assert server.calls == []


def test_setting_one_condition_keeps_the_others_in_the_patch() -> None:
    # A merge patch replaces a list whole: a patch carrying only the new condition would drop the others.
    server = RecordingServer(_advertisement({"conditions": [ACCEPTED_STORED, READY_STORED]}))
    write_status(server, server.read(), conditions=[condition("Ready", False, "Deleting", "tearing down")])
    conditions = server.obj["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Accepted", "Ready"] and conditions[0] == ACCEPTED_STORED


@pytest.mark.parametrize(("status", "calls"), [
    pytest.param({"phase": "Pending", "decisionDeadline": EARLIER}, 1, id="a field to clear that is there is a write"),
    pytest.param({"phase": "Pending"}, 0, id="a field to clear that is absent is no change"),
])  # fmt: skip
def test_a_field_set_to_none_clears_it(status: dict[str, Any], calls: int) -> None:
    server = RecordingServer(_advertisement(status))
    write_status(server, server.read(), fields={"phase": "Pending", "decisionDeadline": None})
    assert len(server.calls) == calls and "decisionDeadline" not in server.obj["status"]


def test_events_are_recorded_after_the_patch() -> None:
    server = RecordingServer(_advertisement())
    event = Event("Deleting", "teardown begins: Deleted")
    write_status(server, server.read(), fields={"phase": "Deleting"}, events=[event])
    assert [kind for kind, _ in server.calls] == ["patch", "event"] and server.calls[1] == ("event", event)


def test_an_event_is_recorded_even_when_the_status_does_not_change() -> None:
    # A virtual kubelet Deployment re-created changes no status, and is still news.
    server = RecordingServer(_advertisement({"conditions": [ACCEPTED_STORED]}))
    event = Event("VirtualKubeletCreated", "vk-cluster-b created")
    write_status(server, server.read(), conditions=[ACCEPTED], events=[event])
    assert server.calls == [("event", event)]


class _Refusing(RecordingServer):
    def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        raise RuntimeError("409 Conflict")


def test_a_refused_patch_records_no_event() -> None:
    server = _Refusing(_advertisement())
    with pytest.raises(RuntimeError):
        write_status(server, server.read(), fields={"phase": "Refused"},
                     events=[Event("MaxReached", "full", warning=True)])  # fmt: skip
    assert server.calls == []


@pytest.mark.parametrize(("target", "patch", "after"), [
    pytest.param({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}}, {"a": {"x": 1, "y": 3}}, id="objects merge key by key"),
    pytest.param({"a": 1, "b": 2}, {"a": None}, {"b": 2}, id="None removes a key"),
    pytest.param({"a": [1, 2]}, {"a": [3]}, {"a": [3]}, id="a list replaces"),
    pytest.param({}, {"a": {"b": None, "c": 1}}, {"a": {"c": 1}}, id="a new object keeps no None"),
])  # fmt: skip
def test_a_merge_patch_applies_as_the_api_server_applies_it(target: Any, patch: Any, after: Any) -> None:
    assert merge_patched(target, patch) == after


def test_a_replacing_patch_removes_what_the_new_value_no_longer_has() -> None:
    current = {"s1": {"cpu": "2", "memory": "4Gi"}, "s2": {"cpu": "1"}}
    new = {"s1": {"cpu": "4"}}
    assert merge_patched(current, replacing(current, new)) == new
