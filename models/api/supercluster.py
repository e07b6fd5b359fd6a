"""SuperCluster: a member of the pool, registered in the tenant control plane."""

from __future__ import annotations

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
    allocatable: Resources | None = None


class SuperCluster(KubernetesObject):
    KIND: ClassVar[str] = "SuperCluster"
    PLURAL: ClassVar[str] = "superclusters"
    spec: SuperClusterSpec
    status: SuperClusterStatus | None = None
