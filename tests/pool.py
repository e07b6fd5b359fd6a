"""The pool the end-to-end pool tests run on: a tenant control plane and two super clusters of the test's
own, the real pool worker (scheduler, watchers, prober) and one syncer per super cluster, handed over
only once the prober has seen every super cluster Ready: a pass that ran before that would see them
Unknown and place nothing, which is not what the tests are about."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import (
    LocalCluster,
    create_cluster,
    delete_cluster,
    join_pool,
    start_cluster,
    stop_cluster,
)
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from kube.tenant_identity import add_tenant
from models.names import SUPER_CLUSTERS, SYSTEM_NAMESPACE
from models.pool.health import Health, health_from_status
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.running import eventually, worker_settings
from workers.pool import run
from workers.syncer import Syncer

# The product's default probe interval (its request timeout is min(5 s, interval)); failover tests pass 5 s.
PROBE_SECONDS = 10
TENANT = "t1"
READY_TIMEOUT_SECONDS = 120  # a loaded machine answers a cluster's first probes slowly


@dataclass
class Pool:
    tenant: LocalCluster
    supers: dict[str, LocalCluster]
    start_worker: Callable[[], None]
    stop_worker: Callable[[], None]  # a kill: the task is cancelled, whatever it was doing
    grace_seconds: int
    probe_seconds: int
    localenv: EnvState
    syncers: dict[str, Syncer] = field(default_factory=dict)
    # Every tenant's control plane by Tenant name; the first one's is `tenant`, the management cluster too.
    tenants: dict[str, LocalCluster] = field(default_factory=dict)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.tenant.api_client())

    def configure(self, **pool: Any) -> None:
        """ClusterConfig spec.pool: the test's probe interval and grace period, and `pool`."""
        apply_cluster_config(self.tenant.api_client(), pool={
            "probeIntervalSeconds": self.probe_seconds, "unreachableGracePeriodSeconds": self.grace_seconds, **pool})  # fmt: skip

    def health(self, name: str) -> Health:
        obj = read_cluster_object(self.tenant.api_client(), SUPER_CLUSTERS, name)
        assert obj is not None, f"SuperCluster {name} is gone"
        return health_from_status(obj.get("status"))

    def stop_cluster(self, cluster: LocalCluster) -> None:
        stop_cluster(cluster.name, binaries=ensure_binaries(), workdir=Path(self.localenv.state_dir) / "kwok")

    def start_cluster(self, cluster: LocalCluster) -> None:
        # A control plane restarted on a loaded machine took two minutes to serve again.
        start_cluster(cluster, binaries=ensure_binaries(), workdir=Path(self.localenv.state_dir) / "kwok", timeout=300)


class WorkerDied(AssertionError):
    """The pool worker's task ended with an error the test did not cause: a crash fails the test, even one whose
    waits happened to pass (a later worker, or nothing waiting on the dead one's work)."""


class WorkerTasks:
    """The pool worker run as tasks of the test's event loop: started, killed by the test (cancelled, as a kill
    -9 would stop it, whatever it was doing), and stopped at teardown, which raises WorkerDied for a task that
    ended with an error: anything but returning once told to stop, or the cancellation of a kill."""

    STOP_TIMEOUT_SECONDS = 30

    def __init__(self) -> None:
        self._started: list[tuple[asyncio.Task[None], asyncio.Event]] = []
        self._killed: set[asyncio.Task[None]] = set()

    def start(self, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
        """A new worker: `run(stop)` returns once `stop` is set."""
        stop = asyncio.Event()
        self._started.append((asyncio.create_task(run(stop)), stop))

    def kill(self) -> None:
        """The latest worker cancelled. One already dead keeps its error, and the teardown still reports it."""
        task = self._started[-1][0]
        task.cancel()
        self._killed.add(task)

    async def stop(self) -> None:
        """Every worker told to stop and awaited; raises WorkerDied naming each one that died with an error."""
        for _, stop in self._started:
            stop.set()
        tasks = [task for task, _ in self._started]
        ended = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=self.STOP_TIMEOUT_SECONDS)
        died = [(i, result) for i, (task, result) in enumerate(zip(tasks, ended, strict=True))
                if isinstance(result, BaseException)
                and not (task in self._killed and isinstance(result, asyncio.CancelledError))]  # fmt: skip
        if died:
            raise WorkerDied("; ".join(f"pool worker #{i + 1} died: {type(e).__name__}: {e}" for i, e in died)) from died[0][1]


