"""The one status writer: a tidepool object's status fields and conditions, merged into the status as last
read and patched once, only when they change it; then the caller's Events. Activities and watchers that
decide a status call `write_status` (activities/consumer.py, activities/peering.py, workers/offloading.py,
workers/remote_namespaces.py, workers/pool_health.py); conditions are merged by kube.objects.with_condition,
so a condition's lastTransitionTime moves only when its status does.

Where the status goes is a `StatusTarget`: `CustomObjectStatus` writes a tidepool custom object's status
subresource through the API server; a test passes its own recorder."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from kubernetes import client as k8s

from kube.objects import ignore_not_found, record_event, with_condition
from models.api.conditions import ConditionValue, Reason
from models.names import GROUP, VERSION

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    """An Event to record on the object: its reason from the vocabulary (models/api/conditions.py)."""

    reason: Reason
    message: str
    warning: bool = False


class StatusTarget(Protocol):
    def patch_status(self, obj: Obj, status: Obj) -> None:
        """Merge-patch `status` into the object's status subresource."""

    def record_event(self, obj: Obj, event: Event) -> None:
        """Record `event` on the object."""


@dataclass(frozen=True)
class CustomObjectStatus:
    """The status subresource of a tidepool custom object of `plural` (GROUP/VERSION), namespaced when the
    object's metadata has a namespace, cluster-scoped otherwise; its Events through kube.objects.record_event.
    `missing_ok`: an object deleted since it was read is not an error (a watcher whose key comes back)."""

    api: k8s.ApiClient
    plural: str
    missing_ok: bool = False

    def patch_status(self, obj: Obj, status: Obj) -> None:
        meta, custom, body = obj["metadata"], k8s.CustomObjectsApi(self.api), {"status": status}
        if meta.get("namespace"):
            call = partial(custom.patch_namespaced_custom_object_status, GROUP, VERSION, meta["namespace"],
                           self.plural, meta["name"], body)  # fmt: skip
        else:
            call = partial(custom.patch_cluster_custom_object_status, GROUP, VERSION, self.plural, meta["name"], body)
        if self.missing_ok:
            ignore_not_found(call)
        else:
            call()

    def record_event(self, obj: Obj, event: Event) -> None:
        record_event(self.api, obj, reason=event.reason, message=event.message, warning=event.warning)


def write_status(target: StatusTarget, obj: Obj, *, fields: Obj | None = None,
                 conditions: tuple[ConditionValue, ...] | list[ConditionValue] = (),
                 events: tuple[Event, ...] | list[Event] = ()) -> bool:  # fmt: skip
    """Sets `fields` (a merge patch: None clears a field) and `conditions` on `obj`'s status as last read, in
    one patch, and makes none when the result equals the status read: a steady state writes nothing (each
    write wakes every watcher of the object). Then records `events`, each call's: the caller says when
    something happened (a Deployment re-created changes no status and is still news). True when it patched."""
    current: Obj = obj.get("status") or {}
    patch = dict(fields or {})
    if conditions:
        merged = list(current.get("conditions") or [])
        for value in conditions:
            merged = with_condition(value, merged)
        patch["conditions"] = merged
    after: object = merge_patched(current, patch)
    changed = after != current
    if changed:
        target.patch_status(obj, patch)
    for event in events:  # after the patch: an Event never says what the status does not
        target.record_event(obj, event)
    return changed


def merge_patched(target: object, patch: object) -> Any:
    """`target` after the JSON merge patch `patch` (RFC 7386), as the API server applies it: objects merge
    key by key, None removes a key, anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patched(result.get(key), value)
    return result


def replacing(current: Any, new: Any) -> Any:
    """The merge patch that turns `current` into `new` (a merge patch alone keeps every key it does not name:
    a cluster a tenant no longer holds would stay in its status)."""
    if not isinstance(new, dict) or not isinstance(current, dict):
        return new
    return {**{key: None for key in current if key not in new},
            **{key: replacing(current.get(key), value) for key, value in new.items()}}  # fmt: skip
