"""Every name tidepool puts on the wire, defined once: API group, task queues, workflow ids, labels,
annotations, search attributes. Workflows, activities, workers and the local environment import them
from here so that a renamed key cannot drift between a writer and its reader."""

from __future__ import annotations

import base64
import hashlib
from typing import Final

GROUP: Final = "tidepool.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Plurals of the tidepool custom resources, as the API server serves them.
CLUSTER_CONFIGS: Final = "clusterconfigs"
PEERING_REQUESTS: Final = "peeringrequests"
ADVERTISEMENTS: Final = "advertisements"
SUPER_CLUSTERS: Final = "superclusters"
TENANTS: Final = "tenants"
NAMESPACE_OFFLOADINGS: Final = "namespaceoffloadings"
REMOTE_NAMESPACES: Final = "remotenamespaces"

# The one ClusterConfig of a cluster (cluster-scoped, a singleton by name).
CLUSTER_CONFIG_NAME: Final = "tidepool"
# Where tidepool keeps its own namespaced objects in every cluster (virtual kubelets, credentials).
SYSTEM_NAMESPACE: Final = "tidepool-system"

# Labels.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "tidepool"
LABEL_NODE_TYPE: Final = "tidepool.io/type"
VIRTUAL_NODE_TYPE: Final = "virtual-node"
LABEL_PROVIDER: Final = "tidepool.io/provider"
LABEL_CONSUMER: Final = "tidepool.io/consumer"
LABEL_OFFLOADED: Final = "tidepool.io/offloaded"
# The virtual kubelet renews its keepalive Lease in its provider every keepalive_renew_seconds (at most
# KEEPALIVE_RENEW_SECONDS: a write a consumer makes on its provider twice a minute; at least its loop's period)
# and writes that period as the Lease's leaseDurationSeconds. The provider deletes the copies once it has gone
# unrenewed for the Advertisement's time to live, and never sooner than KEEPALIVE_MISSED_RENEWALS renewals nor
# KEEPALIVE_MIN_GRACE_SECONDS, so that a restarted virtual kubelet, or a pass of one that waited on a slow API
# server, never loses them (kube/copies.py: keepalive_grace).
KEEPALIVE_RENEW_SECONDS: Final = 30
KEEPALIVE_MIN_RENEW_SECONDS: Final = 10
KEEPALIVE_MISSED_RENEWALS: Final = 4
KEEPALIVE_MIN_GRACE_SECONDS: Final = 60
# Where a kubelet API listens by default, as a kubelet's (--port): the virtual kubelets' and each syncer's.
KUBELET_PORT: Final = 10250
TAINT_VIRTUAL_NODE: Final = "tidepool.io/virtual-node"

