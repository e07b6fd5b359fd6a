"""The consumer's view of one Advertisement, as data, and the pure decision of what to do next.

workflows/advertisement.py observes the Advertisement, its virtual kubelet Deployment and its virtual
node (one activity), asks `next_step` what to do, does it (one activity), and sleeps until a watcher
signals a change or the next deadline. Because every step is derived from what is observed, a crash at
any step resumes at that step.

An Advertisement that expires without being accepted (Pending or Refused) is deleted with the reason
`Expired` and its workflow completes; no deadline already past is ever a deadline again (see `wake_after`).

With incoming.virtualNodeReadyTimeoutSeconds set, an accepted Advertisement whose virtual node has never
been Ready that long after its virtual kubelet was created (the PodCIDR wait comes before, and is not
counted) is refused (VirtualNodeNotReady) and its virtual node and kubelet are taken down in the teardown
order; the Advertisement stays, Refused, without its finalizer, and the workflow goes back to waiting
for a decision. Admission keeps it refused until its offer changes or someone accepts it by hand
(models/admission.py), so no teardown → re-push → re-accept loop forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models.admission import KeptRefusals
from models.api import ClusterConfig
from models.explain import AdmissionEntry, AdmissionRecord, OfferDerivation, as_mapping
from models.names import ADVERTISEMENT_FINALIZER, FORCE_UNPEER_ANNOTATION, VK_CLEAN_ANNOTATION
from models.network import NO_REMAPPING

Step = Literal[
    "AwaitDecision",        # Pending or Refused: nothing to build
    "EnsureFinalizer",      # accepted: hold the Advertisement until teardown is done
    "AwaitPodCIDR",         # accepted: the network module has not set the remapping yet
    "EnsureVirtualKubelet",  # accepted and remapped: create (or re-create) the Deployment
    "Steady",               # everything in place: wait for changes
    "MarkDeleting",         # teardown 1: say so on the Advertisement
    "DeleteVirtualNode",    # teardown 2: cordon and delete the node, so the virtual kubelet cleans up
    "AwaitProviderClean",   # teardown 3: wait until the virtual kubelet reports the provider namespace clean
    "DeleteVirtualKubelet",  # teardown 4
    "ReleaseAdvertisement",  # teardown 5: drop the finalizer (and delete it, when it expired)
    "DeleteExpired",        # never accepted and expired: delete it (Event reason Expired), then Done
    "RefuseNotReady",       # NotReady 1: refuse it (VirtualNodeNotReady); then the teardown from step 2, keeping it
    "Done",
]  # fmt: skip
# NotReady tears down what was built and keeps the Advertisement, refused; the others end the run.
TeardownCause = Literal["Deleted", "Expired", "ProviderUnreachable", "NotReady"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdvertisementObservation(_Model):
    """What one read of the consumer cluster saw: the Advertisement's view (`AdvertisementView`, the
    watcher's key), its timeToLive, the offer's derivation, the virtual kubelet and node, the ClusterConfig's
    timeouts."""

    exists: bool
    deleting: bool = False
    phase: str | None = None
    reason: str | None = None
    has_finalizer: bool = False
    remote_remapped_pod_cidr: str | None = None
    time_to_live: datetime | None = None
    resources: dict[str, str] = Field(default_factory=dict)
    virtual_kubelet_exists: bool = False
    provider_clean: bool = False
    virtual_node_exists: bool = False
    provider_unreachable_since: datetime | None = None
    pod_cidr_wait_timeout_seconds: int = 300
    keepalive_seconds: int = 60
    virtual_node_ready: bool = False  # its Ready condition is True
    virtual_node_ready_timeout_seconds: int | None = None  # incoming.virtualNodeReadyTimeoutSeconds
    offer: OfferDerivation | None = None  # how the provider derived the offer (its annotation), for `tidepool explain`
    forced: bool = False  # `tidepool unpeer --force` marked it: no wait on the provider during teardown


class AdvertisementView(BaseModel):
    """What the AdvertisementWorkflow reads of its Advertisement object (`next_step`, `render_details`, the
    accept/refuse validators), minus its clocks. observe_advertisement builds the observation from it and
    the consumer's watcher keys on it, so what wakes the workflow and what it decides on cannot drift apart.
    Left out: spec.timeToLive, the clock every push renews (the expiry timer re-reads it when it fires), and
    the offer's derivation, which `tidepool explain` reads from the history and no decision does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deleting: bool
    phase: str | None
    reason: str | None
    has_finalizer: bool
    remote_remapped_pod_cidr: str | None
    resources: tuple[tuple[str, str], ...]  # spec.resourceQuota.hard, sorted: hashable
    forced: bool

    def observed(self) -> dict[str, Any]:
        """The observation's fields this view gives (AdvertisementObservation's names and types)."""
        return {**{name: getattr(self, name) for name in type(self).model_fields}, "resources": dict(self.resources)}


