"""Tenant: a tenant control plane that shares the pool, registered in the pool's management cluster (where
its SuperClusters are) by `tidepool pool add-tenant`. The pool's scheduler places the namespaces of every
Tenant, and each super cluster's syncer copies them down, from the control plane its kubeconfig reaches.

The kubeconfig is the tenant's, and the tenant is not trusted: it is read as a peer kubeconfig (server, CA,
token; anything else refused, kube/clients.py), and the identity it holds is the one `add-tenant` minted in
the tenant's control plane with what the pool does there and nothing more (deploy/pool/tenant/rbac.yaml)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from models.api.common import ApiModel, KubernetesObject, SecretReference
from models.api.conditions import Condition
from models.names import TENANT_SECRETS_NAMESPACE
from models.resources import Resources

# A Tenant's name is a label value on everything made for it in a super cluster (models/names.py LABEL_TENANT).
NAME_RULE = "metadata.name must be a DNS label (lower case letters, digits and '-', at most 63 characters)"
MAX_WEIGHT = 1000
SECRET_RULE = (f"spec.kubeConfigRef.namespace must be {TENANT_SECRETS_NAMESPACE}: the one namespace of tenants' "
               "kubeconfigs, which the pool's syncers may read (and no other Secret)")  # fmt: skip


class TenantSpec(ApiModel):
    kube_config_ref: SecretReference = Field(description=(
        "The Secret (key `kubeconfig`) holding a kubeconfig of the tenant's control plane: server, CA and "
        f"token only, in namespace {TENANT_SECRETS_NAMESPACE}. Rotated by writing the Secret again; the pool "
        "reloads it."))  # fmt: skip
    weight: int = Field(default=1, ge=1, le=MAX_WEIGHT, description=(
        "The tenant's share of the pool when quota asked exceeds it: placed slices follow the weights, max-min."))  # fmt: skip


    @field_validator("kube_config_ref")
    @classmethod
    def _in_tenant_secrets(cls, ref: SecretReference) -> SecretReference:
        if ref.namespace != TENANT_SECRETS_NAMESPACE:
            raise ValueError(SECRET_RULE)
        return ref


class NamespacePlacement(ApiModel):
    """The pool's record of one tenant namespace, which the tenant cannot write: where its slices are, where they
    still drain from, their size, and the entries of a user's placement it honours. The syncers copy from this,
    never from the namespace's own annotations, which the tenant can write."""

    placement: dict[str, int] = Field(default_factory=dict)
    draining: dict[str, int] = Field(default_factory=dict)
    slice: Resources = Field(default_factory=Resources)
    mandatory: dict[str, int] = Field(default_factory=dict)


class TenantStatus(ApiModel):
    conditions: list[Condition] = Field(default_factory=list)
    key: str | None = Field(default=None, description="The prefix of its namespaces' names in the super clusters.")
    held: dict[str, Resources] = Field(default_factory=dict, description=(
        "What its namespaces' slices hold in each super cluster, as the last pass that reached its control "
        "plane counted: the pool keeps counting it while that control plane does not answer."))  # fmt: skip
    placements: dict[str, NamespacePlacement] = Field(default_factory=dict, description=(
        "The pool's placement of each of its namespaces that holds slices, by namespace: what the syncers follow."))  # fmt: skip


class Tenant(KubernetesObject):
    KIND: ClassVar[str] = "Tenant"
    PLURAL: ClassVar[str] = "tenants"
    spec: TenantSpec
    status: TenantStatus | None = None
