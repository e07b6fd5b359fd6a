"""The consumer's watchers: they turn changes in the consumer cluster into Temporal signals.

- every Advertisement change signals (with start) the admission workflow's `reconcile`, and (with
  start) its own AdvertisementWorkflow's `changed`; a deleted one only signals;
- a ClusterConfig change signals `reconcile` (a raised maximum accepts refused ones);
- a change of a virtual kubelet Deployment or of a virtual node signals its AdvertisementWorkflow,
  which re-creates a deleted Deployment and follows the teardown.

Identity only: the workflows re-read the objects through activities.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.consumer import ConsumerActivities
from activities.informer import Informer
from models.consumer import AdmissionInput, AdvertisementInput
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
from workers.roles import Role, RoleContext
from workers.watching import Watchers
from workflows.admission import AdmissionWorkflow
from workflows.advertisement import AdvertisementWorkflow

log = logging.getLogger(__name__)


class ConsumerWatchers(Watchers):
    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx.loop)
        self._client: Client = ctx.client
        self._settings = ctx.settings
        custom, apps, core = k8s.CustomObjectsApi(ctx.home), k8s.AppsV1Api(ctx.home), k8s.CoreV1Api(ctx.home)
        self._informers = [
            Informer("advertisements", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=ADVERTISEMENTS, on_sync=self._sync_advertisements, on_event=self._advertisement_event),
            Informer("consumer-clusterconfig", custom.list_cluster_custom_object, group=GROUP, version=VERSION,
                     plural=CLUSTER_CONFIGS, field_selector=f"metadata.name={CLUSTER_CONFIG_NAME}",
                     on_sync=lambda _objs: self._reconcile(), on_event=lambda _kind, _obj: self._reconcile()),
            Informer("virtual-kubelets", apps.list_namespaced_deployment, namespace=SYSTEM_NAMESPACE,
                     label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_PROVIDER}",
                     on_sync=self._sync_children, on_event=self._child_event),
            Informer("virtual-nodes", core.list_node, label_selector=f"{LABEL_NODE_TYPE}={VIRTUAL_NODE_TYPE}",
                     on_sync=self._sync_children, on_event=self._child_event),
        ]  # fmt: skip

    def _reconcile(self) -> None:
        cluster_id = self._settings.cluster.cluster_id
        self._submit(self._signal_with_start(
            AdmissionWorkflow.run, AdmissionInput(cluster_id=cluster_id), admission_workflow_id(cluster_id),
            "reconcile", f"Admission of Advertisements in {cluster_id}",
        ))  # fmt: skip

    def _sync_advertisements(self, objects: list[dict[str, Any]]) -> None:
        self._reconcile()
        for obj in objects:
            self._advertisement_event("MODIFIED", obj)

    def _advertisement_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._reconcile()
        provider = str((obj.get("spec") or {}).get("clusterId") or "")
        if not provider or obj["metadata"]["name"] != advertisement_name(provider):
            # Malformed, or misnamed (one Advertisement per provider, named after it): admission refuses it
            # with a reason. No lifecycle: the provider's one would follow the wrong object.
            return
        if kind == "DELETED":
            self._submit(self._signal(advertisement_workflow_id(provider), "changed"))
            return
        self._submit(self._signal_with_start(
            AdvertisementWorkflow.run, AdvertisementInput(provider_id=provider, advertisement=obj["metadata"]["name"]),
            advertisement_workflow_id(provider), "changed", f"Advertisement from {provider}",
        ))  # fmt: skip

    def _sync_children(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self._child_event("MODIFIED", obj)

    def _child_event(self, _kind: str, obj: dict[str, Any]) -> None:
        provider = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_PROVIDER)
        if provider:
            self._submit(self._signal(advertisement_workflow_id(provider), "changed"))

    async def _signal_with_start(self, run: Any, input: Any, workflow_id: str, signal: str, summary: str) -> None:
        await self._client.start_workflow(
            run, input, id=workflow_id, task_queue=self._settings.task_queue, start_signal=signal,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING, static_summary=summary,
        )  # fmt: skip

    async def _signal(self, workflow_id: str, signal: str) -> None:
        try:
            await self._client.get_workflow_handle(workflow_id).signal(signal)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise


def consumer_role(ctx: RoleContext) -> Role:
    watchers = ConsumerWatchers(ctx)
    activities = ConsumerActivities(home=ctx.home, settings=ctx.settings)
    return Role(
        name="consumer",
        workflows=[AdmissionWorkflow, AdvertisementWorkflow],
        activities=[activities.admit_advertisements, activities.record_manual_decision,
                    activities.observe_advertisement, activities.run_step, activities.report_pod_cidr_timeout],
        start=watchers.start,
        stop=watchers.stop,
    )  # fmt: skip