def advertisement_view(obj: Mapping[str, Any]) -> AdvertisementView:
    """The view of an Advertisement as the API server serves it; never raises (a provider writes the spec)."""
    meta, spec, status = as_mapping(obj.get("metadata")), as_mapping(obj.get("spec")), as_mapping(obj.get("status"))
    finalizers, annotations = meta.get("finalizers"), as_mapping(meta.get("annotations"))
    return AdvertisementView(
        deleting=bool(meta.get("deletionTimestamp")),
        phase=_text(status.get("phase")),
        reason=_text(status.get("reason")),
        has_finalizer=isinstance(finalizers, list) and ADVERTISEMENT_FINALIZER in finalizers,
        remote_remapped_pod_cidr=_text(status.get("remoteRemappedPodCIDR")),
        resources=tuple(sorted((str(k), str(v)) for k, v in as_mapping(as_mapping(spec.get("resourceQuota")).get("hard")).items())),
        forced=FORCE_UNPEER_ANNOTATION in annotations,
    )  # fmt: skip


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class LifecycleSettings(BaseModel):
    """What the AdvertisementWorkflow reads of the ClusterConfig (its timeouts); the consumer's watcher
    tells every AdvertisementWorkflow when it changes, as the admission's when `incoming` does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pod_cidr_wait_timeout_seconds: int
    keepalive_seconds: int
    virtual_node_ready_timeout_seconds: int | None

    def observed(self) -> dict[str, Any]:
        return self.model_dump()


def lifecycle_settings(config: ClusterConfig) -> LifecycleSettings:
    spec = config.spec
    return LifecycleSettings(
        pod_cidr_wait_timeout_seconds=spec.incoming.pod_cidr_wait_timeout_seconds,
        keepalive_seconds=spec.keepalive.threshold_failures * spec.keepalive.retry_seconds,
        virtual_node_ready_timeout_seconds=spec.incoming.virtual_node_ready_timeout_seconds,
    )


class VirtualKubeletView(BaseModel):
    """What the AdvertisementWorkflow reads of its virtual kubelet Deployment (never its replicas or
    conditions); the consumer's watcher keys on it, as on `AdvertisementView`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    virtual_kubelet_exists: bool  # and is not being deleted
    provider_clean: bool  # the virtual kubelet reported the provider's namespace clean

    def observed(self) -> dict[str, Any]:
        return self.model_dump()


def virtual_kubelet_view(obj: Mapping[str, Any] | None) -> VirtualKubeletView:
    """The view of a Deployment as the API server serves it (camelCase), or of none."""
    meta = as_mapping(as_mapping(obj).get("metadata"))
    return VirtualKubeletView(virtual_kubelet_exists=obj is not None and not meta.get("deletionTimestamp"),
                              provider_clean=as_mapping(meta.get("annotations")).get(VK_CLEAN_ANNOTATION) == "clean")  # fmt: skip


