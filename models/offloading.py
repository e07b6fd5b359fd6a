"""Namespace offloading's pure rules, shared by the consumer's controller, its virtual kubelets and the CLI:
which remote namespace a consumer namespace maps to in a provider, and whether a provider is selected."""

from __future__ import annotations

from collections.abc import Mapping

from models.api.offloading import ClusterSelector, NamespaceOffloadingSpec
from models.names import remote_namespace_default_name


def remote_namespace_name(spec: NamespaceOffloadingSpec, *, consumer_cluster_id: str, namespace: str) -> str:
    """The namespace the consumer asks each selected provider for (the same name in every provider)."""
    match spec.namespace_mapping_strategy:
        case "EnforceSameName":
            return namespace
        case "SelectedName":
            assert spec.remote_namespace_name is not None  # the model refuses SelectedName without it
            return spec.remote_namespace_name
        case "DefaultName":
            return remote_namespace_default_name(consumer_cluster_id, namespace)


def selects(selector: ClusterSelector, labels: Mapping[str, str]) -> bool:
    """Whether a provider whose virtual node has `labels` is selected: a Kubernetes label selector's meaning."""
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for requirement in selector.match_expressions:
        present, value = requirement.key in labels, labels.get(requirement.key)
        match requirement.operator:
            case "In":
                ok = present and value in requirement.values
            case "NotIn":
                ok = not present or value not in requirement.values
            case "Exists":
                ok = present
            case "DoesNotExist":
                ok = not present
        if not ok:
            return False
    return True
