"""`tidepool offload namespace` and `tidepool unoffload namespace` (workers/cli.py parses them), and what
`tidepool status` shows of offloading on a consumer: its offloaded namespaces and every pod on a virtual node.

Offloading writes the namespace's NamespaceOffloading `offloading` by server-side apply (the whole spec, as
the command says it: a second run updates it); unoffloading deletes it, and the offloading controller
(workers/offloading.py) drains the namespace before the object goes. --wait follows the Ready condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.objects import APPLY
from models.api.conditions import POD_PROVIDER_CONDITION
from models.api.offloading import NamespaceOffloading, NamespaceOffloadingSpec
from models.enforcement import status_message
from models.names import API_VERSION, GROUP, NAMESPACE_OFFLOADING_NAME, NAMESPACE_OFFLOADINGS, VERSION
from models.offloading import on_virtual_node, selector_text

# The CLI's own field manager: what a user asked for, apart from what tidepool's controllers write.
FIELD_MANAGER = "tidepool-offload"
# How often --wait reads the object again: a human watches; the controller answers within a second or two.
WAIT_INTERVAL_SECONDS = 2.0

Say = Callable[[str], None]


class OffloadError(Exception):
    """What the command could not do, said to the user as it is (exit 1)."""


def _read(custom: k8s.CustomObjectsApi, namespace: str) -> dict[str, Any] | None:
    try:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS,
                                                  NAMESPACE_OFFLOADING_NAME)  # fmt: skip
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return obj if isinstance(obj, dict) else None


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})


def _applied(spec: NamespaceOffloadingSpec) -> dict[str, Any]:
    """The spec as applied: empty parts of the selector left out, so that a run without --selector takes back
    what an earlier one set (server-side apply removes what its manager no longer sends; an emptied map would
    be stored as null, which the schema refuses)."""
    body = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    selector = {k: v for k, v in body.pop("clusterSelector").items() if v}
    return {**body, "clusterSelector": selector} if selector else body


def offload_namespace(api: k8s.ApiClient, namespace: str, spec: NamespaceOffloadingSpec, *, wait: bool,
                      timeout: float, say: Say) -> None:  # fmt: skip
    custom = k8s.CustomObjectsApi(api)
    current = _read(custom, namespace)
    if current is not None and (current.get("metadata") or {}).get("deletionTimestamp"):
        raise OffloadError(f"namespace {namespace} is being unoffloaded (draining): offload it again once its "
                           f"NamespaceOffloading is gone (`tidepool unoffload namespace {namespace} --wait`)")
    body = {"apiVersion": API_VERSION, "kind": NamespaceOffloading.KIND,
            "metadata": {"name": NAMESPACE_OFFLOADING_NAME, "namespace": namespace},
            "spec": _applied(spec)}  # fmt: skip
    try:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME,
                                              body, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)  # fmt: skip
    except ApiException as e:
        if e.status in (403, 404, 409, 422):  # refused (RBAC, no such namespace, immutable mapping...): say why
            raise OffloadError(f"namespace {namespace}: {(status_message(e.body) or str(e.reason))}") from None
        raise
    say(f"namespace {namespace} offloaded (pods {spec.pod_offloading_strategy}, mapping "
        f"{spec.namespace_mapping_strategy}, clusters {selector_text(spec.cluster_selector) or 'all'})")
    if not wait:
        return
    deadline, said = time.monotonic() + timeout, ""
    while True:
        obj = _read(custom, namespace) or {}
        ready = _ready(obj)
        if ready.get("status") == "True":
            say(f"Ready: {ready.get('message', '')}")
            return
        if ready.get("reason") == "RemoteNamespaceRefused":
            raise OffloadError(f"namespace {namespace}: {ready.get('message', '')}")
        line = f"{ready.get('reason', 'waiting for the offloading controller')}: {ready.get('message', '')}"
        if line != said:
            say(line)
            said = line
        if time.monotonic() > deadline:
            raise OffloadError(f"namespace {namespace} not Ready after {timeout:.0f} s: {line}")
        time.sleep(WAIT_INTERVAL_SECONDS)


def unoffload_namespace(api: k8s.ApiClient, namespace: str, *, wait: bool, timeout: float, say: Say) -> None:
    custom = k8s.CustomObjectsApi(api)
    try:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME)
    except ApiException as e:
        if e.status == 404:
            say(f"namespace {namespace} is not offloaded")
            return
        if e.status == 403:
            raise OffloadError(f"namespace {namespace}: {(status_message(e.body) or str(e.reason))}") from None
        raise
    say(f"namespace {namespace} unoffloading: its pods leave the virtual nodes, then its remote namespaces go")
    if not wait:
        return
    deadline, said = time.monotonic() + timeout, ""
    while (obj := _read(custom, namespace)) is not None:
        ready = _ready(obj)
        line = f"{ready.get('reason', 'Draining')}: {ready.get('message', '')}" if ready.get("reason") == "DrainBlocked" else ""
        if line and line != said:
            say(line)
            said = line
        if time.monotonic() > deadline:
            raise OffloadError(f"namespace {namespace} still draining after {timeout:.0f} s: {said or 'no answer yet'}")
        time.sleep(WAIT_INTERVAL_SECONDS)
    say(f"namespace {namespace} drained")


# `tidepool status` --------------------------------------------------------------------------------------
def offloaded_namespace_rows(cluster: str, api: k8s.ApiClient) -> list[list[str]]:
    """One row per NamespaceOffloading: strategy, selector, each cluster's remote namespace and phase, Ready."""
    try:
        listed = k8s.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, NAMESPACE_OFFLOADINGS)
    except ApiException:
        return []  # no CRD (an older install) or no right to list: nothing to show
    rows = []
    for obj in listed.get("items", []) if isinstance(listed, dict) else []:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        selector = (NamespaceOffloadingSpec.model_validate(spec).cluster_selector
                    if spec else NamespaceOffloadingSpec().cluster_selector)  # fmt: skip
        clusters = ", ".join(f"{c.get('clusterId')}: {c.get('remoteNamespace')} ({c.get('phase')})"
                             for c in status.get("clusters") or []) or "—"  # fmt: skip
        ready = _ready(obj)
        rows.append([cluster, meta.get("namespace", "?"), spec.get("podOffloadingStrategy", "LocalAndRemote"),
                     selector_text(selector) or "all", clusters,
                     f"{ready.get('status', 'Unknown')} ({ready.get('reason', '—')})"
                     + (" deleting" if meta.get("deletionTimestamp") else "")])  # fmt: skip
    return rows


def virtual_node_pod_rows(cluster: str, pods: list[k8s.V1Pod]) -> list[list[str]]:
    """Every pod bound to a virtual node, Pending ones included, and why one is not running: its
    ProviderAdmitted condition's message (the provider refused its copy, or its namespace is not ready there),
    else its status reason and message, else its phase."""
    rows = []
    for pod in pods:
        spec, status, meta = pod.spec, pod.status or k8s.V1PodStatus(), pod.metadata or k8s.V1ObjectMeta()
        if spec is None or not on_virtual_node(spec.node_name):
            continue
        phase = status.phase or "Pending"
        admitted = next((c for c in status.conditions or [] if c.type == POD_PROVIDER_CONDITION and c.status == "False"),
                        None)  # fmt: skip
        if meta.deletion_timestamp is not None:
            why = "terminating"
        elif admitted is not None:
            why = f"{admitted.reason}: {admitted.message or ''}"
        elif phase != "Running" and (status.reason or status.message):
            why = f"{status.reason or ''}: {status.message or ''}".strip(": ")
        else:
            why = "" if phase == "Running" else phase
        rows.append([cluster, f"{meta.namespace}/{meta.name}", str(spec.node_name), phase, why or "—"])
    return rows