class VirtualNodeView(BaseModel):
    """What the AdvertisementWorkflow reads of its virtual node, minus its clocks: its Ready condition's
    status, and whether its reason says the provider is unreachable (since when, the observation reads
    beside the view: heartbeats and transition times wake nothing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    virtual_node_exists: bool
    virtual_node_ready: bool  # its Ready condition is True
    provider_unreachable: bool  # Ready is not True, for the reason ProviderUnreachable

    def observed(self, unreachable_since: datetime | None) -> dict[str, Any]:
        """The observation's fields: `unreachable_since` is the Ready condition's transition time."""
        return {"virtual_node_exists": self.virtual_node_exists, "virtual_node_ready": self.virtual_node_ready,
                "provider_unreachable_since": unreachable_since if self.provider_unreachable else None}  # fmt: skip


def virtual_node_view(obj: Mapping[str, Any] | None) -> VirtualNodeView:
    """The view of a Node as the API server serves it (camelCase), or of none."""
    ready = ready_condition(obj)
    status = ready.get("status")
    return VirtualNodeView(virtual_node_exists=obj is not None, virtual_node_ready=status == "True",
                           provider_unreachable=status != "True" and ready.get("reason") == "ProviderUnreachable")  # fmt: skip


def ready_condition(node: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A Node's Ready condition, empty when it has none."""
    conditions = as_mapping(as_mapping(node).get("status")).get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c
    return {}


class AdvertisementState(_Model):
    """Carried over continue-as-new."""

    teardown: TeardownCause | None = None
    accepted_at: datetime | None = None
    pod_cidr_timed_out: bool = False
    clean_wait_started: datetime | None = None
    deleted: dict[str, datetime] = Field(default_factory=dict)  # what teardown deleted, and when
    virtual_kubelet_created: int = 0
    # The phase last observed, so that a run continued as new refuses a second decision before its first look.
    observed_phase: str | None = None
    # The last activity failure the workflow waited out (a forbidden call, say), for the Web UI; None once a
    # pass succeeds again.
    last_error: str | None = None
    # When the virtual kubelet was first created since acceptance, and whether its node has been Ready since:
    # the virtualNodeReadyTimeoutSeconds deadline runs from the one until the other.
    ready_wait_started: datetime | None = None
    node_was_ready: bool = False
    not_ready_refused: bool = False  # NotReady teardown: RefuseNotReady is done
    # `tidepool unpeer --force` (issue 20): the local teardown waits on nothing in the provider; afterwards the
    # workflow cleans the copies there while the last Advertisement could live, and says how that ended.
    forced: bool = False
    provider_cleanup_until: datetime | None = None
    provider_cleanup_outcome: str | None = None
    # An acting step due again right after it ran made no progress (issue 34): the step last run, how many
    # times in a row it was due again, and until when the run waits before running it again.
    last_acted: Step | None = None
    stalls: int = 0
    stalled_until: datetime | None = None
    # A ProviderUnreachable teardown told admission, which backs off from the provider (issue 34).
    admission_told: bool = False


class AdvertisementInput(_Model):
    provider_id: str
    advertisement: str
    state: AdvertisementState | None = None
    # The consumer's own cluster id, for the HomeCluster search attribute and to name the admission workflow;
    # the worker sets it (a start by hand may not).
    home_cluster_id: str | None = None


# Decided but not accepted: nothing was built for it, and no finalizer holds it. One not decided yet waits
# for admission (an arrival already expired is refused Invalid first, so that its reason is on record).
_UNACCEPTED = ("Pending", "Refused")
# The virtual kubelet cannot report a clean namespace if the provider is gone; do not wait for ever.
PROVIDER_CLEAN_TIMEOUT = timedelta(minutes=2)


def ready_deadline(obs: AdvertisementObservation, state: AdvertisementState) -> datetime | None:
    """When an accepted Advertisement whose virtual node was never Ready is refused; None: no such deadline."""
    if (obs.virtual_node_ready_timeout_seconds is None or state.ready_wait_started is None or state.node_was_ready
            or obs.virtual_node_ready or state.teardown is not None or obs.phase != "Accepted"):  # fmt: skip
        return None
    return state.ready_wait_started + timedelta(seconds=obs.virtual_node_ready_timeout_seconds)


def teardown_cause(obs: AdvertisementObservation, now: datetime) -> TeardownCause | None:
    if not obs.exists or obs.deleting:
        return "Deleted"
    if obs.time_to_live is not None and now >= obs.time_to_live:
        return "Expired"
    # Only an accepted one has a virtual node whose Ready condition can say the provider is unreachable.
    if (
        obs.phase == "Accepted"
        and obs.provider_unreachable_since is not None
        and now - obs.provider_unreachable_since >= timedelta(seconds=obs.keepalive_seconds)
    ):
        return "ProviderUnreachable"
    return None


