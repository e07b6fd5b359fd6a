"""The provider's peering, as data: the workflow's input, the state it carries across continue-as-new,
what a push reports, and the status users query. Also the pure decisions of the loop (push or withdraw,
when to push next, how to back off) and the markdown the Web UI shows. Used by workflows/peering.py and
activities/peering.py.

None of these models may hold a token or kubeconfig content: the Web UI shows every workflow input,
result, signal and query. They carry references to Secrets instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models.api.common import SecretReference
from models.api.peeringrequest import PeeringRequestPhase
from models.resources import Resources

# Forced: `tidepool unpeer --force`, for a foreign cluster that may be gone (the home side first, at once).
WithdrawReason = Literal["BroadcasterDisabled", "PeeringRequestDeleted", "Requested", "Forced"]

CLUSTER_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Push(_Model):
    """Push the Advertisement, sharing this percentage of the home cluster."""

    model_config = ConfigDict(frozen=True)

    sharing_percentage: int = Field(ge=0, le=100)


class Withdraw(_Model):
    """Withdraw the peering instead of pushing. Also what push_advertisement returns then."""

    model_config = ConfigDict(frozen=True)

    reason: WithdrawReason


PushDecision = Push | Withdraw


def decide_push(
    *, peering_request_gone: bool, broadcaster_enabled: bool, requested_percentage: int | None,
    configured_percentage: int, forced: bool = False,
) -> PushDecision:
    """What a push does, from what it read: a deleted PeeringRequest or a disabled broadcaster withdraws
    (the request first: its deletion waits for the withdrawal; `forced`, as `tidepool unpeer --force` marked
    it); otherwise the workflow's percentage, if it has one (a signal or an update set it), overrides the
    ClusterConfig's."""
    if peering_request_gone:
        return Withdraw(reason="Forced" if forced else "PeeringRequestDeleted")
    if not broadcaster_enabled:
        return Withdraw(reason="BroadcasterDisabled")
    return Push(sharing_percentage=configured_percentage if requested_percentage is None else requested_percentage)


class PushResult(_Model):
    """What one push did on the foreign cluster."""

    advertisement: str
    advertised: Resources
    allocatable: Resources
    sharing_percentage: int
    # The rest of the offer's derivation (`tidepool explain peering`, `tidepool simulate peering`).
    used: Resources = Field(description="Requests of the pods counted against the offer.")
    consumer_own: Resources = Field(description="Requests of the consumer's own offloaded pods here, not counted against it.")
    config_generation: int
    period_seconds: int
    capacity_change_threshold_percent: int
    timestamp: datetime
    time_to_live: datetime
    foreign_phase: str | None = None
    remote_remapped_pod_cidr: str | None = None
    configured_percentage: int | None = Field(
        default=None, ge=0, le=100, description="The ClusterConfig's sharing percentage, as the push read it."
    )
    access_verified_until: datetime | None = Field(
        default=None, description="Until then a push asked for by a signal writes only the Advertisement "
        "(models.credentials.access_verified_until); None: the next push ensures the foreign access first.",
    )  # fmt: skip