# Finalizer the consumer puts on an Advertisement so that teardown runs in order before it goes.
ADVERTISEMENT_FINALIZER: Final = "tidepool.io/teardown"
# A manual decision on an Advertisement (acceptPolicy Manual): "accept" or "refuse", and why.
DECISION_ANNOTATION: Final = "tidepool.io/decision"
# The offer (models/admission.offer_fingerprint) of an Advertisement refused because its virtual node never
# became Ready: admission keeps it refused while the offer is the same. Removing it (or accepting by hand) lifts it.
REFUSED_OFFER_ANNOTATION: Final = "tidepool.io/refused-offer"
# On a PeeringRequest being deleted (`tidepool unpeer --force` on the provider), or on an Advertisement (on the
# consumer): finish the local half of the teardown at once, and clean the other side after.
FORCE_UNPEER_ANNOTATION: Final = "tidepool.io/force-unpeer"
# On a PeeringRequest's credentials Secret while a forced withdrawal still has the foreign side to clean: it
# outlives the request (deleted with it) until the workflow is done with it.
FOREIGN_CLEANUP_FINALIZER: Final = "tidepool.io/foreign-cleanup"
DECISION_REASON_ANNOTATION: Final = "tidepool.io/decision-reason"
# Set to "clean" by a virtual kubelet on its own Deployment once it emptied the provider namespace.
VK_CLEAN_ANNOTATION: Final = "tidepool.io/provider-namespace"
# Put by a provider on its Advertisement before deleting it at withdrawal: it removed the foreign namespace
# itself, so a virtual kubelet that its credentials now fail (401) may report the provider side clean.
PROVIDER_WITHDRAWN_ANNOTATION: Final = "tidepool.io/provider-withdrawn"
# On a foreign namespace (provider side): the token generation the foreign cluster holds, when it was
# issued and expires, and the resourceVersion of the foreign cluster's Secret it was written to. Never the
# token itself: that lives only in the foreign cluster's Secret.
TOKEN_GENERATION_ANNOTATION: Final = "tidepool.io/token-generation"
TOKEN_ISSUED_AT_ANNOTATION: Final = "tidepool.io/token-issued-at"
TOKEN_EXPIRES_AT_ANNOTATION: Final = "tidepool.io/token-expires-at"
CREDENTIALS_SECRET_VERSION_ANNOTATION: Final = "tidepool.io/credentials-secret-version"
# On the Secrets a provider binds each token to (one per generation): deleting one revokes its token.
LABEL_TOKEN_ANCHOR: Final = "tidepool.io/token-anchor"
# On an Advertisement: the spare capacity (before the percentage) its last push was computed from, as JSON
# quantities. Whichever replica pushed, the leading replica's early-push baseline is read from it.
SPARE_CAPACITY_ANNOTATION: Final = "tidepool.io/spare-capacity"
# How the provider derived the offer (models.explain.OfferDerivation as JSON): `tidepool explain` on the consumer.
OFFER_DERIVATION_ANNOTATION: Final = "tidepool.io/offer-derivation"
# Finalizer the provider puts on a PeeringRequest so that its deletion waits for the withdrawal, which
# needs the Secret the request names to clean the foreign cluster.
PEERING_FINALIZER: Final = "tidepool.io/withdraw"
# A consumer's virtual kubelet renews this Lease in its provider namespace (kube/copies.py): once it has lapsed
# for an Advertisement's time to live, the provider deletes the consumer's copies there itself.
CONSUMER_KEEPALIVE_LEASE: Final = "tidepool-consumer-keepalive"

# Who writes which annotation of an Advertisement on the consumer (issue 34, "decisions can be written only by
# whoever decides"): the provider writes only its own three; every other tidepool.io/ annotation on it is the
# consumer's, and the consumer's API server refuses a provider identity's writes of them, and of the finalizers
# (deploy/base/consumer-decisions.yaml; docs/threat-model.md).
PROVIDER_ADVERTISEMENT_ANNOTATIONS: Final = (SPARE_CAPACITY_ANNOTATION, OFFER_DERIVATION_ANNOTATION,
                                             PROVIDER_WITHDRAWN_ANNOTATION)  # fmt: skip
CONSUMER_ADVERTISEMENT_ANNOTATIONS: Final = (DECISION_ANNOTATION, DECISION_REASON_ANNOTATION, REFUSED_OFFER_ANNOTATION,
                                             FORCE_UNPEER_ANNOTATION)  # fmt: skip
# The ServiceAccounts (in SYSTEM_NAMESPACE) a consumer mints for its providers all begin so (provider_identity_name).
PROVIDER_IDENTITY_PREFIX: Final = "tidepool-provider-"


def worker_lease_name(cluster_id: str) -> str:
    """The Lease (in SYSTEM_NAMESPACE) whose holder runs a cluster worker's watchers: one per cluster id, so
    that workers of several cluster ids on one API server (tests, benchmarks) do not wait on each other."""
    return f"tidepool-worker-{cluster_id}"


def pool_lease_name(workflow_id: str) -> str:
    """The Lease (in the tenant's SYSTEM_NAMESPACE) whose holder runs a pool worker's watchers and prober."""
    return f"tidepool-pool-{workflow_id}"


def task_queue(cluster_id: str) -> str:
    """Each cluster's worker polls its own task queue; two clusters never share one."""
    return f"tidepool-{cluster_id}"


# Workflow ids name the home cluster too: operators share Temporal namespaces, and two providers peering
# with one consumer (or two consumers of one provider) must never attach to each other's workflow. '@' is
# no DNS label character, so no two (home, foreign) pairs make the same id.
def peering_workflow_id(home_cluster_id: str, foreign_cluster_id: str) -> str:
    """One peering workflow per foreign cluster of a home cluster, ever: a second start finds the running one."""
    return f"peering-{foreign_cluster_id}@{home_cluster_id}"


