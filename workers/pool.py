"""The pool's scheduler worker: `python -m workers.pool`, for the operator of a super cluster pool. It
serves the pool's task queue with PoolSchedulerWorkflow and watches the tenant control plane
(namespaces, ResourceQuotas, pods), the SuperClusters and the pool's settings (ClusterConfig spec.pool), probes the super clusters
(workers/pool_health.py: health on the SuperClusters' status), and signals (with start) the scheduler when
something a pass reads changes (models/pool/triggers.py): not on status churn. Configured like a cluster worker (TIDEPOOL_* variables): TIDEPOOL_CLUSTER_KUBECONFIG is the
tenant control plane's kubeconfig. Any number of replicas serve the task queue; the one holding the pool's
Lease (kube/lease.py) watches and probes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import MetricMeter, WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.pool import PoolActivities
from kube.clients import client_from_own_kubeconfig_file
from kube.informer import Informer
from kube.keys import KeyMemory, by_namespace_and_name
from kube.lease import LeaderElection
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
from models.pool.triggers import namespace_key, pod_key, pool_config_key, quota_key, super_cluster_key
from models.settings import WorkerSettings
from workers.cluster import connect, leading, replica_identity
from workers.errors import KubernetesErrors
from workers.metrics import metrics_runtime
from workers.pool_health import HealthProber
from workers.roles import Role
from workers.watching import Watchers
from workflows.pool import PoolSchedulerWorkflow

log = logging.getLogger("tidepool.pool")
# One scheduler's activities run one at a time; a few threads are plenty, and no task waits for one (as in
# workers/cluster.py, the worker takes no more tasks than it has threads).
POOL_ACTIVITY_THREADS = 8


class PoolWatchers(Watchers):
    def __init__(self, *, tenant: k8s.ApiClient, client: Client, task_queue: str, workflow_id: str,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        super().__init__(loop)
        self._client, self._task_queue, self._workflow_id = client, task_queue, workflow_id
        core, custom = k8s.CoreV1Api(tenant), k8s.CustomObjectsApi(tenant)
        self._informers = [
            self._informer("pool-namespaces", namespace_key, core.list_namespace),
            self._informer("pool-quotas", quota_key, core.list_resource_quota_for_all_namespaces),
            self._informer("pool-pods", pod_key, core.list_pod_for_all_namespaces),
            self._informer("pool-superclusters", super_cluster_key, custom.list_cluster_custom_object,
                           group=GROUP, version=VERSION, plural=SUPER_CLUSTERS),
            self._informer("pool-config", pool_config_key, custom.list_cluster_custom_object, group=GROUP,
                           version=VERSION, plural=CLUSTER_CONFIGS, field_selector=f"metadata.name={CLUSTER_CONFIG_NAME}"),
        ]  # fmt: skip

    def _informer(self, name: str, key: Callable[[dict[str, Any]], Hashable], list_call: Callable[..., Any],
                  **kwargs: Any) -> Informer[dict[str, Any]]:  # fmt: skip
        """An informer whose events signal only when an object's key changes. The first list always
        signals: nobody has looked before, and it starts the scheduler."""
        keys = KeyMemory(key, identity=by_namespace_and_name)

        def on_sync(objects: list[dict[str, Any]]) -> None:
            first = not keys.listed
            if keys.sync(objects) or first:
                self._changed(keys)

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            if keys.event(kind, obj):
                self._changed(keys)

        return Informer(name, list_call, on_sync=on_sync, on_event=on_event, **kwargs)

    def _changed(self, keys: KeyMemory) -> None:
        self._submit(self._signal(keys))

    async def _signal(self, keys: KeyMemory) -> None:
        """A signal Temporal did not take is told again at the informer's next event or list."""
        try:
            await self._start_or_signal()
        except Exception:
            keys.forget()
            raise

    async def _start_or_signal(self) -> None:
        await self._client.start_workflow(
            PoolSchedulerWorkflow.run, id=self._workflow_id, task_queue=self._task_queue,
            start_signal="changed", id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="Super cluster pool: namespace slices and pod placement",
        )  # fmt: skip


async def run(settings: WorkerSettings, *, stop: asyncio.Event, task_queue: str = POOL_TASK_QUEUE,
              workflow_id: str = POOL_SCHEDULER_WORKFLOW_ID) -> None:  # fmt: skip
    runtime = metrics_runtime(settings.metrics.port, service="pool")
    client = await connect(settings.temporal, runtime=runtime)
    tenant = client_from_own_kubeconfig_file(settings.cluster.kubeconfig)
    meter = runtime.metric_meter if runtime else MetricMeter.noop
    activities = PoolActivities(tenant=tenant)
    loop = asyncio.get_running_loop()

    def lead() -> Callable[[], None]:
        prober = HealthProber(tenant, meter=meter).start()
        watchers = PoolWatchers(tenant=tenant, client=client, task_queue=task_queue, workflow_id=workflow_id,
                                loop=loop)  # fmt: skip
        watchers.start()

        def stop() -> None:
            watchers.stop()
            prober.stop()

        return stop

    started_leading, stopped_leading = leading([Role(name="pool", lead=lead)])

    with ThreadPoolExecutor(POOL_ACTIVITY_THREADS, thread_name_prefix="pool-activity") as executor:
        async with Worker(client, task_queue=task_queue, workflows=[PoolSchedulerWorkflow],
                          activities=[activities.schedule_pool, activities.move_pods, activities.finish_move],
                          activity_executor=executor, max_concurrent_activities=POOL_ACTIVITY_THREADS,
                          interceptors=[KubernetesErrors()]):  # fmt: skip
            election = LeaderElection(
                tenant, lease=pool_lease_name(workflow_id), namespace=SYSTEM_NAMESPACE,
                identity=replica_identity(settings.leader), settings=settings.leader,
                on_started_leading=started_leading, on_stopped_leading=stopped_leading,
            ).start()  # fmt: skip
            try:
                await stop.wait()
            finally:
                election.stop()


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
