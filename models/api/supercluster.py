"""SuperCluster: a member of the pool, registered in the tenant control plane."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from models.api.common import ApiModel, KubernetesObject, SecretReference
from models.api.conditions import Condition
from models.api.offloading import LABEL_KEY
from models.resources import Resources

# privileged is refused: a pool's tenants do not trust each other, and a privileged pod reaches the node,
# and from there every other tenant's pods on it.
SuperClusterPodSecurity = Literal["baseline", "restricted"]
SYSTEM_PRIORITY_PREFIX = "system-"
SYSTEM_PRIORITY_RULE = (
    "priorityClasses.allowed and priorityClasses.default must not name a system- class: those are the super "
    "cluster's own, above every tenant's pods"
)
DEFAULT_PRIORITY_RULE = "priorityClasses.default must be one of priorityClasses.allowed"
PriorityClassName = Annotated[str, Field(min_length=1, max_length=253)]
TaintKey = Annotated[str, Field(min_length=1, max_length=317, pattern=LABEL_KEY)]


def _no_schema_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class PriorityClasses(ApiModel):
    """The priority classes of the super cluster that tenant pods may name; the same for every tenant."""

    allowed: list[PriorityClassName] = Field(default_factory=list, max_length=32, description=(
        "A tenant pod whose priorityClassName is one of these keeps it in the super cluster."))  # fmt: skip
    default: PriorityClassName | None = Field(default=None, description=(
        "The class of every other tenant pod's copy; none: the super cluster's global default."))  # fmt: skip

    @model_validator(mode="after")
    def _tenant_classes_only(self) -> Self:
        if any(name.startswith(SYSTEM_PRIORITY_PREFIX) for name in [*self.allowed, self.default or ""]):
            raise ValueError(SYSTEM_PRIORITY_RULE)
        if self.default is not None and self.default not in self.allowed:
            raise ValueError(DEFAULT_PRIORITY_RULE)
        return self


class Tolerations(ApiModel):
    """The taints of the super cluster's nodes that tenant pods may tolerate; the same for every tenant."""

    allowed: list[TaintKey] = Field(default_factory=list, max_length=32, description=(
        "Taint keys (a GPU node's nvidia.com/gpu, say) whose tolerations a tenant pod keeps in the super cluster; "
        "every other toleration is left out of its copy, so that no tenant's pod runs on the nodes its owner "
        "keeps apart (control plane, system or other dedicated nodes)."))  # fmt: skip


class SuperClusterSpec(ApiModel):
    kube_config_ref: SecretReference
    headroom: Resources = Field(default_factory=Resources)
    # No default in the CRD (json_schema_extra drops it): the API server would write it into every
    # SuperCluster, which a 0.1.0 worker, refusing unknown fields, could no longer read while it is upgraded.
    pod_security: SuperClusterPodSecurity = Field(default="baseline", json_schema_extra=_no_schema_default,
                                                  description=(
        "The Pod Security level every tenant namespace enforces in this super cluster (enforce, warn and audit); "
        "baseline when unset. privileged is refused: the pool's tenants do not trust each other."))  # fmt: skip
    priority_classes: PriorityClasses = Field(default_factory=PriorityClasses, description=(
        "The priority classes tenant pods may name here; any other (or none) gets the default."))  # fmt: skip
    tolerations: Tolerations = Field(default_factory=Tolerations, description=(
        "The taints tenant pods may tolerate here; a node with any other NoSchedule or NoExecute taint is not "
        "counted in the cluster's allocatable."))  # fmt: skip


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