def advertisement_workflow_id(home_cluster_id: str, provider_cluster_id: str) -> str:
    """One Advertisement workflow per provider of a consumer (the home cluster)."""
    return f"advertisement-{provider_cluster_id}@{home_cluster_id}"


def admission_workflow_id(cluster_id: str) -> str:
    """One admission workflow per consumer cluster: it alone decides, so concurrent arrivals never
    overshoot the maximum."""
    return f"admission-{cluster_id}"


def advertisement_name(provider_cluster_id: str) -> str:
    """The Advertisement a provider writes on a foreign cluster: one per provider, deterministic."""
    return f"advertisement-{provider_cluster_id}"


def credentials_secret_name(provider_cluster_id: str) -> str:
    """The kubeconfig Secret a provider writes on the foreign cluster, beside its Advertisement."""
    return f"tidepool-kubeconfig-{provider_cluster_id}"


def token_anchor_name(generation: int) -> str:
    """The Secret, in a foreign namespace, that the token of this generation is bound to."""
    # No '-': a Secret the virtual kubelet copies into the same namespace is named `<namespace>-<name>`
    # (models/virtual_kubelet.reflected_name), so a name without one can never be taken by a copy.
    return f"tidepool.token.{generation}"


FOREIGN_NAMESPACE_PREFIX: Final = "tidepool-foreign-"


def foreign_namespace(foreign_cluster_id: str) -> str:
    """A foreign cluster's control namespace in the provider: its quota record, token anchors, keepalive Lease
    and RemoteNamespace requests. Its offloaded pods run in namespaces of their own (`remote_namespace_name`);
    copies made here under the single-namespace layout (`<namespace>-<name>`) stay until their pods go or move."""
    return f"{FOREIGN_NAMESPACE_PREFIX}{foreign_cluster_id}"


def foreign_cluster_of_namespace(namespace: str) -> str | None:
    """The foreign cluster a provider namespace was made for (`foreign_namespace`'s inverse), or None."""
    consumer = namespace.removeprefix(FOREIGN_NAMESPACE_PREFIX)
    return consumer if consumer != namespace and consumer else None


# Namespace offloading (issue 35, Liqo's NamespaceOffloading). A consumer opts a namespace in with a
# NamespaceOffloading of this name in it (one per namespace); its controller mirrors the pod strategy into the
# namespace's LABEL_OFFLOADING, which the consumer's admission policies read (deploy/base/consumer-offloading.yaml).
NAMESPACE_OFFLOADING_NAME: Final = "offloading"
LABEL_OFFLOADING: Final = "tidepool.io/offloading"
# On a NamespaceOffloading: its deletion waits until its pods have left the virtual nodes and every remote
# namespace is gone.
OFFLOADING_FINALIZER: Final = "tidepool.io/drain"
# On a RemoteNamespace (provider side): its deletion waits until the provider deleted the namespace it made.
REMOTE_NAMESPACE_FINALIZER: Final = "tidepool.io/remote-namespace"
# On a namespace a provider made for a consumer: the consumer's namespace it mirrors (LABEL_CONSUMER names the
# consumer). The provider owns a namespace for a consumer only when both labels and LABEL_MANAGED_BY say so.
LABEL_CONSUMER_NAMESPACE: Final = "tidepool.io/consumer-namespace"
# The namespaces a provider made for consumers (control namespaces and remote ones), as a label selector.
MADE_FOR_CONSUMERS_SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_CONSUMER}"
# On the ResourceQuota of a consumer's control namespace: the whole offer's quota (JSON), which the provider's
# worker splits over the consumer's namespaces (models/enforcement.split_offer).
OFFER_ANNOTATION: Final = "tidepool.io/offer"
# Namespace names a consumer may never ask a provider for, whatever the mapping: the provider's own.
RESERVED_NAMESPACES: Final = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
RESERVED_NAMESPACE_PREFIXES: Final = ("kube-", "tidepool-", "openshift-")


