"""soak: the real steady state, in real time — what a day in production costs and whether it loses anything.

The demo's topology (deploy/localenv/demo.py: clusters a, b, c and tenant; providers a and c, consumer b, the
super cluster pool) with its real processes: a worker, a network module and a kubelet stand-in per
cluster (which runs the virtual kubelets), the syncers and the pool scheduler, each cluster in its own
Temporal namespace. Production defaults, except the provider's token lifetime (TOKEN_LIFETIME_SECONDS,
twice the advertisement period) so that a run sees a rotation on every push. Everything runs in a
private state directory on free ports, beside a running `make demo` if there is one, and is torn down
at the end (also on Ctrl-C, SIGTERM or an error).

Pods churn on the virtual nodes (`churn_per_minute` created, as many deleted, CHURN_ALIVE alive at a
time) beside the demo's long-lived offloaded pods. After `warmup_minutes`, the window runs until
`minutes` after the bring-up. Figures (targets in docs/benchmarks.md):

- offloaded_pods_lost: offloaded pods (followed by their UID in the consumer, and their provider copies by
  theirs) deleted, restarted or recreated by anything but the churn, over the whole run;
- virtual_node_not_ready_seconds: node-seconds a virtual node was not Ready (or missing) after it first
  became Ready, over the whole run, sampled every `sample_seconds`;
- actions_per_peering_day_provider / _consumer: billable actions (bench/actions_per_day.count_actions) of
  every workflow of that side's Temporal namespace whose event time is inside the window, continue-as-new
  runs included, per day, divided by that side's accepted peerings; the worst provider; baseline the
  TickWorkflow (bench/echo.py) run in the same server and window. actions_per_day_pool: the pool's
  namespace, per day (not per peering);
- history_events_per_workflow_day: the largest, over every workflow of the four namespaces;
- worker_rss_growth_mib_per_hour / virtual_kubelet_rss_growth_mib_per_hour: least-squares slope of the
  per-minute RSS samples inside the window, of the largest process of each kind (baseline: the same slope
  of the consumer's kubelet stand-in, a Python process that only watches);
- token_rotations_seen: changes of the token inside the consumer's credentials Secrets seen inside the
  window (only hashes are kept; baseline: the pushes in the window, one rotation each by design);
- quota_mismatches: samples where the offer a provider enforces (recorded on its ResourceQuota in the consumer's
  foreign namespace, and split over the quotas of the consumer's namespaces there) differed from the offer of
  its Advertisement in two samples in a row, over the whole run (baseline: the samples).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import shutil
import tempfile
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from bench.actions_per_day import count_actions
from bench.common import emit, log, rss_mb
from bench.echo import EchoActivities, TickWorkflow
from deploy.localenv import demo
from deploy.localenv.env import EnvState, temporal_namespace
from kube.clients import client_from_own_kubeconfig_file
from kube.objects import list_cluster_objects, read_cluster_object
from models.enforcement import QUOTA_NAME, offer_of, quota_hard
from models.names import (
    ADVERTISEMENTS,
    LABEL_NODE_TYPE,
    LABEL_OFFLOADED,
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    VIRTUAL_NODE_TYPE,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
)
from models.resources import Resources
from models.virtual_kubelet import ORIGIN_UID
from tests.kube import offload_namespace

DEFAULTS: dict[str, Any] = {"minutes": 45.0, "warmup_minutes": 10.0, "churn_per_minute": 4.0, "sample_seconds": 5.0}
TOKEN_LIFETIME_SECONDS = 1200  # twice the advertisement period: a rotation on every push
PERIOD_SECONDS = 600  # the ClusterConfig's default advertisementPeriodSeconds, the TickWorkflow's period
DAY_SECONDS = 86400
TARGET_ACTIONS_PER_PEERING_DAY = 432  # 3 per period
TARGET_RSS_GROWTH = 5.0  # MiB per hour
RSS_EVERY_SECONDS = 60
CALL_TIMEOUT_SECONDS = 10  # every Kubernetes call of the samplers and the churn
HISTORIES_TIMEOUT_SECONDS = 600  # reading every history at the end
TEARDOWN_NOTICE = "tearing the soak down"
PROVIDERS = {"a": "cluster-a", "c": "cluster-c"}
CONSUMER = "b"
CONSUMER_ID = "cluster-b"  # as deploy/localenv/demo.py peers it
CHURN_NAMESPACE = "soak-churn"
CHURN_LABEL = "bench.tidepool.io/soak-churn"
CHURN_ALIVE = 3  # churn pods alive at a time: each lives CHURN_ALIVE churn intervals


# Pure pieces (tests/test_bench.py) ---------------------------------------------------------------------


def rss_slope_mib_per_hour(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per hour; 0 with fewer than two instants."""
    if len(samples) < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_r = sum(r for _, r in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (r - mean_r) for t, r in samples) / spread * 3600


