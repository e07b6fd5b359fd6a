"""Ask a provider for resources: what a consumer's operator does once, by `tidepool peer` or the demo.

With the consumer's admin credentials it mints, on the consumer, an identity for exactly this provider
(kube/identity.py: its Advertisement, its credentials Secret, its own next token, nothing else); with the
provider's, it writes a Secret holding a kubeconfig for that identity and a PeeringRequest naming it. The
provider's worker turns the PeeringRequest into its peering workflow and renews the token itself. Run
again, it applies everything again and writes a new token: the way back after an outage longer than the
token's life."""

from __future__ import annotations

import base64
import time
from typing import Any

from kubernetes import client as k8s

from kube.clock import utcnow
from kube.identity import DEFAULT_TOKEN_LIFETIME_SECONDS, mint_provider_identity, revoke_provider_identity
from kube.objects import (
    apply_cluster_object,
    apply_core,
    delete_cluster_object,
    ignore_not_found,
    patch_cluster_object,
    read_cluster_object,
)
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    FORCE_UNPEER_ANNOTATION,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    advertisement_name,
)
from models.times import format_rfc3339

# How long `tidepool peer` waits for a PeeringRequest of the same name still being withdrawn, and how often it looks.
PREVIOUS_REQUEST_WAIT_SECONDS = 60
PREVIOUS_REQUEST_POLL_SECONDS = 0.5


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
    backing off), then the Secret again, owned by the request. A request of the same name still being
    withdrawn is waited for first (`_wait_for_previous_request`)."""
    secret = request_secret_name(consumer_id)
    _wait_for_previous_request(provider, consumer_id=consumer_id, secret=secret)
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


def _wait_for_previous_request(provider: k8s.ApiClient, *, consumer_id: str, secret: str) -> None:
    """Peered again right after an unpeer: what is applied to a PeeringRequest, or to a Secret, being deleted
    goes with it. Wait (PREVIOUS_REQUEST_WAIT_SECONDS at most: `unpeer --force` releases the request within
    seconds) until the request is gone and its Secret is no longer owned by a request that is gone (the garbage
    collector's to delete)."""
    deadline = time.monotonic() + PREVIOUS_REQUEST_WAIT_SECONDS
    while True:
        request = read_cluster_object(provider, PEERING_REQUESTS, consumer_id)
        held = ignore_not_found(k8s.CoreV1Api(provider).read_namespaced_secret, secret, SYSTEM_NAMESPACE)
        live_uid = None if request is None or request["metadata"].get("deletionTimestamp") else request["metadata"]["uid"]
        meta = held.metadata if held is not None else None
        owners = [o.uid for o in (meta.owner_references or []) if o.kind == "PeeringRequest"] if meta else []
        withdrawing = request is not None and live_uid is None
        orphaned = meta is not None and (bool(meta.deletion_timestamp) or any(o != live_uid for o in owners))
        if not withdrawing and not orphaned:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"PeeringRequest {consumer_id} on the provider is still being withdrawn after "
                f"{PREVIOUS_REQUEST_WAIT_SECONDS} s (the consumer may be out of reach): run `tidepool peer` again "
                "once it is gone, or `tidepool unpeer --force` it first")  # fmt: skip
        time.sleep(PREVIOUS_REQUEST_POLL_SECONDS)


def cancel_peering(provider: k8s.ApiClient, *, consumer_id: str, force: bool = False) -> None:
    """Deleting the PeeringRequest withdraws the peering; its Secret goes with it, once withdrawn. The
    identity on the consumer stays (its token expires within its lifetime): a later `tidepool peer`
    applies it again. `force`: the provider does not wait for the consumer (which may be gone) before it
    releases the request; it cleans there afterwards if it can (workflows/peering.py)."""
    if force:
        ignore_not_found(patch_cluster_object, provider, PEERING_REQUESTS, consumer_id,
                         {"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: format_rfc3339(utcnow())}}})  # fmt: skip
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
                         {"metadata": {"annotations": {FORCE_UNPEER_ANNOTATION: format_rfc3339(utcnow())}}})  # fmt: skip
    delete_cluster_object(consumer, ADVERTISEMENTS, name)