@dataclass(frozen=True)
class NextStep:
    """What `next_step` decided: the step, and the teardown cause the workflow keeps in its state (latched:
    once set, it stays)."""

    step: Step
    teardown: TeardownCause | None


def next_step(obs: AdvertisementObservation, state: AdvertisementState, now: datetime) -> NextStep:
    """What to do now, from what was observed; teardown, once begun, runs to its end."""
    teardown = state.teardown
    if teardown is None and obs.phase == "Accepted":
        teardown = teardown_cause(obs, now)
        deadline = ready_deadline(obs, state)
        if teardown is None and deadline is not None and now >= deadline:
            teardown = "NotReady"
    elif teardown is None and (not obs.exists or obs.deleting):
        teardown = "Deleted"
    if teardown is not None:
        return NextStep(_teardown_step(obs, state, now, teardown), teardown)
    return NextStep(_building_step(obs, now), None)


def _building_step(obs: AdvertisementObservation, now: datetime) -> Step:
    if obs.phase != "Accepted":
        # Not latched as a teardown: a push may renew it before the deletion, which then does nothing.
        expired = obs.time_to_live is not None and now >= obs.time_to_live
        return "DeleteExpired" if expired and obs.phase in _UNACCEPTED else "AwaitDecision"
    if not obs.has_finalizer:
        return "EnsureFinalizer"
    if not obs.remote_remapped_pod_cidr:
        return "AwaitPodCIDR"
    if not obs.virtual_kubelet_exists:
        return "EnsureVirtualKubelet"
    return "Steady"


def _teardown_step(obs: AdvertisementObservation, state: AdvertisementState, now: datetime,
                   teardown: TeardownCause) -> Step:  # fmt: skip
    if teardown == "NotReady" and obs.exists:
        return _not_ready_step(obs, state, now)
    if "advertisement" in state.deleted and not obs.virtual_kubelet_exists and not obs.virtual_node_exists:
        # Released: one there now is the provider's next push, a new arrival for a new run (or the teardown
        # would take it down too, as if it were this one).
        return "Done"
    if not obs.exists:
        return "Done" if not obs.virtual_kubelet_exists and not obs.virtual_node_exists else (
            "DeleteVirtualNode" if obs.virtual_node_exists else "DeleteVirtualKubelet"
        )
    if obs.phase != "Deleting":
        return "MarkDeleting"
    if obs.virtual_node_exists:
        return "DeleteVirtualNode"
    if obs.virtual_kubelet_exists:
        waited = now - state.clean_wait_started if state.clean_wait_started else timedelta(0)
        if not obs.provider_clean and waited < PROVIDER_CLEAN_TIMEOUT and not (state.forced or obs.forced):
            return "AwaitProviderClean"
        return "DeleteVirtualKubelet"
    return "ReleaseAdvertisement"


def _not_ready_step(obs: AdvertisementObservation, state: AdvertisementState, now: datetime) -> Step:
    """Refuse, then the teardown's node → clean → virtual kubelet, then drop the finalizer (the
    Advertisement stays); after it (`after_step`) the run waits for a decision again."""
    if not state.not_ready_refused:
        return "RefuseNotReady"
    if obs.virtual_node_exists:
        return "DeleteVirtualNode"
    if obs.virtual_kubelet_exists:
        # A node that never registered had no pods: nothing in the provider to wait for.
        started = state.clean_wait_started
        if started is not None and not obs.provider_clean and now - started < PROVIDER_CLEAN_TIMEOUT:
            return "AwaitProviderClean"
        return "DeleteVirtualKubelet"
    return "ReleaseAdvertisement"


