"""Namespace offloading (Liqo's NamespaceOffloading, issue 35): which consumer namespaces may run pods in
providers, on which providers, how, and under which name there.

- NamespaceOffloading (consumer side, namespaced, named `offloading`): a namespace's opt-in. Its controller in the
  consumer's worker mirrors the pod strategy into the namespace's label tidepool.io/offloading, which the
  consumer's admission policies read; each selected provider's virtual kubelet writes its own entry of
  `status.clusters` (server-side apply, one field manager per provider).
- RemoteNamespace (provider side, in the consumer's control namespace `tidepool-foreign-<consumer>`): a
  consumer's request for one namespace in the provider, named as the namespace it asks for. Only the
  provider writes its status; the provider makes the namespace, binds the consumer's identity there, and
  enforces Pod Security and the consumer's share of the offer in it.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from models.api.common import DNS_LABEL, ApiModel, KubernetesObject
from models.api.conditions import Condition

# How pods of an offloaded namespace may use the providers: as Liqo's podOffloadingStrategy.
PodOffloadingStrategy = Literal["LocalAndRemote", "Remote", "Local"]
# How the namespace is named in each provider: DefaultName (models.names.remote_namespace_default_name, which
# never collides), EnforceSameName (the consumer's name; refused where the provider has one it does not own for
# this consumer), SelectedName (spec.remoteNamespaceName).
NamespaceMappingStrategy = Literal["DefaultName", "EnforceSameName", "SelectedName"]
SELECTED_NAME_RULE = "remoteNamespaceName is required with namespaceMappingStrategy SelectedName, and only with it"
NAME_RULE = "a NamespaceOffloading must be named 'offloading' (one per namespace)"
MAPPING_IMMUTABLE_RULE = "namespaceMappingStrategy and remoteNamespaceName are immutable: unoffload and offload again"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


class SelectorRequirement(ApiModel):
    key: str = Field(min_length=1, max_length=317, pattern=LABEL_KEY)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list, max_length=64)


class ClusterSelector(ApiModel):
    """Virtual nodes' labels a provider must have (a label selector, ANDed); empty selects every provider."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    match_expressions: list[SelectorRequirement] = Field(default_factory=list, max_length=32)


class NamespaceOffloadingSpec(ApiModel):
    pod_offloading_strategy: PodOffloadingStrategy = "LocalAndRemote"
    namespace_mapping_strategy: NamespaceMappingStrategy = "DefaultName"
    remote_namespace_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS_LABEL)
    cluster_selector: ClusterSelector = Field(default_factory=ClusterSelector)

    @model_validator(mode="after")
    def _selected_name(self) -> Self:
        if (self.namespace_mapping_strategy == "SelectedName") != (self.remote_namespace_name is not None):
            raise ValueError(SELECTED_NAME_RULE)
        return self


# One selected provider's remote namespace, as its virtual kubelet last saw it.
RemoteNamespacePhase = Literal["Pending", "Ready", "Refused", "Deleting"]


class OffloadingCluster(ApiModel):
    cluster_id: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    remote_namespace: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    phase: RemoteNamespacePhase
    message: str = Field(default="", max_length=1024)


class NamespaceOffloadingStatus(ApiModel):
    observed_generation: int | None = Field(default=None, ge=0)
    clusters: list[OffloadingCluster] = Field(default_factory=list, max_length=256, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["clusterId"]})  # fmt: skip
    conditions: list[Condition] = Field(default_factory=list)


class NamespaceOffloading(KubernetesObject):
    KIND: ClassVar[str] = "NamespaceOffloading"
    PLURAL: ClassVar[str] = "namespaceoffloadings"
    SCOPE: ClassVar[str] = "Namespaced"
    spec: NamespaceOffloadingSpec = Field(default_factory=NamespaceOffloadingSpec)
    status: NamespaceOffloadingStatus | None = None


class RemoteNamespaceSpec(ApiModel):
    consumer_namespace: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL,
                                    description="The consumer's namespace whose pods run in this one.")  # fmt: skip


class RemoteNamespaceStatus(ApiModel):
    phase: RemoteNamespacePhase | None = None
    message: str = Field(default="", max_length=1024)
    conditions: list[Condition] = Field(default_factory=list)


class RemoteNamespace(KubernetesObject):
    KIND: ClassVar[str] = "RemoteNamespace"
    PLURAL: ClassVar[str] = "remotenamespaces"
    SCOPE: ClassVar[str] = "Namespaced"
    spec: RemoteNamespaceSpec
    status: RemoteNamespaceStatus | None = None
