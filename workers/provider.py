"""The provider's watchers: they turn Kubernetes changes in the home cluster into Temporal calls.

- a PeeringRequest that appears starts its peering workflow with the signal `peering_requested` (a second
  start finds the running one and tells it; one still withdrawing a request of the same name, deleted and
  made again, or withdrawing for a broadcaster disabled and since enabled again, continues as new for it
  once done); one that is deleted signals `withdraw` with its uid;
- for each live PeeringRequest, a watch on our Advertisement in the foreign cluster
  (workers/decision_watch.py) signals `foreign_changed` when the foreign decision moves;
- a ClusterConfig whose generation moves signals `cluster_config_changed` to every running peering,
  which re-reads it in its next push; while it disables the broadcaster (every push withdraws) no
  peering starts, and enabling it again starts one for every live PeeringRequest;
- a consumer's spare capacity that moves by more than the ClusterConfig's threshold signals
  `capacity_changed` to that consumer's peering (workers/early_push.py);
- consumers' RemoteNamespaces become namespaces of their own (workers/remote_namespaces.py, no workflow).

Level-triggered: every (re)list replays the whole state, and the workflows drop what they already know
(an unchanged generation, a peering that already runs).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from activities.peering import PeeringActivities
from kube.capacity import HomeCapacity
from kube.clients import SecretClients
from kube.informer import Informer
from kube.keys import KeyMemory
from models.api import ClusterConfig, PeeringRequest
from models.api.clusterconfig import OutgoingConfig
from models.api.common import SecretReference
from models.names import (
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    FORCE_UNPEER_ANNOTATION,
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
from workers.remote_namespaces import RemoteNamespaces
from workers.roles import Role, RoleContext
from workers.watching import Watchers, signal_if_running
from workflows.peering import PeeringWorkflow

log = logging.getLogger(__name__)


class ProviderWatchers(Watchers):
    def __init__(self, *, home: k8s.ApiClient, client: Client, settings: WorkerSettings,
                 loop: asyncio.AbstractEventLoop, capacity: HomeCapacity, foreign_clients: SecretClients) -> None:  # fmt: skip
        super().__init__(loop)
        self._capacity = capacity
        self._client = client
        self._settings = settings
        self._config_generation: int | None = None
        self._outgoing = ClusterConfig.default().spec.outgoing
        self._secrets = foreign_clients
        self._decision_watches: dict[str, DecisionWatch] = {}  # by foreign cluster id
        self._decision_watches_lock = threading.Lock()  # the requests' informer thread vs stop()
        # The live PeeringRequests (by name) and the broadcaster's switch, shared by the two informers'
        # threads: enabling the broadcaster again starts a peering for each. None until the ClusterConfig is
        # read: until then no peering starts (one that pushed into a disabled broadcaster would withdraw).
        self._live_requests: dict[str, PeeringInput] = {}
        # The input each peering was started with in this term, by foreign cluster: every push patches its
        # request's status, and starting again at each such event cost a Temporal call per push. A changed
        # input, a failed start or the broadcaster's switch starts again (USE_EXISTING: a running peering is
        # found, not doubled).
        self._started = KeyMemory(lambda _obj: None)
        self._unreachable: set[str] = set()  # foreign clusters whose PeeringRequest says Unreachable
        self._broadcaster_enabled: bool | None = None
        self._requests_lock = threading.Lock()
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
        listed = {obj.get("metadata", {}).get("name") for obj in objects}
        with self._requests_lock:
            for name in set(self._live_requests) - listed:  # deleted while no watch was open
                del self._live_requests[name]
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
        foreign, name = request.spec.cluster_identity.cluster_id, request.metadata.name
        if kind == "DELETED" or request.metadata.deletion_timestamp:
            with self._requests_lock:
                self._live_requests.pop(name, None)
                self._started.see(foreign, None)
                self._unreachable.discard(foreign)
            self._unwatch_decision(foreign)
            forced = FORCE_UNPEER_ANNOTATION in (obj.get("metadata", {}).get("annotations") or {})
            self._submit(self._signal_peering(foreign, "withdraw", "Forced" if forced else "PeeringRequestDeleted",
                                              request.metadata.uid))  # fmt: skip
            return
        ref = request.spec.kube_config_ref
        self._watch_decision(foreign, ref)
        input = PeeringInput(
            foreign_cluster_id=foreign,
            kube_config_ref=ref,
            peering_request=name,
            home_cluster_id=self._settings.cluster.cluster_id,
            unreachable_backoff_max_seconds=self._settings.provider.unreachable_backoff_max_seconds,
            peering_request_uid=request.metadata.uid,
        )
        with self._requests_lock:
            self._live_requests[name] = input
            enabled = self._broadcaster_enabled
            if request.status is not None and request.status.phase == "Unreachable":
                self._unreachable.add(foreign)  # its peering backs off: an early push would only defeat that
            else:
                self._unreachable.discard(foreign)
            start = bool(enabled) and self._started.see(foreign, input.model_dump_json())
        if start:
            self._submit(self._start_peering(input))

    def _watch_decision(self, foreign: str, ref: SecretReference) -> None:
        with self._decision_watches_lock:
            current = self._decision_watches.get(foreign)
            if current is not None and current.kube_config_ref == ref:
                return
            if current is not None:
                current.stop()  # the request names other credentials now
            watch = DecisionWatch(
                foreign_cluster_id=foreign, kube_config_ref=ref,
                advertisement=advertisement_name(self._settings.cluster.cluster_id), secrets=self._secrets,
                on_change=lambda: self._submit(self._tell_foreign_changed(foreign, watch)),
                backoff_max_seconds=self._settings.provider.unreachable_backoff_max_seconds,
                on_pushed=lambda spare_capacity: self._capacity.pushed(foreign, spare_capacity),
            )  # fmt: skip
            self._decision_watches[foreign] = watch.start()

    async def _tell_foreign_changed(self, foreign: str, watch: DecisionWatch) -> None:
        try:
            await self._signal_peering(foreign, "foreign_changed")
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
        # With the start, the request as seen (signal-with-start): a run still withdrawing a request deleted and
        # made again, or withdrawing for a broadcaster enabled again since, continues as new for it once done,
        # where a bare start would find it and be lost.
        try:
            await self._client.start_workflow(
                PeeringWorkflow.run, input, start_signal="peering_requested", start_signal_args=[input],
                id=self._workflow_id(input.foreign_cluster_id), task_queue=self._settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,  # one peering per foreign cluster, ever
                static_summary=f"Peering: {self._settings.cluster.cluster_id} shares with {input.foreign_cluster_id}",
            )  # fmt: skip
        except Exception:
            self._started.forget(input.foreign_cluster_id)  # not started: the request's next event tries again
            raise

    async def _signal_peering(self, foreign: str, signal: str, *args: Any) -> None:
        """Signal the peering with this foreign cluster; none running: nothing to tell."""
        await signal_if_running(self._client, self._workflow_id(foreign), signal, *args)

    # ClusterConfig and capacity ------------------------------------------------------------------------
    def _sync_config(self, objects: list[dict[str, Any]]) -> None:
        if not objects:
            self._switch_broadcaster(ClusterConfig.default().spec.outgoing.enable_broadcaster)  # none: the defaults
            return
        obj = objects[0]
        enabled = self._broadcaster_enabled
        try:
            outgoing = ClusterConfig.from_kubernetes(obj).spec.outgoing
            self._outgoing, enabled = outgoing, outgoing.enable_broadcaster
        except ValueError as e:
            log.warning("ClusterConfig is invalid, keeping the last settings: %s", e)
        self._switch_broadcaster(enabled is not False)  # an invalid one first: let the pushes read it
        generation = int(obj.get("metadata", {}).get("generation", 0))
        if generation != self._config_generation:
            self._config_generation = generation
            self._submit(self._signal_peerings("cluster_config_changed", generation))

    def outgoing(self) -> OutgoingConfig:
        """The ClusterConfig's provider settings as last read (the defaults until it is)."""
        return self._outgoing

    def live_consumers(self) -> set[str]:
        """The foreign clusters of the live PeeringRequests (each has its decision watch) that are reachable."""
        with self._decision_watches_lock:
            live = set(self._decision_watches)
        with self._requests_lock:
            return live - self._unreachable

    def push_early(self, foreign: str) -> None:
        """Called by EarlyPushWatch (in its thread) when the offer to `foreign` moved past the threshold."""
        self._submit(self._signal_peering(foreign, "capacity_changed"))

    def _switch_broadcaster(self, enabled: bool) -> None:
        """Enabled after being disabled (or unknown, at start-up): start a peering for every live request."""
        with self._requests_lock:
            resumed = enabled and not self._broadcaster_enabled
            starts = list(self._live_requests.values()) if resumed else []
            self._broadcaster_enabled = enabled
            if not enabled:  # the peerings withdraw and end: the next event of each starts it
                for live in self._live_requests.values():
                    self._started.see(live.foreign_cluster_id, None)
            for input in starts:
                self._started.see(input.foreign_cluster_id, input.model_dump_json())
        for input in starts:
            self._submit(self._start_peering(input))

    async def _signal_peerings(self, signal: str, *args: Any) -> None:
        query = f"WorkflowType = 'PeeringWorkflow' AND ExecutionStatus = 'Running' AND TaskQueue = '{self._settings.task_queue}'"
        async for execution in self._client.list_workflows(query):
            await signal_if_running(self._client, execution.id, signal, *args)