def wake_after(obs: AdvertisementObservation, state: AdvertisementState, step: Step, now: datetime) -> timedelta | None:
    """When to look again without being told: the nearest deadline (expiry, keepalive, PodCIDR wait,
    provider-clean wait); None means only a signal wakes the workflow. A deadline already past gives the
    1-second floor once, never in a loop: a past expiry is a teardown or a deletion (`next_step`), or,
    before admission has decided, no deadline at all (the decision signals); a past keepalive is a
    teardown, a past provider-clean wait deletes the virtual kubelet, and the workflow reports a past
    PodCIDR wait, after which none of them is a deadline any more."""
    deadlines: list[datetime] = []
    if obs.time_to_live is not None and state.teardown is None and obs.time_to_live > now:
        deadlines.append(obs.time_to_live)
    if obs.provider_unreachable_since is not None and state.teardown is None and obs.phase == "Accepted":
        deadlines.append(obs.provider_unreachable_since + timedelta(seconds=obs.keepalive_seconds))
    if step == "AwaitPodCIDR" and not state.pod_cidr_timed_out and state.accepted_at is not None:
        deadlines.append(state.accepted_at + timedelta(seconds=obs.pod_cidr_wait_timeout_seconds))
    if step == "AwaitProviderClean" and state.clean_wait_started is not None:
        deadlines.append(state.clean_wait_started + PROVIDER_CLEAN_TIMEOUT)
    ready = ready_deadline(obs, state)
    if ready is not None and ready > now:
        deadlines.append(ready)
    if not deadlines:
        return None
    return max(timedelta(seconds=1), min(deadlines) - now)


