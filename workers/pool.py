"""The pool's scheduler worker: `python -m workers.pool`, for the operator of a super cluster pool. It
serves the pool's task queue with PoolSchedulerWorkflow and watches the tenant control plane
(namespaces, ResourceQuotas, pods) and the SuperClusters, signalling (with start) the scheduler on every
change. Configured like a cluster worker (TIDEPOOL_* variables): TIDEPOOL_CLUSTER_KUBECONFIG is the
tenant control plane's kubeconfig."""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.informer import Informer
from activities.kube import client_from_kubeconfig_file
from activities.pool import PoolActivities
from models.names import (
    GROUP,
    POOL_SCHEDULER_WORKFLOW_ID,
    POOL_TASK_QUEUE,
    SUPER_CLUSTERS,
    VERSION,
)
from models.settings import WorkerSettings
from workers.cluster import connect
from workers.metrics import metrics_runtime
from workers.watching import Watchers
from workflows.pool import PoolSchedulerWorkflow

log = logging.getLogger("tidepool.pool")


class PoolWatchers(Watchers):
    def __init__(self, *, tenant: k8s.ApiClient, client: Client, task_queue: str, workflow_id: str,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        super().__init__(loop)
        self._client, self._task_queue, self._workflow_id = client, task_queue, workflow_id
        core, custom = k8s.CoreV1Api(tenant), k8s.CustomObjectsApi(tenant)
        self._informers = [
            Informer("pool-namespaces", core.list_namespace, on_sync=self._changed, on_event=self._changed),
            Informer("pool-quotas", core.list_resource_quota_for_all_namespaces, on_sync=self._changed,
                     on_event=self._changed),
            Informer("pool-pods", core.list_pod_for_all_namespaces, on_sync=self._changed, on_event=self._pod_event),
            Informer("pool-superclusters", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=SUPER_CLUSTERS, on_sync=self._changed, on_event=self._changed),
        ]  # fmt: skip

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "ADDED" or kind == "DELETED":  # a pod's status moves often; only arrivals and departures count
            self._changed()

    def _changed(self, *_: Any) -> None:
        self._submit(self._signal())

    async def _signal(self) -> None:
        await self._client.start_workflow(
            PoolSchedulerWorkflow.run, id=self._workflow_id, task_queue=self._task_queue,
            start_signal="changed", id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="Super cluster pool: namespace slices and pod placement",
        )  # fmt: skip


async def run(settings: WorkerSettings, *, stop: asyncio.Event, task_queue: str = POOL_TASK_QUEUE,
              workflow_id: str = POOL_SCHEDULER_WORKFLOW_ID, policy: str = "spread") -> None:  # fmt: skip
    client = await connect(settings.temporal, runtime=metrics_runtime(settings.metrics.port))
    tenant = client_from_kubeconfig_file(settings.cluster.kubeconfig)
    activities = PoolActivities(tenant=tenant, policy=policy)
    watchers = PoolWatchers(tenant=tenant, client=client, task_queue=task_queue, workflow_id=workflow_id,
                           loop=asyncio.get_running_loop())
    with ThreadPoolExecutor(8, thread_name_prefix="pool-activity") as executor:
        async with Worker(client, task_queue=task_queue, workflows=[PoolSchedulerWorkflow],
                          activities=[activities.schedule_pool], activity_executor=executor):  # fmt: skip
            watchers.start()
            try:
                await stop.wait()
            finally:
                watchers.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def _main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run(WorkerSettings.from_env(), stop=stop)

    asyncio.run(_main())


if __name__ == "__main__":
    main()