def event_time(event: Any) -> datetime:
    return event.event_time.ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


def window_counts(runs: Iterable[Sequence[Any]], start: datetime, end: datetime) -> tuple[Counter[str], int]:
    """Billable actions by kind and history events of `runs` (the runs of one workflow, or of many)
    written inside [start, end)."""
    inside = [e for run in runs for e in run if start <= event_time(e) < end]
    actions, events, _ = count_actions(inside)
    return actions, events


def per_day(count: float, window_seconds: float) -> float:
    return count * DAY_SECONDS / window_seconds


@dataclass
class NotReadyClock:
    """Seconds each virtual node was not Ready after it first became Ready, from samples: the interval
    up to a sample counts as the state seen at its start; a node missing from a sample is not Ready."""

    first_ready: dict[str, float] = field(default_factory=dict)
    intervals: list[tuple[str, float, float]] = field(default_factory=list)  # (node, from, to) not Ready
    _last: tuple[float, dict[str, bool]] | None = None

    def sample(self, at: float, ready: dict[str, bool]) -> None:
        if self._last is not None:
            last_at, last_ready = self._last
            self.intervals += [(node, last_at, at) for node in self.first_ready if not last_ready.get(node, False)]
        for node, is_ready in ready.items():
            if is_ready:
                self.first_ready.setdefault(node, at)
        self._last = (at, ready)

    def seconds(self, start: float = float("-inf"), end: float = float("inf")) -> float:
        return sum(max(0.0, min(to, end) - max(since, start)) for _, since, to in self.intervals)


@dataclass(frozen=True)
class OffloadedPod:
    """An offloaded pod as one sample saw it: its consumer UID and restarts, its provider copy's."""

    uid: str
    name: str
    restarts: int
    copy_uid: str | None
    copy_restarts: int = 0


@dataclass
class LossLedger:
    """The offloaded pods followed by UID, and those lost: deleted or restarted in the consumer, or whose
    provider copy was deleted, recreated or restarted. The churn `forget`s a pod before it deletes it."""

    tracked: dict[str, OffloadedPod] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)  # consumer UID -> what happened (pod name included)

    def track(self, pod: OffloadedPod) -> None:
        """Follows `pod` from now on, once it runs with its copy."""
        if pod.copy_uid is not None and pod.uid not in self.tracked and pod.uid not in self.lost:
            self.tracked[pod.uid] = pod

    def forget(self, uid: str) -> None:
        self.tracked.pop(uid, None)

    def observe(self, seen: dict[str, OffloadedPod]) -> list[str]:
        """Compares one complete sample (every offloaded pod by consumer UID) with what was tracked;
        returns the new losses. A lost pod is counted once and no longer followed."""
        new = []
        for uid, before in list(self.tracked.items()):
            now = seen.get(uid)
            if now is None:
                why = "deleted in the consumer"
            elif now.restarts > before.restarts:
                why = "restarted in the consumer"
            elif now.copy_uid is None:
                why = "provider copy deleted"
            elif now.copy_uid != before.copy_uid:
                why = "provider copy recreated"
            elif now.copy_restarts > before.copy_restarts:
                why = "provider copy restarted"
            else:
                continue
            self.lost[uid] = f"{before.name}: {why}"
            del self.tracked[uid]
            new.append(self.lost[uid])
        return new


def token_hash(data: Mapping[str, bytes | str] | None) -> str | None:
    """A hash of the token(s) in a credentials Secret's data (base64 values, as the API returns them):
    the tokens of any kubeconfig in it, else a `token` key; None when there is none. The token itself is
    never kept."""
    tokens: list[str] = []
    for key, value in sorted((data or {}).items()):
        text = base64.b64decode(value).decode(errors="replace")
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError:
            config = None
        if isinstance(config, dict):
            tokens += [str((u.get("user") or {}).get("token")) for u in config.get("users") or []
                       if (u.get("user") or {}).get("token")]  # fmt: skip
        elif key == "token":
            tokens.append(text)
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest() if tokens else None


