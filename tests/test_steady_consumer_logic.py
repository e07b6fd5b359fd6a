"""Issue 14, consumer side, without clusters: what the watchers' keys see and ignore, how a relist signals
only what changed, and the rules that keep an Advertisement from polling (an unaccepted one that expires is
deleted; no past deadline becomes a short loop)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Coroutine, Hashable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from models.admission import admission_view
from models.consumer import AdvertisementObservation, AdvertisementState, next_step, wake_after
from models.names import ADVERTISEMENT_FINALIZER, DECISION_ANNOTATION, FORCE_UNPEER_ANNOTATION, VK_CLEAN_ANNOTATION
from models.settings import WorkerSettings
from workers.consumer import (
    ConsumerWatchers,
    ObjectKeys,
    advertisement_provider,
    incoming_config_key,
    lifecycle_view,
    virtual_kubelet_key,
    virtual_node_key,
)
from workers.roles import RoleContext
from workflows.advertisement import ACTING_STEPS

pytestmark = [pytest.mark.steady, pytest.mark.consumer]
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
Obj = dict[str, Any]


def advertisement() -> Obj:
    return {
        "metadata": {"name": "advertisement-prov", "uid": "u1", "resourceVersion": "10", "finalizers": []},
        "spec": {"clusterId": "prov", "resourceQuota": {"hard": {"cpu": "2", "memory": "4Gi"}},
                 "timestamp": "2026-11-22T12:00:00Z", "timeToLive": "2026-11-22T12:30:00Z"},
        "status": {"phase": "Accepted", "reason": "WithinMaximum", "remoteRemappedPodCIDR": "None",
                   "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "2026-11-22T12:00:01Z"}]},
    }  # fmt: skip


def virtual_node() -> Obj:
    return {
        "metadata": {"name": "tidepool-prov", "uid": "n1", "resourceVersion": "5", "labels": {"tidepool.io/provider": "prov"}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": "2026-11-22T12:00:00Z",
                                   "lastTransitionTime": "2026-11-22T11:00:00Z"}],
                   "capacity": {"cpu": "2"}},
    }  # fmt: skip


def deployment() -> Obj:
    return {"metadata": {"name": "tidepool-vk-prov", "uid": "d1", "resourceVersion": "3", "annotations": {}},
            "status": {"replicas": 1, "readyReplicas": 1}}  # fmt: skip


def changed(make: Callable[[], Obj], key: Callable[[Obj], Hashable], edit: Callable[[Obj], None]) -> bool:
    before = make()
    after = copy.deepcopy(before)
    edit(after)
    return key(before) != key(after)


def _set(path: str, value: Any) -> Callable[[Obj], None]:
    def edit(obj: Obj) -> None:
        *parents, last = path.split(".")
        for part in parents:
            obj = obj.setdefault(part, {})
        obj[last] = value

    return edit


def _refused_invalid(obj: Obj) -> Obj:
    obj.setdefault("status", {}).update({"phase": "Refused", "reason": "Invalid"})
    return obj


def _heartbeat(obj: Obj) -> None:
    obj["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-22T12:00:10Z"
    obj["metadata"]["resourceVersion"] = "6"


@pytest.mark.parametrize(
    ("make", "key", "edit", "signals"),
    [
        # The AdvertisementWorkflow's key
        pytest.param(advertisement, lifecycle_view, _set("spec.timeToLive", "2026-11-22T12:40:00Z"), False,
                     id="a push that only renews timeToLive and timestamp wakes no AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("metadata.resourceVersion", "11"), False,
                     id="a resourceVersion bump alone wakes no AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("status.conditions", []), False,
                     id="conditions the workflow writes for people wake no AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("status.phase", "Deleting"), True,
                     id="a phase change wakes the AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("metadata.finalizers", [ADVERTISEMENT_FINALIZER]), True,
                     id="the finalizer added wakes the AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("status.remoteRemappedPodCIDR", "10.9.0.0/16"), True,
                     id="the remapped PodCIDR wakes the AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("metadata.annotations", {DECISION_ANNOTATION: "accept"}), False,
                     id="a decision annotation, admission's to read, wakes no AdvertisementWorkflow (the decision does)"),
        pytest.param(advertisement, lifecycle_view, _set("status.reason", "ManuallyAccepted"), True,
                     id="a new reason for the same phase wakes the AdvertisementWorkflow, whose updates read it"),
        pytest.param(advertisement, lifecycle_view, _set("metadata.annotations", {FORCE_UNPEER_ANNOTATION: "x"}), True,
                     id="a forced unpeer's mark wakes the AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("spec.resourceQuota.hard", {"cpu": "3", "memory": "4Gi"}), True,
                     id="a changed advertised capacity wakes the AdvertisementWorkflow"),
        pytest.param(advertisement, lifecycle_view, _set("metadata.deletionTimestamp", "2026-11-22T12:05:00Z"), True,
                     id="a deletion wakes the AdvertisementWorkflow"),
        # The admission workflow's key
        pytest.param(advertisement, admission_view, _set("spec.timeToLive", "2026-11-22T12:40:00Z"), False,
                     id="a push that only renews timeToLive wakes no admission"),
        pytest.param(lambda: _refused_invalid(advertisement()), admission_view, _set("spec.timeToLive", "2026-11-22T12:40:00Z"),
                     True, id="a push that renews the timeToLive of one refused as Invalid wakes admission to judge it again"),
        pytest.param(advertisement, admission_view, _set("spec.resourceQuota.hard", {"cpu": "3", "memory": "4Gi"}), False,
                     id="a capacity change that keeps it valid wakes no admission"),
        pytest.param(advertisement, admission_view, _set("metadata.finalizers", [ADVERTISEMENT_FINALIZER]), False,
                     id="the lifecycle's finalizer wakes no admission"),
        pytest.param(advertisement, admission_view, _set("spec.resourceQuota.hard", {}), True,
                     id="an Advertisement made invalid wakes admission"),
        pytest.param(advertisement, admission_view, _set("spec.clusterId", "other"), True,
                     id="a clusterId that no longer matches the name wakes admission"),
        pytest.param(advertisement, admission_view, _set("status.phase", "Deleting"), True,
                     id="a phase written by the lifecycle (Deleting frees a place) wakes admission"),
        pytest.param(advertisement, admission_view, _set("metadata.annotations", {DECISION_ANNOTATION: "refuse"}), True,
                     id="a decision annotation wakes admission"),
        pytest.param(advertisement, admission_view, _set("spec.prices", {"cpu": "9"}), True,
                     id="a new price wakes admission, which caps prices"),
        pytest.param(advertisement, admission_view, _set("spec.kubeConfigRef", {"namespace": "x", "name": "y"}), True,
                     id="a new kubeConfigRef wakes admission, which checks it"),
        pytest.param(lambda: {"spec": {"incoming": {"maxAcceptableAdvertisements": 2}, "outgoing": {"sharingPercentage": 30}}},
                     incoming_config_key, _set("spec.outgoing", {"sharingPercentage": 60}), False,
                     id="a ClusterConfig outgoing change wakes no admission"),
        pytest.param(lambda: {"spec": {"incoming": {"maxAcceptableAdvertisements": 2}}},
                     incoming_config_key, _set("spec.incoming", {"maxAcceptableAdvertisements": 3}), True,
                     id="a ClusterConfig incoming change wakes admission"),
        # Virtual nodes and virtual kubelets
        pytest.param(virtual_node, virtual_node_key, _heartbeat, False,
                     id="a node status heartbeat wakes no AdvertisementWorkflow"),
        pytest.param(virtual_node, virtual_node_key, _set("status.capacity", {"cpu": "3"}), False,
                     id="the node's capacity (copied from the Advertisement) wakes no AdvertisementWorkflow"),
        pytest.param(virtual_node, virtual_node_key,
                     _set("status.conditions", [{"type": "Ready", "status": "False", "reason": "ProviderUnreachable"}]),
                     True, id="the node going NotReady wakes the AdvertisementWorkflow"),
        pytest.param(virtual_node, virtual_node_key,
                     _set("status.conditions", [{"type": "Ready", "status": "True", "reason": "Recovered"}]),
                     False, id="a new reason of a node still Ready wakes nothing: no decision reads it"),
        pytest.param(virtual_node, virtual_node_key,
                     _set("status.conditions", [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]),
                     True, id="the node going NotReady for another reason wakes the AdvertisementWorkflow"),
        pytest.param(deployment, virtual_kubelet_key, _set("status.readyReplicas", 0), False,
                     id="the Deployment's status wakes no AdvertisementWorkflow"),
        pytest.param(deployment, virtual_kubelet_key, _set("metadata.annotations", {VK_CLEAN_ANNOTATION: "clean"}), True,
                     id="the provider-clean report wakes the AdvertisementWorkflow"),
        pytest.param(deployment, virtual_kubelet_key, _set("metadata.deletionTimestamp", "2026-11-22T12:05:00Z"), True,
                     id="the Deployment being deleted wakes the AdvertisementWorkflow"),
        pytest.param(deployment, virtual_kubelet_key, _set("metadata.uid", "d2"), True,
                     id="a Deployment re-created between two lists wakes the AdvertisementWorkflow"),
    ],
)  # fmt: skip
def test_a_watcher_key_changes_only_with_what_the_workflow_decides_on(
    make: Callable[[], Obj], key: Callable[[Obj], Hashable], edit: Callable[[Obj], None], signals: bool
) -> None:
    assert changed(make, key, edit) is signals


def test_a_misnamed_or_malformed_advertisement_has_no_lifecycle() -> None:
    misnamed = advertisement()
    misnamed["metadata"]["name"] = "advertisement-someone-else"
    assert advertisement_provider(advertisement()) == "prov"
    assert advertisement_provider(misnamed) is None
    assert advertisement_provider({"metadata": {"name": "x"}, "spec": {"clusterId": 7}}) is None


def test_the_first_list_signals_every_object_once_and_a_relist_only_what_changed_or_went() -> None:
    keys = ObjectKeys(virtual_node_key)
    first, second = virtual_node(), virtual_node()
    second["metadata"] |= {"name": "tidepool-other", "uid": "n2"}
    assert [o["metadata"]["name"] for o, _ in keys.sync([first, second])] == ["tidepool-prov", "tidepool-other"]

    heartbeat = copy.deepcopy(first)
    _heartbeat(heartbeat)
    assert keys.sync([heartbeat, second]) == []  # a relist after a watch error: nothing changed

    not_ready = copy.deepcopy(heartbeat)
    not_ready["status"]["conditions"][0] |= {"status": "False", "reason": "ProviderUnreachable"}
    assert keys.sync([not_ready]) == [(not_ready, False), (second, True)]  # changed, and one went while unwatched


def test_watch_events_signal_a_change_once_and_a_deletion_of_a_followed_object() -> None:
    keys = ObjectKeys(virtual_node_key)
    node = virtual_node()
    assert keys.event("ADDED", node)
    heartbeat = copy.deepcopy(node)
    _heartbeat(heartbeat)
    assert not keys.event("MODIFIED", heartbeat)
    assert keys.event("DELETED", heartbeat)
    assert not keys.event("DELETED", heartbeat)  # already gone: nothing left to tell


def test_a_failed_signal_is_sent_again_at_the_next_event_even_without_a_change() -> None:
    keys = ObjectKeys(virtual_node_key)
    node = virtual_node()
    assert keys.event("ADDED", node)
    keys.forget("tidepool-prov")
    assert keys.event("MODIFIED", node)


def test_objects_no_workflow_follows_are_never_signalled() -> None:
    keys = ObjectKeys(lambda obj: lifecycle_view(obj) if advertisement_provider(obj) else None)
    misnamed = advertisement()
    misnamed["metadata"]["name"] = "advertisement-someone-else"
    assert keys.sync([misnamed]) == []
    assert not keys.event("MODIFIED", misnamed)
    assert not keys.event("DELETED", misnamed)


# The rules of next_step and wake_after ---------------------------------------------------------------------
def observed(**fields: Any) -> AdvertisementObservation:
    base: dict[str, Any] = {"exists": True, "phase": "Accepted", "has_finalizer": True,
                            "remote_remapped_pod_cidr": "None", "time_to_live": NOW + timedelta(minutes=30),
                            "virtual_kubelet_exists": True}  # fmt: skip
    return AdvertisementObservation(**{**base, **fields})


PAST = NOW - timedelta(seconds=1)


@pytest.mark.parametrize(
    ("obs", "step"),
    [
        pytest.param(observed(phase="Pending", time_to_live=PAST, virtual_kubelet_exists=False),
                     "DeleteExpired", id="a pending one that expired is deleted"),
        pytest.param(observed(phase="Refused", time_to_live=PAST, virtual_kubelet_exists=False),
                     "DeleteExpired", id="a refused one that expired is deleted"),
        pytest.param(observed(phase=None, time_to_live=PAST, virtual_kubelet_exists=False),
                     "AwaitDecision", id="one that arrived expired waits for admission to refuse it first"),
        pytest.param(observed(phase="Refused", virtual_kubelet_exists=False),
                     "AwaitDecision", id="a refused one that has not expired sleeps"),
        pytest.param(observed(time_to_live=PAST),
                     "MarkDeleting", id="an accepted one that expired is still torn down in order"),
        pytest.param(observed(phase="Pending", provider_unreachable_since=NOW - timedelta(hours=1),
                              virtual_kubelet_exists=False),
                     "AwaitDecision", id="an unaccepted one has no provider to be unreachable"),
    ],
)  # fmt: skip
def test_the_next_step_of_an_advertisement_that_expires(obs: AdvertisementObservation, step: str) -> None:
    assert next_step(obs, AdvertisementState(), NOW).step == step


def test_an_expiry_is_not_latched_so_a_renewal_before_the_deletion_wins() -> None:
    state = AdvertisementState()
    assert next_step(observed(phase="Refused", time_to_live=PAST), state, NOW).step == "DeleteExpired"
    assert state.teardown is None
    assert next_step(observed(phase="Refused", time_to_live=NOW + timedelta(minutes=30)), state, NOW).step == "AwaitDecision"


@pytest.mark.parametrize(
    ("obs", "state", "step", "after"),
    [
        pytest.param(observed(phase="Refused"), AdvertisementState(), "AwaitDecision", timedelta(minutes=30),
                     id="a refused one sleeps until its expiry"),
        pytest.param(observed(), AdvertisementState(), "Steady", timedelta(minutes=30),
                     id="a steady one sleeps until its expiry, which the timer re-reads"),
        pytest.param(observed(time_to_live=None), AdvertisementState(), "Steady", None,
                     id="with no deadline only a signal wakes it"),
        pytest.param(observed(phase=None, time_to_live=PAST), AdvertisementState(), "AwaitDecision", None,
                     id="an expired one not decided yet has no deadline: the decision signals"),
        pytest.param(observed(phase="Pending", provider_unreachable_since=NOW - timedelta(hours=1)),
                     AdvertisementState(), "AwaitDecision", timedelta(minutes=30),
                     id="a past keepalive of an unaccepted one is no deadline"),
        pytest.param(observed(remote_remapped_pod_cidr=None), AdvertisementState(accepted_at=NOW - timedelta(minutes=1)),
                     "AwaitPodCIDR", timedelta(minutes=4), id="an accepted one waits for the PodCIDR until its timeout"),
        pytest.param(observed(remote_remapped_pod_cidr=None),
                     AdvertisementState(accepted_at=NOW - timedelta(hours=1), pod_cidr_timed_out=True),
                     "AwaitPodCIDR", timedelta(minutes=30), id="a PodCIDR timeout once reported is no deadline"),
    ],
)  # fmt: skip
def test_when_an_advertisement_looks_again_on_its_own(
    obs: AdvertisementObservation, state: AdvertisementState, step: str, after: timedelta | None
) -> None:
    assert next_step(obs, state.model_copy(), NOW).step == step
    assert wake_after(obs, state, step, NOW) == after


@pytest.mark.parametrize("phase", [None, "Pending", "Refused", "Accepted"])
def test_no_past_expiry_is_ever_slept_on(phase: str | None) -> None:
    """Whatever the phase, an expired Advertisement is acted on (deleted, or torn down) or, not decided yet,
    waits for the decision with no timer: never slept on for a second and looked at again."""
    obs = observed(phase=phase, time_to_live=PAST, virtual_kubelet_exists=phase == "Accepted")
    state = AdvertisementState()
    decided = next_step(obs, state, NOW)
    step, state = decided.step, state.model_copy(update={"teardown": decided.teardown})
    assert step in ACTING_STEPS or wake_after(obs, state, step, NOW) is None
    if step in ACTING_STEPS:
        assert step in ("DeleteExpired", "MarkDeleting")


def _recording_watchers() -> tuple[ConsumerWatchers, list[str]]:
    """The consumer's watchers, never started, whose Temporal calls are recorded (by workflow) instead."""
    ctx = RoleContext(client=None, home=k8s.ApiClient(), settings=WorkerSettings(),  # type: ignore[arg-type]
                      loop=asyncio.new_event_loop())  # fmt: skip
    watchers, told = ConsumerWatchers(ctx), []

    def submit(coroutine: Coroutine[Any, Any, None]) -> None:
        # A call wrapped by _forgetting_on_failure is named by what it wraps: admission's signal-with-start,
        # or an Advertisement's (_advertisement_changed).
        inner = coroutine.cr_frame.f_locals.get("call") if hasattr(coroutine, "cr_frame") else None
        told.append("lifecycle" if getattr(inner, "__name__", "") == "_advertisement_changed" else "admission")
        for each in (inner, coroutine):
            if each is not None:
                each.close()

    watchers._submit = submit  # type: ignore[method-assign]
    ctx.loop.close()
    return watchers, told


