"""Parts every tidepool kind shares: object metadata, Secret references, and the base model that maps
camelCase JSON to snake_case attributes and refuses unknown fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
CIDR_PATTERN = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$|^[0-9a-fA-F:]+/[0-9]{1,3}$"


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ObjectMeta(BaseModel):
    """The metadata tidepool reads; the API server's other fields are kept as they are."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    deletion_timestamp: datetime | None = None
    creation_timestamp: datetime | None = None
    owner_references: list[dict[str, Any]] = Field(default_factory=list)


class SecretReference(ApiModel):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)


class ObjectReference(ApiModel):
    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = None


class KubernetesObject(ApiModel):
    """A whole object as the API server serves it: apiVersion, kind, metadata, spec, status."""

    KIND: ClassVar[str] = ""
    PLURAL: ClassVar[str] = ""
    SCOPE: ClassVar[str] = "Cluster"  # or "Namespaced"

    api_version: str = "tidepool.io/v1alpha1"
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @classmethod
    def from_kubernetes(cls, obj: dict[str, Any]) -> Self:
        return cls.model_validate({"kind": cls.KIND, **obj})

    def to_kubernetes(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_apply(self) -> dict[str, Any]:
        """The object as its writer applies it (server-side apply): only the fields it set, so that it claims
        none it does not write (the defaults, the metadata's empty finalizers and ownerReferences)."""
        return {"apiVersion": self.api_version, "kind": self.KIND,
                **self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)}  # fmt: skip
