"""The local environment as one object: a Temporal server and several Kubernetes clusters, brought up
and torn down together, with a state file that says where everything is. The demo (`python -m
deploy.localenv up`) and the test fixtures (tests/conftest.py) both use it."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.localenv.binaries import Binaries, ensure_binaries
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster
from deploy.localenv.realnode import stop_real_nodes
from deploy.localenv.temporal import (
    TemporalEndpoint,
    start_temporal,
    stop_process_group,
)

DEFAULT_STATE_DIR = Path(__file__).resolve().parents[2] / ".tidepool" / "localenv"
DEMO_UI_PORT = 8233
DEMO_TEMPORAL_PORT = 7233


def temporal_namespace(cluster: str) -> str:
    """Each cluster's worker has a Temporal namespace of its own, as it would in production; the demo
    only shares the server."""
    return f"cluster-{cluster}"


def temporal_namespaces(clusters: list[str], extra: list[str] | None = None) -> list[str]:
    """The Temporal namespaces registered at the server's start (besides `default`)."""
    return [temporal_namespace(c) for c in clusters] + list(extra or [])


@dataclass
class EnvState:
    state_dir: str
    temporal_address: str = ""
    temporal_ui: str | None = None
    temporal_pid: int = 0
    temporal_namespaces: list[str] = field(default_factory=list)
    kubeconfigs: dict[str, str] = field(default_factory=dict)
    startup_seconds: dict[str, float] = field(default_factory=dict)
    # What the workers the demo runs are, for the `tidepool` CLI: the cluster id each cluster's worker runs as
    # (status names the clusters by it), and each worker's Temporal namespace by its cluster id (explain and
    # simulate read the histories there).
    cluster_ids: dict[str, str] = field(default_factory=dict)
    worker_namespaces: dict[str, str] = field(default_factory=dict)

    @property
    def file(self) -> Path:
        return Path(self.state_dir) / "state.json"

    def save(self) -> None:
        self.file.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> EnvState | None:
        path = state_dir / "state.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def record_worker(self, *, cluster_id: str, namespace: str, cluster: str | None = None) -> None:
        """A worker that runs as `cluster_id` in Temporal namespace `namespace`, serving `cluster` if it is one
        cluster's (the pool's scheduler serves a pool)."""
        self.worker_namespaces[cluster_id] = namespace
        if cluster is not None:
            self.cluster_ids[cluster] = cluster_id
        self.save()

    def cluster(self, name: str) -> LocalCluster:
        return LocalCluster(name=name, kubeconfig=Path(self.kubeconfigs[name]))


def up(
    *,
    clusters: list[str],
    without_scheduler: Collection[str] = (),
    without_node_lifecycle: Collection[str] = (),
    state_dir: Path = DEFAULT_STATE_DIR,
    persistent: bool = True,
    extra_namespaces: list[str] | None = None,
    dynamic_config: dict[str, str] | None = None,
    binaries: Binaries | None = None,
    temporal: TemporalEndpoint | None = None,
) -> EnvState:
    """Starts Temporal and the clusters. `persistent` is the demo's mode: a database file and the Web UI
    on its usual port; otherwise in memory on free ports (tests). `temporal` is a server already running
    (the tests' container, started with `temporal_namespaces`): it is used, and left to its owner.
    `without_scheduler`: the clusters that run no kube-scheduler (a pool's tenant control planes)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    binaries = binaries or ensure_binaries()
    state = EnvState(state_dir=str(state_dir))
    namespaces = temporal_namespaces(clusters, extra_namespaces)
    started = time.monotonic()
    endpoint: TemporalEndpoint = temporal or start_temporal(
        cli=binaries.temporal,
        namespaces=namespaces,
        log_file=state_dir / "temporal.log",
        db_file=state_dir / "temporal.db" if persistent else None,
        port=DEMO_TEMPORAL_PORT if persistent else None,
        ui_port=DEMO_UI_PORT if persistent else None,
        dynamic_config=dynamic_config,
    )
    state.temporal_address, state.temporal_ui, state.temporal_pid = endpoint.address, endpoint.ui_url, endpoint.pid
    state.temporal_namespaces = ["default", *namespaces]
    state.startup_seconds["temporal"] = round(time.monotonic() - started, 2)
    state.save()
    for name in clusters:
        add_cluster(state, name, binaries=binaries, scheduler=name not in without_scheduler,
                    node_lifecycle=name not in without_node_lifecycle)  # fmt: skip
    return state


def add_cluster(state: EnvState, name: str, *, binaries: Binaries, scheduler: bool = True,
                node_lifecycle: bool = True) -> LocalCluster:  # fmt: skip
    """Creates cluster `name` in the environment and records it in its state, which `down` deletes."""
    workdir, started = Path(state.state_dir) / "kwok", time.monotonic()
    try:
        cluster = create_cluster(name, binaries=binaries, workdir=workdir, scheduler=scheduler,
                                 node_lifecycle=node_lifecycle)  # fmt: skip
    except BaseException:
        # `down` knows only the clusters in the state: one that failed half-way is stopped here.
        delete_cluster(name, binaries=binaries, workdir=workdir)
        raise
    state.kubeconfigs[name] = str(cluster.kubeconfig)
    state.startup_seconds[f"cluster-{name}"] = round(time.monotonic() - started, 2)
    state.save()
    return cluster


def down(state_dir: Path = DEFAULT_STATE_DIR, *, binaries: Binaries | None = None, purge: bool = True) -> None:
    """Stops everything `up` started; `purge` also removes the state (database file, cluster data)."""
    state = EnvState.load(state_dir)
    if state is None:
        return
    binaries = binaries or ensure_binaries()
    stop_real_nodes(state_dir / "kwok")  # their kubelets first: nothing of theirs may outlive the clusters
    for name in state.kubeconfigs:
        delete_cluster(name, binaries=binaries, workdir=state_dir / "kwok")
    if state.temporal_pid:
        stop_process_group(state.temporal_pid)
    if purge:
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        state.file.unlink(missing_ok=True)
