"""Pods copied into another cluster: the two rules that the virtual kubelet (a consumer pod run in the
provider, models/virtual_kubelet.py) and the pool's syncer (a tenant pod run in a super cluster,
models/pool/sync.py and workers/syncer.py) share, so that both copy the same way.

- A copy never carries the origin's service-account token: the token is the origin cluster's
  credential, meaningless (or worse, valid) elsewhere. A token volume is the one the API server adds
  (`kube-api-access-*`) or any projected volume with a serviceAccountToken source; its mounts go with it.
- The origin pod shows the copy's status as a kubelet would report it; never what describes the other
  cluster's machines (hostIP, hostIPs: a node of another cluster) or what the origin's API server
  computes for itself (qosClass).
- A reason and message the copy does not have are cleared on the origin: they were said of an earlier
  state (an eviction, or the pool's own SuperClusterUnreachable/Recreating) and would outlive it.
- Events about a copy become Events on the origin pod (`kubectl describe pod` there says why it is
  Pending over there), once per change of the source Event.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

# What of a copy's status the origin pod shows.
COPIED_STATUS = ("phase", "conditions", "containerStatuses", "initContainerStatuses", "podIP", "podIPs", "startTime",
                 "reason", "message")  # fmt: skip
CLEARED_WHEN_ABSENT = ("reason", "message")
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
MAX_REMEMBERED_EVENTS = 10_000


def is_service_account_token(volume: dict[str, Any]) -> bool:
    sources = (volume.get("projected") or {}).get("sources") or []
    return str(volume.get("name", "")).startswith("kube-api-access-") or any("serviceAccountToken" in s for s in sources)


def strip_service_account_token(spec: dict[str, Any]) -> None:
    """In place, on a copy of the origin's spec: drops the token volumes and their mounts, and stops the
    other cluster from mounting its own token."""
    dropped = {v["name"] for v in spec.get("volumes") or [] if is_service_account_token(v)}
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in dropped]
    if not spec["volumes"]:
        spec.pop("volumes")
    for key in CONTAINER_LISTS:
        for container in spec.get(key) or []:
            if "volumeMounts" in container:
                container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] not in dropped]
    spec["automountServiceAccountToken"] = False


def copied_status(copy_status: dict[str, Any]) -> dict[str, Any]:
    """What of the copy's status the origin pod shows (None: cleared, as a patch says it)."""
    shown = {k: copy_status[k] for k in COPIED_STATUS if k in copy_status}
    return {**{k: None for k in CLEARED_WHEN_ABSENT}, **shown}


def status_patch(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` as a strategic merge patch body. A strategic merge would add a new copy's pod IPs to the
    old ones (merged by `ip`), which the API server refuses (one IP per family): they are replaced whole."""
    patch = dict(status)
    if patch.get("podIPs"):
        patch["podIPs"] = [{"$patch": "replace"}, *patch["podIPs"]]
    return {"status": patch}


def condition_of(status: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), None)


def says(status: Mapping[str, Any] | None, patch: Mapping[str, Any]) -> bool:
    """Whether the pod's status already says what `patch` would write (times aside): nothing to write.
    Conditions compare by type: a pod keeps conditions of its own beside those written (a strategic merge)."""
    status = status or {}
    for key, value in patch.items():
        if key == "conditions":
            for wanted in value or []:
                have = condition_of(status, wanted["type"]) or {}
                if any(have.get(k) != wanted.get(k) for k in ("status", "reason", "message")):
                    return False
        elif status.get(key) != value:
            return False
    return True


def event_for_origin(event: dict[str, Any], pod: dict[str, Any], *, labels: Mapping[str, str]) -> dict[str, Any]:
    """An Event of the other cluster about a pod's copy, as an Event on the origin pod. Its name is derived
    from the source Event's uid, so that writing it again (a restarted syncer or virtual kubelet) updates
    it, never doubles it. What names the other cluster's machines (source.host, the copy's uid) stays
    behind."""
    meta = pod["metadata"]
    involved = event.get("involvedObject") or {}
    reflected: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{event['metadata']['uid']}", "namespace": meta["namespace"],
                     "labels": dict(labels)},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                           "uid": meta["uid"]},
        "reason": event.get("reason"), "message": event.get("message"), "type": event.get("type") or "Normal",
        "count": event.get("count") or 1,
        "source": {"component": (event.get("source") or {}).get("component") or event.get("reportingComponent")
                   or "tidepool"},
    }  # fmt: skip
    if involved.get("fieldPath"):
        reflected["involvedObject"]["fieldPath"] = involved["fieldPath"]
    first = event.get("firstTimestamp") or event.get("eventTime")
    last = event.get("lastTimestamp") or first
    if first:
        reflected["firstTimestamp"], reflected["lastTimestamp"] = first, last
    return reflected


class ReflectedEvents:
    """Which source Events (uid, count) were already reflected: one write per change of a source Event,
    never more, however often the watch repeats it. Bounded: the least recently seen are forgotten first
    (a forgotten Event that changes again is reflected again, by the same name: an update, not a copy)."""

    def __init__(self, capacity: int = MAX_REMEMBERED_EVENTS) -> None:
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._capacity = capacity

    def is_new(self, event: dict[str, Any]) -> bool:
        seen = self._seen.get(event["metadata"]["uid"])
        return seen is None or (event.get("count") or 1) > seen

    def remember(self, event: dict[str, Any]) -> None:
        uid = event["metadata"]["uid"]
        self._seen[uid] = max(self._seen.get(uid, 0), event.get("count") or 1)
        self._seen.move_to_end(uid)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)
