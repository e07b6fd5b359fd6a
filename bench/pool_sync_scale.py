"""pool_sync_scale: the pool's syncers at scale (issue 36): `tenants` tenant control planes × `pods` pods each,
on `supers` super clusters of the benchmark's own, with the real pool worker (`python -m workers.pool`:
scheduler, prober, pod placer) and one syncer per super cluster (`python -m workers.syncer`) each in a process
of its own, as users run them (and so that a syncer's memory is its own). The first tenant's control plane is the pool's management cluster too, as in tests/pool.py; the
tenants' kube-schedulers are stopped (the pool places their pods: a tenant's scheduler would only write
FailedScheduling for each one). Every tenant has a namespace `app` of one slice that fits its pods, placed by
the pool before anything is measured (so is its copy in the super cluster), and its pods ask 10m / 16Mi.

- `pods_running_seconds`: every tenant's pods created at once (`threads` connections, the tenants
  interleaved) → every copy Running in its super cluster and every pod shown Running in its tenant (status
  pushed up). Baseline, in the same run and before it: the same number of pods created at once directly in
  the super clusters, each super cluster getting as many as the pool put there (the namespaces' placements),
  each tenant's in a namespace with the same ResourceQuota as in the tenant (how a super cluster is shared
  without the pool), then deleted. Target: ratio ≤ 1.25 (virtualcluster's paper: about 1.28). The
  params say where each phase's CPU went (each kind of process, summed) and its API writes per pod.
- `syncer_rss_kib_per_pod`: per syncer, (VmRSS with every pod synced − VmRSS just before the burst) / the
  copies it keeps; the largest. Target < 20 KiB; the paper's ~40 KB per pod is the baseline.
- `other_tenant_pod_seconds_p99`: while the first tenant creates `pods` more pods at once (namespace
  `burst`), the last tenant creates `quiet_pods` pods one a second (namespace `quiet`): each one's create →
  Running in its tenant; p99. Baseline: the same quiet pods before, with nothing else happening. Target 5 s.
  At small sizes the burst is over before the quiet pods are: only the first few overlap it.
- `syncer_list_calls_per_minute_idle`: LIST requests the syncers sent in `idle_seconds` once everything was
  Running and settled, per minute. Counted by the API servers themselves: the benchmark gives each syncer an
  identity of its own in the super clusters and in the management cluster (a ServiceAccount token, bound to
  cluster-admin: what is measured is load, not permissions) and installs in every cluster a FlowSchema
  that matches the LIST verb of the syncers' identities (in the tenants that is the pool's tidepool-pool,
  which the pool worker shares: the worker is stopped for the window), and reads the FlowSchema's
  `apiserver_flowcontrol_dispatched_requests_total` from each API server's /metrics before and after.
  Watches are verb `watch` and not counted. Target 0. Every LIST any client sent meanwhile
  (`apiserver_request_total{verb="LIST"}`) is in the params, for scale. A window shorter than the syncer's
  RESYNC_SECONDS cannot see a periodic relist: the full run should use `--idle-seconds` above it.

A pod not Running by its phase's deadline (`deadline_seconds` from the phase's start) is a miss: its sample is
infinite and so is every figure it reaches. Times come from watches (kube/informer.py), stamped as events
arrive: polling 10,000 pods would be a load of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from bench.common import cpu_seconds, emit, local_env, log, percentile, rss_mb
from deploy.localenv.clusters import LocalCluster, join_pool, node_pod_cidrs
from deploy.localenv.env import EnvState
from kube.errors import already_exists
from kube.identity import request_token, token_kubeconfig
from kube.informer import Informer
from kube.objects import apply_core, drained, read_cluster_object
from kube.tenant_identity import TENANT_IDENTITY, add_tenant
from models.names import (
    LABEL_TENANT,
    LABEL_TENANT_NAMESPACE,
    POD_CLUSTER_ANNOTATION,
    SLICE_ANNOTATION,
    SUPER_CLUSTERS,
    SYSTEM_NAMESPACE,
    super_cluster_namespace,
)
from models.pool.health import health_from_status
from models.pool.namespaces import placement_of
from tests.kube import apply_cluster_config, create_node

DEFAULTS: dict[str, Any] = {"tenants": 20, "pods": 500, "supers": 3, "quiet_pods": 20, "threads": 16,
                            "idle_seconds": 60, "deadline_seconds": 600}  # fmt: skip
APP, QUIET, BURST = "app", "quiet", "burst"
DIRECT_PREFIX = "direct-"  # the baseline's namespaces in the super clusters
POD_CPU_MILLI, POD_MEMORY_MI = 10, 16
NODE_PODS = 250  # a kwok node's pods get IPs from its /24 (node_pod_cidrs)
SETUP_TIMEOUT = 300
SETTLE_SECONDS = 10  # after the last pod Running: the last status pushes and Events go out before the idle window
PROGRESS_SECONDS = 10
CREATE_ATTEMPTS = 3  # an API server answering 409/429/5xx under the burst is not what is measured
SYNCER_IDENTITY = "tidepool-syncer"
FLOW_SCHEMA = "bench-syncer-lists"
# Matched before the defaults for ServiceAccounts (service-accounts, 9000); workload-high has seats to spare.
FLOW_SCHEMA_PRECEDENCE = 500
PAPER_KIB_PER_POD = 40 * 1000 / 1024  # virtualcluster's syncer: about 40 KB per pod
ROOT = Path(__file__).resolve().parents[1]

Key = tuple[str, str, str]  # (tenant, tenant namespace, pod); the baseline's: ("", super namespace, pod)


def tenant_names(count: int) -> list[str]:
    """The tenants, each named as its control plane's cluster; the first one's is the management cluster."""
    return [f"t{i}" for i in range(count)]


def super_names(count: int) -> list[str]:
    return [f"s{i + 1}" for i in range(count)]


def quota_of(pods: int) -> dict[str, str]:
    """What `pods` pods of POD_CPU_MILLI / POD_MEMORY_MI ask: a namespace's quota, and its one slice."""
    return {"cpu": f"{pods * POD_CPU_MILLI}m", "memory": f"{pods * POD_MEMORY_MI}Mi"}


