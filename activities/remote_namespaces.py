"""The provider's Kubernetes calls for its consumers' remote namespaces (issue 35): making one (the namespace with
its labels, the consumer's binding, the worker's own binding, the LimitRange, its share of the offer), deleting
them, the RemoteNamespace's finalizer and status, and the offer split over a consumer's namespaces
(models/enforcement.split_offer). workers/remote_namespaces.py reconciles with them; activities/credentials.py
splits the offer at each push and deletes a consumer's namespaces with its access."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.objects import apply_core, finalizers_after, ignore_not_found, raw_json
from models.enforcement import (
    QUOTA_NAME,
    PodSecurityLevel,
    limit_range,
    offer_annotation,
    offer_of,
    quota_for,
    quota_hard,
    split_offer,
)
from models.names import (
    GROUP,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    REMOTE_NAMESPACE_FINALIZER,
    REMOTE_NAMESPACES,
    VERSION,
    foreign_namespace,
)
from models.quantities import parse_quantity
from models.remote_namespaces import namespace_labels
from models.resources import Resources

# One split at a time per consumer in this process (the push's activity, the controller's quota watch and a
# namespace just made may each split): each reads the quotas afresh under the lock, so the last write is made
# from the last read. Another replica's push may still interleave: its write is corrected at the next usage
# change or push.
_split_locks: dict[str, threading.Lock] = {}
_split_locks_lock = threading.Lock()


def _split_lock(consumer: str) -> threading.Lock:
    with _split_locks_lock:
        return _split_locks.setdefault(consumer, threading.Lock())


def consumer_labels(consumer: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: consumer}


def consumer_selector(consumer: str) -> str:
    return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_CONSUMER}={consumer}"


def read_namespace(home: k8s.ApiClient, name: str) -> Any:
    return ignore_not_found(k8s.CoreV1Api(home).read_namespace, name)


def ensure_remote_namespace(home: k8s.ApiClient, *, consumer: str, name: str, consumer_namespace: str,
                            level: PodSecurityLevel) -> None:  # fmt: skip
    """The namespace `name` for `consumer` (server-side apply: a hand-edited label or binding is put back): Pod
    Security at `level`, the consumer's virtual kubelet bound to its ClusterRole there, the worker's own
    binding (its quota, LimitRange and clean-up rights), the LimitRange, then the offer split again with it."""
    # Late import: credentials.py imports this module for the split and the clean-up.
    from activities.credentials import namespace_bindings, while_forbidden

    labels = consumer_labels(consumer)
    apply_core(home, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": namespace_labels(consumer=consumer, consumer_namespace=consumer_namespace, level=level)}})  # fmt: skip
    for body in namespace_bindings(name, consumer):
        apply_core(home, body)
    while_forbidden(apply_core, home, limit_range(name, labels=labels))  # through the worker's binding, just made
    split_consumer_offer(home, consumer, offered=None, new_namespaces=[name])


def delete_namespace(home: k8s.ApiClient, name: str) -> None:
    ignore_not_found(k8s.CoreV1Api(home).delete_namespace, name)


def consumer_namespaces(home: k8s.ApiClient, consumer: str) -> list[str]:
    """The namespaces made for `consumer` (its control namespace among them), by the labels only the worker writes."""
    listed = k8s.CoreV1Api(home).list_namespace(label_selector=consumer_selector(consumer)).items
    return [ns.metadata.name for ns in listed if ns.metadata is not None and ns.metadata.name]


def delete_remote_namespaces(home: k8s.ApiClient, consumer: str) -> list[str]:
    """Withdrawal: every namespace made for `consumer` but its control namespace (which the caller deletes, and
    whose RemoteNamespaces `release_remote_namespace_requests` then releases). Returns the names asked to go."""
    control = foreign_namespace(consumer)
    names = [name for name in consumer_namespaces(home, consumer) if name != control]
    for name in names:
        delete_namespace(home, name)
    return names


def release_remote_namespace_requests(home: k8s.ApiClient, consumer: str) -> None:
    """Withdrawal, once `delete_remote_namespaces` asked every namespace made for `consumer` to go: its
    RemoteNamespaces' finalizers have done their work, so they are released here rather than left for the
    controller, which may not run again (a worker stopped or killed mid-withdrawal) while they would hold the
    control namespace Terminating."""
    control = foreign_namespace(consumer)
    listed: Any = k8s.CustomObjectsApi(home).list_namespaced_custom_object(GROUP, VERSION, control, REMOTE_NAMESPACES)
    for request in listed.get("items") or []:
        meta = request.get("metadata") or {}
        finalizers = finalizers_after(meta.get("finalizers"), REMOTE_NAMESPACE_FINALIZER, present=False)
        if finalizers is not None:
            ignore_not_found(patch_remote_namespace, home, control, meta["name"],
                             {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}})  # fmt: skip


def patch_remote_namespace(home: k8s.ApiClient, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """Merge patch (a finalizer list with the resourceVersion read: compare-and-swap)."""
    k8s.CustomObjectsApi(home).patch_namespaced_custom_object(GROUP, VERSION, namespace, REMOTE_NAMESPACES, name, patch)


def _quotas(home: k8s.ApiClient, consumer: str) -> dict[str, dict[str, Any]]:
    """The consumer's quotas, by namespace (raw: status.used as the API server wrote it)."""
    response = k8s.CoreV1Api(home).list_resource_quota_for_all_namespaces(
        label_selector=consumer_selector(consumer), field_selector=f"metadata.name={QUOTA_NAME}",
        _preload_content=False)  # fmt: skip
    items = raw_json(response).get("items", [])
    return {item["metadata"]["namespace"]: item for item in items}