def remote_namespace_default_name(consumer_cluster_id: str, namespace: str) -> str:
    """The DefaultName mapping: `<consumer>-<namespace>` and a hash of the pair, so that no two (consumer,
    namespace) pairs meet (`a` + `b-c` and `a-b` + `c` differ in the hash) and the name still reads."""
    digest = hashlib.sha256(f"{consumer_cluster_id}/{namespace}".encode()).hexdigest()[:8]
    return f"{f'{consumer_cluster_id}-{namespace}'[:54].rstrip('-')}-{digest}"


def namespace_reserved(name: str) -> bool:
    return name in RESERVED_NAMESPACES or name.startswith(RESERVED_NAMESPACE_PREFIXES)


def virtual_node_name(provider_cluster_id: str) -> str:
    return f"tidepool-{provider_cluster_id}"


def virtual_kubelet_name(provider_cluster_id: str) -> str:
    return f"virtual-kubelet-{provider_cluster_id}"


def provider_identity_name(provider_cluster_id: str) -> str:
    """The identity a consumer mints for one provider at `tidepool peer`: its ServiceAccount (in
    tidepool-system), and the ClusterRole, Role and their bindings that allow it exactly what the provider
    does there. One name for all of them, so that an operator finds them together."""
    return f"{PROVIDER_IDENTITY_PREFIX}{provider_cluster_id}"


def service_account_subject(name: str, namespace: str = SYSTEM_NAMESPACE) -> str:
    """The user name (and a token's `sub` claim) of a ServiceAccount."""
    return f"system:serviceaccount:{namespace}:{name}"


# Temporal search attributes tidepool registers (name -> Temporal type), so the Web UI can filter on them.
SEARCH_ATTRIBUTES: Final = {
    "HomeCluster": "Keyword",
    "ForeignCluster": "Keyword",
    "PeeringPhase": "Keyword",
    "SharingPercentage": "Int",
    "ProviderCluster": "Keyword",
    "AdvertisementPhase": "Keyword",
    "SuperClusters": "KeywordList",
}


# The super cluster pool (virtualcluster's keys, under tidepool's own prefix).
SLICE_ANNOTATION: Final = "pool.tidepool.io/slice"  # JSON ResourceList; default cpu 2 / memory 4Gi
PLACEMENTS_ANNOTATION: Final = "pool.tidepool.io/placements"  # JSON {super cluster: slice count}
PLACED_SLICE_ANNOTATION: Final = "pool.tidepool.io/placed-slice"  # the slice the placement was made with
PLACEMENT_STATUS_ANNOTATION: Final = "pool.tidepool.io/placement-status"  # why a namespace is not placed
SCHEDULED_ANNOTATION: Final = "pool.tidepool.io/scheduled"  # the placement the scheduler last wrote
POD_CLUSTER_ANNOTATION: Final = "pool.tidepool.io/super-cluster"
# A tenant namespace's policy, overriding the pool's (ClusterConfig spec.pool.policy): "spread" or "pack".
POLICY_ANNOTATION: Final = "pool.tidepool.io/policy"
# The placement a user wrote (JSON {super cluster: slice count}), kept by the scheduler once it honours the
# edit: mandatory until the user clears or edits the placement, never moved off a failed cluster.
MANDATORY_ANNOTATION: Final = "pool.tidepool.io/mandatory"
# A namespace moving off clusters (JSON {super cluster: slice count}): those clusters keep its objects and
# the copies of its pods that have not moved yet, until each moved pod runs where it went.
DRAINING_ANNOTATION: Final = "pool.tidepool.io/draining"
# A pod being moved: the cluster whose copy keeps running until the copy on its new cluster runs.
MOVED_FROM_ANNOTATION: Final = "pool.tidepool.io/moved-from"
LABEL_TENANT_NAMESPACE: Final = "pool.tidepool.io/tenant-namespace"
# On a copy in a super cluster: a digest of what the syncer last applied, so that an unchanged source costs no write.
SOURCE_DIGEST_ANNOTATION: Final = "pool.tidepool.io/source-digest"
# On what a syncer writes into the tenant control plane (mirrored volumes, reflected Events, virtual nodes): the
# super cluster. Also the key of the NoSchedule taint on a tenant's virtual nodes.
LABEL_SUPER_CLUSTER: Final = "pool.tidepool.io/super-cluster"
# On a pod's copy in a super cluster: the tenant pod's uid (the kubelet API serves a copy only if it is that pod's).
TENANT_UID_ANNOTATION: Final = "pool.tidepool.io/tenant-uid"
# The `type` label of a tenant's virtual nodes, as virtualcluster's syncer labels them.
TENANT_NODE_TYPE: Final = "virtual-kubelet"
FEATURE_SUPER_CLUSTER_POOLING: Final = "SuperClusterPooling"
POOL_SCHEDULER_WORKFLOW_ID: Final = "pool-scheduler"
POOL_TASK_QUEUE: Final = "tidepool-pool"


