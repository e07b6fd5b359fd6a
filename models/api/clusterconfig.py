"""ClusterConfig: one per cluster (named "tidepool"), the protocol's knobs that change without a restart."""

from __future__ import annotations

from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from models.api.common import DNS_LABEL, ApiModel, KubernetesObject
from models.api.conditions import Condition
from models.enforcement import PodSecurityLevel
from models.prices import PRICES_DESCRIPTION, Prices

MAX_ACCEPTABLE_ADVERTISEMENTS = 1_000_000
TTL_RULE = "advertisementTimeToLiveSeconds must be greater than advertisementPeriodSeconds"


class OutgoingConfig(ApiModel):
    """Provider side."""

    sharing_percentage: int = Field(default=30, ge=0, le=100, description="Share of spare capacity, in percent.")
    prices: Prices | None = Field(
        default=None, description=f"Carried in every Advertisement pushed. {PRICES_DESCRIPTION}"
    )
    enable_broadcaster: bool = Field(default=True, description="Advertise to foreign clusters at all.")
    advertisement_period_seconds: int = Field(default=600, ge=10, le=86400, description="Re-push period, seconds.")
    advertisement_time_to_live_seconds: int = Field(
        default=1800, ge=30, le=604800, description="How long a pushed Advertisement lives, seconds."
    )
    capacity_change_threshold_percent: int = Field(
        default=10, ge=1, le=100,
        description="Push early when a consumer's spare capacity moves by more than this, percent.",
    )  # fmt: skip
    # An early push costs three billable actions (signal, activity, timer). Nothing moves in the steady
    # state, so it keeps its two per period; under churn a minute bounds the cost per peering at three
    # a minute while consumers learn of lost capacity within a minute instead of a period.
    early_push_min_interval_seconds: int = Field(
        default=300, ge=10, le=86400,
        description="Least time between two early pushes to one consumer, seconds: bounds what pod churn costs.",
    )
    # Enforced by the provider's own API server (Pod Security Admission), whatever the consumer sends.
    pod_security_level: PodSecurityLevel = Field(default="baseline", description=(
        "The Pod Security Standard enforced on consumers' pods here (their namespace's pod-security.kubernetes.io "
        "labels, applied at each push): baseline, restricted or privileged (no check at all)."))  # fmt: skip

    @model_validator(mode="after")
    def _ttl_outlives_period(self) -> Self:
        if self.advertisement_time_to_live_seconds <= self.advertisement_period_seconds:
            raise ValueError(TTL_RULE)
        return self


class IncomingConfig(ApiModel):
    """Consumer side."""

    accept_policy: Literal["AutoAcceptMax", "Manual"] = "AutoAcceptMax"
    max_acceptable_advertisements: int = Field(default=5, ge=0, le=MAX_ACCEPTABLE_ADVERTISEMENTS)
    allowed_clusters: list[str] = Field(default_factory=list, description="Cluster ids; empty allows all.")
    denied_clusters: list[str] = Field(default_factory=list, description="Cluster ids; deny wins over allow.")
    pod_cidr_wait_timeout_seconds: int = Field(default=300, ge=1, le=86400, alias="podCIDRWaitTimeoutSeconds")
    manual_decision_timeout_seconds: int | None = Field(default=None, ge=60, le=30 * 86400, description=(
        "With acceptPolicy Manual: an Advertisement nobody accepts or refuses within this time is refused "
        "(DecisionTimedOut) until someone decides. Unset: it waits until it expires."))  # fmt: skip
    virtual_node_ready_timeout_seconds: int | None = Field(default=None, ge=30, le=86400, description=(
        "An accepted Advertisement whose virtual node is not Ready this long after its virtual kubelet was created "
        "(the PodCIDR wait not counted) is refused (VirtualNodeNotReady) and its virtual kubelet removed, until its "
        "offer changes or someone accepts it by hand. Unset: it waits."))  # fmt: skip
    max_prices: Prices | None = Field(default=None, description=(
        "The most this cluster pays per unit of each resource listed, in the units of outgoing.prices: an Advertisement "
        "asking more for any of them is refused (PriceTooHigh). A resource not listed is not capped; one the provider "
        "gives no price for is free."))  # fmt: skip


class KeepaliveConfig(ApiModel):
    threshold_failures: int = Field(default=3, ge=1, le=100)
    retry_seconds: int = Field(default=20, ge=1, le=3600)


GRACE_RULE = "unreachableGracePeriodSeconds must be at least probeIntervalSeconds"


class PoolConfig(ApiModel):
    """The super cluster pool, read in the tenant control plane by the pool's worker."""

    policy: Literal["spread", "pack"] = Field(default="spread", description=(
        "Where a namespace's slices go: spread balances the clusters' free share, pack fills the fewest clusters. "
        "A namespace's pool.tidepool.io/policy annotation overrides it."))  # fmt: skip
    probe_interval_seconds: int = Field(default=10, ge=1, le=300, description="How often each super cluster is probed.")
    unreachable_grace_period_seconds: int = Field(default=60, ge=1, le=86400, description=(
        "How long a super cluster fails its probes before it is Unreachable and its slices move: a shorter "
        "failure moves nothing."))  # fmt: skip
    headroom_percent: int = Field(default=0, ge=0, le=90, description=(
        "Share of every super cluster's allocatable kept free, to take the slices of a cluster that fails; "
        "a SuperCluster's spec.headroom adds to it."))  # fmt: skip

    @model_validator(mode="after")
    def _grace_covers_a_probe(self) -> Self:
        if self.unreachable_grace_period_seconds < self.probe_interval_seconds:
            raise ValueError(GRACE_RULE)
        return self


class ClusterConfigSpec(ApiModel):
    outgoing: OutgoingConfig = Field(default_factory=OutgoingConfig)
    incoming: IncomingConfig = Field(default_factory=IncomingConfig)
    keepalive: KeepaliveConfig = Field(default_factory=KeepaliveConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)


class ClusterConfigStatus(ApiModel):
    conditions: list[Condition] = Field(default_factory=list)


class ClusterConfig(KubernetesObject):
    KIND: ClassVar[str] = "ClusterConfig"
    PLURAL: ClassVar[str] = "clusterconfigs"
    spec: ClusterConfigSpec = Field(default_factory=ClusterConfigSpec)
    status: ClusterConfigStatus | None = None

    @classmethod
    def default(cls) -> ClusterConfig:
        return cls.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {}})


__all__ = ["DNS_LABEL", "ClusterConfig", "ClusterConfigSpec", "IncomingConfig", "KeepaliveConfig", "OutgoingConfig",
           "PoolConfig"]
