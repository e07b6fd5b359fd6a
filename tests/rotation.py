"""A peering's credentials seen from outside: the token the consumer holds, whether the provider's API server
still accepts one, and a rotation brought forward (tests of rotation on the stand-in and on a real kubelet)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clients import client_from_peer_kubeconfig_text
from models.credentials import TokenGeneration
from models.names import SYSTEM_NAMESPACE, credentials_secret_name, foreign_namespace
from tests.running import eventually


def held_kubeconfig(consumer: k8s.ApiClient, provider_id: str) -> str:
    """The kubeconfig the consumer holds now, in the Secret its virtual kubelet mounts."""
    secret = k8s.CoreV1Api(consumer).read_namespaced_secret(credentials_secret_name(provider_id), SYSTEM_NAMESPACE)
    return base64.b64decode((secret.data or {})["kubeconfig"]).decode()


def refused(kubeconfig: str, namespace: str) -> bool:
    """True when the provider's API server refuses this kubeconfig's token (401); False when it accepts it."""
    try:
        k8s.CoreV1Api(client_from_peer_kubeconfig_text(kubeconfig)).list_namespaced_pod(namespace, limit=1)
    except ApiException as e:
        if e.status == 401:
            return True
        raise
    return False


def token_generation(provider: k8s.ApiClient, consumer_id: str) -> TokenGeneration | None:
    namespace = k8s.CoreV1Api(provider).read_namespace(foreign_namespace(consumer_id))
    return TokenGeneration.from_annotations(namespace.metadata.annotations)


async def force_rotation(provider: k8s.ApiClient, consumer_id: str, *, period_seconds: float) -> TokenGeneration:
    """Age the provider's record of the token past half its life: the next periodic push (every
    `period_seconds`, the provider's advertisementPeriodSeconds) renews it. A push a signal or update asks
    for would not look: it writes only the Advertisement while the last access check holds."""
    held = token_generation(provider, consumer_id)
    assert held is not None
    aged = TokenGeneration(number=held.number, issued_at=held.issued_at - timedelta(hours=2),
                           expires_at=held.expires_at - timedelta(hours=2) + timedelta(seconds=1),
                           secret_version=held.secret_version)  # fmt: skip
    k8s.CoreV1Api(provider).patch_namespace(foreign_namespace(consumer_id),
                                            {"metadata": {"annotations": aged.to_annotations()}})  # fmt: skip
    renewed: TokenGeneration = await eventually(
        lambda: (g := token_generation(provider, consumer_id)) is not None and g.number > held.number and g,
        timeout=3 * period_seconds, what="the next periodic push to renew the aged token")  # fmt: skip
    assert renewed.number == held.number + 1, (held, renewed)
    assert renewed.expires_at > datetime.now(UTC)
    return renewed