@dataclass
class RotationCounter:
    """Changes of each Secret's token hash between samples, with the time they were seen."""

    last: dict[str, str] = field(default_factory=dict)
    changes: list[tuple[float, str]] = field(default_factory=list)

    def sample(self, at: float, hashes: dict[str, str | None]) -> None:
        for name, digest in hashes.items():
            if digest is None:
                continue
            if name in self.last and self.last[name] != digest:
                self.changes.append((at, name))
            self.last[name] = digest

    def between(self, start: float, end: float) -> int:
        return sum(1 for at, _ in self.changes if start <= at < end)


# The live run -----------------------------------------------------------------------------------------


class QuotaLedger:
    """Whether each provider's ResourceQuota for the consumer (models.enforcement) equals the offer of the
    Advertisement it last pushed, sample by sample. A push writes the Advertisement, then the quota: a sample
    may fall between the two writes, so a mismatch counts once the next sample of that provider still sees it."""

    def __init__(self) -> None:
        self.samples = 0
        self.persistent: list[str] = []  # "<provider>: offer ... quota ..." of each mismatch seen twice in a row
        self._mismatched: dict[str, bool] = {}

    def observe(self, provider_id: str, *, offered: Mapping[str, str] | None, quota: Mapping[str, str] | None) -> None:
        if offered is None:
            return  # no Advertisement (yet, or withdrawn): nothing was offered to keep equal
        self.samples += 1
        mismatch = quota is None or Resources(quota_hard(Resources(offered))) != Resources(quota)
        if mismatch and self._mismatched.get(provider_id):
            self.persistent.append(f"{provider_id}: offer {dict(offered)}, quota {dict(quota or {})}")
        self._mismatched[provider_id] = mismatch


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _children(parent: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(int(p.name)) == parent]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Observer:
    """Everything the soak samples from the clusters and /proc, one sample at a time (called from a thread)."""

    apis: dict[str, k8s.ApiClient]
    processes: dict[str, int]
    ledger: LossLedger = field(default_factory=LossLedger)
    clock: NotReadyClock = field(default_factory=NotReadyClock)
    rotations: RotationCounter = field(default_factory=RotationCounter)
    quotas: QuotaLedger = field(default_factory=QuotaLedger)
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    failed_samples: int = 0

    def sample(self, at: float) -> None:
        try:
            self._nodes(at)
            self._pods()
            self._secrets(at)
            self._quotas()
        except Exception as e:  # noqa: BLE001 - a sample that fails is skipped, counted and logged
            self.failed_samples += 1
            log(f"sample skipped: {e!r}"[:300])

    def _nodes(self, at: float) -> None:
        nodes = k8s.CoreV1Api(self.apis[CONSUMER]).list_node(
            label_selector=f"{LABEL_NODE_TYPE}={VIRTUAL_NODE_TYPE}", _request_timeout=CALL_TIMEOUT_SECONDS).items
        self.clock.sample(at, {n.metadata.name: any(c.type == "Ready" and c.status == "True"
                                                    for c in (n.status.conditions if n.status else None) or [])
                               for n in nodes if n.metadata and n.metadata.name})  # fmt: skip

    def _pods(self) -> None:
        copies: dict[str, k8s.V1Pod] = {}
        for cluster in PROVIDERS:
            for pod in k8s.CoreV1Api(self.apis[cluster]).list_pod_for_all_namespaces(
                label_selector=f"{LABEL_OFFLOADED}=true", _request_timeout=CALL_TIMEOUT_SECONDS
            ).items:
                meta = pod.metadata or k8s.V1ObjectMeta()
                origin = (meta.annotations or {}).get(ORIGIN_UID)
                if origin and not meta.deletion_timestamp:
                    copies[origin] = pod
        virtual = set(self.clock.first_ready)
        seen: dict[str, OffloadedPod] = {}
        for pod in k8s.CoreV1Api(self.apis[CONSUMER]).list_pod_for_all_namespaces(
            _request_timeout=CALL_TIMEOUT_SECONDS
        ).items:
            meta = pod.metadata or k8s.V1ObjectMeta()
            node = pod.spec.node_name if pod.spec else None
            if node is None or node not in virtual or meta.deletion_timestamp or meta.uid is None:
                continue
            copy = copies.get(meta.uid)
            seen[meta.uid] = OffloadedPod(
                uid=meta.uid, name=f"{meta.namespace}/{meta.name}", restarts=_restarts(pod),
                copy_uid=(copy.metadata or k8s.V1ObjectMeta()).uid if copy is not None else None,
                copy_restarts=_restarts(copy) if copy is not None else 0,
            )  # fmt: skip
        for lost in self.ledger.observe(seen):
            log(f"offloaded pod lost: {lost}")
        for offloaded in seen.values():
            self.ledger.track(offloaded)

    def _secrets(self, at: float) -> None:
        core = k8s.CoreV1Api(self.apis[CONSUMER])
        hashes = {}
        for provider_id in PROVIDERS.values():
            name = credentials_secret_name(provider_id)
            try:
                secret = core.read_namespaced_secret(name, SYSTEM_NAMESPACE, _request_timeout=CALL_TIMEOUT_SECONDS)
            except k8s.ApiException as e:
                if e.status != 404:
                    raise
                continue
            hashes[name] = token_hash(secret.data)
        self.rotations.sample(at, hashes)

    def _quotas(self) -> None:
        for cluster, provider_id in PROVIDERS.items():
            advertisement = read_cluster_object(self.apis[CONSUMER], ADVERTISEMENTS, advertisement_name(provider_id))
            offered = ((advertisement or {}).get("spec") or {}).get("resourceQuota", {}).get("hard")
            try:
                quota = k8s.CoreV1Api(self.apis[cluster]).read_namespaced_resource_quota(
                    QUOTA_NAME, foreign_namespace(CONSUMER_ID), _request_timeout=CALL_TIMEOUT_SECONDS)  # fmt: skip
            except k8s.ApiException as e:
                if e.status != 404:
                    raise
                quota = None
            # Since issue 35 this quota's hard is only its share of the offer: the whole one is recorded on it.
            enforced = offer_of(quota.metadata.annotations) if quota is not None and quota.metadata is not None else None
            self.quotas.observe(provider_id, offered=offered, quota=enforced)

    def sample_rss(self, at: float) -> None:
        for name, pid in self.processes.items():
            if name.startswith(("worker-", "pool-scheduler")):
                self._rss(at, name, pid)
            elif name.startswith("kubelet-"):
                self._rss(at, name, pid)
                for child in _children(pid):
                    if "virtual_kubelet" in _cmdline(child):
                        self._rss(at, f"virtual-kubelet pid {child} ({name})", child)

    def _rss(self, at: float, name: str, pid: int) -> None:
        try:
            self.rss[name].append((at, rss_mb(pid)))
        except (OSError, RuntimeError):
            pass  # it exited between the listing and the reading