class ForeignDecision(_Model):
    """The foreign cluster's decision on our Advertisement, as last read (`foreign_decision`). Frozen, so
    hashable: the decision watch's key is this very model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    phase: str | None = None
    reason: str | None = None
    remote_remapped_pod_cidr: str | None = None
    exists: bool = True


class PeeringState(_Model):
    """Everything the loop knows, carried over continue-as-new."""

    # The peering's own percentage, what each push asks for: set only by the input, the signal
    # `set_sharing_percentage` or the update `update_sharing_percentage` (null drops it); None follows the
    # ClusterConfig. What a push used is in `last_push`, never fed back here.
    sharing_percentage_override: int | None = Field(default=None, ge=0, le=100)
    config_generation: int = 0
    phase: PeeringRequestPhase = "Pending"
    pushes: int = 0
    last_push: PushResult | None = None
    foreign: ForeignDecision | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    foreign_changed: bool = False  # the worker's watch saw the decision move: read it once
    next_push: datetime | None = None
    push_requested: bool = False
    pushes_started: int = 0  # attempts begun, failed ones included: an update waits for its own
    pushes_finished: int = 0
    # A forced withdrawal (`tidepool unpeer --force`) that has cleaned at home: until when it tries the
    # foreign side again (its last Advertisement's expiry), and how that ended (None while it tries).
    foreign_cleanup_until: datetime | None = None
    foreign_cleanup_outcome: str | None = None
    # The uid of a PeeringRequest made again while this peering withdrew (issue 34): the run continues as a
    # new peering for it once the withdrawal is done, instead of completing.
    requested_again: str | None = None


class PeeringInput(_Model):
    """Start a peering with this, from the worker's PeeringRequest watcher or from the `temporal` CLI:

    temporal workflow start --type PeeringWorkflow --task-queue tidepool-<home> --workflow-id peering-<foreign>@<home>
      --input '{"foreign_cluster_id": "<foreign>", "kube_config_ref": {"name": "...", "namespace": "..."}}'
    """

    foreign_cluster_id: str = Field(pattern=CLUSTER_ID_PATTERN, max_length=63)
    kube_config_ref: SecretReference = Field(
        description="Secret in the home cluster with key 'kubeconfig' for the foreign one."
    )
    peering_request: str | None = Field(default=None, description="PeeringRequest whose deletion withdraws.")
    sharing_percentage: int | None = Field(default=None, ge=0, le=100, description="Overrides the ClusterConfig's.")
    state: PeeringState | None = Field(default=None, description="Carried over by continue-as-new; leave unset.")
    unreachable_backoff_max_seconds: int | None = Field(
        default=None, ge=1,
        description="Longest wait between attempts to reach the foreign cluster, in seconds; the worker passes its "
        "TIDEPOOL_PROVIDER_UNREACHABLE_BACKOFF_MAX_SECONDS, unset means the default (300).",
    )  # fmt: skip
    home_cluster_id: str | None = Field(
        default=None, pattern=CLUSTER_ID_PATTERN, max_length=63,
        description="The provider's own cluster id, shown as the HomeCluster search attribute; the worker sets it.",
    )  # fmt: skip
    peering_request_uid: str | None = Field(
        default=None, max_length=64,
        description="The uid of the PeeringRequest this peering serves; the worker sets it. A request made again "
        "under the same name (a new uid) while this one withdraws continues it as a new peering.",
    )  # fmt: skip


class PushRequest(_Model):
    foreign_cluster_id: str
    kube_config_ref: SecretReference
    peering_request: str | None
    sharing_percentage: int | None
    phase: PeeringRequestPhase
    # A push the period made (or a retry) re-ensures the foreign access; one a signal asked for (a new
    # percentage, moved capacity, a decision to re-read) writes the Advertisement alone while the last
    # push's `access_verified_until` holds. The defaults (a push made outside the workflow) ensure everything.
    periodic: bool = True
    access_verified_until: datetime | None = None
    # The ClusterConfig generation the last push read: a push that finds a newer one applies what the
    # ClusterConfig sets in the foreign namespace (its Pod Security level) even when it skips the access check.
    # None: this push does.
    config_generation: int | None = None


class DecisionRequest(_Model):
    foreign_cluster_id: str
    kube_config_ref: SecretReference
    peering_request: str | None
    phase: PeeringRequestPhase


class WithdrawRequest(_Model):
    foreign_cluster_id: str
    kube_config_ref: SecretReference
    peering_request: str | None
    reason: WithdrawReason
    skip_foreign: bool = Field(default=False, description="Clean only the home side (the foreign one is gone).")
    hold_credentials: bool = Field(default=False, description=(
        "Keep the credentials Secret past the PeeringRequest (a finalizer) for a foreign cleaning still to come."))
    peering_request_uid: str | None = Field(default=None, max_length=64, description=(
        "The uid of the PeeringRequest withdrawn: one of another uid under its name is a new peering's, not touched."))


class CleanForeignRequest(_Model):
    foreign_cluster_id: str
    kube_config_ref: SecretReference


class CleanForeignResult(_Model):
    cleaned: bool
    note: str = ""


class WithdrawResult(_Model):
    foreign_cleaned: bool
    home_cleaned: bool
    note: str = ""


class PeeringStatus(_Model):
    """What `temporal workflow query --name status` returns."""

    foreign_cluster_id: str
    phase: PeeringRequestPhase
    sharing_percentage: int | None = Field(description="The effective percentage, from the last push.")
    pushes: int
    advertised: Resources | None
    last_push: datetime | None
    next_push: datetime | None
    foreign_phase: str | None
    remote_remapped_pod_cidr: str | None
    last_error: str | None
    sharing_percentage_override: int | None = Field(
        default=None, description="The peering's own percentage, if it has one; None follows the ClusterConfig."
    )


def sharing_percentage_problem(value: object) -> str | None:
    """Why `value` cannot be a sharing percentage override, or None (null drops the override). Signals and
    updates take their value untyped and ask this: typed as int, the data converter would turn `true` into 1
    and "50" into 50 first."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100):
        return f"sharing_percentage must be an integer between 0 and 100, got {value!r} (null follows the ClusterConfig)"
    return None


def phase_after_push(foreign: ForeignDecision | None) -> PeeringRequestPhase:
    """The peering's phase once a push went through, from the foreign cluster's decision."""
    if foreign is None or not foreign.exists:
        return "Advertised"
    if foreign.phase in ("Accepted", "Refused", "Deleting"):
        return foreign.phase  # type: ignore[return-value]
    return "Advertised"


