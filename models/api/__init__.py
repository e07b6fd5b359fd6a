"""tidepool's API (group tidepool.io, version v1alpha1), the single source of truth: the CRDs in
deploy/crds are generated from these models (python -m deploy.crdgen)."""

from models.api.advertisement import (
    Advertisement,
    AdvertisementSpec,
    AdvertisementStatus,
)
from models.api.clusterconfig import (
    ClusterConfig,
    ClusterConfigSpec,
    IncomingConfig,
    KeepaliveConfig,
    OutgoingConfig,
)
from models.api.common import ObjectMeta, ObjectReference, SecretReference
from models.api.conditions import Condition
from models.api.offloading import NamespaceOffloading, RemoteNamespace
from models.api.peeringrequest import (
    PeeringRequest,
    PeeringRequestSpec,
    PeeringRequestStatus,
)
from models.api.supercluster import SuperCluster, SuperClusterSpec
from models.api.tenant import Tenant, TenantSpec

KINDS = (ClusterConfig, PeeringRequest, Advertisement, SuperCluster, Tenant, NamespaceOffloading, RemoteNamespace)

__all__ = [
    "KINDS", "Advertisement", "AdvertisementSpec", "AdvertisementStatus", "ClusterConfig", "ClusterConfigSpec",
    "Condition", "IncomingConfig", "KeepaliveConfig", "NamespaceOffloading", "ObjectMeta", "ObjectReference", "OutgoingConfig",
    "PeeringRequest", "PeeringRequestSpec", "PeeringRequestStatus", "RemoteNamespace", "SecretReference", "SuperCluster",
    "SuperClusterSpec", "Tenant", "TenantSpec",
]  # fmt: skip
