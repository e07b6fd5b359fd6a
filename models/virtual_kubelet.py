"""The virtual kubelet's pure parts. `virtual_kubelet_deployment` is the Deployment the consumer side
creates for an accepted Advertisement (the contract between workflows/advertisement.py and
workers/virtual_kubelet)."""

from __future__ import annotations

from typing import Any

from models.names import LABEL_MANAGED_BY, LABEL_PROVIDER, MANAGED_BY, SYSTEM_NAMESPACE, virtual_kubelet_name

PROVIDER_KUBECONFIG_DIR = "/etc/tidepool/provider"


def virtual_kubelet_deployment(
    *, provider_id: str, consumer_id: str, advertisement: str, kubeconfig_secret: str,
    namespace: str = SYSTEM_NAMESPACE, image: str = "tidepool:latest",
) -> dict[str, Any]:  # fmt: skip
    name = virtual_kubelet_name(provider_id)
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: provider_id}
    env = {
        "TIDEPOOL_VK_PROVIDER_ID": provider_id,
        "TIDEPOOL_VK_CONSUMER_ID": consumer_id,
        "TIDEPOOL_VK_ADVERTISEMENT": advertisement,
        "TIDEPOOL_VK_NAMESPACE": namespace,
        "TIDEPOOL_VK_PROVIDER_KUBECONFIG": f"{PROVIDER_KUBECONFIG_DIR}/kubeconfig",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two virtual kubelets for one provider
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "tidepool-virtual-kubelet",
                    "containers": [{
                        "name": "virtual-kubelet", "image": image,
                        "command": ["python", "-m", "workers.virtual_kubelet"],
                        "env": [{"name": k, "value": v} for k, v in env.items()],
                        "volumeMounts": [{"name": "provider-kubeconfig", "mountPath": PROVIDER_KUBECONFIG_DIR,
                                          "readOnly": True}],
                    }],
                    "volumes": [{"name": "provider-kubeconfig", "secret": {"secretName": kubeconfig_secret}}],
                },
            },
        },
    }  # fmt: skip