def _same(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    return a.keys() == b.keys() and all(parse_quantity(a[k]) == parse_quantity(b[k]) for k in a)


def _grows(old: Mapping[str, str], new: Mapping[str, str]) -> bool:
    return any(k not in old or parse_quantity(new[k]) > parse_quantity(old[k]) for k in new)


def split_consumer_offer(home: k8s.ApiClient, consumer: str, *, offered: Resources | None,
                         new_namespaces: Iterable[str] = ()) -> int:  # fmt: skip
    """Split the offer to `consumer` over its namespaces' quotas (its control namespace, each namespace made
    for it, and `new_namespaces`, which have none yet). `offered`: the offer a push is applying (recorded on the
    control namespace's quota); None: the last one recorded there (between pushes, when a usage moved; nothing
    is done before a push recorded one). Quotas that shrink are written before those that grow, so that the
    sum stays within the offer while they change. Returns how many quotas were written."""
    with _split_lock(consumer):
        return _split(home, consumer, offered=offered, new_namespaces=new_namespaces)


def _split(home: k8s.ApiClient, consumer: str, *, offered: Resources | None, new_namespaces: Iterable[str]) -> int:
    control = foreign_namespace(consumer)
    quotas = _quotas(home, consumer)
    recorded = ((quotas.get(control) or {}).get("metadata") or {}).get("annotations") or {}
    if offered is not None:
        offer = quota_hard(offered)
    else:
        recorded_offer = offer_of(recorded)
        if recorded_offer is None:
            return 0
        offer = recorded_offer
    annotations = offer_annotation(offer)
    used = {namespace: dict((quota.get("status") or {}).get("used") or {}) for namespace, quota in quotas.items()}
    for namespace in [control, *new_namespaces]:
        used.setdefault(namespace, {})
    split = split_offer(offer, used)
    current = {namespace: dict((quotas.get(namespace) or {}).get("spec", {}).get("hard") or {}) for namespace in split}
    writes = [namespace for namespace in split if not _same(current[namespace], split[namespace])
              or (namespace == control and any(recorded.get(k) != v for k, v in annotations.items()))]  # fmt: skip
    writes.sort(key=lambda namespace: _grows(current[namespace], split[namespace]))  # shrinking first
    from activities.credentials import while_forbidden  # late: credentials.py imports this module

    labels = consumer_labels(consumer)
    for namespace in writes:
        body = quota_for(namespace, split[namespace], labels=labels,
                         annotations=annotations if namespace == control else None)  # fmt: skip
        try:
            while_forbidden(apply_core, home, body)
        except ApiException as e:
            # A namespace deleted (404) or terminating (403: no new object in it) since the list: its quota goes
            # with it, and its share comes back at the next split (its quota's deletion). The control namespace
            # goes only with the consumer's access (withdrawal): nothing is left to split then.
            if not (e.status == 404 or (e.status == 403 and "being terminated" in str(e.body))):
                raise
    return len(writes)
