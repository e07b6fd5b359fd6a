"""The consumer's next step, derived from what was observed: accepted → finalizer → PodCIDR → virtual
kubelet; teardown node → clean → virtual kubelet → Advertisement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from models.consumer import (
    PROVIDER_CLEAN_TIMEOUT,
    AdvertisementObservation,
    AdvertisementState,
    after_step,
    next_step,
    render_details,
    wake_after,
)

pytestmark = pytest.mark.consumer
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=30)


def observed(**fields: Any) -> AdvertisementObservation:
    base: dict[str, Any] = {"exists": True, "phase": "Accepted", "has_finalizer": True,
                            "remote_remapped_pod_cidr": "None", "time_to_live": LATER, "virtual_kubelet_exists": True}
    return AdvertisementObservation(**{**base, **fields})


@pytest.mark.parametrize(
    ("obs", "step"),
    [
        pytest.param(observed(phase="Pending"), "AwaitDecision", id="a pending one waits for the decision"),
        pytest.param(observed(phase="Refused"), "AwaitDecision", id="a refused one builds nothing"),
        pytest.param(observed(has_finalizer=False), "EnsureFinalizer", id="accepted: hold it first"),
        pytest.param(observed(remote_remapped_pod_cidr=None), "AwaitPodCIDR", id="then wait for the remapping"),
        pytest.param(observed(virtual_kubelet_exists=False), "EnsureVirtualKubelet", id="then the virtual kubelet"),
        pytest.param(observed(), "Steady", id="then wait for changes"),
        pytest.param(observed(deleting=True), "MarkDeleting", id="deleted: teardown begins by saying so"),
        pytest.param(observed(time_to_live=NOW - timedelta(seconds=1)), "MarkDeleting", id="expired: teardown too"),
        pytest.param(observed(provider_unreachable_since=NOW - timedelta(minutes=5), keepalive_seconds=60),
                     "MarkDeleting", id="unreachable past the keepalive: teardown"),
        pytest.param(observed(provider_unreachable_since=NOW - timedelta(seconds=10), keepalive_seconds=60),
                     "Steady", id="unreachable for a moment: not yet"),
    ],
)  # fmt: skip
def test_the_next_step(obs: AdvertisementObservation, step: str) -> None:
    assert next_step(obs, AdvertisementState(), NOW).step == step


def test_teardown_goes_node_then_virtual_kubelet_then_advertisement() -> None:
    state = AdvertisementState(teardown="Deleted", clean_wait_started=NOW)
    deleting = {"phase": "Deleting", "deleting": True}
    assert next_step(observed(**deleting, virtual_node_exists=True), state, NOW).step == "DeleteVirtualNode"
    assert next_step(observed(**deleting), state, NOW).step == "AwaitProviderClean"
    assert next_step(observed(**deleting, provider_clean=True), state, NOW).step == "DeleteVirtualKubelet"
    assert next_step(observed(**deleting), state, NOW + PROVIDER_CLEAN_TIMEOUT).step == "DeleteVirtualKubelet"
    assert next_step(observed(**deleting, virtual_kubelet_exists=False), state, NOW).step == "ReleaseAdvertisement"
    assert next_step(AdvertisementObservation(exists=False), state, NOW).step == "Done"


def test_a_forced_teardown_waits_on_nothing_in_the_provider() -> None:
    """`tidepool unpeer --force` on the consumer: the provider may be gone; the virtual kubelet goes right
    after the node, whether the Advertisement still says so (obs) or the run latched it (state)."""
    deleting = {"phase": "Deleting", "deleting": True}
    waiting = AdvertisementState(teardown="Deleted", clean_wait_started=NOW)
    assert next_step(observed(**deleting), waiting, NOW).step == "AwaitProviderClean"
    assert next_step(observed(**deleting, forced=True), waiting, NOW).step == "DeleteVirtualKubelet"
    forced = waiting.model_copy(update={"forced": True})
    assert next_step(observed(**deleting), forced, NOW).step == "DeleteVirtualKubelet"
    # The order stays: the node first, the Advertisement last.
    assert next_step(observed(**deleting, forced=True, virtual_node_exists=True), waiting, NOW).step == "DeleteVirtualNode"
    assert next_step(observed(**deleting, forced=True, virtual_kubelet_exists=False), waiting, NOW).step == "ReleaseAdvertisement"
    details = render_details("prov", observed(**deleting), forced.model_copy(update={"provider_cleanup_until": NOW}),
                             "DeleteVirtualKubelet", read_at=NOW)  # fmt: skip
    assert "forced unpeer" in details and "not cleaned yet" in details, details


def test_next_step_leaves_the_state_alone_and_returns_the_teardown_cause() -> None:
    state = AdvertisementState()
    decided = next_step(observed(deleting=True), state, NOW)
    assert (decided.step, decided.teardown) == ("MarkDeleting", "Deleted")
    assert state == AdvertisementState()
    latched = state.model_copy(update={"teardown": "Expired"})
    assert next_step(observed(deleting=True), latched, NOW).teardown == "Expired"  # once begun, the cause stays


def test_a_virtual_node_never_ready_in_time_is_refused_torn_down_and_the_advertisement_kept() -> None:
    """virtualNodeReadyTimeoutSeconds (issue 20): the wait runs from the virtual kubelet's creation."""
    state = after_step(AdvertisementState(accepted_at=NOW), "EnsureVirtualKubelet", done=True, now=NOW)
    obs = observed(virtual_node_ready_timeout_seconds=600, virtual_node_exists=True)
    assert next_step(obs, state, NOW + timedelta(seconds=599)).step == "Steady"
    assert wake_after(obs, state, "Steady", NOW + timedelta(seconds=100)) == timedelta(seconds=500)
    decided = next_step(obs, state, NOW + timedelta(seconds=600))
    assert (decided.step, decided.teardown) == ("RefuseNotReady", "NotReady")
    state = after_step(state.model_copy(update={"teardown": "NotReady"}), "RefuseNotReady", done=True, now=NOW)
    refused = {"phase": "Refused", "virtual_node_ready_timeout_seconds": 600}
    assert next_step(observed(**refused, virtual_node_exists=True), state, NOW).step == "DeleteVirtualNode"
    state = after_step(state, "DeleteVirtualNode", done=True, now=NOW)
    assert next_step(observed(**refused), state, NOW).step == "AwaitProviderClean"
    assert next_step(observed(**refused, provider_clean=True), state, NOW).step == "DeleteVirtualKubelet"
    assert next_step(observed(**refused, virtual_kubelet_exists=False), state, NOW).step == "ReleaseAdvertisement"
    state = after_step(state, "ReleaseAdvertisement", done=True, now=NOW)
    assert (state.teardown, state.ready_wait_started, state.accepted_at) == (None, None, None)
    # Kept and refused: the run waits for a decision, and no deadline is armed.
    kept = observed(**refused, has_finalizer=False, virtual_kubelet_exists=False)
    assert next_step(kept, state, NOW).step == "AwaitDecision"
    assert wake_after(kept.model_copy(update={"time_to_live": None}), state, "AwaitDecision", NOW) is None