def provider_role(ctx: RoleContext) -> Role:
    """The provider: peering workflows and their activities, the capacity aggregate they read (every
    replica), and the watchers, early pushes and the RemoteNamespace controller (the leading replica)."""
    capacity_dirty = threading.Event()
    capacity = HomeCapacity(ctx.home, on_change=capacity_dirty.set)
    peering = PeeringActivities(home=ctx.home, capacity=capacity, settings=ctx.settings)

    def start_capacity() -> None:
        capacity.start()

    def lead() -> Callable[[], None]:
        watchers = ProviderWatchers(home=ctx.home, client=ctx.client, settings=ctx.settings, loop=ctx.loop,
                                    capacity=capacity, foreign_clients=peering.foreign_clients)  # fmt: skip
        early_pushes = EarlyPushWatch(capacity=capacity, dirty=capacity_dirty, live_consumers=watchers.live_consumers,
                                      outgoing=watchers.outgoing, signal=watchers.push_early)  # fmt: skip
        remote_namespaces = RemoteNamespaces(ctx.home)
        watchers.start()
        early_pushes.start()
        remote_namespaces.start()

        def stop() -> None:
            remote_namespaces.stop()
            early_pushes.stop()
            watchers.stop()

        return stop

    return Role(
        name="provider",
        workflows=[PeeringWorkflow],
        activities=[peering.push_advertisement, peering.read_foreign_decision, peering.withdraw_peering,
                    peering.clean_foreign, peering.release_credentials],  # fmt: skip
        start=start_capacity,
        stop=capacity.stop,
        lead=lead,
    )
