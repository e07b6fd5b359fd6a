"""SuperCluster: a member of the pool, registered in the tenant control plane."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from models.api.common import ApiModel, KubernetesObject, SecretReference
from models.api.conditions import Condition
from models.resources import Resources


class SuperClusterSpec(ApiModel):
    kube_config_ref: SecretReference
    headroom: Resources = Field(default_factory=Resources)


class SuperClusterStatus(ApiModel):
    conditions: list[Condition] = Field(default_factory=list)
    capacity: Resources | None = None
    allocatable: Resources | None = Field(default=None, description=(
        "Of its Ready, schedulable physical nodes (never a peering's virtual nodes), at the last probe."))  # fmt: skip
    failing_since: datetime | None = Field(default=None, description=(
        "When its probes began to fail; absent while they succeed. Kept here so that a restarted prober "
        "keeps counting the grace period."))  # fmt: skip


class SuperCluster(KubernetesObject):
    KIND: ClassVar[str] = "SuperCluster"
    PLURAL: ClassVar[str] = "superclusters"
    spec: SuperClusterSpec
    status: SuperClusterStatus | None = None
