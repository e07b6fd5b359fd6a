"""PeeringRequest: a foreign cluster asks this (home) cluster for resources; named after its cluster id."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from models.api.common import DNS_LABEL, ApiModel, KubernetesObject, SecretReference
from models.api.conditions import Condition, PeeringReadyReason

# The peering's phase, which its Ready condition gives as the reason (one list for both); the peering
# workflow carries it too (models/peering.py).
PeeringRequestPhase = PeeringReadyReason


class ClusterIdentity(ApiModel):
    cluster_id: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, alias="clusterId")
    cluster_name: str | None = Field(default=None, max_length=253)


class PeeringRequestSpec(ApiModel):
    cluster_identity: ClusterIdentity
    kube_config_ref: SecretReference = Field(description="Secret here, key 'kubeconfig', for the foreign cluster.")


class PeeringRequestStatus(ApiModel):
    phase: PeeringRequestPhase | None = None
    advertisement_status: str | None = None
    remote_remapped_pod_cidr: str | None = Field(default=None, alias="remoteRemappedPodCIDR")
    last_push_time: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)


class PeeringRequest(KubernetesObject):
    KIND: ClassVar[str] = "PeeringRequest"
    PLURAL: ClassVar[str] = "peeringrequests"
    spec: PeeringRequestSpec
    status: PeeringRequestStatus | None = None