def interleaved(groups: Sequence[Sequence[Key]]) -> list[Key]:
    """One of each group in turn, so that every group's creates start at once."""
    return [key for batch in itertools.zip_longest(*groups) for key in batch if key is not None]


def done_at(keys: Iterable[Key], *ran_at: Mapping[Key, float]) -> list[float]:
    """Per key, the last of its `ran_at` times (perf_counter); a key missing from any of them is a miss."""
    return [max(r[k] for r in ran_at) if all(k in r for r in ran_at) else math.inf for k in keys]


def since(keys: Sequence[Key], done: Sequence[float], created: Mapping[Key, float]) -> list[float]:
    """Per key, seconds from its create to its `done` time (a miss stays infinite)."""
    return [at - created[key] for key, at in zip(keys, done, strict=True)]


def tail(values: Sequence[float], p: float) -> float:
    """`percentile`; of no values, a miss (nothing measured has not met the target)."""
    return percentile(values, p) if values else math.inf


def list_calls(metrics_text: str, *, flow_schema: str) -> tuple[float, float]:
    """(LISTs `flow_schema` dispatched, LISTs of every client) in an API server's /metrics text."""
    ours = total = 0.0
    for line in metrics_text.splitlines():
        match = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if not match:
            continue
        name, labels, value = match[1], dict(re.findall(r'(\w+)="([^"]*)"', match[2])), float(match[3])
        if name == "apiserver_flowcontrol_dispatched_requests_total" and labels.get("flow_schema") == flow_schema:
            ours += value
        elif name == "apiserver_request_total" and labels.get("verb") == "LIST":
            total += value
    return ours, total


WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def writes(metrics_text: str) -> dict[str, float]:
    """Write requests an API server has answered, by `verb resource[/subresource]` (and the code, when not a
    success), from its /metrics text."""
    counted: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = re.match(r"^apiserver_request_total\{([^}]*)\} (\S+)$", line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
        if labels.get("verb") in WRITE_VERBS:
            what = f"{labels['verb']} {labels.get('resource', '')}" + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            if not labels.get("code", "").startswith("2"):
                what += f" {labels.get('code')}"  # refused or failed: a write that did nothing, counted apart
            counted[what] = counted.get(what, 0.0) + float(match[2])
    return counted


class RunningWatch:
    """Every pod of one cluster followed by an informer: when each key was first seen Running, and which keys
    exist now. `key_of` names a pod (None: not one this benchmark follows)."""

    def __init__(self, name: str, api: k8s.ApiClient, key_of: Callable[[dict[str, Any]], Key | None]) -> None:
        self.running_at: dict[Key, float] = {}
        self.seen_at: dict[Key, float] = {}  # first seen: a copy made
        self.placed_at: dict[Key, float] = {}  # first seen with the pool's super cluster annotation: a pod placed
        self.present: set[Key] = set()
        self._key_of = key_of
        self._changed = threading.Condition()
        self._informer: Informer[dict[str, Any]] = Informer(
            f"sync-scale-{name}", k8s.CoreV1Api(api).list_pod_for_all_namespaces,
            on_sync=self._listed, on_event=self._event)  # fmt: skip

    def start(self) -> RunningWatch:
        self._informer.start()
        if not self._informer.wait_synced(SETUP_TIMEOUT):
            raise TimeoutError(f"informer {self._informer.name} not synced")
        return self

    def stop(self) -> None:
        self._informer.stop()

    def snapshot(self) -> tuple[dict[Key, float], set[Key]]:
        """(running_at, present) as they are now: the informer's handler changes them meanwhile."""
        with self._changed:
            return dict(self.running_at), set(self.present)

    def _listed(self, pods: list[dict[str, Any]]) -> None:
        at = time.perf_counter()
        with self._changed:
            self.present = set()
            for pod in pods:
                self._record(pod, at)
            self._changed.notify_all()

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        at = time.perf_counter()
        with self._changed:
            if kind == "DELETED":
                self.present.discard(self._key_of(pod) or ("", "", ""))
            else:
                self._record(pod, at)
            self._changed.notify_all()

    def _record(self, pod: dict[str, Any], at: float) -> None:
        key = self._key_of(pod)
        if key is None:
            return
        self.present.add(key)
        self.seen_at.setdefault(key, at)
        if POD_CLUSTER_ANNOTATION in (pod["metadata"].get("annotations") or {}):
            self.placed_at.setdefault(key, at)
        if key not in self.running_at and (pod.get("status") or {}).get("phase") == "Running":
            self.running_at[key] = at


def _tenant_key(tenant: str) -> Callable[[dict[str, Any]], Key | None]:
    def key_of(pod: dict[str, Any]) -> Key | None:
        meta = pod["metadata"]
        return (tenant, meta["namespace"], meta["name"]) if meta["namespace"] in (APP, QUIET, BURST) else None

    return key_of


def _super_key(pod: dict[str, Any]) -> Key | None:
    """A copy by its tenant pod; a baseline pod by its namespace here."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    if LABEL_TENANT in labels and LABEL_TENANT_NAMESPACE in labels:
        return labels[LABEL_TENANT], labels[LABEL_TENANT_NAMESPACE], meta["name"]
    return ("", meta["namespace"], meta["name"]) if meta["namespace"].startswith(DIRECT_PREFIX) else None


@dataclass
class Watches:
    tenants: dict[str, RunningWatch] = field(default_factory=dict)
    supers: dict[str, RunningWatch] = field(default_factory=dict)

    def all(self) -> list[RunningWatch]:
        return [*self.tenants.values(), *self.supers.values()]

    @staticmethod
    def merged(where: Mapping[str, RunningWatch]) -> dict[Key, float]:
        return {k: v for w in where.values() for k, v in w.snapshot()[0].items()}

    @staticmethod
    def wait(keys: Iterable[Key], *wheres: Mapping[str, RunningWatch], deadline: float, what: str) -> None:
        """Until every key was seen Running in one watch of each of `wheres`, or the perf_counter `deadline`.
        Only the keys still pending are looked up again (membership only: no iteration of a changing dict)."""
        pending = set(keys)
        next_progress = time.perf_counter() + PROGRESS_SECONDS
        while pending:
            pending = {k for k in pending if not all(any(k in w.running_at for w in ws.values()) for ws in wheres)}
            now = time.perf_counter()
            if not pending or now >= deadline:
                return
            if now >= next_progress:
                log(f"{what}: {len(pending)} pods not Running yet")
                next_progress = now + PROGRESS_SECONDS
            time.sleep(0.1)


def _pooled_client(cluster: LocalCluster, connections: int) -> k8s.ApiClient:
    """A client keeping `connections` connections, so that concurrent creates do not open one each."""
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return k8s.ApiClient(configuration)


def _pod(name: str) -> k8s.V1Pod:
    requests = {"cpu": f"{POD_CPU_MILLI}m", "memory": f"{POD_MEMORY_MI}Mi"}
    return k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "app", "image": "app", "resources": {"requests": requests}}]}})  # fmt: skip


def _create_pod(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    for attempt in range(CREATE_ATTEMPTS):
        try:
            drained(core.create_namespaced_pod(namespace, _pod(name), _preload_content=False))
            return
        except ApiException as e:
            if already_exists(e):
                return
            if e.status not in (409, 429, 500, 502, 503, 504) or attempt == CREATE_ATTEMPTS - 1:
                log(f"cannot create {namespace}/{name}: {e.status} {e.reason}")  # it will be a miss
                return
            time.sleep(0.5 * (attempt + 1))


def _create_all(cores: Mapping[str, k8s.CoreV1Api], keys: Sequence[tuple[str, str, str]], threads: int,
                created_at: dict[Key, float]) -> None:  # fmt: skip
    """Creates (cluster, namespace, pod) at once over `threads` connections, stamping each create's start."""

    def create(key: tuple[str, str, str]) -> None:
        created_at[key] = time.perf_counter()
        _create_pod(cores[key[0]], key[1], key[2])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, keys))


# --- setup ---------------------------------------------------------------------------------------------


def _stop_scheduler(cluster: LocalCluster) -> None:
    """A tenant control plane's kube-scheduler stopped (by its pid file): the pool places tenant pods."""
    pid_file = cluster.kubeconfig.parent.parent / "clusters" / cluster.name / "pids" / "kube-scheduler.pid"
    try:
        os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError):
        log(f"no kube-scheduler to stop in {cluster.name}")


