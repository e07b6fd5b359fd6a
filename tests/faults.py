"""What the fault tests (tests/test_faults_*.py) share: a cluster worker run as a real separate process
(so that SIGKILL is real), the one "converged and nothing orphaned" check of a provider/consumer pair,
a check that no workflow history holds a failed workflow task, and the scanner of histories for
credentials."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from deploy.localenv.clusters import LocalCluster
from kube.objects import list_cluster_objects, read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    LABEL_OFFLOADED,
    MANAGED_BY,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    credentials_secret_name,
    foreign_namespace,
    virtual_kubelet_name,
    virtual_node_name,
)
from tests.kube import apply_cluster_config, create_namespace, create_node, offload_namespace
from tests.replay import every_run, run_histories

# The sequence of kill points is drawn from this seed (printed by the tests, overridable to replay one).
DEFAULT_SEED = 20261123


def fault_seed() -> int:
    return int(os.environ.get("TIDEPOOL_FAULT_SEED", DEFAULT_SEED))


class WorkerProcess:
    """`python -m workers.cluster` as a child process, configured by TIDEPOOL_* variables like the demo's
    workers; `kill()` is a real SIGKILL, `start()` a fresh process with the same settings."""

    def __init__(self, *, cluster: LocalCluster, cluster_id: str, temporal_address: str, log: Path,
                 namespace: str = "default", pod_cidr: str = "10.0.0.0/16", identity: str | None = None) -> None:  # fmt: skip
        """`identity`: its name in the cluster's Lease, kept across restarts like a pod's (None: a new one
        at each start, which waits out the Lease a killed predecessor held)."""
        self.cluster_id = cluster_id
        self.log = log
        self.kills = 0
        self._env = dict(os.environ)
        self._env.update({
            "TIDEPOOL_CLUSTER_CLUSTER_ID": cluster_id,
            "TIDEPOOL_CLUSTER_KUBECONFIG": str(cluster.kubeconfig),
            "TIDEPOOL_CLUSTER_POD_CIDR": pod_cidr,
            "TIDEPOOL_TEMPORAL_ADDRESS": temporal_address,
            "TIDEPOOL_TEMPORAL_NAMESPACE": namespace,
            "TIDEPOOL_METRICS_PORT": "0",
            "TIDEPOOL_HEALTH_PORT": "0",  # many workers on one machine
        })  # fmt: skip
        if identity is not None:
            self._env["TIDEPOOL_LEADER_IDENTITY"] = identity
        # Bytecode, as in the image (pip compiles what it installs): without it the workflow sandbox compiles
        # the workflow's module from source for every run it creates (a tenth of a worker's CPU in a burst).
        self._env.pop("PYTHONDONTWRITEBYTECODE", None)
        self._env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "tidepool-pycache")
        self._process: subprocess.Popen[bytes] | None = None
        self._starts = 0

    def start(self) -> WorkerProcess:
        assert self._process is None or self._process.poll() is not None, "already running"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self._process = subprocess.Popen([sys.executable, "-m", "workers.cluster"], env=self._env, stdout=out,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        self._starts += 1
        return self

    def ready(self) -> bool:
        """True once this start has logged that it serves its task queue (workers/cluster.py)."""
        if not self.alive() or not self.log.exists():
            return False
        return self.log.read_text(errors="replace").count(f"worker for cluster {self.cluster_id} on task queue") >= self._starts

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed, in-flight activities are simply lost."""
        assert self._process is not None and self._process.poll() is None, f"worker {self.cluster_id} is not running"
        os.kill(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=10)
        self.kills += 1

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        assert self._process is not None, f"worker {self.cluster_id} was never started"
        return self._process.pid

    def stop(self) -> None:
        if self.alive():
            assert self._process is not None
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def exit_code(self) -> int | None:
        return None if self._process is None else self._process.poll()


@dataclass(frozen=True)
class Pair:
    """A provider and a consumer cluster, peered (or being peered) under these ids."""

    provider: LocalCluster
    consumer: LocalCluster
    provider_id: str
    consumer_id: str


