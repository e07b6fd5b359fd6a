"""The identity of an object the API server returned, narrowed once: the Kubernetes client types every
metadata field as optional (it also builds bodies), while the server always sets name, uid and
creationTimestamp. Used by activities/pool.py; the pass reads its pod lists as JSON (served_items_json), narrowed
the same way and checked, since a tenant's control plane is another owner's server."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import urllib3
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
        raise MalformedObject(f"a {type(obj).__name__} without metadata.name, uid or creationTimestamp")
    return ServedMetadata(name=meta.name, namespace=meta.namespace, uid=meta.uid, created=meta.creation_timestamp,
                          deleting=meta.deletion_timestamp is not None, labels=dict(meta.labels or {}),
                          annotations=dict(meta.annotations or {}))  # fmt: skip


class MalformedObject(ValueError):
    """What a control plane answered lacks what every served object has. Another owner's server may answer
    anything: the message names the field and the rule, never the body."""


def served_metadata_json(obj: object) -> ServedMetadata:
    """The same, of an object read as JSON (a list too long for the client's typed models)."""
    if not isinstance(obj, Mapping):
        raise MalformedObject(f"an item is a {type(obj).__name__}, not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise MalformedObject("metadata must be an object")
    name, uid, namespace = meta.get("name"), meta.get("uid"), meta.get("namespace")
    created = parse_rfc3339(meta.get("creationTimestamp"))
    for field_name, value in (("name", name), ("uid", uid)):
        if not isinstance(value, str) or not value:
            raise MalformedObject(f"metadata.{field_name} must be a non-empty string")
    if namespace is not None and not isinstance(namespace, str):
        raise MalformedObject("metadata.namespace must be a string")
    if created is None:
        raise MalformedObject("metadata.creationTimestamp must be an RFC 3339 time")
    return ServedMetadata(name=str(name), namespace=namespace, uid=str(uid), created=created,
                          deleting=meta.get("deletionTimestamp") is not None,
                          labels=_string_map(meta, "labels"), annotations=_string_map(meta, "annotations"))  # fmt: skip


def served_items_json(response: object) -> list[tuple[ServedMetadata, dict[str, Any]]]:
    """The items of a list read with _preload_content=False, each with its metadata; MalformedObject if the
    body is no list of objects (one bad item spoils the list: what was left out could be what a decision needed)."""
    if not isinstance(response, urllib3.BaseHTTPResponse):
        raise TypeError(f"expected an HTTP response, got {type(response).__name__}")
    try:
        listed = json.loads(response.data)
    except ValueError:
        raise MalformedObject("the body is not JSON") from None
    items = listed.get("items") if isinstance(listed, Mapping) else None
    if not isinstance(items, list):
        raise MalformedObject("items must be a list")
    return [(served_metadata_json(item), item) for item in items]


def _string_map(meta: Mapping[str, Any], field_name: str) -> dict[str, str]:
    value = meta.get(field_name) or {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise MalformedObject(f"metadata.{field_name} must map strings to strings")
    return dict(value)
