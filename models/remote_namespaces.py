"""The provider's rules for a consumer's RemoteNamespace (issue 35, item 5 of docs' offloading design): whether
the namespace it asks for may be made, what the made namespace carries, and whether one that exists is the
consumer's. workers/remote_namespaces.py reconciles with them; activities/remote_namespaces.py makes the calls.

A consumer asks by creating a RemoteNamespace, named as the namespace it wants, in its control namespace
`tidepool-foreign-<consumer>`; only the provider writes its status. The provider owns a namespace for a consumer
only when the namespace says so with labels only the provider's worker writes (a consumer writes no namespace).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from models.api.conditions import RemoteNamespaceReadyReason
from models.enforcement import PodSecurityLevel, pod_security_labels
from models.names import (
    LABEL_CONSUMER,
    LABEL_CONSUMER_NAMESPACE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    RESERVED_NAMESPACE_PREFIXES,
    RESERVED_NAMESPACES,
    namespace_reserved,
)

_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAMESPACE_NAME: Final = 63


@dataclass(frozen=True)
class Refused:
    reason: RemoteNamespaceReadyReason
    message: str  # names the namespace and the rule


def owned_by(labels: Mapping[str, str] | None, consumer: str) -> bool:
    """Whether a namespace with these labels was made by this provider for `consumer`."""
    labels = labels or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGED_BY and labels.get(LABEL_CONSUMER) == consumer


def refusal(name: str, *, consumer: str, existing_labels: Mapping[str, str] | None, exists: bool) -> Refused | None:
    """Why the namespace `name` may not be made (or taken over) for `consumer`, or None when it may.
    `exists`/`existing_labels`: the namespace of that name in the provider, if any."""
    if len(name) > MAX_NAMESPACE_NAME or not _DNS_LABEL.match(name):
        return Refused("NameInvalid", f"namespace {name!r}: a namespace name must be a DNS label (lower-case "
                                      f"letters, digits and '-', at most {MAX_NAMESPACE_NAME} characters)")  # fmt: skip
    if namespace_reserved(name):
        return Refused("NameReserved", f"namespace {name!r} is reserved for the provider's own use (the names "
                                       f"{', '.join(sorted(RESERVED_NAMESPACES))} and those starting with "
                                       f"{', '.join(RESERVED_NAMESPACE_PREFIXES)})")  # fmt: skip
    if exists and not owned_by(existing_labels, consumer):
        return Refused("NameTaken", f"namespace {name!r} already exists in the provider and was not made for "
                                    f"{consumer}: choose another name (namespaceMappingStrategy DefaultName never "
                                    "collides)")  # fmt: skip
    return None


def namespace_labels(*, consumer: str, consumer_namespace: str, level: PodSecurityLevel) -> dict[str, str]:
    """The made namespace's labels: whose it is (what the consumer admission policies select it by,
    models/enforcement.consumer_policies), which consumer namespace it mirrors, and Pod Security at `level`."""
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: consumer, LABEL_CONSUMER_NAMESPACE: consumer_namespace,
            **pod_security_labels(level)}  # fmt: skip


def pod_security_level(labels: Mapping[str, str] | None) -> PodSecurityLevel | None:
    """The level the control namespace enforces (the push applies it from the ClusterConfig): each remote
    namespace of the consumer enforces the same. None when it carries none yet (no push made it)."""
    value = (labels or {}).get("pod-security.kubernetes.io/enforce")
    match value:
        case "baseline" | "restricted" | "privileged":
            return value
    return None