def new_pair(make_cluster: Callable[[str], LocalCluster], unique: str) -> Pair:
    """Two clusters of the test's own: a provider with one 8-CPU node sharing 50%, and a consumer with
    tidepool's system namespace and an `app` namespace for workloads, offloaded."""
    pair = Pair(make_cluster("prov"), make_cluster("cons"), f"prov-{unique}", f"cons-{unique}")
    prepare_pair(pair.provider.api_client(), pair.consumer.api_client())
    return pair


def prepare_pair(provider: k8s.ApiClient, consumer: k8s.ApiClient) -> None:
    """What a peering of the fault tests and benchmarks starts from, on two fresh clusters."""
    create_node(provider, "big", cpu="8", memory="16Gi")
    apply_cluster_config(provider, outgoing={"sharingPercentage": 50})
    create_namespace(consumer, SYSTEM_NAMESPACE)
    create_namespace(consumer, "app")
    offload_namespace(consumer, "app")  # its pods may run on virtual nodes


def _names(items: Iterable[Any]) -> list[str]:
    return sorted(i.metadata.name for i in items)


def convergence_problems(pair: Pair, *, peered: bool) -> list[str]:
    """Everything that keeps the pair from having converged, as sentences; empty when it has.

    Always: at most one Advertisement of the provider on the consumer, and at most one copy of each
    offloaded pod in the provider. Peered: exactly one, Accepted, with its credentials Secret, its virtual
    kubelet and its virtual node. Torn down: nothing left on either side — no Advertisement, credentials
    Secret, virtual kubelet Deployment, virtual node, PeeringRequest, foreign namespace, remote namespace or
    reflected pod."""
    consumer, provider = pair.consumer.api_client(), pair.provider.api_client()
    c_core, p_core = k8s.CoreV1Api(consumer), k8s.CoreV1Api(provider)
    problems: list[str] = []
    adverts = [a for a in list_cluster_objects(consumer, ADVERTISEMENTS)
               if (a.get("spec") or {}).get("clusterId") == pair.provider_id]  # fmt: skip
    if len(adverts) > 1:
        problems.append(f"{len(adverts)} Advertisements of {pair.provider_id}: {[a['metadata']['name'] for a in adverts]}")
    secrets = _names(c_core.list_namespaced_secret(SYSTEM_NAMESPACE).items)
    deployments = _names(k8s.AppsV1Api(consumer).list_namespaced_deployment(
        SYSTEM_NAMESPACE, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}").items)  # fmt: skip
    nodes = _names(c_core.list_node().items)
    reflected = [p for p in p_core.list_pod_for_all_namespaces(label_selector=f"{LABEL_OFFLOADED}=true").items
                 if not p.metadata.deletion_timestamp]  # fmt: skip
    copies: dict[str, int] = {}
    for pod in reflected:
        copies[f"{pod.metadata.namespace}/{pod.metadata.name}"] = copies.get(f"{pod.metadata.namespace}/{pod.metadata.name}", 0) + 1
    problems += [f"{n} copies of reflected pod {name}" for name, n in copies.items() if n > 1]
    secret, deployment, node = (credentials_secret_name(pair.provider_id), virtual_kubelet_name(pair.provider_id),
                                virtual_node_name(pair.provider_id))  # fmt: skip
    if peered:
        phase = ((adverts[0].get("status") or {}).get("phase") if len(adverts) == 1 else None)
        if len(adverts) != 1 or phase != "Accepted":
            problems.append(f"expected one Accepted Advertisement of {pair.provider_id}, found phases "
                            f"{[(a.get('status') or {}).get('phase') for a in adverts]}")  # fmt: skip
        problems += [f"missing {what}" for what, present in (
            (f"credentials Secret {secret}", secret in secrets), (f"virtual kubelet {deployment}", deployment in deployments),
            (f"virtual node {node}", node in nodes)) if not present]  # fmt: skip
        return problems
    if adverts:
        problems.append(f"orphaned Advertisement {adverts[0]['metadata']['name']}")
    problems += [f"orphaned {what}" for what, present in (
        (f"credentials Secret {secret}", secret in secrets), (f"virtual kubelet Deployment {deployment}", deployment in deployments),
        (f"virtual node {node}", node in nodes),
        (f"PeeringRequest {pair.consumer_id}", read_cluster_object(provider, PEERING_REQUESTS, pair.consumer_id) is not None),
    ) if present]  # fmt: skip
    foreign = foreign_namespace(pair.consumer_id)
    namespace = next((n for n in p_core.list_namespace().items if n.metadata.name == foreign), None)
    if namespace is not None:  # say whether it is on its way out, and what holds it
        left = _names(p_core.list_namespaced_pod(foreign).items)
        problems.append(f"orphaned foreign namespace {foreign} (phase {namespace.status.phase}, "
                        f"deletion requested: {namespace.metadata.deletion_timestamp is not None}, pods: {left})")  # fmt: skip
    problems += [f"orphaned reflected pod {p.metadata.namespace}/{p.metadata.name}" for p in reflected]
    remote = p_core.list_namespace(label_selector=f"{LABEL_CONSUMER}={pair.consumer_id}").items
    problems += [f"orphaned remote namespace {n.metadata.name} (phase {n.status.phase})" for n in remote]
    return problems


async def failed_workflow_tasks(client: Client, workflow_id: str) -> list[str]:
    """The WorkflowTaskFailed events of every run of `workflow_id`, with their causes: a workflow whose
    task fails is stuck (the task is retried for ever) even if it looks Running. UnhandledCommand is left
    out: it is the server's answer to a task that raced a new signal, and the next task goes on."""
    failures: list[str] = []
    for history in await run_histories(client, workflow_id):
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                attributes = event.workflow_task_failed_event_attributes
                if attributes.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND:
                    # Not a failure of the workflow's code: the server turns down a task's commands when a
                    # signal arrived meanwhile (e.g. a completion racing a signal) and a new task follows.
                    continue
                failures.append(f"{workflow_id}/{history.run_id} event {event.event_id}: "
                                f"{WorkflowTaskFailedCause.Name(attributes.cause)}: {attributes.failure.message}")  # fmt: skip
    return failures


# Runs that are still open; a run closed any other way than these is a defect, not "not yet".
CLOSED_WELL = ("COMPLETED", "CONTINUED_AS_NEW")


async def runs_still_open(client: Client, workflow_id: str) -> list[str]:
    """The runs of `workflow_id` that have not closed yet. Raises AssertionError (which `eventually` does
    not retry) for a run that closed otherwise than Completed or ContinuedAsNew: failed, terminated, timed
    out or cancelled. No run at all is not yet."""
    open_runs: list[str] = []
    found = False
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        found = True
        status = execution.status.name if execution.status is not None else "UNKNOWN"
        if status == "RUNNING":
            open_runs.append(execution.run_id)
        else:
            assert status in CLOSED_WELL, f"{workflow_id}/{execution.run_id} closed {status}, not Completed"
    return open_runs if found else [f"{workflow_id}: no run listed yet"]


@dataclass
class InterruptedWork:
    """Evidence in histories that work was in flight when a worker died: activity attempts beyond the
    first (a lost attempt retried after its timeout), activity timeouts and failures, and workflow task
    timeouts (a task the dead worker had taken)."""

    retried_attempts: int = 0
    activity_timeouts: int = 0
    activity_failures: int = 0
    workflow_task_timeouts: int = 0

    @property
    def activities_hit(self) -> int:
        return self.retried_attempts + self.activity_timeouts + self.activity_failures


def interrupted_work(events: Iterable[Any]) -> InterruptedWork:
    found = InterruptedWork()
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            found.retried_attempts += max(0, event.activity_task_started_event_attributes.attempt - 1)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            found.activity_timeouts += 1
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            found.activity_failures += 1
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            found.workflow_task_timeouts += 1
    return found


async def interrupted_work_of(client: Client, workflow_ids: Iterable[str]) -> InterruptedWork:
    """interrupted_work over every run of every one of `workflow_ids`."""
    events: list[Any] = []
    for workflow_id in workflow_ids:
        for history in await run_histories(client, workflow_id):
            events += history.events
    return interrupted_work(events)


# Secrets in histories ---------------------------------------------------------------------------------

# Markers of credentials whatever their values: kubeconfig keys, PEM blocks, a JWT (a ServiceAccount token).
GENERIC_MARKERS = {
    "client-key-data": re.compile(rb"client-key-data"),
    "client-certificate-data": re.compile(rb"client-certificate-data"),
    "certificate-authority-data": re.compile(rb"certificate-authority-data"),
    "PEM block": re.compile(rb"-----BEGIN [A-Z ]+-----"),
    "BEGIN CERTIFICATE (base64)": re.compile(rb"LS0tLS1CRUdJTi"),  # '-----BEGIN' once base64-encoded
    "token:": re.compile(rb"\btoken:\s"),
    "JWT": re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
}
# A secret value shorter than this is not distinctive enough to look for (e.g. a namespace name).
MIN_SECRET_LENGTH = 16


@dataclass
class SecretValues:
    """The actual secret material read from the clusters: tokens, key and certificate data, whole
    kubeconfig texts, each also in the forms they would take inside a payload (base64, JSON-escaped)."""

    values: dict[str, bytes] = field(default_factory=dict)

    def add(self, label: str, value: str | bytes) -> None:
        raw = value.encode() if isinstance(value, str) else value
        if len(raw) < MIN_SECRET_LENGTH:
            return
        self.values[label] = raw
        self.values[f"{label} (base64)"] = base64.b64encode(raw)
        escaped = raw.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b'"', b'\\"')
        if escaped != raw:
            self.values[f"{label} (JSON-escaped)"] = escaped

    def add_kubeconfig(self, label: str, text: str) -> None:
        """The kubeconfig's text and every credential in it (token, key and certificate data, and the
        contents of the files it points at)."""
        self.add(f"{label} kubeconfig", text)
        config = yaml.safe_load(text) or {}
        for user in config.get("users") or []:
            for key, value in (user.get("user") or {}).items():
                if key in ("token", "client-key-data", "client-certificate-data", "password"):
                    self.add(f"{label} {key}", str(value))
                elif key in ("client-key", "client-certificate", "tokenFile") and Path(str(value)).is_file():
                    self.add(f"{label} {key} file", Path(str(value)).read_text())
        for cluster in config.get("clusters") or []:
            ca = (cluster.get("cluster") or {}).get("certificate-authority-data")
            if ca:
                self.add(f"{label} certificate-authority-data", str(ca))


