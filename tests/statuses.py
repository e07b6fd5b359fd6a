"""A StatusTarget (kube/status.py) for tests without a cluster: it keeps one object, applies each status
patch to it as the API server does (a JSON merge patch of the status subresource), and records every call
in order, so that a test reads both what was written and what the object became."""

from __future__ import annotations

import copy
from typing import Any

from kube.status import Event, merge_patched

Obj = dict[str, Any]


class RecordingServer:
    def __init__(self, obj: Obj) -> None:
        self.obj = copy.deepcopy(obj)
        self.calls: list[tuple[str, Any]] = []  # ("patch", status patch) or ("event", Event)

    def patch_status(self, obj: Obj, status: Obj) -> None:
        assert obj["metadata"]["name"] == self.obj["metadata"]["name"], "patched another object"
        self.calls.append(("patch", copy.deepcopy(status)))
        self.obj["status"] = merge_patched(self.obj.get("status") or {}, status)

    def record_event(self, obj: Obj, event: Event) -> None:
        self.calls.append(("event", event))

    def read(self) -> Obj:
        """The object as a fresh read returns it."""
        return copy.deepcopy(self.obj)

    @property
    def patches(self) -> list[Obj]:
        return [status for kind, status in self.calls if kind == "patch"]
