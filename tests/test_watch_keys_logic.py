"""Issue 37, without clusters: a watcher's key cannot drift from its decision's input. The consumer's watchers
key on the views the decisions are built from (models/consumer.py advertisement_view, models/admission.py
admission_view); here hypothesis edits an Advertisement (fields a decision reads, fields none reads, the
clock) and checks that two objects with equal views get equal decisions from the real decision functions
at the same clock, and that the view moves with every field those decisions read."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from models.admission import (
    AdmissionSnapshot,
    Candidate,
    KeptRefusals,
    RefusalOnRecord,
    _candidate,  # the whole read, which the view leaves fields of out
    admission_view,
    candidate,
    decide,
    kept_refusals,
    validate_advertisement,
)
from models.admission import next_decision_deadline as admission_deadline
from models.api import ClusterConfig
from models.consumer import (
    AdvertisementObservation,
    AdvertisementState,
    AdvertisementView,
    LifecycleSettings,
    VirtualKubeletView,
    VirtualNodeView,
    advertisement_view,
    next_step,
    render_details,
    virtual_kubelet_view,
    virtual_node_view,
    wake_after,
)
from models.explain import as_mapping
from models.names import (
    ADVERTISEMENT_FINALIZER,
    DECISION_ANNOTATION,
    DECISION_REASON_ANNOTATION,
    FORCE_UNPEER_ANNOTATION,
    REFUSED_OFFER_ANNOTATION,
    SYSTEM_NAMESPACE,
    VK_CLEAN_ANNOTATION,
    credentials_secret_name,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
Obj = dict[str, Any]
Edit = Callable[[Obj], None]


def _set(path: str, value: Any) -> Edit:
    def edit(obj: Obj) -> None:
        *parents, last = path.split(".")
        for part in parents:
            obj = obj.setdefault(part, {})
        obj[last] = value

    return edit


def _annotate(key: str, value: str | None) -> Edit:
    def edit(obj: Obj) -> None:
        annotations = obj["metadata"].setdefault("annotations", {})
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value

    return edit


def _condition_message(message: str) -> Edit:
    return _set("status.conditions", [{"type": "Accepted", "status": "False", "message": message,
                                       "lastTransitionTime": "2026-11-22T11:00:00Z"}])  # fmt: skip



def _annotate_child(child: str, key: str, value: str | None) -> Edit:
    def edit(obj: Obj) -> None:
        if obj.get(child) is not None:
            _annotate(key, value)(obj[child])

    return edit


def _ready(status: str, reason: str | None) -> Edit:
    def edit(obj: Obj) -> None:
        if obj.get("node") is not None:
            obj["node"]["status"]["conditions"] = [{"type": "Ready", "status": status, "reason": reason,
                                                    "lastTransitionTime": "2026-11-22T11:57:00Z"}]  # fmt: skip

    return edit


def _set_child(child: str, path: str, value: Any) -> Edit:
    def edit(obj: Obj) -> None:
        if obj.get(child) is not None:
            _set(path, value)(obj[child])

    return edit


def _gone(child: str) -> Edit:
    def edit(obj: Obj) -> None:
        obj[child] = None

    return edit

TIMES = ["2026-11-22T11:00:00Z", "2026-11-22T12:30:00Z", "2026-11-22T13:00:00Z"]
# Edits a decision may read ...
READ: list[Edit] = [
    *[_set("status.phase", p) for p in (None, "Pending", "Accepted", "Refused", "Deleting")],
    *[_set("status.reason", r) for r in (None, "Invalid", "MaxReached", "VirtualNodeNotReady", "DecisionTimedOut")],
    *[_set("status.remoteRemappedPodCIDR", c) for c in (None, "None", "10.9.0.0/16")],
    *[_set("status.decisionDeadline", t) for t in (None, *TIMES)],
    *[_condition_message(m) for m in ("m1", "m2")],
    _set("metadata.finalizers", [ADVERTISEMENT_FINALIZER]), _set("metadata.finalizers", ["someone-else"]),
    _set("metadata.deletionTimestamp", "2026-11-22T11:59:00Z"),
    _set("metadata.uid", "u2"), _set("metadata.creationTimestamp", "2026-11-22T10:00:00Z"),
    _set("metadata.name", "advertisement-other"), _set("spec.clusterId", "other"),
    *[_annotate(DECISION_ANNOTATION, v) for v in (None, "accept", "refuse")],
    _annotate(DECISION_REASON_ANNOTATION, "because"), _annotate(FORCE_UNPEER_ANNOTATION, "x"),
    *[_annotate(REFUSED_OFFER_ANNOTATION, v) for v in (None, "0000000000000000")],
    *[_set("spec.resourceQuota.hard", h) for h in ({"cpu": "2"}, {"cpu": "3", "memory": "4Gi"}, {}, {"cpu": "x"})],
    *[_set("spec.prices", p) for p in ({"cpu": "1"}, {"cpu": "9"}, None)],
    _set("spec.kubeConfigRef", {"namespace": "elsewhere", "name": credentials_secret_name("prov")}),
    _set("spec.network.podCIDR", "127.0.0.0/8"),
]
# ... edits none reads ...
UNREAD: list[Edit] = [
    _set("metadata.resourceVersion", "11"), _set("metadata.labels", {"a": "b"}), _annotate("example.com/x", "y"),
    # (admission reads spec.timestamp only to hold spec.timeToLive after it: every timeToLive here is later than
    # both timestamps)
    _set("spec.timestamp", "2026-11-22T10:31:00Z"), _set("status.vkReference", {"name": "vk"}),
]
# ... and the clock: every push renews the time to live.
CLOCK: list[Edit] = [_set("spec.timeToLive", t) for t in TIMES]


def advertisement() -> Obj:
    return {
        "metadata": {"name": "advertisement-prov", "uid": "u1", "resourceVersion": "10",
                     "creationTimestamp": "2026-11-22T09:00:00Z"},
        "spec": {"clusterId": "prov", "resourceQuota": {"hard": {"cpu": "2", "memory": "4Gi"}},
                 "kubeConfigRef": {"namespace": SYSTEM_NAMESPACE, "name": credentials_secret_name("prov")},
                 "network": {"podCIDR": "10.1.0.0/16"}, "timestamp": "2026-11-22T10:30:00Z",
                 "timeToLive": "2026-11-22T12:30:00Z"},
        "status": {},
    }  # fmt: skip


edits = st.lists(st.sampled_from(READ + UNREAD + CLOCK), max_size=6)


def edited(base: Obj, changes: list[Edit]) -> Obj:
    obj = copy.deepcopy(base)
    for change in changes:
        change(obj)
    return obj


def same_clock(obj: Obj, clock_from: Obj) -> Obj:
    """`obj` at the clock of `clock_from`: the same time to live, as a decision reads it at the same time."""
    return edited(obj, [_set("spec.timeToLive", clock_from["spec"].get("timeToLive"))])


# The AdvertisementWorkflow --------------------------------------------------------------------------------
def observation_read_directly(obj: Obj) -> AdvertisementObservation:
    """Everything the AdvertisementWorkflow could read of its Advertisement, read straight from the object
    (not through the view), with the virtual kubelet, node and ClusterConfig held fixed."""
    meta, spec, status = as_mapping(obj.get("metadata")), as_mapping(obj.get("spec")), as_mapping(obj.get("status"))
    ttl = spec.get("timeToLive")
    return AdvertisementObservation(
        exists=True, deleting=bool(meta.get("deletionTimestamp")), phase=status.get("phase"), reason=status.get("reason"),
        has_finalizer=ADVERTISEMENT_FINALIZER in (meta.get("finalizers") or []),
        remote_remapped_pod_cidr=status.get("remoteRemappedPodCIDR"),
        time_to_live=datetime.fromisoformat(ttl.replace("Z", "+00:00")) if ttl else None,
        resources={k: str(v) for k, v in as_mapping(as_mapping(spec.get("resourceQuota")).get("hard")).items()},
        forced=FORCE_UNPEER_ANNOTATION in as_mapping(meta.get("annotations")), virtual_kubelet_exists=True,
        virtual_node_exists=True, virtual_node_ready_timeout_seconds=60,
    )  # fmt: skip


def observation_through_view(obj: Obj) -> AdvertisementObservation:
    """As activities/consumer.py observe_advertisement builds it: the view, and the clock beside it."""
    direct = observation_read_directly(obj)
    return AdvertisementObservation(exists=True, **advertisement_view(obj).observed(), time_to_live=direct.time_to_live,
                                    virtual_kubelet_exists=True, virtual_node_exists=True,
                                    virtual_node_ready_timeout_seconds=60)  # fmt: skip


STATES = [AdvertisementState(), AdvertisementState(teardown="Deleted"), AdvertisementState(teardown="NotReady"),
          AdvertisementState(ready_wait_started=NOW - timedelta(minutes=5), accepted_at=NOW - timedelta(minutes=6)),
          AdvertisementState(clean_wait_started=NOW, teardown="Expired")]  # fmt: skip


def lifecycle_decisions(obs: AdvertisementObservation) -> list[Any]:
    """What the workflow derives from one observation in each state: the step, the wake, the details, and
    (phase, reason), which its accept and refuse updates judge."""
    decided = []
    for state in STATES:
        step = next_step(obs, state, NOW)
        decided += [step, wake_after(obs, state, step.step, NOW), render_details("prov", obs, state, step.step, read_at=NOW)]
    return [*decided, (obs.phase, obs.reason)]


@settings(max_examples=400, deadline=None)
@given(before=edits, after=edits)
def test_equal_advertisement_views_give_equal_lifecycle_decisions(before: list[Edit], after: list[Edit]) -> None:
    a = edited(advertisement(), before)
    b = same_clock(edited(a, after), a)
    assert observation_through_view(a) == observation_read_directly(a)
    if advertisement_view(a) == advertisement_view(b):
        assert lifecycle_decisions(observation_read_directly(a)) == lifecycle_decisions(observation_read_directly(b))


@settings(max_examples=200, deadline=None)
@given(before=edits, unread=st.lists(st.sampled_from(UNREAD + CLOCK), min_size=1, max_size=4))
def test_what_no_lifecycle_decision_reads_and_the_clock_leave_the_advertisement_view(
    before: list[Edit], unread: list[Edit]
) -> None:
    a = edited(advertisement(), before)
    assert advertisement_view(edited(a, unread)) == advertisement_view(a)


# The virtual kubelet and its node -------------------------------------------------------------------------
# Edits of the Deployment and the node a lifecycle decision may read, edits none reads, and their clocks.
CHILD_READ: list[Edit] = [
    _set_child("deployment", "metadata.deletionTimestamp", "2026-11-22T11:59:00Z"),
    *[_annotate_child("deployment", VK_CLEAN_ANNOTATION, v) for v in (None, "clean", "dirty")],
    *[_ready(status, reason) for status in ("True", "False", "Unknown") for reason in (None, "KubeletReady", "ProviderUnreachable")],
    _set_child("node", "status.conditions", []), _gone("node"), _gone("deployment"),
]
CHILD_UNREAD: list[Edit] = [
    _set_child("deployment", "status.readyReplicas", 0), _set_child("deployment", "metadata.resourceVersion", "9"),
    _set_child("node", "status.capacity", {"cpu": "9"}), _set_child("node", "metadata.labels", {"a": "b"}),
    _set_child("node", "metadata.resourceVersion", "9"),
]
child_edits = st.lists(st.sampled_from(CHILD_READ + CHILD_UNREAD), max_size=5)
SINCE = NOW - timedelta(minutes=3)  # the Ready condition's transition time, a clock read beside the view


def children() -> Obj:
    """The virtual kubelet Deployment and node of an accepted, remapped Advertisement, as served."""
    return {
        "deployment": {"metadata": {"name": "tidepool-vk-prov", "uid": "d1", "annotations": {}},
                       "status": {"replicas": 1, "readyReplicas": 1}},
        "node": {"metadata": {"name": "tidepool-prov", "uid": "n1"},
                 "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                            "lastHeartbeatTime": "2026-11-22T11:59:00Z",
                                            "lastTransitionTime": "2026-11-22T11:57:00Z"}]}},
    }  # fmt: skip


def children_read_directly(objs: Obj) -> dict[str, Any]:
    """What the workflow could read of the two, straight from the objects (as observe_advertisement did
    before the views)."""
    deployment, node = objs.get("deployment"), objs.get("node")
    ready: Obj = next((c for c in (node or {}).get("status", {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    unreachable = ready.get("status") != "True" and ready.get("reason") == "ProviderUnreachable"
    return {
        "virtual_kubelet_exists": deployment is not None and not deployment["metadata"].get("deletionTimestamp"),
        "provider_clean": (deployment or {}).get("metadata", {}).get("annotations", {}).get(VK_CLEAN_ANNOTATION) == "clean",
        "virtual_node_exists": node is not None, "virtual_node_ready": ready.get("status") == "True",
        "provider_unreachable_since": SINCE if unreachable else None,
    }  # fmt: skip


def children_through_views(objs: Obj) -> dict[str, Any]:
    """As activities/consumer.py observe_advertisement builds it: the views, and the clock beside them."""
    return {**virtual_kubelet_view(objs.get("deployment")).observed(),
            **virtual_node_view(objs.get("node")).observed(unreachable_since=SINCE)}  # fmt: skip


def children_views(objs: Obj) -> tuple[Any, Any]:
    return virtual_kubelet_view(objs.get("deployment")), virtual_node_view(objs.get("node"))


def observation_with(children_fields: dict[str, Any]) -> AdvertisementObservation:
    accepted = edited(advertisement(), [_set("status.phase", "Accepted"), _set("status.remoteRemappedPodCIDR", "None"),
                                        _set("metadata.finalizers", [ADVERTISEMENT_FINALIZER])])  # fmt: skip
    return observation_read_directly(accepted).model_copy(update=children_fields)


@settings(max_examples=400, deadline=None)
@given(before=child_edits, after=child_edits)
def test_equal_virtual_kubelet_and_node_views_give_equal_lifecycle_decisions(before: list[Edit], after: list[Edit]) -> None:
    a = edited(children(), before)
    b = edited(a, after)
    assert children_through_views(a) == children_read_directly(a)
    if children_views(a) == children_views(b):
        assert lifecycle_decisions(observation_with(children_read_directly(a))) == \
            lifecycle_decisions(observation_with(children_read_directly(b)))


@settings(max_examples=200, deadline=None)
@given(before=child_edits, unread=st.lists(st.sampled_from(CHILD_UNREAD), min_size=1, max_size=4))
def test_what_no_lifecycle_decision_reads_of_the_virtual_kubelet_and_node_leaves_their_views(
    before: list[Edit], unread: list[Edit]
) -> None:
    a = edited(children(), before)
    assert children_views(edited(a, unread)) == children_views(a)


# Admission ------------------------------------------------------------------------------------------------
CONFIGS = [
    ClusterConfig.model_validate({"spec": {"incoming": incoming}})
    for incoming in (
        {"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 1, "maxPrices": {"cpu": "5"}},
        {"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 0},
        {"acceptPolicy": "Manual", "maxAcceptableAdvertisements": 1, "manualDecisionTimeoutSeconds": 3600},
        {"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 1, "deniedClusters": ["prov"]},
    )
]  # fmt: skip
KEPT = [{}, {"prov": KeptRefusals(by_hand=RefusalOnRecord(uid="u0", detail="no"), changed=NOW)},
        {"prov": KeptRefusals(not_ready=RefusalOnRecord(uid="u0", detail="0000000000000000"), changed=NOW)}]  # fmt: skip


def candidate_read_directly(obj: Obj) -> Candidate:
    """Every field admission could read of the Advertisement, straight from the object (not through the
    view), validated at NOW."""
    return replace(_candidate(obj), problems=tuple(validate_advertisement(obj, NOW)))


def admission_decisions(obj: Obj) -> list[Any]:
    """What admission passes decide with this Advertisement alone, read directly, under each ClusterConfig
    and record kept: the decisions to write, the refusals to keep, the next deadline (the records for
    `tidepool simulate` are not decisions)."""
    decided: list[Any] = []
    for config in CONFIGS:
        for kept in KEPT:
            snapshot = replace(AdmissionSnapshot.from_kubernetes(config=config, advertisements=[], kept=kept, now=NOW),
                               candidates=(candidate_read_directly(obj),))  # fmt: skip
            decisions = decide(snapshot)
            decided += [decisions, kept_refusals(snapshot), admission_deadline(snapshot, decisions)]
    return decided


@settings(max_examples=400, deadline=None)
@given(before=edits, after=edits)
def test_equal_admission_views_give_equal_admission_decisions(before: list[Edit], after: list[Edit]) -> None:
    a = edited(advertisement(), before)
    b = same_clock(edited(a, after), a)
    assert candidate(a, NOW) == candidate_read_directly(a)
    if admission_view(a) == admission_view(b):
        assert admission_decisions(a) == admission_decisions(b)


@settings(max_examples=200, deadline=None)
@given(before=edits, unread=st.lists(st.sampled_from(UNREAD + CLOCK), min_size=1, max_size=4))
def test_what_admission_does_not_read_and_the_clock_leave_its_view_unless_refused_as_invalid(
    before: list[Edit], unread: list[Edit]
) -> None:
    a = edited(advertisement(), before)
    view = admission_view(a)
    if view.renewal is None:
        assert admission_view(edited(a, unread)) == view


def test_a_renewal_is_news_to_admission_only_for_one_refused_as_invalid() -> None:
    expired = edited(advertisement(), [_set("spec.timeToLive", TIMES[0]), _set("status.phase", "Refused"),
                                        _set("status.reason", "Invalid")])  # fmt: skip
    assert admission_view(edited(expired, [_set("spec.timeToLive", TIMES[2])])) != admission_view(expired)
    assert admission_decisions(edited(expired, [_set("spec.timeToLive", TIMES[2])])) != admission_decisions(expired)


def test_every_field_of_the_lifecycle_s_observation_comes_from_a_view_a_watcher_keys_on_or_is_a_named_clock() -> None:
    """What AdvertisementObservation holds is read through the views the consumer's watchers key on, the
    ClusterConfig's timeouts (LifecycleSettings, whose change wakes every lifecycle), or the clocks and
    records no decision is woken by: a field added to the observation outside them fails here."""
    from_views = {*AdvertisementView.model_fields, *VirtualKubeletView.model_fields, *LifecycleSettings.model_fields,
                  *VirtualNodeView(virtual_node_exists=False, virtual_node_ready=False, provider_unreachable=False)
                  .observed(unreachable_since=None)}  # fmt: skip
    clocks_and_records = {"exists", "time_to_live", "offer"}  # the object's incarnation; the expiry timer; explain's
    assert set(AdvertisementObservation.model_fields) == from_views | clocks_and_records
    assert not from_views & clocks_and_records
