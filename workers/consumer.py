"""The consumer's watchers: they turn changes in the consumer cluster into Temporal signals.

- an Advertisement signals (with start) the admission workflow's `changed` when what admission reads
  changed (models/admission.py: admission_view, what the admission pass decides from minus the clock),
  and (with start) its own AdvertisementWorkflow's `changed` when what its lifecycle reads changed
  (models/consumer.py: advertisement_view, what its observation is built from minus the clock);
- the ClusterConfig signals `changed` when `spec.incoming` changed (a raised maximum accepts refused ones);
- a virtual kubelet Deployment (existence, deletion, its provider-clean annotation) or a virtual node
  (existence, the Ready condition's status and reason) signals its AdvertisementWorkflow, which
  re-creates a deleted Deployment and follows the teardown.

Level-triggered and debounced by a key per object (`ObjectKeys`): a signal goes out only when the key
of what the workflow decides on changed, so timestamps, TTL refreshes, node heartbeats, status writes
nobody reads and resourceVersion bumps wake no workflow (Leases are not watched at all). The first list
after the worker starts signals every object once, which is how a restarted worker catches up; a relist
after a watch error signals only the objects whose key changed or that went away.

Identity only: the workflows re-read the objects through activities.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Hashable
from typing import Any

from kubernetes import client as k8s
from pydantic import ValidationError
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from activities.consumer import ConsumerActivities
from kube.informer import Informer
from kube.keys import KeyMemory
from models.admission import admission_view
from models.api import ClusterConfig
from models.consumer import (
    AdmissionInput,
    AdvertisementInput,
    LifecycleSettings,
    advertisement_view,
    lifecycle_settings,
    virtual_kubelet_view,
    virtual_node_view,
)
from models.names import (
    ADVERTISEMENTS,
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    GROUP,
    LABEL_MANAGED_BY,
    LABEL_NODE_TYPE,
    LABEL_PROVIDER,
    MANAGED_BY,
    SYSTEM_NAMESPACE,
    VERSION,
    VIRTUAL_NODE_TYPE,
    admission_workflow_id,
    advertisement_name,
    advertisement_workflow_id,
)
from workers.offloading import OffloadingController
from workers.roles import Role, RoleContext
from workers.watching import Watchers, signal_if_running
from workflows.admission import AdmissionWorkflow
from workflows.advertisement import AdvertisementWorkflow

Obj = dict[str, Any]


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Obj) -> dict[str, Any]:
    return _meta(obj).get("annotations") or {}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def advertisement_provider(obj: Obj) -> str | None:
    """The provider whose AdvertisementWorkflow follows this object; None for a malformed or misnamed one
    (one Advertisement per provider, named after it): admission refuses it with a reason, and no
    lifecycle follows it, since the provider's own would follow the wrong object."""
    provider = (obj.get("spec") or {}).get("clusterId")
    if not isinstance(provider, str) or not provider or _meta(obj).get("name") != advertisement_name(provider):
        return None
    return provider


def lifecycle_view(obj: Obj) -> Hashable | None:
    """The AdvertisementWorkflow's key: the view its observation is built from (models/consumer.py:
    advertisement_view) and the incarnation (one deleted and created again between two lists is news);
    None for one no lifecycle follows."""
    return (_meta(obj).get("uid"), advertisement_view(obj)) if advertisement_provider(obj) else None


def incoming_config_key(obj: Obj) -> Hashable:
    """Admission reads only the ClusterConfig's incoming section; the outgoing one is the provider's."""
    return _canonical((obj.get("spec") or {}).get("incoming"))


def virtual_kubelet_key(obj: Obj) -> Hashable:
    """The Deployment's incarnation and the view the AdvertisementWorkflow reads of it (models/consumer.py)."""
    return _meta(obj).get("uid"), virtual_kubelet_view(obj)