# Of the pool's management cluster: where the Tenants' kubeconfig Secrets are, and the only Secrets the
# super clusters' syncers may read there.
TENANT_SECRETS_NAMESPACE: Final = "tidepool-tenants"
# On everything a syncer makes in a super cluster: the Tenant (its name) it was made for.
LABEL_TENANT: Final = "pool.tidepool.io/tenant"
TENANT_KEY_LENGTH: Final = 8
# A super-cluster namespace name is `<tenant key>-<namespace>` while that is at most this long; a longer one
# is cut and ends in a digest of the whole name, and is exactly 63 long: the two forms never meet.
PLAIN_NAMESPACE_MAX: Final = 62


def _base32_digest(text: str) -> str:
    """sha256, in characters a Kubernetes name may hold (RFC 4648 base32, lower case)."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=").lower()


def tenant_key(tenant: str) -> str:
    """A Tenant's prefix in super-cluster names: 't' and 7 characters of a digest of its name. Fixed in
    length, so that the prefix ends where it ends whatever the names: `a` + `b-c` and `a-b` + `c` cannot
    meet, as they would if tenant names were the prefix. Two Tenants whose keys collide (1 in 34 billion) are
    caught at registration: kube/tenants.py serves only the older."""
    return f"t{_base32_digest(tenant)[:TENANT_KEY_LENGTH - 1]}"


def super_cluster_namespace(tenant: str, namespace: str) -> str:
    """A tenant namespace's name in a super cluster: unique per (tenant, namespace), at most 63 long."""
    plain = f"{tenant_key(tenant)}-{namespace}"
    if len(plain) <= PLAIN_NAMESPACE_MAX:
        return plain
    digest = _base32_digest(namespace)[:12]
    return f"{plain[:63 - len(digest) - 1]}-{digest}"


# Of every super cluster's finalizer on a Tenant; what follows is the cluster's name (`tidepool pool remove-tenant`
# says which clusters still hold a Tenant).
TENANT_FINALIZER_PREFIX: Final = "syncer.pool.tidepool.io/"


def tenant_finalizer(super_cluster: str) -> str:
    """The finalizer a super cluster's syncer holds on a Tenant while that cluster holds anything of it."""
    name = super_cluster if len(super_cluster) <= 63 else f"{super_cluster[:50]}-{_base32_digest(super_cluster)[:12]}"
    return f"{TENANT_FINALIZER_PREFIX}{name}"


# A tenant's virtual node is named `<super cluster>.<node>` while that is at most this long and the super
# cluster's name has no dot; otherwise it is cut and ends in a digest of both names, and is exactly
# TENANT_NODE_NAME_MAX long: the two forms never meet. At most 63, so that the name is also a label value
# (kubernetes.io/hostname).
TENANT_NODE_NAME_MAX: Final = 63
TENANT_NODE_DIGEST_MIN: Final = 16


def tenant_node_name(super_cluster: str, node: str) -> str:
    """The virtual node in a tenant's control plane standing for physical node `node` of `super_cluster`:
    distinct for distinct (super cluster, node) pairs. In the plain form the super cluster is everything up to
    the first dot; a dotted or long pair takes the digested form, whose length no plain name has."""
    plain = f"{super_cluster}.{node}"
    if "." not in super_cluster and len(plain) < TENANT_NODE_NAME_MAX:
        return plain
    readable = plain[:TENANT_NODE_NAME_MAX - TENANT_NODE_DIGEST_MIN - 1].rstrip(".-")
    length = TENANT_NODE_NAME_MAX - len(readable) - 1
    digest = base64.b32encode(hashlib.shake_256(f"{super_cluster}/{node}".encode()).digest(length)).decode().lower()
    return f"{readable}.{digest[:length]}"
