"""Ask a provider for resources: what a consumer's operator does once, by `tidepool peer` or the demo.

It writes, on the provider cluster, a Secret with a kubeconfig for the consumer cluster (so that the
provider can put its Advertisement there) and a PeeringRequest that names it. The provider's worker
turns the PeeringRequest into its peering workflow. In production the kubeconfig is a least-privilege
one for tidepool's objects on the consumer; the local demo uses the cluster's own."""

from __future__ import annotations

import base64

from kubernetes import client as k8s

from kube.objects import apply_cluster_object, apply_core, delete_cluster_object
from models.names import API_VERSION, PEERING_REQUESTS, SYSTEM_NAMESPACE


def request_secret_name(consumer_id: str) -> str:
    return f"tidepool-peer-{consumer_id}"


def request_peering(provider: k8s.ApiClient, *, consumer_id: str, consumer_kubeconfig: str) -> None:
    secret = request_secret_name(consumer_id)
    apply_core(provider, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}})
    request = apply_cluster_object(provider, PEERING_REQUESTS, {
        "apiVersion": API_VERSION, "kind": "PeeringRequest",
        "metadata": {"name": consumer_id},
        "spec": {"clusterIdentity": {"clusterId": consumer_id},
                 "kubeConfigRef": {"name": secret, "namespace": SYSTEM_NAMESPACE}},
    })  # fmt: skip
    # Owned by the request: it goes when the request goes, after the provider's withdrawal used it.
    owner = {"apiVersion": API_VERSION, "kind": "PeeringRequest", "name": consumer_id,
             "uid": request["metadata"]["uid"]}  # fmt: skip
    apply_core(provider, {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": secret, "namespace": SYSTEM_NAMESPACE, "ownerReferences": [owner]},
        "data": {"kubeconfig": base64.b64encode(consumer_kubeconfig.encode()).decode()},
    })  # fmt: skip


def cancel_peering(provider: k8s.ApiClient, *, consumer_id: str) -> None:
    """Deleting the PeeringRequest withdraws the peering; its Secret goes with it, once withdrawn."""
    delete_cluster_object(provider, PEERING_REQUESTS, consumer_id)