def foreign_decision(advertisement: Mapping[str, Any] | None) -> ForeignDecision:
    """What the peering decides on in its Advertisement on the foreign cluster: whether it exists, the
    phase, its reason and the remote remapped PodCIDR. The activities read it so, and the worker's watch
    compares it so (its key is this, absent or not), so that what wakes the peering and what the peering
    reads cannot drift apart. The timestamp and TTL that every push writes, and the rest of the status,
    are left out: they wake no workflow. A value that is not a string (the consumer's cluster writes the
    status) reads as none."""
    if advertisement is None:
        return ForeignDecision(exists=False)
    status = advertisement.get("status")
    status = status if isinstance(status, Mapping) else {}
    return ForeignDecision(phase=_text(status.get("phase")), reason=_text(status.get("reason")),
                           remote_remapped_pod_cidr=_text(status.get("remoteRemappedPodCIDR")))  # fmt: skip


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# The share of a period by which a push may come early. Peerings started together (a thousand PeeringRequests
# applied at once, a worker back after an outage) would otherwise push together every period for ever, as
# one burst at the API servers; drawn anew at each push, the early starts spread them apart within a few
# periods. Early, never late: the Advertisement's time to live counts on a push at least every period.
PERIOD_JITTER = 0.1


def jittered_period(period_seconds: int, draw: float) -> timedelta:
    """The wait until the next periodic push: the period, shortened by up to PERIOD_JITTER of it as
    `draw` (uniform in [0, 1), the workflow's deterministic random) says."""
    if not 0 <= draw < 1:
        raise ValueError(f"draw must be in [0, 1), got {draw}")
    return timedelta(seconds=period_seconds * (1 - PERIOD_JITTER * draw))


def backoff_seconds(failures: int, *, ceiling: int, base: int = 5) -> int:
    """Exponential backoff, base * 2^(failures-1), never above `ceiling`: an unreachable foreign cluster
    is retried for ever, but never in a tight loop."""
    if failures <= 0:
        return 0
    return int(min(ceiling, base * 2 ** min(failures - 1, 20)))


def render_details(state: PeeringState, *, foreign_cluster_id: str) -> str:
    """The markdown the Web UI shows as the workflow's current details."""
    push = state.last_push
    lines = [
        f"**Peering with `{foreign_cluster_id}`** — phase **{state.phase}**",
        "",
        f"- sharing percentage: {_or_dash(push.sharing_percentage if push else None, '%')} "
        f"({_percentage_owner(state)})",
        f"- pushes: {state.pushes}",
    ]
    if push is not None:
        lines.append(f"- last push: {push.timestamp:%Y-%m-%d %H:%M:%S} UTC (expires {push.time_to_live:%H:%M:%S})")
    if state.next_push is not None:
        lines.append(f"- next push: {state.next_push:%Y-%m-%d %H:%M:%S} UTC")
    foreign = state.foreign
    if foreign is not None:
        reason = f" ({foreign.reason})" if foreign.reason else ""
        lines.append(f"- foreign decision: {foreign.phase or 'none yet'}{reason}")
        if foreign.remote_remapped_pod_cidr:
            lines.append(f"- remote remapped PodCIDR: {foreign.remote_remapped_pod_cidr}")
    if state.last_error:
        lines.append(f"- ⚠ last error (attempt {state.consecutive_failures}): {state.last_error}")
    if state.foreign_cleanup_until is not None:
        lines.append("- forced unpeer: cleaned at home (access revoked, PeeringRequest released)")
        lines.append(f"- on `{foreign_cluster_id}`: " + (state.foreign_cleanup_outcome or (
            "not cleaned yet (its Advertisement and credentials Secret): tried again until "
            f"{state.foreign_cleanup_until:%Y-%m-%d %H:%M:%S} UTC, when the Advertisement expires; after that its "
            "own TTL and keepalive clean it")))  # fmt: skip
    if state.requested_again is not None:
        lines.append(f"- peered again (PeeringRequest uid {state.requested_again}): a new peering begins once this "
                     "withdrawal is done")  # fmt: skip
    if push is not None:
        lines += ["", "| resource | allocatable | advertised |", "|---|---|---|"]
        for name in sorted(set(push.allocatable) | set(push.advertised)):
            allocatable = push.allocatable.only([name]).to_kubernetes().get(name, "0")
            advertised = push.advertised.only([name]).to_kubernetes().get(name, "0")
            lines.append(f"| {name} | {allocatable} | {advertised} |")
    return "\n".join(lines)


def _percentage_owner(state: PeeringState) -> str:
    if state.sharing_percentage_override is not None:
        return f"this peering's override, {state.sharing_percentage_override}%"
    return "the ClusterConfig's"


def _or_dash(value: object, suffix: str = "") -> str:
    return "—" if value is None else f"{value}{suffix}"


def next_wait(*, state: PeeringState, now: datetime, next_push: datetime, unreachable_max_seconds: int) -> timedelta:
    """How long the loop sleeps before it wakes on its own: until the next push, or sooner to retry an
    unreachable cluster. A pending foreign decision is not polled: the worker's watch signals when it moves."""
    if state.consecutive_failures:
        # The failed push is retried after the backoff, whatever the schedule says; never later than a
        # period, so that a cluster that comes back is advertised to again on the first cycle after.
        ceiling = unreachable_max_seconds
        if state.last_push is not None:
            ceiling = min(ceiling, state.last_push.period_seconds)
        return timedelta(seconds=backoff_seconds(state.consecutive_failures, ceiling=ceiling))
    return max(timedelta(0), next_push - now)