def _nodes(api: k8s.ApiClient, name: str, index: int, pods: int) -> None:
    """kwok nodes with room for `pods` pods and far more CPU and memory than they ask, each with a /24."""
    count = max(1, math.ceil(pods / NODE_PODS))
    for i, cidr in enumerate(node_pod_cidrs(f"10.{100 + index}.0.0/16", count)):
        create_node(api, f"{name}-node-{i}", cpu="1000", memory="4000Gi", pods=str(NODE_PODS), pod_cidr=cidr)


def _syncer_kubeconfig(admin: k8s.ApiClient, path: Path) -> Path:
    """An identity of the syncer's own in a cluster (see the module's docstring), as a kubeconfig file."""
    meta = {"name": SYNCER_IDENTITY}
    apply_core(admin, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": SYSTEM_NAMESPACE}})
    apply_core(admin, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
                       "subjects": [{"kind": "ServiceAccount", "name": SYNCER_IDENTITY, "namespace": SYSTEM_NAMESPACE}],
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}})  # fmt: skip
    token = request_token(admin, SYNCER_IDENTITY, 24 * 3600)
    path.write_text(token_kubeconfig(admin.configuration, server=None, token=token, user=SYNCER_IDENTITY,
                                     namespace=SYSTEM_NAMESPACE))  # fmt: skip
    return path


def _flow_schema(admin: k8s.ApiClient, identities: Sequence[str]) -> None:
    """The FlowSchema that counts the LISTs of the syncers' identities (ServiceAccounts of tidepool-system)."""
    subjects = [{"kind": "ServiceAccount", "serviceAccount": {"name": n, "namespace": SYSTEM_NAMESPACE}} for n in identities]
    body: dict[str, Any] = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": FLOW_SCHEMA},
            "spec": {"matchingPrecedence": FLOW_SCHEMA_PRECEDENCE, "priorityLevelConfiguration": {"name": "workload-high"},
                     "rules": [{"subjects": subjects, "resourceRules": [
                         {"verbs": ["list"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                          "namespaces": ["*"]}]}]}}  # fmt: skip
    k8s.FlowcontrolApiserverV1Api(admin).create_flow_schema(k8s.V1FlowSchema.model_validate(body))


def _metrics(admin: k8s.ApiClient) -> str:
    method, url, headers, _, _ = admin.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = admin.call_api(method, url, header_params=headers)
    if response.status != 200:
        raise RuntimeError(f"GET /metrics answered {response.status} {response.reason}")
    return bytes(response.read()).decode()


def _namespace(core: k8s.CoreV1Api, name: str, pods: int) -> None:
    quota = quota_of(pods)
    core.create_namespace(k8s.V1Namespace.model_validate(
        {"metadata": {"name": name, "annotations": {SLICE_ANNOTATION: json.dumps(quota)}}}))  # fmt: skip
    core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate(
        {"metadata": {"name": "quota"}, "spec": {"hard": quota}}))  # fmt: skip


def _placed_copy(tenant: k8s.CoreV1Api, supers: Mapping[str, k8s.CoreV1Api], tenant_name: str, namespace: str) -> str | None:
    """The super cluster a tenant namespace is placed on, once its copy there can take pods (its default
    ServiceAccount made); None until then."""
    meta = tenant.read_namespace(namespace).metadata
    placement = placement_of((meta.annotations if meta else None) or {})
    if len(placement) != 1:
        return None
    (where,) = placement
    try:
        supers[where].read_namespaced_service_account("default", super_cluster_namespace(tenant_name, namespace))
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return where


