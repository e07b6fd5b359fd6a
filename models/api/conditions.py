"""Status conditions, the Kubernetes convention: one type per question, a closed CamelCase reason, a
message for people, and a lastTransitionTime that moves only when the status does (kube.status
.write_status writes them, merged by kube.objects.with_condition).

This module is the one vocabulary: every question tidepool answers on an object has a closed type here
with its closed reasons, and every writer builds its condition with `condition(...)`, which refuses a
reason that does not belong to the type. Events reuse the same reasons (a condition's reason is what
happened; its Event says so once) plus the few that are only Events (`EventReason`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from models.api.common import ApiModel

REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

# Advertisement.status.conditions[type=Accepted]: the admission decision (models/admission.py decides).
AcceptedReason = Literal["WithinMaximum", "ManuallyAccepted"]
RefusedReason = Literal["MaxReached", "Denied", "NotAllowed", "Invalid", "ManuallyRefused",
                        "UnexpectedCredentials", "PriceTooHigh", "DecisionTimedOut",
                        "VirtualNodeNotReady", "UnreachableBackoff"]  # fmt: skip
PendingReason = Literal["AwaitingManualDecision"]
AdmissionReason = Literal[AcceptedReason, RefusedReason, PendingReason]
# Advertisement.status.conditions[type=Ready]: False once teardown begins.
AdvertisementReadyReason = Literal["Deleting"]
# Advertisement.status.conditions[type=PodCIDRReady]: the network module's remapping.
PodCIDRReason = Literal["RemappingTimedOut"]
# Advertisement.status.conditions[type=VirtualKubeletReady]: its Deployment exists.
VirtualKubeletReason = Literal["Created"]
# PeeringRequest.status.conditions[type=Ready]: the peering's phase (models/api/peeringrequest.py).
PeeringReadyReason = Literal["Pending", "Advertised", "Accepted", "Refused", "Deleting", "Unreachable", "Withdrawn"]
# ... and why an Unreachable peering is, when only its operator can mend it (the phase stays Unreachable).
# InvalidCredentials: the foreign cluster's kubeconfig was refused (models/kubeconfig.py), the field named.
PeeringCredentialsReason = Literal["CredentialsExpired", "InvalidCredentials"]
# The virtual node's Ready condition (a Node condition, written by the virtual kubelet).
# InvalidCredentials: the provider's kubeconfig was refused and no earlier one was accepted (models/kubeconfig.py).
NodeReadyReason = Literal["KubeletReady", "PodCIDRNotSet", "ProviderUnreachable", "InvalidCredentials"]
# A tenant namespace's placement (the pool scheduler writes it as an annotation: namespaces have no status
# of ours).
PlacedReason = Literal["Scheduled", "InvalidSlice", "InsufficientCapacity", "InvalidPolicy", "WaitingForCluster"]
# SuperCluster.status.conditions[type=Ready]: the pool's prober (models/pool/health.py). True while it
# answers, or fails for less than the grace period (ProbeFailing: nothing moves on a blip); False past it.
SuperClusterReadyReason = Literal["ProbeSucceeded", "ProbeFailing", "Unreachable", "NoReadyNode"]
# A tenant pod of the pool, as the pool scheduler writes it (models/pool/moves.py): the condition
# pool.tidepool.io/SuperClusterReady (whether the super cluster it is annotated to runs it), the pod's Ready
# while it is recreated elsewhere, and status.reason (the STATUS column of `kubectl get pods`).
PoolPodReason = Literal["SuperClusterReady", "SuperClusterUnreachable", "Recreating"]
# A tenant pod's PodScheduled, False when it fits in none of its namespace's super clusters.
PodScheduledReason = Literal["Unschedulable", "SuperClusterRefused"]
POD_SUPER_CLUSTER_CONDITION: Final = "pool.tidepool.io/SuperClusterReady"
# A consumer pod bound to a virtual node, as its virtual kubelet writes it: False while the provider's API
# server refuses the pod's copy (its Pod Security level, its quota, an admission policy); gone once a copy is made.
ProviderAdmittedReason = Literal["ProviderRefused", "NamespaceNotReady"]
# NamespaceOffloading.status.conditions[type=Ready], written by the consumer's offloading controller.
OffloadingReadyReason = Literal["RemoteNamespacesReady", "RemoteNamespacesPending", "RemoteNamespaceRefused",
                                "NoClusterSelected", "DrainBlocked"]  # fmt: skip
# RemoteNamespace.status.conditions[type=Ready], written by the provider.
RemoteNamespaceReadyReason = Literal["Created", "NameTaken", "NameReserved", "NameInvalid", "Pending", "Deleting"]
POD_PROVIDER_CONDITION: Final = "tidepool.io/ProviderAdmitted"
# Tenant.status.conditions[type=Ready], written by the pool's pass: whether it reached the tenant's control plane.
TenantReadyReason = Literal["Reachable", "Unreachable", "InvalidKubeconfig"]

ConditionType = Literal["Accepted", "Ready", "PodCIDRReady", "VirtualKubeletReady", "Placed", "PodScheduled",
                        "pool.tidepool.io/SuperClusterReady", "tidepool.io/ProviderAdmitted"]  # fmt: skip
# What each writer may say, by the object it writes on; `condition` checks a reason against its type.
REASONS: dict[str, frozenset[str]] = {
    "Accepted": frozenset(get_args(AcceptedReason) + get_args(RefusedReason) + get_args(PendingReason)),
    "Ready": frozenset(get_args(AdvertisementReadyReason) + get_args(PeeringReadyReason) + get_args(NodeReadyReason)
                       + get_args(PeeringCredentialsReason) + get_args(SuperClusterReadyReason)
                       + get_args(PoolPodReason) + get_args(OffloadingReadyReason)
                       + get_args(RemoteNamespaceReadyReason) + get_args(TenantReadyReason)),
    "PodCIDRReady": frozenset(get_args(PodCIDRReason)),
    "VirtualKubeletReady": frozenset(get_args(VirtualKubeletReason)),
    "Placed": frozenset(get_args(PlacedReason)),
    "PodScheduled": frozenset(get_args(PodScheduledReason)),
    POD_SUPER_CLUSTER_CONDITION: frozenset(get_args(PoolPodReason)),
    POD_PROVIDER_CONDITION: frozenset(get_args(ProviderAdmittedReason)),
}

# Reasons that only Events carry: a moment, not a state.
EventReason = Literal[
    "VirtualKubeletCreated",  # the consumer created (or re-created) a virtual kubelet Deployment
    "Expired",  # an Advertisement's timeToLive passed before it was accepted: deleted
    "PodCIDRNotRemapped",  # the network module could not remap a provider's PodCIDR
    "FailedScheduling",  # a pool pod fits in none of its namespace's super clusters
    "Draining",  # a pool namespace's slices leave super clusters: its pods move before anything is removed
    "MovedPod",  # a pool pod is recreated on another super cluster of its namespace
    "MoveFinished",  # every moved pod of a pool namespace runs: the old clusters drop their copies
    "ConsumerSilent",  # a consumer's virtual kubelet stopped renewing its keepalive: the provider deleted its copies
    "ProviderReportedForeignIP",  # a copy's status named an address outside its provider's PodCIDR: not shown
    "ReflectedEventsDropped",  # more Events about a copy than a pod's budget: the rest counted, not shown
    "IngressHostTaken",  # a tenant's Ingress asks for a host another tenant's copy holds in a super cluster
    "EndpointRefused",  # a tenant's own endpoints name an address of a super cluster's networks not its own
]

# Every reason a tidepool Event may carry: what a condition says, or a moment.
Reason = Literal[AdmissionReason, AdvertisementReadyReason, PodCIDRReason, VirtualKubeletReason, PeeringReadyReason,
                 NodeReadyReason, PlacedReason, EventReason, PeeringCredentialsReason,
                 SuperClusterReadyReason, PoolPodReason, PodScheduledReason, ProviderAdmittedReason,
                 OffloadingReadyReason, RemoteNamespaceReadyReason, TenantReadyReason]  # fmt: skip


class ConditionValue(BaseModel):
    """A condition before it is written: kube.status.write_status adds lastTransitionTime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: ConditionType
    status: bool
    reason: str = Field(pattern=REASON_PATTERN)
    message: str = Field(default="", max_length=32768)


def condition(type: ConditionType, status: bool, reason: str, message: str = "") -> ConditionValue:
    """The one way to build a condition: a reason outside its type's closed list is a bug, said at once."""
    if reason not in REASONS[type]:
        raise ValueError(f"condition {type}: reason {reason!r} is not one of {sorted(REASONS[type])}")
    return ConditionValue(type=type, status=status, reason=reason, message=message)


# A condition as stored on an object, as the CRDs' schemas describe it (no docstring: it would enter them).
class Condition(ApiModel):
    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1, max_length=1024, pattern=REASON_PATTERN)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime
    observed_generation: int | None = Field(default=None, ge=0)