def _config(**incoming: Any) -> Obj:
    return {"metadata": {"name": "tidepool", "uid": "c1"}, "spec": {"incoming": incoming}}


def test_a_timeout_every_advertisement_workflow_reads_wakes_each_and_nothing_else_does() -> None:
    watchers, told = _recording_watchers()
    watchers._sync_advertisements([advertisement()])
    told.clear()
    watchers._sync_config([_config(virtualNodeReadyTimeoutSeconds=120)])
    assert told == ["admission"]  # its first sight: each lifecycle read the timeouts when it last looked
    told.clear()
    watchers._config_event("MODIFIED", _config(virtualNodeReadyTimeoutSeconds=120, maxAcceptableAdvertisements=3))
    assert told == ["admission"]  # admission's `incoming` moved, no timeout: admission only
    told.clear()
    watchers._config_event("MODIFIED", _config(virtualNodeReadyTimeoutSeconds=60, maxAcceptableAdvertisements=3))
    assert told == ["admission", "lifecycle"]  # `incoming` and a timeout moved: admission and the one lifecycle
    told.clear()
    watchers._config_event("MODIFIED", {**_config(virtualNodeReadyTimeoutSeconds=60, maxAcceptableAdvertisements=3),
                                        "metadata": {"name": "tidepool", "uid": "c1", "labels": {"x": "y"}}})  # fmt: skip
    assert told == []