class PoolWorker:
    """`python -m workers.pool` against the management cluster, in a process of its own as users run it: its
    watches, pod placer and passes do not share the benchmark's interpreter with the creating threads."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, env: EnvState, management: LocalCluster, logs: Path) -> None:
        variables = dict(os.environ, TIDEPOOL_CLUSTER_CLUSTER_ID="pool-bench",
                         TIDEPOOL_CLUSTER_KUBECONFIG=str(management.kubeconfig),
                         TIDEPOOL_TEMPORAL_ADDRESS=env.temporal_address, TIDEPOOL_TEMPORAL_NAMESPACE="default",
                         TIDEPOOL_METRICS_PORT="0", TIDEPOOL_HEALTH_PORT="0")  # fmt: skip
        with open(logs / "pool-worker.log", "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "workers.pool"], cwd=ROOT, env=variables,
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip

    def check(self) -> None:
        """A worker that died fails the run: its figures would be a dead one's."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the pool worker exited with {self.process.returncode}: see pool-worker.log")

    def stop(self) -> None:
        if self.process is None:
            return
        self.check()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class Syncers:
    """One `python -m workers.syncer` per super cluster, its output in the environment's state directory."""

    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *, management: Path, super_cluster: Path, logs: Path) -> None:
        with open(logs / f"syncer-{name}.log", "ab") as out:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "workers.syncer", "--management-kubeconfig", str(management),
                 "--super-kubeconfig", str(super_cluster), "--cluster", name,
                 "--kubelet-port", "0"],  # several on this machine: each its own free port
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip

    def rss_kib(self) -> dict[str, float]:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"the syncer of {name} exited with {process.returncode}: see its log")
        return {name: rss_mb(p.pid) * 1024 for name, p in self.processes.items()}

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class Run:
    params: dict[str, Any]
    env: EnvState
    tenants: dict[str, LocalCluster]
    supers: dict[str, LocalCluster]
    watches: Watches = field(default_factory=Watches)
    syncers: Syncers = field(default_factory=Syncers)
    cores: dict[str, k8s.CoreV1Api] = field(default_factory=dict)  # every cluster's, with `threads` connections
    lists_at_start: dict[str, tuple[float, float]] = field(default_factory=dict)  # `list_calls`, before the syncers
    placed: dict[str, str] = field(default_factory=dict)  # tenant -> the super cluster its `app` is on

    @property
    def management(self) -> LocalCluster:
        return next(iter(self.tenants.values()))

    def deadline(self) -> float:
        return time.perf_counter() + float(self.params["deadline_seconds"])

    def setup(self) -> None:
        pods, quiet, threads = int(self.params["pods"]), int(self.params["quiet_pods"]), int(self.params["threads"])
        mgmt = self.management.api_client()
        state = Path(self.env.state_dir)
        apply_cluster_config(mgmt, pool={})
        for cluster in self.tenants.values():
            _stop_scheduler(cluster)
        syncer_mgmt = _syncer_kubeconfig(mgmt, state / "syncer-management.yaml")
        for name, cluster in self.tenants.items():
            api = cluster.api_client()
            add_tenant(mgmt, api, name)
            _flow_schema(api, [TENANT_IDENTITY, SYNCER_IDENTITY] if cluster is self.management else [TENANT_IDENTITY])
        everything = len(self.tenants) * pods + pods + 2 * quiet  # all of them fit on any one super cluster
        for index, (name, cluster) in enumerate(self.supers.items()):
            api = cluster.api_client()
            _nodes(api, name, index, everything)
            _flow_schema(api, [SYNCER_IDENTITY])
        self.lists_at_start = self.list_calls()  # before any syncer: what they list from here on is counted
        for name, cluster in self.supers.items():
            api = cluster.api_client()
            join_pool(mgmt, name, cluster.kubeconfig)
            self.syncers.start(name, management=syncer_mgmt, logs=state,
                               super_cluster=_syncer_kubeconfig(api, state / f"syncer-{name}.yaml"))  # fmt: skip
        self.cores = {name: k8s.CoreV1Api(_pooled_client(c, threads)) for name, c in [*self.tenants.items(), *self.supers.items()]}  # fmt: skip
        for name, cluster in self.tenants.items():
            self.watches.tenants[name] = RunningWatch(name, cluster.api_client(), _tenant_key(name)).start()
        for name, cluster in self.supers.items():
            self.watches.supers[name] = RunningWatch(name, cluster.api_client(), _super_key).start()

    def wait_ready(self) -> None:
        """Every super cluster probed Ready, then the tenants' namespaces made, and each placed, its copy ready
        for pods."""
        mgmt = self.management.api_client()
        supers = {n: self.cores[n] for n in self.supers}

        def ready() -> bool:
            return all(health_from_status((read_cluster_object(mgmt, SUPER_CLUSTERS, n) or {}).get("status")).state == "Ready"
                       for n in self.supers)  # fmt: skip

        _wait_until(ready, what="every super cluster probed Ready")
        # The namespaces only now: a pass that saw one super cluster Ready would put every one of them there.
        pods, quiet, names = int(self.params["pods"]), int(self.params["quiet_pods"]), list(self.tenants)
        for name in names:
            _namespace(self.cores[name], APP, pods)
        _namespace(self.cores[names[-1]], QUIET, 2 * quiet)
        _namespace(self.cores[names[0]], BURST, pods)
        wanted = [(n, APP) for n in names] + [(names[-1], QUIET), (names[0], BURST)]
        for tenant, namespace in wanted:
            where = _wait_until(partial(_placed_copy, self.cores[tenant], supers, tenant, namespace),
                                what=f"{tenant}/{namespace} placed and copied")  # fmt: skip
            if namespace == APP:
                self.placed[tenant] = where
        log(f"placed: {self.placed}")

    def direct(self) -> tuple[list[float], float]:
        """The baseline: as many pods in each super cluster as the pool puts there, at once; then deleted."""
        pods, supers = int(self.params["pods"]), self.watches.supers
        for tenant, where in self.placed.items():
            core = self.cores[where]
            core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": DIRECT_PREFIX + tenant}}))
            # Each tenant's namespace with its quota, as in the tenant: a super cluster shared without the pool
            # is divided the same way, and quota admission and the quota controller are costs of either.
            core.create_namespaced_resource_quota(DIRECT_PREFIX + tenant, k8s.V1ResourceQuota.model_validate(
                {"metadata": {"name": "quota"}, "spec": {"hard": quota_of(pods)}}))  # fmt: skip
        for tenant, where in self.placed.items():
            _wait_until(partial(_has_default_account, self.cores[where], DIRECT_PREFIX + tenant),
                        what=f"{DIRECT_PREFIX}{tenant}'s ServiceAccount")  # fmt: skip
        groups = [[(where, DIRECT_PREFIX + tenant, f"app-{i}") for i in range(pods)] for tenant, where in self.placed.items()]
        created: dict[Key, float] = {}
        deadline = self.deadline()
        started = time.perf_counter()
        _create_all(self.cores, interleaved(groups), int(self.params["threads"]), created)
        log(f"created in {time.perf_counter() - started:.1f} s")  # the creating client's own share of the figure
        keys = [("", ns, name) for group in groups for (_, ns, name) in group]
        posted = {("", ns, name): at for (_, ns, name), at in created.items()}
        self.watches.wait(keys, supers, deadline=deadline, what="direct")
        done = done_at(keys, self.watches.merged(supers))
        for tenant, where in self.placed.items():
            core = self.cores[where]
            core.delete_collection_namespaced_pod(DIRECT_PREFIX + tenant, grace_period_seconds=0)
            core.delete_namespace(DIRECT_PREFIX + tenant)
        _wait_until(lambda: not any(k[0] == "" for w in supers.values() for k in w.snapshot()[1]), what="the baseline deleted")
        return since(keys, done, posted), max(done) - started

    def pool(self) -> tuple[list[float], float, dict[str, float]]:
        """The burst through the pool; with the median seconds of each stage of a pod's way."""
        pods, tenants, supers = int(self.params["pods"]), self.watches.tenants, self.watches.supers
        groups = [[(tenant, APP, f"app-{i}") for i in range(pods)] for tenant in self.tenants]
        created: dict[Key, float] = {}
        deadline = self.deadline()
        started = time.perf_counter()
        _create_all(self.cores, interleaved(groups), int(self.params["threads"]), created)
        log(f"created in {time.perf_counter() - started:.1f} s")  # the creating client's own share of the figure
        keys = [key for group in groups for key in group]
        self.watches.wait(keys, supers, tenants, deadline=deadline, what="pool")
        done = done_at(keys, self.watches.merged(supers), self.watches.merged(tenants))
        return since(keys, done, created), max(done) - started, self.stages(keys, created)

    def stages(self, keys: Sequence[Key], created: Mapping[Key, float]) -> dict[str, float]:
        """Where a pod's time goes: created → placed (the pool's pass wrote its super cluster) → copied (the
        syncer made its copy) → copy Running (the super cluster's scheduler and node) → Running in its tenant
        (the syncer pushed the status up). Medians over the pods that went the whole way."""
        placed = {k: v for w in self.watches.tenants.values() for k, v in dict(w.placed_at).items()}
        copied = {k: v for w in self.watches.supers.values() for k, v in dict(w.seen_at).items()}
        copy_running = self.watches.merged(self.watches.supers)
        tenant_running = self.watches.merged(self.watches.tenants)
        marks = [("placed", placed), ("copied", copied), ("copy_running", copy_running), ("tenant_running", tenant_running)]
        whole = [k for k in keys if k in created and all(k in m for _, m in marks)]
        stages: dict[str, float] = {}
        before: Mapping[Key, float] = created
        for name, mark in marks:
            for p in (50, 99):
                stages[f"to_{name}_p{p}"] = tail([mark[k] - before[k] for k in whole], p) if whole else math.inf
            before = mark
        for key in sorted(whole, key=lambda k: tenant_running[k] - created[k])[-3:]:  # the slowest, stage by stage
            at = [created[key], *(mark[key] for _, mark in marks)]
            log(f"slow: {'/'.join(key)} " + ", ".join(f"{name} +{at[i + 1] - at[i]:.2f}" for i, (name, _) in enumerate(marks)))
        return stages

    def cpu_seconds(self, worker: PoolWorker) -> dict[str, float]:
        """CPU seconds used so far, by component: each kind of control-plane process of the tenants and of the
        super clusters (summed over the clusters), the pool worker, the syncers and this benchmark. On 2 cores
        every component takes from the same CPU: the difference between two readings says where a phase's went."""
        used: dict[str, float] = {}

        def add(role: str, pid: int | None) -> None:
            try:
                used[role] = used.get(role, 0.0) + (cpu_seconds(pid) if pid else 0.0)
            except (FileNotFoundError, ProcessLookupError):
                pass  # exited: what it used is not read

        for kind, clusters in (("tenant", self.tenants), ("super", self.supers)):
            for cluster in clusters.values():
                for pid_file in (cluster.workdir / "clusters" / cluster.name / "pids").glob("*.pid"):
                    add(f"{kind} {pid_file.stem}", int(pid_file.read_text().strip()))
        add("pool worker", worker.process.pid if worker.process else None)
        for process in self.syncers.processes.values():
            add("syncers", process.pid)
        add("benchmark", os.getpid())
        return used

    def quiet(self, name_prefix: str, *, burst: bool) -> list[float]:
        """The last tenant's quiet pods, one a second; with `burst`, the first tenant's burst pods at once beside."""
        names, watch = list(self.tenants), self.watches.tenants
        quiet_tenant, count = names[-1], int(self.params["quiet_pods"])
        created: dict[Key, float] = {}
        burst_keys = [(names[0], BURST, f"{name_prefix}-{i}") for i in range(int(self.params["pods"]))] if burst else []
        bursting = threading.Thread(target=_create_all, args=(self.cores, burst_keys, int(self.params["threads"]), {}))
        deadline = self.deadline()
        bursting.start()
        keys = [(quiet_tenant, QUIET, f"{name_prefix}-{i}") for i in range(count)]
        for key in keys:
            created[key] = time.perf_counter()
            _create_pod(self.cores[quiet_tenant], QUIET, key[2])
            time.sleep(max(0.0, created[key] + 1 - time.perf_counter()))
        bursting.join()
        every = [*keys, *burst_keys]
        self.watches.wait(every, watch, deadline=deadline, what=f"quiet pods ({name_prefix})")
        return since(keys, done_at(keys, self.watches.merged(watch)), created)

    def list_calls(self) -> dict[str, tuple[float, float]]:
        """`list_calls` of every cluster's API server, by cluster."""
        clusters = [*self.tenants.items(), *self.supers.items()]
        return {n: list_calls(_metrics(c.api_client()), flow_schema=FLOW_SCHEMA) for n, c in clusters}

    def writes(self) -> dict[str, float]:
        """Write requests answered so far by `tenant|super verb resource`, summed over the clusters."""
        counted: dict[str, float] = {}
        for kind, clusters in (("tenant", self.tenants), ("super", self.supers)):
            for cluster in clusters.values():
                for what, count in writes(_metrics(cluster.api_client())).items():
                    counted[f"{kind} {what}"] = counted.get(f"{kind} {what}", 0.0) + count
        return counted

    def idle_lists(self) -> IdleLists:
        before = self.list_calls()
        time.sleep(float(self.params["idle_seconds"]))
        after = self.list_calls()
        return IdleLists(
            syncers={n: after[n][0] - before[n][0] for n in after},
            every_client=sum(after[n][1] - before[n][1] for n in after),
            counted_before=sum(before[n][0] - self.lists_at_start[n][0] for n in before),
            every_client_before=sum(before[n][1] - self.lists_at_start[n][1] for n in before),
        )  # fmt: skip


