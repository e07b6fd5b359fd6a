"""Reads and writes every tidepool process shares: server-side apply with tidepool's field manager,
merge patches (compare-and-swap when they carry a resourceVersion), deletes that treat 'already gone' as
success, Events, and status conditions whose lastTransitionTime moves only when the status does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clock import utcnow
from models.api.clusterconfig import ClusterConfig
from models.api.conditions import ConditionValue, Reason
from models.names import CLUSTER_CONFIG_NAME, CLUSTER_CONFIGS, GROUP, VERSION
from models.times import format_rfc3339

FIELD_MANAGER = "tidepool"
APPLY = "application/apply-patch+yaml"
T = TypeVar("T")



def apply_cluster_object(api: k8s.ApiClient, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply of a cluster-scoped tidepool object: creates or updates, never duplicates.
    Returns the object as stored (read raw: the client maps only 200 to a body, and a create is 201)."""
    response = k8s.CustomObjectsApi(api).patch_cluster_custom_object(
        GROUP, VERSION, plural, body["metadata"]["name"], body,
        field_manager=FIELD_MANAGER, force=True, _content_type=APPLY, _preload_content=False,
    )  # fmt: skip
    return raw_json(response)


def patch_cluster_object(api: k8s.ApiClient, plural: str, name: str, patch: dict[str, Any]) -> None:
    """Merge-patch; carrying metadata.resourceVersion in the patch makes it a compare-and-swap (409 on a
    concurrent change, and the activity's retry reads again)."""
    k8s.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, plural, name, patch)


def patch_cluster_object_status(api: k8s.ApiClient, plural: str, name: str, status: dict[str, Any]) -> None:
    """Merge-patch the status subresource (the owner of status is whoever decides it)."""
    k8s.CustomObjectsApi(api).patch_cluster_custom_object_status(GROUP, VERSION, plural, name, {"status": status})


def read_cluster_object(api: k8s.ApiClient, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return _json_object(k8s.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, plural, name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def read_cluster_config(api: k8s.ApiClient) -> ClusterConfig:
    """The cluster's ClusterConfig `tidepool`; absent, the defaults."""
    obj = read_cluster_object(api, CLUSTER_CONFIGS, CLUSTER_CONFIG_NAME)
    return ClusterConfig.from_kubernetes(obj) if obj else ClusterConfig.default()


def list_cluster_objects(api: k8s.ApiClient, plural: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Every tidepool object of a kind, as the API server serves them."""
    listed = _json_object(k8s.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, plural, **kwargs))
    return list(listed["items"])


def delete_cluster_object(api: k8s.ApiClient, plural: str, name: str) -> None:
    ignore_not_found(k8s.CustomObjectsApi(api).delete_cluster_custom_object, GROUP, VERSION, plural, name)


def finalizers_after(current: list[str] | None, finalizer: str, *, present: bool) -> list[str] | None:
    """The finalizer list with `finalizer` added (last) or removed, others kept in order; None when there is
    nothing to write. Written with the object's resourceVersion, as a merge patch: a strategic one merges
    lists and would never remove one."""
    if present:
        return None if finalizer in (current or []) else [*(current or []), finalizer]
    kept = [f for f in current or [] if f != finalizer]
    return None if kept == (current or []) else kept


def ignore_not_found(call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Deleting what is already gone is success: activities are retried."""
    try:
        return call(*args, **kwargs)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def delete_exactly(call: Callable[..., Any], name: str, namespace: str, *, uid: str | None,
                   grace_period_seconds: int | None = None) -> bool:
    """Deletes the object `uid` names, never one made under its name since (a uid precondition; without a uid,
    whatever has the name). False when another object holds the name now (409): left alone. Gone is success.
    The grace period goes in the body: a body's options replace the query's."""
    preconditions = k8s.V1Preconditions(uid=uid) if uid else None
    try:
        ignore_not_found(call, name, namespace, body=k8s.V1DeleteOptions(grace_period_seconds=grace_period_seconds,
                                                                         preconditions=preconditions))  # fmt: skip
    except ApiException as e:
        if e.status != 409:
            raise
        return False
    return True


def apply_core(api: k8s.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply of a core or RBAC object by kind (namespaced or cluster-scoped); returns the object
    as stored."""
    kind, meta = body["kind"], body["metadata"]
    kwargs: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY,
                              "_preload_content": False}  # fmt: skip
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    namespaced: dict[str, Callable[..., Any]] = {
        "Secret": core.patch_namespaced_secret,
        "ServiceAccount": core.patch_namespaced_service_account,
        "ConfigMap": core.patch_namespaced_config_map,
        "Role": rbac.patch_namespaced_role,
        "RoleBinding": rbac.patch_namespaced_role_binding,
        "ResourceQuota": core.patch_namespaced_resource_quota,
        "LimitRange": core.patch_namespaced_limit_range,
    }
    cluster_scoped: dict[str, Callable[..., Any]] = {
        "Namespace": core.patch_namespace,
        "ClusterRole": rbac.patch_cluster_role,
        "ClusterRoleBinding": rbac.patch_cluster_role_binding,
    }
    if kind in cluster_scoped:
        response: object = cluster_scoped[kind](meta["name"], body, **kwargs)
    else:
        response = namespaced[kind](meta["name"], meta["namespace"], body, **kwargs)
    return raw_json(response)


def _json_object(value: object) -> dict[str, Any]:
    """A custom object as the client returns it: parsed JSON, which it types as `object`."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object from the API server, got {type(value).__name__}")
    return value


def raw_json(response: object) -> dict[str, Any]:
    """The body of a call made with _preload_content=False, for which the client returns urllib3's response."""
    if not isinstance(response, urllib3.BaseHTTPResponse):
        raise TypeError(f"expected an HTTP response, got {type(response).__name__}")
    return _json_object(json.loads(response.data))


def drained(response: object) -> None:
    """Reads the unwanted body of a write made with _preload_content=False (to skip parsing it into typed models),
    so that its connection goes back to the client's pool: an unread response keeps its connection, and the
    next call opens a new one, a TLS handshake on both sides."""
    if not isinstance(response, urllib3.BaseHTTPResponse):
        raise TypeError(f"expected an HTTP response, got {type(response).__name__}")
    response.drain_conn()


def record_event(api: k8s.ApiClient, obj: dict[str, Any], *, reason: Reason, message: str, warning: bool = False) -> None:
    """A Kubernetes Event on a tidepool object, so that `kubectl describe` says what tidepool decided; its
    reason is one of the vocabulary's (models/api/conditions.py), checked by the type checker."""
    meta = obj["metadata"]
    namespace = meta.get("namespace") or "default"  # events about cluster-scoped objects live in default
    now = utcnow()
    drained(k8s.CoreV1Api(api).create_namespaced_event(namespace, k8s.CoreV1Event.model_validate({
        "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                           "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
        "source": {"component": "tidepool"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "reportingComponent": "tidepool", "reportingInstance": "tidepool",
    }), _preload_content=False))  # fmt: skip


def with_condition(value: ConditionValue, previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conditions with `value`'s type set in its place (a new type last), so that setting what is there
    changes nothing; lastTransitionTime moves only when the status does."""
    status = "True" if value.status else "False"
    old = next((c for c in previous if c.get("type") == value.type), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status else format_rfc3339(utcnow())
    new = {"type": value.type, "status": status, "reason": value.reason, "message": value.message,
           "lastTransitionTime": since}  # fmt: skip
    kept = [c for c in previous if c.get("type") != value.type]
    kept.insert(len(kept) if old is None else previous.index(old), new)
    return kept

