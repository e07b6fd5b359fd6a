"""The provider's watchers: they turn Kubernetes changes in the home cluster into Temporal calls.

- a PeeringRequest that appears starts its peering workflow (a second start finds the running one);
  one that is deleted signals `withdraw`;
- for each live PeeringRequest, a watch on our Advertisement in the foreign cluster
  (workers/decision_watch.py) signals `foreign_changed` when the foreign decision moves;
- a ClusterConfig whose generation moves signals `cluster_config_changed` to every running peering,
  which re-reads it in its next push;
- a consumer's spare capacity that moves by more than the ClusterConfig's threshold signals
  `capacity_changed` to that consumer's peering (workers/early_push.py).

Level-triggered: every (re)list replays the whole state, and the workflows drop what they already know
(an unchanged generation, a peering that already runs).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.peering import PeeringActivities
from kube.capacity import HomeCapacity
from kube.clients import SecretClients
from kube.informer import Informer
from models.api import ClusterConfig, PeeringRequest
from models.api.clusterconfig import OutgoingConfig
from models.api.common import SecretReference
from models.names import (
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    GROUP,
    PEERING_REQUESTS,
    VERSION,
    advertisement_name,
    peering_workflow_id,
)
from models.peering import PeeringInput
from models.settings import WorkerSettings
from workers.decision_watch import DecisionWatch
from workers.early_push import EarlyPushWatch
from workers.roles import Role, RoleContext
from workers.watching import Watchers
from workflows.peering import PeeringWorkflow

log = logging.getLogger(__name__)


class ProviderWatchers(Watchers):
    def __init__(self, *, home: k8s.ApiClient, client: Client, settings: WorkerSettings,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        super().__init__(loop)
        self._client = client
        self._settings = settings
        self._config_generation: int | None = None
        self._outgoing = ClusterConfig.default().spec.outgoing
        self._secrets = SecretClients(home)
        self._decision_watches: dict[str, DecisionWatch] = {}  # by foreign cluster id
        self._decision_watches_lock = threading.Lock()  # the requests' informer thread vs stop()
        custom = k8s.CustomObjectsApi(home)
        self._informers = [
            Informer("peeringrequests", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=PEERING_REQUESTS, on_sync=self._sync_requests, on_event=self._request_event),
            Informer("clusterconfig", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=CLUSTER_CONFIGS, field_selector=f"metadata.name={CLUSTER_CONFIG_NAME}",
                     on_sync=self._sync_config, on_event=lambda _kind, obj: self._sync_config([obj])),
        ]  # fmt: skip

    def _workflow_id(self, foreign: str) -> str:
        return peering_workflow_id(self._settings.cluster.cluster_id, foreign)

    # PeeringRequests ---------------------------------------------------------------------------------
    def _sync_requests(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self._request_event("MODIFIED", obj)
        live = {((obj.get("spec") or {}).get("clusterIdentity") or {}).get("clusterId") for obj in objects
                if not obj.get("metadata", {}).get("deletionTimestamp")}  # fmt: skip
        for foreign in set(self._decision_watches) - live:  # deleted while no watch was open
            self._unwatch_decision(foreign)

    def _request_event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            request = PeeringRequest.from_kubernetes(obj)
        except ValueError as e:  # the CRD validates; this only guards against an older schema
            log.warning("ignored PeeringRequest %s: %s", obj.get("metadata", {}).get("name"), e)
            return
        foreign = request.spec.cluster_identity.cluster_id
        if kind == "DELETED" or request.metadata.deletion_timestamp:
            self._unwatch_decision(foreign)
            self._submit(self._signal(self._workflow_id(foreign), "withdraw", "PeeringRequestDeleted"))
            return
        ref = request.spec.kube_config_ref
        self._watch_decision(foreign, ref)
        self._submit(self._start_peering(PeeringInput(
            foreign_cluster_id=foreign,
            kube_config_ref=ref,
            peering_request=request.metadata.name,
            home_cluster_id=self._settings.cluster.cluster_id,
            unreachable_backoff_max_seconds=self._settings.provider.unreachable_backoff_max_seconds,
        )))  # fmt: skip

    def _watch_decision(self, foreign: str, ref: SecretReference) -> None:
        with self._decision_watches_lock:
            current = self._decision_watches.get(foreign)
            if current is not None and current.kube_config_ref == ref:
                return
            if current is not None:
                current.stop()  # the request names other credentials now
            workflow_id = self._workflow_id(foreign)
            watch = DecisionWatch(
                foreign_cluster_id=foreign, kube_config_ref=ref,
                advertisement=advertisement_name(self._settings.cluster.cluster_id), secrets=self._secrets,
                on_change=lambda: self._submit(self._tell_foreign_changed(workflow_id, watch)),
                backoff_max_seconds=self._settings.provider.unreachable_backoff_max_seconds,
            )  # fmt: skip
            self._decision_watches[foreign] = watch.start()

    async def _tell_foreign_changed(self, workflow_id: str, watch: DecisionWatch) -> None:
        try:
            await self._signal(workflow_id, "foreign_changed")
        except Exception:
            watch.forget()  # Temporal did not take it: the next event or relist tells it again
            raise

    def _unwatch_decision(self, foreign: str) -> None:
        with self._decision_watches_lock:
            watch = self._decision_watches.pop(foreign, None)
        if watch is not None:
            watch.stop()

    def stop(self) -> None:
        super().stop()
        with self._decision_watches_lock:
            watches, self._decision_watches = list(self._decision_watches.values()), {}
        for watch in watches:
            watch.stop()

    async def _start_peering(self, input: PeeringInput) -> None:
        await self._client.start_workflow(
            PeeringWorkflow.run, input,
            id=self._workflow_id(input.foreign_cluster_id), task_queue=self._settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,  # one peering per foreign cluster, ever
            static_summary=f"Peering: {self._settings.cluster.cluster_id} shares with {input.foreign_cluster_id}",
        )  # fmt: skip

    async def _signal(self, workflow_id: str, signal: str, *args: Any) -> None:
        handle: WorkflowHandle[Any, Any] = self._client.get_workflow_handle(workflow_id)
        try:
            await handle.signal(signal, *args) if args else await handle.signal(signal)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:  # nothing runs for it: nothing to tell
                raise

    # ClusterConfig and capacity ------------------------------------------------------------------------
    def _sync_config(self, objects: list[dict[str, Any]]) -> None:
        if not objects:
            return
        obj = objects[0]
        try:
            self._outgoing = ClusterConfig.from_kubernetes(obj).spec.outgoing
        except ValueError as e:
            log.warning("ClusterConfig is invalid, keeping the last settings: %s", e)
        generation = int(obj.get("metadata", {}).get("generation", 0))
        if generation != self._config_generation:
            self._config_generation = generation
            self._submit(self._signal_peerings("cluster_config_changed", generation))

    def outgoing(self) -> OutgoingConfig:
        """The ClusterConfig's provider settings as last read (the defaults until it is)."""
        return self._outgoing

    def live_consumers(self) -> set[str]:
        """The foreign clusters of the live PeeringRequests: each has its decision watch."""
        with self._decision_watches_lock:
            return set(self._decision_watches)

    def push_early(self, foreign: str) -> None:
        """Called by EarlyPushWatch (in its thread) when the offer to `foreign` moved past the threshold."""
        self._submit(self._signal(self._workflow_id(foreign), "capacity_changed"))

    async def _signal_peerings(self, signal: str, *args: Any) -> None:
        query = f"WorkflowType = 'PeeringWorkflow' AND ExecutionStatus = 'Running' AND TaskQueue = '{self._settings.task_queue}'"
        async for execution in self._client.list_workflows(query):
            await self._signal(execution.id, signal, *args)


def provider_role(ctx: RoleContext) -> Role:
    """The provider: peering workflows, their activities, the capacity aggregate and the watchers."""
    watchers = ProviderWatchers(home=ctx.home, client=ctx.client, settings=ctx.settings, loop=ctx.loop)
    capacity_dirty = threading.Event()
    capacity = HomeCapacity(ctx.home, on_change=capacity_dirty.set)
    early_pushes = EarlyPushWatch(capacity=capacity, dirty=capacity_dirty, live_consumers=watchers.live_consumers,
                                  outgoing=watchers.outgoing, signal=watchers.push_early)  # fmt: skip
    peering = PeeringActivities(home=ctx.home, capacity=capacity, settings=ctx.settings)

    def start() -> None:
        capacity.start()
        watchers.start()
        early_pushes.start()

    def stop() -> None:
        early_pushes.stop()
        watchers.stop()
        capacity.stop()

    return Role(
        name="provider",
        workflows=[PeeringWorkflow],
        activities=[peering.push_advertisement, peering.read_foreign_decision, peering.withdraw_peering],
        start=start,
        stop=stop,
    )
