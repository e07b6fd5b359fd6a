"""Advertisement: what a provider offers, written by it on the foreign (consumer) cluster."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, field_validator, model_validator

from models.api.common import (
    CIDR_PATTERN,
    DNS_LABEL,
    ApiModel,
    KubernetesObject,
    ObjectMeta,
    ObjectReference,
    SecretReference,
)
from models.api.conditions import Condition
from models.api.reading import Reading, read_leniently
from models.names import (
    LABEL_MANAGED_BY,
    LABEL_PROVIDER,
    MANAGED_BY,
    SYSTEM_NAMESPACE,
    advertisement_name,
    credentials_secret_name,
)
from models.network import pod_cidr_problem
from models.prices import PRICES_DESCRIPTION, Prices
from models.resources import NonNegativeResources, Resources
from models.times import ZonedTime

AdvertisementPhase = Literal["Pending", "Accepted", "Refused", "Deleting"]
TTL_RULE = "timeToLive must be later than timestamp"


class ResourceQuotaSpec(ApiModel):
    # What the offer holds: no amount below zero. An empty or all-zero offer is well formed (a provider sharing 0%
    # writes one); the consumer's admission refuses it as offering nothing.
    hard: NonNegativeResources


class LimitRangeItem(ApiModel):
    type: str
    max: Resources | None = None
    min: Resources | None = None
    default: Resources | None = None
    default_request: Resources | None = None


class LimitRangeSpec(ApiModel):
    limits: list[LimitRangeItem] = Field(default_factory=list)


class NetworkInfo(ApiModel):
    pod_cidr: str = Field(alias="podCIDR", pattern=CIDR_PATTERN)
    gateway_ip: str | None = Field(default=None, alias="gatewayIP")

    # Before the pattern (which the CRD holds too): a PodCIDR that is no CIDR, or none a pod can have, is named
    # for what it is ("IPv4-mapped", "not a CIDR: ...") rather than as a pattern missed.
    @field_validator("pod_cidr", mode="before")
    @classmethod
    def _usable(cls, value: Any) -> Any:
        if value is not None and (problem := pod_cidr_problem(value)):
            raise ValueError(problem)
        return value


class AdvertisementSpec(ApiModel):
    cluster_id: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, alias="clusterId")
    cluster_name: str | None = None
    resource_quota: ResourceQuotaSpec
    limit_range: LimitRangeSpec | None = None
    prices: Prices | None = Field(default=None, description=PRICES_DESCRIPTION)
    network: NetworkInfo
    kube_config_ref: SecretReference = Field(
        description="The provider's credentials Secret here; only the protocol's (tidepool-system/"
        "tidepool-kubeconfig-<clusterId>) is accepted, and the virtual kubelet always uses that one."
    )
    timestamp: ZonedTime
    time_to_live: ZonedTime

    @model_validator(mode="after")
    def _lives_after_its_timestamp(self) -> Self:
        if self.time_to_live <= self.timestamp:
            raise ValueError(TTL_RULE)
        return self


class AdvertisementStatus(ApiModel):
    phase: AdvertisementPhase | None = None
    reason: str | None = None
    remote_remapped_pod_cidr: str | None = Field(default=None, alias="remoteRemappedPodCIDR")
    remapped_for_pod_cidr: str | None = Field(
        default=None, alias="remappedForPodCIDR",
        description="The spec.network.podCIDR the network module's remoteRemappedPodCIDR was decided for; pod IPs "
        "are shown only inside it, so an edited spec.network.podCIDR counts only once decided again.",
    )  # fmt: skip
    local_remapped_pod_cidr: str | None = Field(default=None, alias="localRemappedPodCIDR")
    vk_reference: ObjectReference | None = None
    vnode_reference: ObjectReference | None = None
    # Pending a manual decision under manualDecisionTimeoutSeconds: when it is refused if nobody decides.
    decision_deadline: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Advertisement(KubernetesObject):
    KIND: ClassVar[str] = "Advertisement"
    PLURAL: ClassVar[str] = "advertisements"
    spec: AdvertisementSpec
    status: AdvertisementStatus | None = None


def offered_advertisement(*, provider_id: str, offered: Resources, pod_cidr: str, prices: Resources | None,
                          timestamp: datetime, time_to_live: datetime, annotations: dict[str, str]) -> Advertisement:  # fmt: skip
    """The Advertisement a provider pushes to a consumer: its offer, its network, the Secret its credentials are
    in, and how long the offer holds. Validated here, by the model that generates the CRD, before it leaves."""
    return Advertisement(
        kind=Advertisement.KIND,
        metadata=ObjectMeta(name=advertisement_name(provider_id), annotations=annotations,
                            labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: provider_id}),  # fmt: skip
        spec=AdvertisementSpec(
            clusterId=provider_id, resource_quota=ResourceQuotaSpec(hard=offered), prices=prices,
            network=NetworkInfo(podCIDR=pod_cidr),
            kube_config_ref=SecretReference(name=credentials_secret_name(provider_id), namespace=SYSTEM_NAMESPACE),
            timestamp=timestamp, time_to_live=time_to_live),
    )  # fmt: skip


def read_advertisement(raw: Any) -> Reading[Advertisement]:
    """An Advertisement as its provider wrote it, read leniently (models/api/reading.py): all but its status,
    which is the consumer's own record, read field by field by admission."""
    body = {key: value for key, value in raw.items() if key != "status"} if isinstance(raw, Mapping) else raw
    return read_leniently(Advertisement, body)
