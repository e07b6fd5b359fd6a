"""Ask a provider for resources: what a consumer's operator does once, by `tidepool peer` or the demo.

With the consumer's admin credentials it mints, on the consumer, an identity for exactly this provider
(kube/identity.py: its Advertisement, its credentials Secret, its own next token, nothing else); with the
provider's, it writes a Secret holding a kubeconfig for that identity and a PeeringRequest naming it. The
provider's worker turns the PeeringRequest into its peering workflow and renews the token itself. Run
again, it applies everything again and writes a new token: the way back after an outage longer than the
token's life."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from kube.identity import DEFAULT_TOKEN_LIFETIME_SECONDS, mint_provider_identity, revoke_provider_identity
from kube.objects import apply_cluster_object, apply_core, delete_cluster_object, ignore_not_found, patch_cluster_object
from models.api.common import rfc3339
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    FORCE_UNPEER_ANNOTATION,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    advertisement_name,
)


def request_secret_name(consumer_id: str) -> str:
    return f"tidepool-peer-{consumer_id}"


def request_peering(
    provider: k8s.ApiClient,
    consumer: k8s.ApiClient,
    *,
    provider_id: str,
    consumer_id: str,
    token_lifetime_seconds: int = DEFAULT_TOKEN_LIFETIME_SECONDS,
    consumer_server: str | None = None,
) -> None:
    """`consumer_server`: the consumer's API server address as the provider reaches it, when it is not
    the one `consumer` uses (a provider in a container, behind a proxy)."""
    kubeconfig = mint_provider_identity(consumer, provider_id=provider_id, lifetime_seconds=token_lifetime_seconds,
                                        server=consumer_server)  # fmt: skip
    write_peering_request(provider, consumer_id=consumer_id, kubeconfig=kubeconfig)


def write_peering_request(provider: k8s.ApiClient, *, consumer_id: str, kubeconfig: str) -> None:
    """The provider's half: the Secret with the consumer's kubeconfig, then the PeeringRequest naming it
    (the peering's first push and its decision watch find the Secret at once, instead of failing and
    backing off), then the Secret again, owned by the request."""
    secret = request_secret_name(consumer_id)
    apply_core(provider, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}})
    credentials: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": secret, "namespace": SYSTEM_NAMESPACE},
        "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
    }  # fmt: skip
    apply_core(provider, credentials)
    request = apply_cluster_object(provider, PEERING_REQUESTS, {
        "apiVersion": API_VERSION, "kind": "PeeringRequest",
        "metadata": {"name": consumer_id},
        "spec": {"clusterIdentity": {"clusterId": consumer_id},
                 "kubeConfigRef": {"name": secret, "namespace": SYSTEM_NAMESPACE}},
    })  # fmt: skip
    # Owned by the request: it goes when the request goes, after the provider's withdrawal used it.
    credentials["metadata"]["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "PeeringRequest",
                                                   "name": consumer_id, "uid": request["metadata"]["uid"]}]  # fmt: skip
    apply_core(provider, credentials)


def cancel_peering(provider: k8s.ApiClient, *, consumer_id: str, force: bool = False) -> None:
    """Deleting the PeeringRequest withdraws the peering; its Secret goes with it, once withdrawn. The
    identity on the consumer stays (its token expires within its lifetime): a later `tidepool peer`
    applies it again. `force`: the provider does not wait for the consumer (which may be gone) before it
    releases the request; it cleans there afterwards if it can (workflows/peering.py)."""
    if force:
        ignore_not_found(patch_cluster_object, provider, PEERING_REQUESTS, consumer_id,
                         {"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: rfc3339(datetime.now(UTC))}}})  # fmt: skip
    delete_cluster_object(provider, PEERING_REQUESTS, consumer_id)


def leave_provider(consumer: k8s.ApiClient, *, provider_id: str, force: bool = False) -> None:
    """The consumer's unpeer: the provider's identity here is revoked (it can push nothing more), then its
    Advertisement deleted, which the consumer's workflow tears down in order: the virtual node, the
    virtual kubelet once it has cleaned the provider namespace (a wait bounded at two minutes), the
    Advertisement. `force`: the provider may be gone: the teardown waits on nothing there, and the
    workflow cleans there afterwards if it answers (workflows/advertisement.py)."""
    revoke_provider_identity(consumer, provider_id=provider_id)
    name = advertisement_name(provider_id)
    if force:
        ignore_not_found(patch_cluster_object, consumer, ADVERTISEMENTS, name,
                         {"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: rfc3339(datetime.now(UTC))}}})  # fmt: skip
    delete_cluster_object(consumer, ADVERTISEMENTS, name)