@dataclass(frozen=True)
class IdleLists:
    syncers: dict[str, float]  # the syncers' LISTs in the idle window, by cluster
    every_client: float  # every client's LISTs in the window, all clusters
    counted_before: float  # the syncers' (and in the tenants the pool worker's) LISTs before the window: not 0,
    # or the FlowSchema counted nothing and a 0 in the window would prove nothing
    every_client_before: float  # every client's LISTs before the window: not 0 either, or none was parsed


def _has_default_account(core: k8s.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _wait_until(check: Callable[[], Any], *, what: str) -> Any:
    deadline = time.monotonic() + SETUP_TIMEOUT
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {SETUP_TIMEOUT} s waiting for {what}")
        time.sleep(0.5)
    return result


async def _measure(params: dict[str, Any]) -> None:
    if int(params["tenants"]) < 2:
        raise ValueError("tenants must be 2 or more: one bursts while another stays quiet")
    tenants, supers = tenant_names(int(params["tenants"])), super_names(int(params["supers"]))
    with local_env([*tenants, *supers]) as env:
        run = Run(params, env, {n: env.cluster(n) for n in tenants}, {n: env.cluster(n) for n in supers})
        worker = PoolWorker()
        try:
            await asyncio.to_thread(run.setup)
            worker.start(env, run.management, Path(env.state_dir))
            await asyncio.to_thread(run.wait_ready)
            cpu_at, writes_at = [run.cpu_seconds(worker)], [run.writes()]
            direct, direct_seconds = await asyncio.to_thread(run.direct)
            log(f"direct: {len(direct)} pods Running in {direct_seconds:.1f} s")
            cpu_at.append(run.cpu_seconds(worker))
            writes_at.append(run.writes())
            rss_before = run.syncers.rss_kib()
            pooled, pool_seconds, stages = await asyncio.to_thread(run.pool)
            worker.check()
            cpu_at.append(run.cpu_seconds(worker))
            writes_at.append(run.writes())
            phases = (("direct", 0, 1), ("pool", 1, 2))
            cpu = {phase: {role: round(cpu_at[b][role] - cpu_at[a].get(role, 0.0), 1) for role in sorted(cpu_at[b])}
                   for phase, a, b in phases}  # fmt: skip
            pods_in = {"direct": len(direct), "pool": len(pooled)}
            per_pod = {phase: {what: round((writes_at[b][what] - writes_at[a].get(what, 0.0)) / pods_in[phase], 2)
                               for what in sorted(writes_at[b]) if writes_at[b][what] > writes_at[a].get(what, 0.0)}
                       for phase, a, b in phases}  # fmt: skip
            log(f"cpu seconds by component: {cpu}")
            log(f"API writes per pod: {per_pod}")
            log(f"pool: {len(pooled)} pods Running in {pool_seconds:.1f} s; stages (p50 s): "
                + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
            await asyncio.sleep(SETTLE_SECONDS)
            rss_after = run.syncers.rss_kib()
            copies = {n: sum(1 for k in w.snapshot()[1] if k[0]) for n, w in run.watches.supers.items()}
            quiet_alone = await asyncio.to_thread(run.quiet, "alone", burst=False)
            quiet_burst = await asyncio.to_thread(run.quiet, "burst", burst=True)
            log(f"quiet pods: p99 {tail(quiet_burst, 99):.1f} s during the burst, {tail(quiet_alone, 99):.1f} s alone")
            await asyncio.sleep(SETTLE_SECONDS)
            worker.stop()  # in the tenants the pool worker is the syncers' identity: silent for the window
            lists = await asyncio.to_thread(run.idle_lists)
        finally:
            try:
                worker.stop()
            finally:
                run.syncers.stop()
                for watch in run.watches.all():
                    watch.stop()
    _report(params, pooled=pooled, pool_seconds=pool_seconds, stages=stages, cpu=cpu, writes=per_pod, direct=direct,
            direct_seconds=direct_seconds, rss=(rss_before, rss_after, copies), quiet=(quiet_burst, quiet_alone),
            lists=lists)  # fmt: skip


def _report(params: Mapping[str, Any], *, pooled: Sequence[float], pool_seconds: float, stages: Mapping[str, float],
            cpu: Mapping[str, Mapping[str, float]], writes: Mapping[str, Mapping[str, float]], direct: Sequence[float],
            direct_seconds: float, rss: tuple[dict[str, float], dict[str, float], dict[str, int]],
            quiet: tuple[Sequence[float], Sequence[float]], lists: IdleLists) -> None:  # fmt: skip
    common = dict(params)
    misses = {"misses": sum(map(math.isinf, pooled)), "baseline_misses": sum(map(math.isinf, direct))}
    emit("pods_running_seconds", pool_seconds, "s", baseline=direct_seconds,  # a miss made either infinite
         params={**common, **misses, "target": "ratio <= 1.25", "pods_total": len(pooled),
                 "pod_p99_seconds": tail(pooled, 99), "baseline_pod_p99_seconds": tail(direct, 99), "stages": dict(stages),
                 "cpu_seconds": {phase: dict(by_role) for phase, by_role in cpu.items()},
                 "api_writes_per_pod": {phase: dict(by_what) for phase, by_what in writes.items()},
                 "baseline": "the same pods created directly in the super clusters, spread as the pool spread them, "
                             "in namespaces with the same quota"})  # fmt: skip
    before, after, copies = rss
    per_pod = {n: (after[n] - before[n]) / copies[n] for n in after if copies.get(n)}
    emit("syncer_rss_kib_per_pod", max(per_pod.values()) if per_pod else math.inf, "KiB", baseline=PAPER_KIB_PER_POD,
         params={**common, "target": "< 20 KiB", "per_syncer": {n: round(v, 2) for n, v in per_pod.items()},
                 "rss_kib_before": {n: round(v) for n, v in before.items()},
                 "rss_kib_after": {n: round(v) for n, v in after.items()}, "copies": copies,
                 "baseline": "virtualcluster's paper: about 40 KB per pod"})  # fmt: skip
    during, alone = quiet
    emit("other_tenant_pod_seconds_p99", tail(during, 99), "s", baseline=tail(alone, 99),
         params={**common, "target": "<= 5 s", "p50": tail(during, 50), "baseline_p50": tail(alone, 50),
                 "misses": sum(map(math.isinf, during)), "baseline_misses": sum(map(math.isinf, alone)),
                 "baseline": "the same quiet pods without the burst"})  # fmt: skip
    emit("syncer_list_calls_per_minute_idle", sum(lists.syncers.values()) * 60 / float(params["idle_seconds"]),
         "calls/min", baseline=None,
         params={**common, "target": "0", "per_cluster": lists.syncers, "every_client_lists": lists.every_client,
                 "counted_before_idle": lists.counted_before, "every_client_lists_before_idle": lists.every_client_before,
                 "method": f"FlowSchema {FLOW_SCHEMA} on the syncers' identities, pool worker stopped"})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
