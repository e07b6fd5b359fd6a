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
- What the other cluster reports is bounded before the origin's API server and its readers see it: reasons
  and messages are cut (MAX_REASON_CHARS, MAX_MESSAGE_CHARS), the origin shows conditions only of the types
  a pod has (its readiness gates' included) and a container's status only for a container of its spec, each
  once, with the fields a kubelet writes; Events come at most EVENTS_PER_MINUTE per pod (EventBudget), the
  rest counted in one summarizing Event.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from models.recent import Recent

# What of a copy's status the origin pod shows.
COPIED_STATUS = ("phase", "conditions", "containerStatuses", "initContainerStatuses", "podIP", "podIPs", "startTime",
                 "reason", "message")  # fmt: skip
CLEARED_WHEN_ABSENT = ("reason", "message")
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
MAX_REMEMBERED_EVENTS = 10_000
# A kubelet cuts its Events' messages at 1 KiB; reasons are short CamelCase words.
MAX_REASON_CHARS = 128
MAX_MESSAGE_CHARS = 1024
MAX_OTHER_CHARS = 256  # times, phases, image names and ids: nothing a kubelet writes is longer
# The condition types a kubelet and the control plane write on a pod; a pod's readiness gates add its own.
POD_CONDITION_TYPES = frozenset({"PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready",
                                 "DisruptionTarget", "PodResizePending", "PodResizeInProgress"})  # fmt: skip
CONDITION_FIELDS = ("type", "status", "reason", "message", "lastProbeTime", "lastTransitionTime")
CONTAINER_STATUS_FIELDS = ("name", "ready", "restartCount", "image", "imageID", "containerID", "started")
CONTAINER_STATE_FIELDS = {"waiting": ("reason", "message"), "running": ("startedAt",),
                          "terminated": ("exitCode", "signal", "reason", "message", "startedAt", "finishedAt",
                                         "containerID")}  # fmt: skip
# Events reflected per origin pod: a kubelet's own rate (its event recorder's burst, then a steady trickle).
EVENTS_PER_MINUTE = 10
EVENTS_BURST = 20
# How often the Event that counts the dropped ones is written again while they keep coming.
DROPPED_EVENTS_SUMMARY_SECONDS = 60


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


class StatusShape(NamedTuple):
    """What of the origin pod's spec bounds the status it shows: its containers' names and its readiness
    gates' condition types."""

    containers: tuple[str, ...] = ()
    init_containers: tuple[str, ...] = ()
    condition_types: frozenset[str] = POD_CONDITION_TYPES


def status_shape(spec: Mapping[str, Any]) -> StatusShape:
    def names(key: str) -> tuple[str, ...]:
        return tuple(str(c.get("name")) for c in spec.get(key) or [] if isinstance(c, Mapping))

    gates = {str(g.get("conditionType")) for g in spec.get("readinessGates") or [] if isinstance(g, Mapping)}
    return StatusShape(names("containers"), names("initContainers"), POD_CONDITION_TYPES | gates)


def clipped(key: str, value: Any) -> Any:
    """A scalar the other cluster reported, cut to its field's bound; None for anything but a scalar."""
    if isinstance(value, str):
        limit = MAX_REASON_CHARS if key == "reason" else MAX_MESSAGE_CHARS if key == "message" else MAX_OTHER_CHARS
        return value[:limit]
    return value if isinstance(value, bool | int | float) else None


def _fields(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """`keys` of `obj`, clipped; a null stays (the API server writes `lastProbeTime: null`: the same shown)."""
    if not isinstance(obj, Mapping):
        return {}
    return {k: v for k in keys if k in obj and ((v := clipped(k, obj[k])) is not None or obj[k] is None)}


def _once_each(entries: Any, key: str, allowed: Any) -> list[Mapping[str, Any]]:
    """The entries whose `key` is allowed, the first of each, in the order reported."""
    seen: set[Any] = set()
    kept = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and entry.get(key) in allowed and entry.get(key) not in seen:
            seen.add(entry.get(key))
            kept.append(entry)
    return kept


def _container_status(status: Mapping[str, Any]) -> dict[str, Any]:
    shown = _fields(status, CONTAINER_STATUS_FIELDS)
    for key in ("state", "lastState"):
        state = status.get(key)
        if isinstance(state, Mapping):
            shown[key] = {kind: _fields(state[kind], fields) for kind, fields in CONTAINER_STATE_FIELDS.items()
                          if isinstance(state.get(kind), Mapping)}  # fmt: skip
    return shown


def copied_status(copy_status: dict[str, Any], *, shape: StatusShape) -> dict[str, Any]:
    """What of the copy's status the origin pod shows (None: cleared, as a patch says it), bounded by the
    origin's `shape`: conditions of a pod's types, container statuses of its containers, each once."""
    shown: dict[str, Any] = {k: None for k in CLEARED_WHEN_ABSENT}
    for key in ("phase", "startTime", "reason", "message"):
        if key in copy_status:
            shown[key] = clipped(key, copy_status[key])
    if "conditions" in copy_status:
        shown["conditions"] = [_fields(c, CONDITION_FIELDS)
                               for c in _once_each(copy_status["conditions"], "type", shape.condition_types)]  # fmt: skip
    for key, names in (("containerStatuses", shape.containers), ("initContainerStatuses", shape.init_containers)):
        if key in copy_status:
            shown[key] = [_container_status(c) for c in _once_each(copy_status[key], "name", names)]
    for key in ("podIP", "podIPs"):  # the virtual kubelet checks them against the provider's PodCIDR
        if key in copy_status:
            shown[key] = copy_status[key]
    return shown


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


def said_by_the_pool(event: dict[str, Any]) -> bool:
    """Whether an Event about a pool pod's copy says what the tenant is told in its own names already: the super
    cluster's scheduler's `Scheduled` names the super cluster's namespace and node, where the pool's own
    `Scheduled` Event says which super cluster and the binding to a virtual node says which node. Not
    reflected: one tenant write a pod fewer in a burst."""
    return event.get("reason") == "Scheduled" and event.get("type") != "Warning"


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
        "reason": clipped("reason", event.get("reason")), "message": clipped("message", event.get("message")),
        "type": "Warning" if event.get("type") == "Warning" else "Normal",
        "count": min(count, 2**31 - 1) if isinstance(count := event.get("count"), int) and count > 0 else 1,
        "source": {"component": clipped("component", (event.get("source") or {}).get("component")
                                        or event.get("reportingComponent")) or "tidepool"},
    }  # fmt: skip
    if involved.get("fieldPath"):
        reflected["involvedObject"]["fieldPath"] = clipped("fieldPath", involved["fieldPath"])
    first = event.get("firstTimestamp") or event.get("eventTime")
    last = event.get("lastTimestamp") or first
    if first:
        reflected["firstTimestamp"], reflected["lastTimestamp"] = first, last
    return reflected


def dropped_events_event(pod: dict[str, Any], *, dropped: int, source: str, labels: Mapping[str, str],
                         now: str) -> dict[str, Any]:  # fmt: skip
    """The one Event on an origin pod that counts the Events about its copy that EventBudget dropped: one
    name per pod, written again (its count and message) as more are dropped."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{meta['uid']}.dropped", "namespace": meta["namespace"],
                     "labels": dict(labels)},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                           "uid": meta["uid"]},
        "reason": "ReflectedEventsDropped", "type": "Warning", "count": dropped,
        "message": f"{dropped} Events from {source} about this pod were not shown: more than {EVENTS_PER_MINUTE} "
                   f"a minute (bursts of {EVENTS_BURST})",
        "source": {"component": "tidepool"}, "firstTimestamp": now, "lastTimestamp": now,
    }  # fmt: skip


class ReflectedEvents:
    """Which source Events (uid, count) were already reflected: one write per change of a source Event,
    never more, however often the watch repeats it. Bounded: the least recently seen are forgotten first
    (a forgotten Event that changes again is reflected again, by the same name: an update, not a copy)."""

    def __init__(self, capacity: int = MAX_REMEMBERED_EVENTS) -> None:
        self._seen: Recent[str, int] = Recent(capacity)

    def is_new(self, event: dict[str, Any]) -> bool:
        seen = self._seen.get(event["metadata"]["uid"])
        return seen is None or (event.get("count") or 1) > seen

    def remember(self, event: dict[str, Any]) -> None:
        uid = event["metadata"]["uid"]
        self._seen.put(uid, max(self._seen.get(uid) or 0, event.get("count") or 1))

    def __len__(self) -> int:
        return len(self._seen)


K = TypeVar("K", bound=Hashable)


class EventBudget(Generic[K]):
    """Events reflected per origin pod: a token bucket each (EVENTS_PER_MINUTE, at most EVENTS_BURST at once),
    so that the other cluster cannot flood a pod's Events (nor the API server behind them). What exceeds it is
    dropped and counted; `summary_due` says when the Event that counts them is written again. Bounded: the
    least recently used pods are forgotten first, and the caller forgets a pod that is gone."""

    def __init__(self, *, per_minute: int = EVENTS_PER_MINUTE, burst: int = EVENTS_BURST,
                 capacity: int = MAX_REMEMBERED_EVENTS) -> None:  # fmt: skip
        self._rate, self._burst = per_minute / 60, burst
        self._buckets: Recent[K, list[float]] = Recent(capacity)  # key -> [tokens, at, dropped, summarized at]

    def take(self, key: K, *, now: float) -> bool:
        """Whether one more Event about `key` may be written now; when not, it counts as dropped."""
        bucket = self._bucket(key, now)
        bucket[0] = min(self._burst, bucket[0] + (now - bucket[1]) * self._rate)
        bucket[1] = now
        if bucket[0] >= 1:
            bucket[0] -= 1
            return True
        bucket[2] += 1
        return False

    def dropped(self, key: K) -> int:
        bucket = self._buckets.get(key)
        return int(bucket[2]) if bucket is not None else 0

    def summary_due(self, key: K, *, now: float) -> bool:
        """Whether the count of `key`'s dropped Events should be written now (and it is taken as written):
        at the first drop, then at most every DROPPED_EVENTS_SUMMARY_SECONDS."""
        bucket = self._buckets.get(key)
        if bucket is None or not bucket[2] or now - bucket[3] < DROPPED_EVENTS_SUMMARY_SECONDS:
            return False
        bucket[3] = now
        return True

    def forget(self, key: K) -> None:
        self._buckets.pop(key)

    def _bucket(self, key: K, now: float) -> list[float]:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = [float(self._burst), now, 0, -math.inf]
        self._buckets.put(key, bucket)  # the most recently used: the last forgotten
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)


class Throttle(Generic[K]):
    """Says something about a key at most every `seconds`, or at once when what it says changes (a new
    address reported): one Warning, not one per status change. Bounded like EventBudget."""

    def __init__(self, seconds: float, *, capacity: int = MAX_REMEMBERED_EVENTS) -> None:
        self._seconds = seconds
        self._said: Recent[K, tuple[Hashable, float]] = Recent(capacity)

    def due(self, key: K, what: Hashable, *, now: float) -> bool:
        said = self._said.get(key)
        if said is not None and said[0] == what and now - said[1] < self._seconds:
            return False
        self._said.put(key, (what, now))
        return True

    def forget(self, key: K) -> None:
        self._said.pop(key)

    def __len__(self) -> int:
        return len(self._said)