def test_a_node_that_was_ready_once_and_no_timeout_arm_no_ready_deadline() -> None:
    state = after_step(AdvertisementState(accepted_at=NOW), "EnsureVirtualKubelet", done=True, now=NOW)
    late = NOW + timedelta(minutes=20)  # past the 600 s, before the expiry
    assert next_step(observed(), state, late).step == "Steady"  # no timeout configured
    ready = observed(virtual_node_ready_timeout_seconds=600, virtual_node_ready=True, virtual_node_exists=True)
    assert next_step(ready, state, late).step == "Steady"
    was_ready = state.model_copy(update={"node_was_ready": True})
    assert next_step(observed(virtual_node_ready_timeout_seconds=600), was_ready, late).step == "Steady"
    # Recreated after an accident: the wait still runs from the first creation.
    assert after_step(state, "EnsureVirtualKubelet", done=True, now=late).ready_wait_started == NOW


def test_a_never_registered_node_leaves_nothing_to_wait_for() -> None:
    state = AdvertisementState(teardown="NotReady", not_ready_refused=True)
    assert next_step(observed(phase="Refused"), state, NOW).step == "DeleteVirtualKubelet"


@pytest.mark.parametrize(("remapped", "shown"), [
    pytest.param(None, "not decided yet (waiting for the network module", id="not set yet: waiting for the network"),
    pytest.param("", "not decided yet (waiting for the network module", id="empty: waiting for the network"),
    pytest.param("None", "no remapping needed", id="the network module's None: no remapping needed"),
    pytest.param("100.64.0.0/16", "remapped into 100.64.0.0/16", id="a block: remapped into it"),
])  # fmt: skip
def test_the_details_tell_no_remapping_needed_from_waiting_for_the_network(remapped: str | None, shown: str) -> None:
    details = render_details("prov", observed(remote_remapped_pod_cidr=remapped), AdvertisementState(), "Steady", read_at=NOW)
    assert f"provider's PodCIDR here: {shown}" in details, details


def test_the_details_say_when_the_expiry_they_show_was_read() -> None:
    details = render_details("prov", observed(), AdvertisementState(), "Steady", read_at=NOW)
    assert f"expires: {LATER:%Y-%m-%d %H:%M:%S} UTC as read at {NOW:%H:%M:%S} UTC (pushes renew it" in details, details
