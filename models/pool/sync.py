"""What the pool's syncer copies down to a super cluster, and in what form: pure functions over objects
as the API server serves them (dicts)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from models.names import LABEL_MANAGED_BY, LABEL_TENANT_NAMESPACE, MANAGED_BY
from models.pods import strip_service_account_token

# Objects a super cluster makes for itself and that must not be copied over its own.
SKIPPED = {"ConfigMap": {"kube-root-ca.crt"}, "ServiceAccount": {"default"}}
SYNCED_KINDS = ("ConfigMap", "Secret", "Service", "ServiceAccount", "ResourceQuota")


def in_scope(placement: Mapping[str, int], cluster: str, *, pooling: bool, scheduled: Mapping[str, int],
             draining: Mapping[str, int]) -> bool:  # fmt: skip
    """With the SuperClusterPooling gate, a namespace goes only to the clusters of its placement, and
    stays on those the scheduler placed it on (a user's edit or clear of the placement takes nothing away
    before the scheduler has made it a move) and on those it drains from until its move ends
    (models/pool/moves.py); without the gate, everywhere (one super cluster, as in virtualcluster without a
    pool)."""
    if not pooling:
        return True
    return any(counts.get(cluster, 0) > 0 for counts in (placement, scheduled, draining))


def pod_goes_here(pod_cluster: str | None, cluster: str, *, pooling: bool) -> bool:
    """The pods this cluster runs, and whose status it pushes up."""
    return pod_cluster == cluster if pooling else True


def copy_stays_here(moved_from: str | None, cluster: str, *, pooling: bool) -> bool:
    """A pod moved away from this cluster keeps its copy here until the move ends (its replacement
    runs), and this cluster says nothing of it: the new cluster's copy owns the pod's status."""
    return pooling and moved_from == cluster


def copy_for_super(kind: str, obj: dict[str, Any], *, target_namespace: str, tenant_namespace: str) -> dict[str, Any] | None:
    """The object as the super cluster gets it, or None when it is not copied."""
    meta = obj.get("metadata") or {}
    if meta.get("name") in SKIPPED.get(kind, set()):
        return None
    if kind == "Secret" and obj.get("type") == "kubernetes.io/service-account-token":
        return None
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": kind,
        "metadata": {"name": meta["name"], "namespace": target_namespace,
                     "labels": {**(meta.get("labels") or {}), LABEL_MANAGED_BY: MANAGED_BY,
                                LABEL_TENANT_NAMESPACE: tenant_namespace},
                     "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                     if not k.startswith("kubectl.kubernetes.io/")}},
    }  # fmt: skip
    if kind in ("ConfigMap", "Secret"):
        for key in ("data", "binaryData", "stringData", "type", "immutable"):
            if key in obj:
                body[key] = obj[key]
    elif kind == "Service":
        spec = copy.deepcopy(obj.get("spec") or {})
        for key in ("clusterIP", "clusterIPs", "healthCheckNodePort", "ipFamilies", "ipFamilyPolicy"):
            spec.pop(key, None)  # the super cluster allocates its own
        for port in spec.get("ports") or []:
            port.pop("nodePort", None)
        body["spec"] = spec
    elif kind == "ResourceQuota":
        body["spec"] = {"hard": (obj.get("spec") or {}).get("hard") or {}}
    return body


def pod_for_super(pod: dict[str, Any], *, target_namespace: str, tenant_namespace: str) -> dict[str, Any]:
    meta = pod["metadata"]
    spec = copy.deepcopy(pod["spec"])
    spec.pop("nodeName", None)
    strip_service_account_token(spec)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": meta["name"], "namespace": target_namespace,
                     "labels": {**(meta.get("labels") or {}), LABEL_MANAGED_BY: MANAGED_BY,
                                LABEL_TENANT_NAMESPACE: tenant_namespace},
                     "annotations": {"pool.tidepool.io/tenant-uid": meta["uid"]}},
        "spec": spec,
    }  # fmt: skip