@asynccontextmanager
async def running_pool(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, *,
                       grace_seconds: int = 60, probe_seconds: int = PROBE_SECONDS, namespace: str = "default",
                       workflow_id: str | None = None,
                       tenant_name: str = TENANT, other_tenants: dict[str, int] | None = None) -> AsyncIterator[Pool]:  # fmt: skip
    """The scheduler runs in Temporal namespace `namespace` as `workflow_id` (default: pool-scheduler-<unique>).
    The management cluster's own tenant is `tenant_name`; `other_tenants`: more tenants (name -> weight), each
    with a control plane of its own. Tenant control planes run no kube-scheduler, as the pool requires."""
    workdir, made = Path(localenv.state_dir) / "kwok", []

    def make_tenant(role: str) -> LocalCluster:
        made.append(f"{role}-{unique}")
        return create_cluster(made[-1], binaries=ensure_binaries(), workdir=workdir, scheduler=False)

    try:
        async with _running_pool(localenv, make_cluster, make_tenant, unique, grace_seconds=grace_seconds,
                                 probe_seconds=probe_seconds, namespace=namespace, workflow_id=workflow_id,
                                 tenant_name=tenant_name, other_tenants=other_tenants) as pool:  # fmt: skip
            yield pool
    finally:
        for name in made:
            delete_cluster(name, binaries=ensure_binaries(), workdir=workdir)


@asynccontextmanager
async def _running_pool(localenv: EnvState, make_cluster: Callable[[str], LocalCluster],
                        make_tenant: Callable[[str], LocalCluster], unique: str, *, grace_seconds: int,
                        probe_seconds: int, namespace: str, workflow_id: str | None, tenant_name: str,
                        other_tenants: dict[str, int] | None) -> AsyncIterator[Pool]:  # fmt: skip
    tenant = make_tenant("tenant")
    supers = {"s1": make_cluster("s1"), "s2": make_cluster("s2")}
    api = tenant.api_client()
    create_namespace(api, SYSTEM_NAMESPACE)
    workers = WorkerTasks()

    def start_worker() -> None:
        workers.start(lambda stop: run(worker_settings(localenv, tenant, f"pool-{unique}", namespace=namespace), stop=stop,
                                       task_queue=f"pool-{unique}", workflow_id=workflow_id or f"pool-scheduler-{unique}"))  # fmt: skip

    pool = Pool(tenant, supers, start_worker, workers.kill, grace_seconds, probe_seconds, localenv)
    pool.configure()
    add_tenant(api, api, tenant_name)  # the tenant's control plane is the pool's management cluster too
    pool.tenants[tenant_name] = tenant
    for name, weight in (other_tenants or {}).items():
        pool.tenants[name] = make_tenant(name)
        add_tenant(api, pool.tenants[name].api_client(), name, weight=weight)
    for name, cluster in supers.items():
        create_node(cluster.api_client(), f"{name}-node", cpu="4", memory="8Gi")  # 4 slices of 1 CPU / 2Gi each
        join_pool(api, name, cluster.kubeconfig)
        pool.syncers[name] = Syncer(management=api, super_cluster=cluster.api_client(), cluster=name).start()
    start_worker()
    try:
        for name in supers:
            await eventually(lambda n=name: pool.health(n).state == "Ready", timeout=READY_TIMEOUT_SECONDS,
                             what=f"{name} probed Ready")  # fmt: skip
        yield pool
    finally:
        try:
            await workers.stop()  # a worker that died with an error fails the test here
        finally:
            for syncer in pool.syncers.values():
                syncer.stop()
