"""The pool's scheduler worker: `python -m workers.pool`, for the operator of a super cluster pool, run against
the pool's management cluster (TIDEPOOL_CLUSTER_KUBECONFIG: where the SuperClusters, the Tenants and the pool's
ClusterConfig are). It serves the pool's task queue with PoolSchedulerWorkflow; follows the Tenants
(kube/tenants.py), each with a client for its control plane; watches, in every tenant's control plane, the
namespaces, ResourceQuotas and pods, and in the management cluster the SuperClusters and the pool's settings
(ClusterConfig spec.pool); probes the super clusters (workers/pool_health.py: health on the SuperClusters'
status); renews each tenant's token at half its life (kube/tenant_identity.py); and signals (with start) the
scheduler when something a pass reads changes (models/pool/triggers.py): not on status churn. Any number of
replicas serve the task queue; the one holding the pool's Lease (kube/lease.py) watches, probes, renews, and
places each new tenant pod as it comes (workers/pod_placer.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import MetricMeter, WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.pool import PoolActivities
from kube.clients import client_from_own_kubeconfig_file
from kube.clock import utcnow
from kube.identity import bearer_token_life
from kube.informer import Informer
from kube.keys import KeyMemory, by_namespace_and_name
from kube.lease import LeaderElection
from kube.tenant_identity import renew_tenant_token, write_tenant_kubeconfig
from kube.tenants import TenantRegistry
from models.api import Tenant
from models.credentials import renewal_due
from models.names import (
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    GROUP,
    POOL_SCHEDULER_WORKFLOW_ID,
    POOL_TASK_QUEUE,
    SUPER_CLUSTERS,
    SYSTEM_NAMESPACE,
    VERSION,
    pool_lease_name,
)
from models.pool.health import health_from_status
from models.pool.triggers import namespace_key, pod_key, pool_config_key, quota_key, super_cluster_key
from models.settings import WorkerSettings
from workers.cluster import connect, leading, replica_identity
from workers.errors import KubernetesErrors
from workers.health import HealthProbes
from workers.metrics import metrics_runtime
from workers.pod_placer import PodPlacer
from workers.pool_health import HealthProber
from workers.roles import Role
from workers.watching import Watchers
from workflows.pool import PoolSchedulerWorkflow

log = logging.getLogger("tidepool.pool")
# One scheduler's activities run one at a time; a few threads are plenty, and no task waits for one (as in
# workers/cluster.py, the worker takes no more tasks than it has threads).
POOL_ACTIVITY_THREADS = 8


class PoolWatchers(Watchers):
    """The management cluster's SuperClusters and pool settings, and, per served tenant, its namespaces,
    quotas and pods: each tenant's informers start when its Tenant is served and start again on a new
    client (a rotated kubeconfig)."""

    def __init__(self, *, management: k8s.ApiClient, tenants: TenantRegistry, client: Client, task_queue: str,
                 workflow_id: str, loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        super().__init__(loop)
        self._client, self._task_queue, self._workflow_id = client, task_queue, workflow_id
        self._tenants = tenants
        self._lock = threading.Lock()
        self._stopped = False
        self._followed: dict[str, tuple[k8s.ApiClient, list[Informer[dict[str, Any]]]]] = {}
        self._untold: set[KeyMemory] = set()  # informers whose change waits for the signal in flight
        self._signalling = False
        custom = k8s.CustomObjectsApi(management)
        self._super_clusters = KeyMemory(super_cluster_key, identity=by_namespace_and_name)
        self._informers = [
            self._informer("pool-superclusters", super_cluster_key, custom.list_cluster_custom_object,
                           keys=self._super_clusters, group=GROUP, version=VERSION, plural=SUPER_CLUSTERS),
            self._informer("pool-config", pool_config_key, custom.list_cluster_custom_object, group=GROUP,
                           version=VERSION, plural=CLUSTER_CONFIGS, field_selector=f"metadata.name={CLUSTER_CONFIG_NAME}"),
        ]  # fmt: skip

    def start(self) -> None:
        super().start()
        for connection in self._tenants.connections():
            self.tenant_changed(connection.name)

    def stop(self) -> None:
        super().stop()
        with self._lock:
            self._stopped = True
            for _, informers in self._followed.values():
                for informer in informers:
                    informer.stop()
            self._followed.clear()

    def tenant_changed(self, tenant: str) -> None:
        """The registry's word on a Tenant (added, removed, a new kubeconfig, a weight): its informers follow
        the client it has now, and the scheduler is told (a weight or a tenant is what a pass reads too)."""
        connection = self._tenants.get(tenant)
        api = connection.api if connection is not None and connection.served else None
        with self._lock:
            if self._stopped:
                return
            followed = self._followed.get(tenant)
            if followed is not None and followed[0] is not api:
                for informer in followed[1]:
                    informer.stop()
                del self._followed[tenant]
                followed = None
            if followed is None and api is not None:
                core = k8s.CoreV1Api(api)
                informers = [
                    self._informer(f"pool-{tenant}-namespaces", namespace_key, core.list_namespace, relist_signals=True),
                    self._informer(f"pool-{tenant}-quotas", quota_key, core.list_resource_quota_for_all_namespaces),
                    self._informer(f"pool-{tenant}-pods", pod_key, core.list_pod_for_all_namespaces),
                ]  # fmt: skip
                self._followed[tenant] = (api, informers)
                for informer in informers:
                    informer.start()
        self._submit(self._start_or_signal())

    def _informer(self, name: str, key: Callable[[dict[str, Any]], Hashable], list_call: Callable[..., Any], *,
                  relist_signals: bool = False, keys: KeyMemory | None = None,
                  **kwargs: Any) -> Informer[dict[str, Any]]:  # fmt: skip
        """An informer whose events signal only when an object's key changes. The first list always
        signals: nobody has looked before, and it starts the scheduler. With `relist_signals`, every list
        does: a list after the first follows a broken watch, and a tenant's control plane back from an
        outage changes nothing a key sees, while its Tenant still says Unreachable until a pass reaches it."""
        keys = keys or KeyMemory(key, identity=by_namespace_and_name)

        def on_sync(objects: list[dict[str, Any]]) -> None:
            first = not keys.listed
            if keys.sync(objects) or first or relist_signals:
                self._changed(keys)

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            if keys.event(kind, obj):
                self._changed(keys)

        return Informer(name, list_call, on_sync=on_sync, on_event=on_event, **kwargs)

    def _changed(self, keys: KeyMemory) -> None:
        self._submit(self._signal(keys))

    def placed_on(self, clusters: set[str]) -> None:
        """The pod placer put pods on `clusters`. New pods wake no pass, but one on a cluster that drains
        (Unreachable, its namespace fitting nowhere else) is told so by a pass: woken here."""
        if any(health_from_status(obj.get("status")).drains and obj["metadata"]["name"] in clusters
               for obj in self._super_clusters.followed()):  # fmt: skip
            self._changed(self._super_clusters)

    async def _signal(self, keys: KeyMemory) -> None:
        """One signal in flight at a time (on the worker's loop): what changes meanwhile is told by one more
        after it, not one each (a burst of a thousand pods ending is a handful of signals, and the scheduler's
        next pass reads them all anyway). A signal Temporal did not take is told again at the informers' next
        event or list."""
        self._untold.add(keys)
        if self._signalling:
            return
        self._signalling = True
        try:
            while self._untold:
                told, self._untold = self._untold, set()
                try:
                    await self._start_or_signal()
                except Exception:
                    for memory in told | self._untold:
                        memory.forget()
                    self._untold = set()
                    raise
        finally:
            self._signalling = False

    async def _start_or_signal(self) -> None:
        await self._client.start_workflow(
            PoolSchedulerWorkflow.run, id=self._workflow_id, task_queue=self._task_queue,
            start_signal="changed", id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="Super cluster pool: namespace slices and pod placement",
        )  # fmt: skip


class TokenRenewer:
    """Each served tenant's token renewed at half its life, with the token itself, into its Secret (the
    registries reload it). Looks once per RENEW_CHECK_SECONDS: a day's token is renewed within the hour
    after its half-life; a token that cannot be renewed says so in the log and is tried at the next look."""

    RENEW_CHECK_SECONDS = 3600
    PERIOD = timedelta(seconds=RENEW_CHECK_SECONDS)

    def __init__(self, management: k8s.ApiClient, tenants: TenantRegistry) -> None:
        self._management, self._tenants = management, tenants
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pool-token-renewer", daemon=True)

    def start(self) -> TokenRenewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._tenants.wait_synced(1):
            if self._stop.is_set():
                return
        while True:
            self.renew_due(now=utcnow())
            if self._stop.wait(self.RENEW_CHECK_SECONDS):
                return

    def renew_due(self, *, now: datetime) -> list[str]:
        """Renews every token past half its life; returns the tenants renewed."""
        renewed = []
        for connection in self._tenants.connections():
            life = bearer_token_life(connection.api) if connection.served and connection.api is not None else None
            if connection.api is None or life is None or not renewal_due(life, now=now, period=self.PERIOD):
                continue
            obj = self._tenants.tenant_object(connection.name)
            try:  # into the Secret its Tenant names, whoever wrote the Tenant
                secret = Tenant.from_kubernetes(obj).spec.kube_config_ref.name if obj is not None else None
                write_tenant_kubeconfig(self._management, connection.name, renew_tenant_token(connection.api),
                                        secret=secret)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - the next look tries again; the Tenant's status tells if it lapses
                log.warning("tenant %s: token not renewed: %s", connection.name, type(e).__name__)
                continue
            renewed.append(connection.name)
            log.info("tenant %s: token renewed", connection.name)
        return renewed


async def run(settings: WorkerSettings, *, stop: asyncio.Event, task_queue: str = POOL_TASK_QUEUE,
              workflow_id: str = POOL_SCHEDULER_WORKFLOW_ID) -> None:  # fmt: skip
    probes = HealthProbes(settings.health.port).start()
    try:
        await _serve(settings, stop=stop, task_queue=task_queue, workflow_id=workflow_id, probes=probes)
    finally:
        probes.stop()


async def _serve(settings: WorkerSettings, *, stop: asyncio.Event, task_queue: str, workflow_id: str,
                 probes: HealthProbes) -> None:  # fmt: skip
    runtime = metrics_runtime(settings.metrics.port, service="pool")
    client = await connect(settings.temporal, runtime=runtime)
    management = client_from_own_kubeconfig_file(settings.cluster.kubeconfig)
    meter = runtime.metric_meter if runtime else MetricMeter.noop
    loop = asyncio.get_running_loop()
    watchers: PoolWatchers | None = None
    placer: PodPlacer | None = None

    def tenant_changed(tenant: str) -> None:
        for follower in (watchers, placer):
            if follower is not None:
                follower.tenant_changed(tenant)

    def tenant_object_changed(tenant: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if placer is not None:
            placer.records_changed(tenant, old, new)

    # Every replica follows the Tenants: the activities it runs read tenants' control planes.
    tenants = TenantRegistry(management, name="pool", changed=tenant_changed,
                             tenant_object_changed=tenant_object_changed).start()  # fmt: skip
    election: LeaderElection | None = None
    # The pass leaves new pods to the placer while a replica (this one or another) holds the Lease.
    activities = PoolActivities(management=management, tenants=tenants,
                                placer_leads=lambda: election is not None and election.led())  # fmt: skip

    def lead() -> Callable[[], None]:
        nonlocal watchers, placer
        prober = HealthProber(management, meter=meter).start()
        renewer = TokenRenewer(management, tenants).start()
        placer = PodPlacer(tenants, placed=lambda clusters: watchers.placed_on(clusters) if watchers else None).start()
        watchers = PoolWatchers(management=management, tenants=tenants, client=client, task_queue=task_queue,
                                workflow_id=workflow_id, loop=loop)  # fmt: skip
        watchers.start()

        def stop() -> None:
            nonlocal watchers, placer
            if watchers is not None:
                watchers.stop()
                watchers = None
            if placer is not None:
                placer.stop()
                placer = None
            renewer.stop()
            prober.stop()

        return stop

    started_leading, stopped_leading = leading([Role(name="pool", lead=lead)])

    try:
        with ThreadPoolExecutor(POOL_ACTIVITY_THREADS, thread_name_prefix="pool-activity") as executor:
            async with Worker(client, task_queue=task_queue, workflows=[PoolSchedulerWorkflow],
                              activities=[activities.schedule_pool, activities.move_pods, activities.finish_move],
                              activity_executor=executor, max_concurrent_activities=POOL_ACTIVITY_THREADS,
                              interceptors=[KubernetesErrors()]):  # fmt: skip
                election = LeaderElection(
                    management, lease=pool_lease_name(workflow_id), namespace=SYSTEM_NAMESPACE,
                    identity=replica_identity(settings.leader), settings=settings.leader,
                    on_started_leading=started_leading, on_stopped_leading=stopped_leading,
                ).start()  # fmt: skip
                try:
                    probes.ready()  # connected, its Temporal worker polling
                    await stop.wait()
                finally:
                    election.stop()
    finally:
        tenants.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = WorkerSettings.from_env(os.environ)

    async def _main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run(settings, stop=stop)

    asyncio.run(_main())


if __name__ == "__main__":
    main()
