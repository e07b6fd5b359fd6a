"""The identity of an object the API server returned, narrowed once: the Kubernetes client types every
metadata field as optional (it also builds bodies), while the server always sets name, uid and
creationTimestamp. Used by activities/pool.py and workers/syncer.py; the pass reads its pod lists as JSON
(served_metadata_json), narrowed the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kubernetes import client as k8s

from models.times import parse_rfc3339


class HasMetadata(Protocol):
    @property
    def metadata(self) -> k8s.V1ObjectMeta | None: ...


@dataclass(frozen=True)
class ServedMetadata:
    name: str
    namespace: str | None  # None for cluster-scoped objects
    uid: str
    created: datetime
    deleting: bool  # a deletionTimestamp is set
    labels: dict[str, str]
    annotations: dict[str, str]


def served_metadata(obj: HasMetadata) -> ServedMetadata:
    meta = obj.metadata
    if meta is None or meta.name is None or meta.uid is None or meta.creation_timestamp is None:
        raise ValueError(f"the API server returned a {type(obj).__name__} without name, uid or creationTimestamp")
    return ServedMetadata(name=meta.name, namespace=meta.namespace, uid=meta.uid, created=meta.creation_timestamp,
                          deleting=meta.deletion_timestamp is not None, labels=dict(meta.labels or {}),
                          annotations=dict(meta.annotations or {}))  # fmt: skip


def served_metadata_json(obj: Mapping[str, Any]) -> ServedMetadata:
    """The same, of an object read as JSON (a list too long for the client's typed models)."""
    meta = obj.get("metadata") or {}
    name, uid, created = meta.get("name"), meta.get("uid"), parse_rfc3339(meta.get("creationTimestamp"))
    if not isinstance(name, str) or not isinstance(uid, str) or created is None:
        raise ValueError(f"the API server returned a {obj.get('kind') or 'object'} without name, uid or creationTimestamp")
    return ServedMetadata(name=name, namespace=meta.get("namespace"), uid=uid, created=created,
                          deleting=meta.get("deletionTimestamp") is not None, labels=dict(meta.get("labels") or {}),
                          annotations=dict(meta.get("annotations") or {}))  # fmt: skip