def render_details(provider_id: str, obs: AdvertisementObservation, state: AdvertisementState, step: Step, *,
                   read_at: datetime) -> str:  # fmt: skip
    """The Web UI's current details of `obs`, which the workflow read at `read_at`."""
    lines = [
        f"**Advertisement from `{provider_id}`** — phase **{obs.phase or 'none'}**"
        + (f" ({obs.reason})" if obs.reason else ""),
        "",
        f"- step: **{step}**" + (f" — teardown because {state.teardown}" if state.teardown else ""),
        f"- waiting for: {_waiting_for(step, state)}",
        f"- provider's PodCIDR here: {pod_cidr_text(obs.remote_remapped_pod_cidr)}",
        _expiry_text(obs.time_to_live, read_at),
        f"- virtual kubelet: {'running' if obs.virtual_kubelet_exists else 'absent'}"
        f" (created {state.virtual_kubelet_created}×), virtual node: {'present' if obs.virtual_node_exists else 'absent'}",
    ]
    if obs.resources:
        lines += ["", "| resource | advertised |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in sorted(obs.resources.items())]
    if state.admission_told:
        lines += ["", f"**unreachable**: torn down because this cluster could not reach `{provider_id}`; admission "
                      "backs off before it accepts its next Advertisement (1 min, doubling to 1 h for each such "
                      "teardown in a row: see the admission workflow)"]  # fmt: skip
    if state.stalled_until is not None:
        lines += ["", f"**no progress**: {step} ran and is due again ({state.stalls}× in a row): waiting for "
                      f"{_NO_PROGRESS.get(step, 'what it did to show')}; it runs again at the next change or at "
                      f"{state.stalled_until:%Y-%m-%d %H:%M:%S} UTC"]  # fmt: skip
    if state.last_error:
        lines += ["", f"**last failure** (retried at the next change or after a backoff): {state.last_error}"]
    if state.forced:
        outcome = state.provider_cleanup_outcome or (
            "not cleaned yet: tried again until " + (f"{state.provider_cleanup_until:%Y-%m-%d %H:%M:%S} UTC"
                                                     if state.provider_cleanup_until else "the teardown is done"))
        lines += ["", f"**forced unpeer**: torn down here without waiting for `{provider_id}`; "
                      f"its copies of our pods there: {outcome}"]  # fmt: skip
    if state.deleted:
        lines += ["", "| deleted | at |", "|---|---|"]
        lines += [f"| {what} | {when:%H:%M:%S.%f} |" for what, when in state.deleted.items()]
    return "\n".join(lines)


# What an acting step that shows no effect waits for (someone else's finalizer, usually).
_NO_PROGRESS: dict[str, str] = {
    "EnsureVirtualKubelet": "the virtual kubelet Deployment to exist (one being deleted, held by a finalizer, "
                            "counts as absent and cannot be applied again until it is gone)",
    "DeleteVirtualNode": "the virtual node to go (a finalizer may hold it)",
    "DeleteVirtualKubelet": "the virtual kubelet Deployment to go",
    "EnsureFinalizer": "the Advertisement to show its finalizer",
    "MarkDeleting": "the Advertisement to show phase Deleting",
    "ReleaseAdvertisement": "the Advertisement to be released",
    "RefuseNotReady": "the Advertisement to show its refusal",
}


def pod_cidr_text(remapped: str | None) -> str:
    """status.remoteRemappedPodCIDR as a person reads it: its "None" means the network module decided that no
    remapping is needed, which an empty field (not decided yet) must not be mistaken for."""
    if not remapped:
        return "not decided yet (waiting for the network module to set status.remoteRemappedPodCIDR)"
    if remapped == NO_REMAPPING:
        return "no remapping needed (it overlaps nothing here): pods' addresses are shown as they are"
    return f"remapped into {remapped}"


def _expiry_text(time_to_live: datetime | None, read_at: datetime) -> str:
    """Every push renews timeToLive without waking the workflow (it reads it again when its expiry timer fires),
    so the time it shows is the one it last read, and says so."""
    if time_to_live is None:
        return "- expires: —"
    return (f"- expires: {time_to_live:%Y-%m-%d %H:%M:%S} UTC as read at {read_at:%H:%M:%S} UTC (pushes renew it "
            "without waking this workflow; the Advertisement's spec.timeToLive is current)")  # fmt: skip


def _waiting_for(step: Step, state: AdvertisementState) -> str:
    return {
        "AwaitDecision": "the admission decision (policy, or a manual accept/refuse)",
        "AwaitPodCIDR": "the network module to set status.remoteRemappedPodCIDR"
        + (" (timed out; still waiting)" if state.pod_cidr_timed_out else ""),
        "AwaitProviderClean": "the virtual kubelet to report the provider namespace clean",
        "Steady": "changes to the Advertisement, its virtual kubelet or node; expiry"
        + ("" if state.ready_wait_started is None or state.node_was_ready else
           "; the virtual node to be Ready (virtualNodeReadyTimeoutSeconds)"),
    }.get(step, "nothing")


def after_step(state: AdvertisementState, step: Step, *, done: bool, now: datetime) -> AdvertisementState:
    """The state once `step` has run (`done`: it found something to do; only DeleteExpired can say no):
    what teardown deleted and when, the clean wait's start, the virtual kubelet's creations."""
    deleted = dict(state.deleted)
    update: dict[str, object] = {"deleted": deleted}
    if step == "DeleteExpired" and done:
        update["teardown"] = "Expired"  # nothing else to tear down: the run completes
    if step == "RefuseNotReady":
        update["not_ready_refused"] = True
    if step == "ReleaseAdvertisement" and state.teardown == "NotReady":
        # Kept, refused: the run waits for a decision again, and a new acceptance starts from the beginning.
        return state.model_copy(update={"deleted": deleted, "teardown": None, "not_ready_refused": False,
                                        "accepted_at": None, "pod_cidr_timed_out": False, "clean_wait_started": None,
                                        "ready_wait_started": None, "node_was_ready": False})  # fmt: skip
    if step == "DeleteVirtualNode":
        deleted["virtual-node"] = now
        update["clean_wait_started"] = now
    elif step == "DeleteVirtualKubelet":
        deleted["virtual-kubelet"] = now
    elif step == "ReleaseAdvertisement" or (step == "DeleteExpired" and done):
        deleted["advertisement"] = now
    elif step == "EnsureVirtualKubelet":
        update["virtual_kubelet_created"] = state.virtual_kubelet_created + 1
        if state.ready_wait_started is None:
            update["ready_wait_started"] = now
    return state.model_copy(update=update)


# One input per acting step, each the activity of the same name (snake case) in activities/consumer.py.
class EnsureFinalizerInput(_Model):
    advertisement: str


class EnsureVirtualKubeletInput(_Model):
    provider_id: str
    advertisement: str


class MarkDeletingInput(_Model):
    advertisement: str
    teardown: TeardownCause


class DeleteVirtualNodeInput(_Model):
    provider_id: str


class DeleteVirtualKubeletInput(_Model):
    provider_id: str


class ReleaseAdvertisementInput(_Model):
    advertisement: str
    teardown: TeardownCause


class CleanProviderInput(_Model):
    provider_id: str


class CleanProviderResult(_Model):
    cleaned: bool
    note: str


class DeleteExpiredInput(_Model):
    advertisement: str


class RefuseNotReadyInput(_Model):
    advertisement: str


class ManualDecision(_Model):
    advertisement: str
    decision: Literal["accept", "refuse"]
    reason: str = Field(min_length=1, max_length=256)


class Verdict(_Model):
    """What an admission pass wrote on an Advertisement that carries a decision by hand: the admission workflow
    signals it (`verdict`) to the Advertisement's workflow, whose accept or refuse update answers with it."""

    advertisement: str
    provider: str
    decision: Literal["accept", "refuse"]  # the decision by hand the pass read
    phase: str
    reason: str


# A provider torn down as unreachable is not accepted again for UNREACHABLE_BACKOFF_FIRST, doubled for each
# such teardown in a row up to UNREACHABLE_BACKOFF_MAX; one more than UNREACHABLE_MEMORY after the last
# starts the count again (a provider that stays up that long was not flapping).
UNREACHABLE_BACKOFF_FIRST = timedelta(minutes=1)
UNREACHABLE_BACKOFF_MAX = timedelta(hours=1)
UNREACHABLE_MEMORY = timedelta(hours=2)


class UnreachableTeardowns(_Model):
    """A provider's teardowns as unreachable in a row, as the admission workflow keeps them."""

    count: int = Field(ge=1)
    last: datetime

    @property
    def until(self) -> datetime:
        """Not accepted again before this."""
        backoff: timedelta = min(UNREACHABLE_BACKOFF_MAX, UNREACHABLE_BACKOFF_FIRST * 2 ** min(self.count - 1, 16))
        return self.last + backoff


def record_unreachable(records: dict[str, UnreachableTeardowns], provider: str,
                       now: datetime) -> dict[str, UnreachableTeardowns]:  # fmt: skip
    """The records once `provider` was torn down as unreachable at `now`; records older than UNREACHABLE_MEMORY
    are forgotten (so the map holds only providers flapping lately)."""
    kept = {p: r for p, r in records.items() if now - r.last <= UNREACHABLE_MEMORY}
    previous = kept.get(provider)
    kept[provider] = UnreachableTeardowns(count=previous.count + 1 if previous else 1, last=now)
    return kept


class AdmissionInput(_Model):
    cluster_id: str
    reconciles: int = 0
    # Carried over continue-as-new: providers backing off after teardowns as unreachable (models/admission.py
    # rule 6¾), by provider id.
    unreachable: dict[str, UnreachableTeardowns] = Field(default_factory=dict)
    # Carried over continue-as-new: the consumer's refusals kept past the Advertisements that carried them
    # (models/admission.py kept_refusals), by provider id, as the last pass returned them.
    refusals: dict[str, KeptRefusals] = Field(default_factory=dict)


class AdmissionResult(_Model):
    """What one admission pass decided (only changes), for the Web UI."""

    accepted: list[str] = Field(default_factory=list)
    refused: dict[str, str] = Field(default_factory=dict)  # advertisement -> reason
    pending: list[str] = Field(default_factory=list)
    total_accepted: int = 0
    maximum: int | None = None
    policy: str = ""
    # The earliest deadline of a manual decision still awaited (manualDecisionTimeoutSeconds): the workflow
    # passes again then, unasked.
    next_decision_deadline: datetime | None = None
    # Each decision written and what it was decided from (`tidepool explain advertisement`); bounded.
    records: list[AdmissionRecord] = Field(default_factory=list)
    records_omitted: int = 0
    # Every live Advertisement in arrival order once the pass's decisions are written (`tidepool simulate
    # admission`); None: not recorded (more than MAX_ADMISSION_ENTRIES).
    live: list[AdmissionEntry] | None = None
    # The refusals to keep for the next pass (models/admission.py kept_refusals), which the workflow hands it.
    kept_refusals: dict[str, KeptRefusals] = Field(default_factory=dict)
    # The decisions written on Advertisements that carry a decision by hand, which the workflow signals to
    # their AdvertisementWorkflows (none in 0.1.0's passes).
    verdicts: list[Verdict] = Field(default_factory=list)