def find_secrets(blob: bytes, secrets: SecretValues) -> list[str]:
    """What of `secrets` and of the generic markers `blob` contains (labels only, never the values)."""
    found = [label for label, value in secrets.values.items() if value in blob]
    found += [f"marker {label}" for label, pattern in GENERIC_MARKERS.items() if pattern.search(blob)]
    return found


def scan_history(events: Iterable[HistoryEvent], secrets: SecretValues) -> list[str]:
    """Every event of a history in its wire form: inputs, results, signals, updates, memo, search
    attributes and user metadata (summaries, details) are all payloads whose data is raw bytes there."""
    findings = []
    for event in events:
        for label in find_secrets(event.SerializeToString(), secrets):
            findings.append(f"event {event.event_id} ({EventType.Name(event.event_type)}): {label}")
    return findings


async def scan_runs(client: Client, workflow_id: str, secrets: SecretValues) -> tuple[int, list[str]]:
    """scan_history over every run of `workflow_id` (`every_run`): what a workflow read may be in its first run's
    history, not in the latest it continued as new into. Returns how many runs were scanned and what was found."""
    runs, findings = await every_run(client, workflow_id), []
    for run_id in runs:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        findings += [f"{workflow_id}/{run_id} {f}" for f in scan_history(history.events, secrets)]
    return len(runs), findings


async def scan_namespace(client: Client, secrets: SecretValues) -> tuple[int, list[str]]:
    """Every run of every workflow in the client's namespace: its history, and its description (memo,
    search attributes, user metadata, pending activities). Returns how many runs were scanned and what was found."""
    runs, findings = 0, []
    async for execution in client.list_workflows():
        runs += 1
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        where = f"{client.namespace}/{execution.id}/{execution.run_id}"
        findings += [f"{where} {f}" for f in scan_history((await handle.fetch_history()).events, secrets)]
        # The description holds the memo, search attributes, user metadata and pending activities' failures.
        raw = (await handle.describe()).raw_description.SerializeToString()
        findings += [f"{where} description: {label}" for label in find_secrets(raw, secrets)]
    return runs, findings