def virtual_node_key(obj: Obj) -> Hashable:
    """The node's incarnation and the view the AdvertisementWorkflow reads of it: never heartbeats or
    transition times."""
    return _meta(obj).get("uid"), virtual_node_view(obj)


# The consumer's objects are cluster-scoped or in the system namespace: known by name.
ObjectKeys = KeyMemory


class ConsumerWatchers(Watchers):
    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx.loop)
        self._client: Client = ctx.client
        self._settings = ctx.settings
        self._admission = ObjectKeys(admission_view)
        self._lifecycles = ObjectKeys(lifecycle_view)
        self._config = ObjectKeys(incoming_config_key)
        self._virtual_kubelets = ObjectKeys(virtual_kubelet_key)
        self._virtual_nodes = ObjectKeys(virtual_node_key)
        self._lifecycle_settings: LifecycleSettings | None = None
        custom, apps, core = k8s.CustomObjectsApi(ctx.home), k8s.AppsV1Api(ctx.home), k8s.CoreV1Api(ctx.home)
        self._informers = [
            Informer("advertisements", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=ADVERTISEMENTS, on_sync=self._sync_advertisements, on_event=self._advertisement_event),
            Informer("consumer-clusterconfig", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=CLUSTER_CONFIGS, field_selector=f"metadata.name={CLUSTER_CONFIG_NAME}",
                     on_sync=self._sync_config, on_event=self._config_event),
            Informer("virtual-kubelets", apps.list_namespaced_deployment, namespace=SYSTEM_NAMESPACE,
                     label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_PROVIDER}",
                     on_sync=lambda objs: self._sync_children(self._virtual_kubelets, objs),
                     on_event=lambda kind, obj: self._child_event(self._virtual_kubelets, kind, obj)),
            Informer("virtual-nodes", core.list_node, label_selector=f"{LABEL_NODE_TYPE}={VIRTUAL_NODE_TYPE}",
                     on_sync=lambda objs: self._sync_children(self._virtual_nodes, objs),
                     on_event=lambda kind, obj: self._child_event(self._virtual_nodes, kind, obj)),
        ]  # fmt: skip

    # Admission ----------------------------------------------------------------------------------------
    def _admission_changed(self) -> None:
        cluster_id = self._settings.cluster.cluster_id
        self._submit(self._forgetting_on_failure(self._signal_with_start(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=cluster_id), admission_workflow_id(cluster_id),
            "changed", f"Admission of Advertisements in {cluster_id}",
        ), self._admission, self._config))  # fmt: skip

    def _sync_config(self, objects: list[Obj]) -> None:
        if self._config.sync(objects):
            self._admission_changed()
        self._lifecycle_settings_seen(objects[0] if objects else None)

    def _config_event(self, kind: str, obj: Obj) -> None:
        if self._config.event(kind, obj):
            self._admission_changed()
        self._lifecycle_settings_seen(None if kind == "DELETED" else obj)

    def _lifecycle_settings_seen(self, obj: Obj | None) -> None:
        """A change of the timeouts every AdvertisementWorkflow reads wakes each (the first sight of them, at
        start, is no change: each workflow read them when it last looked)."""
        try:
            settings = lifecycle_settings(ClusterConfig.from_kubernetes(obj) if obj else ClusterConfig.default())
        except ValidationError:
            return  # the API server's schema holds it; an unreadable one leaves the workflows as they are
        previous, self._lifecycle_settings = self._lifecycle_settings, settings
        if previous is not None and settings != previous:
            for advertisement in self._lifecycles.followed():
                self._lifecycle_changed(advertisement, deleted=False)

    # Advertisements -----------------------------------------------------------------------------------
    def _sync_advertisements(self, objects: list[Obj]) -> None:
        if self._admission.sync(objects):
            self._admission_changed()
        for obj, deleted in self._lifecycles.sync(objects):
            self._lifecycle_changed(obj, deleted=deleted)

    def _advertisement_event(self, kind: str, obj: Obj) -> None:
        if self._admission.event(kind, obj):
            self._admission_changed()
        if self._lifecycles.event(kind, obj):
            self._lifecycle_changed(obj, deleted=kind == "DELETED")

    def _workflow_id(self, provider: str) -> str:
        return advertisement_workflow_id(self._settings.cluster.cluster_id, provider)

    def _lifecycle_changed(self, obj: Obj, *, deleted: bool) -> None:
        """A deleted one only signals (its workflow tears down, or has completed); a live one starts its
        workflow if none runs."""
        provider, name = advertisement_provider(obj), str(_meta(obj).get("name"))
        if provider is None:
            return
        if deleted:
            self._submit(self._signal(provider, "changed"))
            return
        self._submit(self._forgetting_on_failure(self._advertisement_changed(provider, name), self._lifecycles, name=name))

    async def _advertisement_changed(self, provider: str, name: str) -> None:
        await self._signal_with_start(
            AdvertisementWorkflow.run,
            AdvertisementInput(provider_id=provider, advertisement=name, home_cluster_id=self._settings.cluster.cluster_id),
            self._workflow_id(provider), "changed", f"Advertisement from {provider}",
        )  # fmt: skip

    # Virtual kubelets and virtual nodes ----------------------------------------------------------------
    def _sync_children(self, keys: ObjectKeys, objects: list[Obj]) -> None:
        for obj, _deleted in keys.sync(objects):
            self._signal_child(keys, obj)

    def _child_event(self, keys: ObjectKeys, kind: str, obj: Obj) -> None:
        if keys.event(kind, obj):
            self._signal_child(keys, obj)

    def _signal_child(self, keys: ObjectKeys, obj: Obj) -> None:
        provider = (_meta(obj).get("labels") or {}).get(LABEL_PROVIDER)
        if provider:
            self._submit(self._forgetting_on_failure(self._signal(provider, "changed"),
                                                     keys, name=str(_meta(obj).get("name"))))  # fmt: skip

    # Temporal -----------------------------------------------------------------------------------------
    async def _forgetting_on_failure(self, call: Coroutine[Any, Any, None], *keys: ObjectKeys,
                                     name: str | None = None) -> None:  # fmt: skip
        try:
            await call
        except Exception:
            for k in keys:
                k.forget(name)
            raise

    async def _signal_with_start(self, run: Any, input: Any, workflow_id: str, signal: str, summary: str) -> None:
        await self._client.start_workflow(
            run, input, id=workflow_id, task_queue=self._settings.task_queue, start_signal=signal,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING, static_summary=summary,
        )  # fmt: skip

    async def _signal(self, provider: str, signal: str) -> None:
        await signal_if_running(self._client, self._workflow_id(provider), signal)


def consumer_role(ctx: RoleContext) -> Role:
    """The consumer: admission and advertisement workflows and their activities (every replica), and the
    watchers and the offloading controller (the leading replica)."""

    def lead() -> Callable[[], None]:
        watchers = ConsumerWatchers(ctx)
        watchers.start()
        offloading = OffloadingController(ctx.home).start()

        def stop() -> None:
            offloading.stop()
            watchers.stop()

        return stop

    activities = ConsumerActivities(home=ctx.home, settings=ctx.settings)
    return Role(
        name="consumer",
        workflows=[AdmissionWorkflow, AdvertisementWorkflow],
        activities=[activities.admit_advertisements, activities.record_manual_decision,
                    activities.observe_advertisement, activities.ensure_finalizer, activities.ensure_virtual_kubelet,
                    activities.mark_deleting, activities.delete_virtual_node, activities.delete_virtual_kubelet,
                    activities.release_advertisement, activities.delete_expired, activities.report_pod_cidr_timeout,
                    activities.refuse_not_ready, activities.clean_provider, activities.delete_provider_credentials],
        lead=lead,
    )  # fmt: skip