def _restarts(pod: k8s.V1Pod) -> int:
    return sum(s.restart_count or 0 for s in ((pod.status.container_statuses if pod.status else None) or []))


@dataclass
class Churn:
    """Creates a pod on a virtual node (providers in turn) at each step and deletes the oldest beyond
    CHURN_ALIVE, telling the ledger first so that the deletion is not counted as a loss."""

    api: k8s.ApiClient
    ledger: LossLedger
    alive: deque[tuple[str, str | None]] = field(default_factory=deque)  # (name, uid), oldest first
    created: int = 0
    deleted: int = 0
    errors: int = 0

    def step(self) -> None:
        core = k8s.CoreV1Api(self.api)
        try:
            provider = list(PROVIDERS.values())[self.created % len(PROVIDERS)]
            name = f"churn-{self.created}"
            pod = core.create_namespaced_pod(CHURN_NAMESPACE, k8s.V1Pod.model_validate({
                "metadata": {"name": name, "labels": {CHURN_LABEL: "true"}},
                "spec": {"containers": [{"name": "main", "image": "busybox",
                                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
                         "nodeSelector": {LABEL_PROVIDER: provider},
                         "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}]},
            }), _request_timeout=CALL_TIMEOUT_SECONDS)  # fmt: skip
            self.created += 1
            self.alive.append((name, pod.metadata.uid if pod.metadata else None))
            while len(self.alive) > CHURN_ALIVE:
                old, uid = self.alive.popleft()
                if uid is not None:  # a pod the server returned without a UID was never tracked
                    self.ledger.forget(uid)
                core.delete_namespaced_pod(old, CHURN_NAMESPACE, grace_period_seconds=0,
                                           _request_timeout=CALL_TIMEOUT_SECONDS)  # fmt: skip
                self.deleted += 1
        except Exception as e:  # noqa: BLE001 - a failed step is counted and the churn goes on
            self.errors += 1
            log(f"churn step failed: {e!r}"[:300])


async def _histories(client: Client) -> dict[str, list[list[Any]]]:
    """Every run of every workflow of the client's namespace, by workflow id, following continue-as-new
    to runs the visibility store has not listed yet."""
    runs: dict[str, list[list[Any]]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    pending = [(e.id, e.run_id) async for e in client.list_workflows()]
    while pending:
        workflow_id, run_id = pending.pop()
        if (workflow_id, run_id) in seen:
            continue
        seen.add((workflow_id, run_id))
        events = list((await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()).events)
        runs[workflow_id].append(events)
        last = events[-1] if events else None
        if last is not None and last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            pending.append((workflow_id, last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id))
    return runs


def _accepted_peerings(api: k8s.ApiClient) -> dict[str, int]:
    """Accepted Advertisements on the consumer, by provider cluster id."""
    items = list_cluster_objects(api, ADVERTISEMENTS, _request_timeout=CALL_TIMEOUT_SECONDS)
    accepted: Counter[str] = Counter()
    for adv in items:
        if (adv.get("status") or {}).get("phase") == "Accepted" and not adv["metadata"].get("deletionTimestamp"):
            accepted[str((adv.get("spec") or {}).get("clusterId"))] += 1
    return dict(accepted)


def _pushes(runs: dict[str, list[list[Any]]], start: datetime, end: datetime) -> int:
    return sum(1 for chain in runs.values() for run in chain for e in run
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and start <= event_time(e) < end
               and e.activity_task_scheduled_event_attributes.activity_type.name == "push_advertisement")  # fmt: skip


async def _run_window(params: dict[str, Any], state: EnvState) -> None:
    minutes, warmup = float(params["minutes"]), float(params["warmup_minutes"])
    sample_every, churn_every = float(params["sample_seconds"]), 60 / float(params["churn_per_minute"])
    apis = {name: client_from_own_kubeconfig_file(path) for name, path in state.kubeconfigs.items()}
    k8s.CoreV1Api(apis[CONSUMER]).create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": CHURN_NAMESPACE}}))
    offload_namespace(apis[CONSUMER], CHURN_NAMESPACE)  # its pods may run on the virtual nodes
    observer = Observer(apis=apis, processes=demo.processes(state))
    churn = Churn(apis[CONSUMER], observer.ledger)
    default = await Client.connect(state.temporal_address, namespace="default")
    tick_queue = f"soak-tick-{uuid.uuid4().hex[:8]}"
    async with Worker(default, task_queue=tick_queue, workflows=[TickWorkflow],
                      activities=[EchoActivities(lambda value, at: None).echo]):  # fmt: skip
        tick = await default.start_workflow(TickWorkflow.run, PERIOD_SECONDS, id=tick_queue, task_queue=tick_queue)
        began = time.monotonic()
        window_start_at, window_end_at = began + warmup * 60, began + minutes * 60
        now = datetime.now(UTC)
        window_start, window_end = now + timedelta(minutes=warmup), now + timedelta(minutes=minutes)
        log(f"steady state: warm-up until {window_start:%H:%M:%S}, window until {window_end:%H:%M:%S} UTC")
        next_sample = next_rss = next_churn = began
        next_report = began + 60
        while (at := time.monotonic()) < window_end_at:
            if at >= next_sample:
                await asyncio.to_thread(observer.sample, at)
                next_sample += sample_every
            if at >= next_rss:
                await asyncio.to_thread(observer.sample_rss, at)
                next_rss += RSS_EVERY_SECONDS
            if at >= next_churn:
                await asyncio.to_thread(churn.step)
                next_churn += churn_every
            if at >= next_report:
                log(f"{(at - began) / 60:.0f}/{minutes:g} min: {len(observer.ledger.lost)} pods lost, "
                    f"{observer.clock.seconds():.0f} s not Ready, {len(observer.rotations.changes)} rotations, "
                    f"churn {churn.created} created")  # fmt: skip
                next_report += 60
            await asyncio.sleep(max(0.0, min(next_sample, next_rss, next_churn, window_end_at) - time.monotonic()))
        await asyncio.to_thread(observer.sample, time.monotonic())
        accepted = await asyncio.to_thread(_accepted_peerings, apis[CONSUMER])
        log("reading every history")
        histories = {}
        for cluster in (*PROVIDERS, CONSUMER, "tenant"):
            client = await Client.connect(state.temporal_address, namespace=temporal_namespace(cluster))
            histories[cluster] = await asyncio.wait_for(_histories(client), timeout=HISTORIES_TIMEOUT_SECONDS)
        tick_runs = await asyncio.wait_for(_histories(default), timeout=HISTORIES_TIMEOUT_SECONDS)
        await tick.terminate("soak done")
    _report(params, observer, churn, accepted, histories, tick_runs[tick_queue], window_start, window_end,
            window_start_at, window_end_at)  # fmt: skip


def _report(params: dict[str, Any], observer: Observer, churn: Churn, accepted: dict[str, int],
            histories: dict[str, dict[str, list[list[Any]]]], tick_runs: list[list[Any]], window_start: datetime,
            window_end: datetime, window_start_at: float, window_end_at: float) -> None:  # fmt: skip
    window = (window_end - window_start).total_seconds()
    common = {"minutes": params["minutes"], "warmup_minutes": params["warmup_minutes"], "window_seconds": window,
              "churn_per_minute": params["churn_per_minute"], "token_lifetime_seconds": TOKEN_LIFETIME_SECONDS}  # fmt: skip
    tick_actions, tick_events = window_counts(tick_runs, window_start, window_end)
    tick_per_day = per_day(sum(tick_actions.values()), window)
    baseline = {"baseline": f"TickWorkflow, one activity + one timer per {PERIOD_SECONDS} s "
                f"({2 * DAY_SECONDS // PERIOD_SECONDS}/day in theory)"}  # fmt: skip

    emit("offloaded_pods_lost", len(observer.ledger.lost), "pods", baseline=len(observer.ledger.tracked) + len(observer.ledger.lost),
         params={**common, "lost": sorted(observer.ledger.lost.values()), "target": 0, "churn_created": churn.created,
                 "churn_deleted": churn.deleted, "churn_errors": churn.errors, "failed_samples": observer.failed_samples,
                 "baseline": "offloaded pods followed"})  # fmt: skip
    observed = sum(window_end_at - since for since in observer.clock.first_ready.values())
    emit("virtual_node_not_ready_seconds", observer.clock.seconds(), "s", baseline=observed,
         params={**common, "in_window": observer.clock.seconds(window_start_at, window_end_at), "target": 0,
                 "nodes": sorted(observer.clock.first_ready), "baseline": "node-seconds followed since first Ready"})  # fmt: skip

    by_side: dict[str, tuple[float, dict[str, Any]]] = {}
    for cluster, runs in histories.items():
        actions, events = window_counts([run for chain in runs.values() for run in chain], window_start, window_end)
        provider_id = PROVIDERS.get(cluster)
        peerings = (accepted.get(provider_id, 0) if provider_id else sum(accepted.values())) if cluster != "tenant" else 1
        value = per_day(sum(actions.values()), window) / max(1, peerings)
        by_side[cluster] = (value, {"namespace": temporal_namespace(cluster), "actions_in_window": sum(actions.values()),
                                    "by_kind": dict(actions), "events_in_window": events, "workflows": sorted(runs),
                                    **({"accepted_peerings": peerings} if cluster != "tenant" else {})})  # fmt: skip
    worst = max(PROVIDERS, key=lambda c: by_side[c][0])
    target = {"target": f"≤ {TARGET_ACTIONS_PER_PEERING_DAY}"}
    emit("actions_per_peering_day_provider", by_side[worst][0], "actions/peering/day", baseline=tick_per_day,
         params={**common, **baseline, **target, "worst": by_side[worst][1],
                 "all": {c: round(by_side[c][0], 1) for c in PROVIDERS}})  # fmt: skip
    emit("actions_per_peering_day_consumer", by_side[CONSUMER][0], "actions/peering/day", baseline=tick_per_day,
         params={**common, **baseline, **target, **by_side[CONSUMER][1]})
    emit("actions_per_day_pool", by_side["tenant"][0], "actions/day", baseline=tick_per_day,
         params={**common, **baseline, **by_side["tenant"][1]})

    per_workflow = {f"{temporal_namespace(c)}/{wid}": per_day(window_counts(chain, window_start, window_end)[1], window)
                    for c, runs in histories.items() for wid, chain in runs.items()}  # fmt: skip
    busiest = max(per_workflow, key=lambda k: per_workflow[k]) if per_workflow else None
    emit("history_events_per_workflow_day", per_workflow.get(busiest, 0.0) if busiest else 0.0, "events/day",
         baseline=per_day(tick_events, window),
         params={**common, **baseline, "workflow": busiest,
                 "top": dict(sorted(((k, round(v)) for k, v in per_workflow.items()), key=lambda kv: -kv[1])[:8])})  # fmt: skip

    slopes = {name: rss_slope_mib_per_hour([s for s in samples if window_start_at <= s[0] <= window_end_at])
              for name, samples in observer.rss.items()}  # fmt: skip
    last_rss = {name: samples[-1][1] for name, samples in observer.rss.items() if samples}
    stand_in = slopes.get(f"kubelet-{CONSUMER}")
    for figure, prefix in (("worker_rss_growth_mib_per_hour", ("worker-", "pool-scheduler")),
                           ("virtual_kubelet_rss_growth_mib_per_hour", ("virtual-kubelet",))):  # fmt: skip
        kind = [name for name in slopes if name.startswith(prefix)]
        largest = max(kind, key=lambda n: last_rss.get(n, 0.0)) if kind else None
        emit(figure, slopes[largest] if largest else 0.0, "MiB/h", baseline=stand_in,
             params={**common, "process": largest, "rss_mib": round(last_rss.get(largest, 0.0), 1) if largest else None,
                     "samples": len(observer.rss.get(largest, [])) if largest else 0, "target": f"≤ {TARGET_RSS_GROWTH}",
                     "all": {n: round(slopes[n], 2) for n in kind},
                     "baseline": f"kubelet-{CONSUMER} (the stand-in that runs the virtual kubelets)"})  # fmt: skip

    emit("quota_mismatches", len(observer.quotas.persistent), "samples", baseline=observer.quotas.samples,
         params={**common, "target": 0, "mismatches": observer.quotas.persistent[:10],
                 "baseline": "samples of a provider's offer and its foreign namespace's ResourceQuota"})  # fmt: skip

    pushes = sum(_pushes(histories[c], window_start, window_end) for c in PROVIDERS)
    emit("token_rotations_seen", observer.rotations.between(window_start_at, window_end_at), "rotations",
         baseline=pushes, params={**common, "whole_run": len(observer.rotations.changes),
                                  "baseline": "pushes in the window (one rotation each by design)"})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    if not 0 <= float(params["warmup_minutes"]) < float(params["minutes"]):
        raise ValueError("warmup_minutes must be at least 0 and less than minutes")
    if float(params["churn_per_minute"]) <= 0 or float(params["sample_seconds"]) <= 0:
        raise ValueError("churn_per_minute and sample_seconds must be positive")
    state_dir = Path(tempfile.mkdtemp(prefix="tidepool-soak-"))
    log(f"bringing the demo's topology up in {state_dir} (token lifetime {TOKEN_LIFETIME_SECONDS} s)")
    try:
        # Outside the event loop, so that Ctrl-C stops it where it is; its waits are bounded (deploy/localenv/demo.py)
        # and it records every process as it starts it, for tear_down. Its output goes to stderr. No real
        # nodes: the run follows each process's memory, which b's stand-in runs as local processes.
        state = demo.bring_up(state_dir, persistent=False, real_nodes=False,
                              worker_env={"TIDEPOOL_PROVIDER_TOKEN_LIFETIME_SECONDS": str(TOKEN_LIFETIME_SECONDS)})  # fmt: skip
        asyncio.run(_run_window(params, state))
    finally:
        log(TEARDOWN_NOTICE)
        # The processes' logs outlive the run: they are what explains a figure, or a bring-up that failed.
        if (state_dir / "logs").exists():
            kept = Path(tempfile.mkdtemp(prefix="tidepool-soak-logs-"))
            shutil.copytree(state_dir / "logs", kept, dirs_exist_ok=True)
            log(f"the processes' logs are kept in {kept}")
        demo.tear_down(state_dir)
