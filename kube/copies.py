"""What a consumer's virtual kubelet makes in its provider, and the one way it is cleaned (`delete_offloaded`):
the copies in its control namespace (the single-namespace layout's) and in each remote namespace it asked for
(a RemoteNamespace in the control namespace, issue 35), then those RemoteNamespaces
(`delete_remote_namespace_requests`: the provider deletes the namespace it made for each). Three cleaners
share it: the virtual kubelet's own teardown; the consumer's workflow after `tidepool unpeer
--force`, retrying while the provider was out of reach; and the provider, once the virtual kubelet's
keepalive Lease there has lapsed (its consumer is gone: nobody else would ever delete the copies).

The keepalive is a Lease the virtual kubelet renews in the provider namespace, as a kubelet renews its node's:
the provider reads it, it never goes through a workflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.lease import renew_lease
from kube.objects import delete_exactly, ignore_not_found
from models.names import (
    CONSUMER_KEEPALIVE_LEASE,
    GROUP,
    KEEPALIVE_MIN_GRACE_SECONDS,
    KEEPALIVE_MIN_RENEW_SECONDS,
    KEEPALIVE_MISSED_RENEWALS,
    KEEPALIVE_RENEW_SECONDS,
    LABEL_CONSUMER,
    LABEL_OFFLOADED,
    REMOTE_NAMESPACES,
    VERSION,
)
from models.virtual_kubelet import overdue_for_force_delete


def keepalive_grace(time_to_live_seconds: int, renew_seconds: int = KEEPALIVE_RENEW_SECONDS) -> timedelta:
    """How long an unrenewed keepalive is waited for. `renew_seconds` is the consumer's word (its Lease's
    leaseDurationSeconds), bounded: a consumer may shorten its own grace, never lengthen it."""
    renew = min(max(renew_seconds, KEEPALIVE_MIN_RENEW_SECONDS), KEEPALIVE_RENEW_SECONDS)
    return timedelta(seconds=max(time_to_live_seconds, KEEPALIVE_MISSED_RENEWALS * renew, KEEPALIVE_MIN_GRACE_SECONDS))


def copies_selector(consumer_id: str) -> str:
    return f"{LABEL_OFFLOADED}=true,{LABEL_CONSUMER}={consumer_id}"


@dataclass(frozen=True)
class Cleaning:
    deleted: int  # pods this call asked to delete (not terminating before it)
    going: int  # pods still terminating after it: 0 is clean


def delete_copies(core: k8s.CoreV1Api, namespace: str, consumer_id: str, *, now: datetime) -> Cleaning:
    """Deletes every copy (pods, ConfigMaps, Secrets, Services) of `consumer_id` in `namespace`; a pod still
    terminating past its grace period is deleted at once. Objects without the copies' labels are never touched."""
    selector = copies_selector(consumer_id)
    before = core.list_namespaced_pod(namespace, label_selector=selector).items
    deleted = sum(1 for pod in before if pod.metadata is not None and pod.metadata.deletion_timestamp is None)
    for deleter in (core.delete_collection_namespaced_pod, core.delete_collection_namespaced_config_map,
                    core.delete_collection_namespaced_secret):  # fmt: skip
        deleter(namespace, label_selector=selector)
    for service in core.list_namespaced_service(namespace, label_selector=selector).items:
        if service.metadata and service.metadata.name:  # Services have no deletecollection
            ignore_not_found(core.delete_namespaced_service, service.metadata.name, namespace)
    remaining = core.list_namespaced_pod(namespace, label_selector=selector).items
    for pod in remaining:
        meta = pod.metadata
        if meta is not None and meta.name and overdue_for_force_delete(meta.deletion_timestamp, now=now):
            delete_exactly(core.delete_namespaced_pod, meta.name, namespace, uid=meta.uid, grace_period_seconds=0)
    return Cleaning(deleted=deleted, going=len(remaining))


def remote_namespaces_requested(api: k8s.ApiClient, control_namespace: str) -> tuple[str, ...]:
    """The namespaces a consumer asked for (its RemoteNamespaces in its control namespace); none from a provider
    of an earlier release, which serves none (404) or grants none (403)."""
    try:
        listed: Any = k8s.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, control_namespace,
                                                                              REMOTE_NAMESPACES)  # fmt: skip
    except ApiException as e:
        if e.status not in (403, 404):
            raise
        return ()
    return tuple(str(item["metadata"]["name"]) for item in listed.get("items") or [])


def delete_all_copies(api: k8s.ApiClient, control_namespace: str, consumer_id: str, *, now: datetime) -> Cleaning:
    """`delete_copies` in the control namespace (the single-namespace layout's copies) and in every namespace
    made for the consumer's RemoteNamespaces, summed; a remote namespace already gone (403: the consumer's
    rights there went with it; 404) has none left."""
    core = k8s.CoreV1Api(api)
    total = delete_copies(core, control_namespace, consumer_id, now=now)
    deleted, going = total.deleted, total.going
    for namespace in remote_namespaces_requested(api, control_namespace):
        try:
            cleaning = delete_copies(core, namespace, consumer_id, now=now)
        except ApiException as e:
            if e.status not in (403, 404):
                raise
            continue
        deleted, going = deleted + cleaning.deleted, going + cleaning.going
    return Cleaning(deleted=deleted, going=going)


@dataclass(frozen=True)
class Offloaded:
    going: int  # pods still terminating, in the control namespace and the remote namespaces
    remote_namespaces: int  # RemoteNamespaces still there (deleted: the provider deletes their namespaces)


def delete_offloaded(api: k8s.ApiClient, control_namespace: str, consumer_id: str, *, now: datetime) -> Offloaded:
    """The virtual kubelet's teardown, in order: every copy (`delete_all_copies`), then, once no pod is left, its
    RemoteNamespaces."""
    going = delete_all_copies(api, control_namespace, consumer_id, now=now).going
    if going:
        return Offloaded(going=going, remote_namespaces=len(remote_namespaces_requested(api, control_namespace)))
    return Offloaded(going=0, remote_namespaces=delete_remote_namespace_requests(api, control_namespace))


def delete_remote_namespace_requests(api: k8s.ApiClient, namespace: str) -> int:
    """Deletes every RemoteNamespace in a consumer's control namespace (the provider's controller then deletes
    the namespace made for each, its copies with it, and releases the request, keepalive or not). Returns how
    many were there, being released or not. One at a time: the consumer's identity may delete, not by collection.
    A provider of an earlier release has no RemoteNamespaces (404) or grants none (403): nothing to delete."""
    custom = k8s.CustomObjectsApi(api)
    try:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, REMOTE_NAMESPACES)
    except ApiException as e:
        if e.status in (403, 404):
            return 0
        raise
    items = listed.get("items", []) if isinstance(listed, dict) else []
    for item in items:
        if not (item.get("metadata") or {}).get("deletionTimestamp"):
            ignore_not_found(custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, REMOTE_NAMESPACES,
                             item["metadata"]["name"])  # fmt: skip
    return len(items)


def renew_keepalive(api: k8s.ApiClient, namespace: str, *, holder: str, every_seconds: int) -> None:
    """The virtual kubelet's heartbeat in its provider namespace (created on first renewal), renewed every
    `every_seconds`, which the Lease says."""
    renew_lease(api, namespace, CONSUMER_KEEPALIVE_LEASE, holder=holder, duration_seconds=every_seconds)


def drop_keepalive(api: k8s.ApiClient, namespace: str) -> None:
    """Once the copies are gone: nothing is left for the provider to clean. A provider of an earlier release
    grants no Lease (403): there is none to drop."""
    try:
        k8s.CoordinationV1Api(api).delete_namespaced_lease(CONSUMER_KEEPALIVE_LEASE, namespace)
    except ApiException as e:
        if e.status not in (403, 404):
            raise


def keepalive_lapsed_since(api: k8s.ApiClient, namespace: str, *, time_to_live_seconds: int,
                           now: datetime) -> datetime | None:  # fmt: skip
    """When the keepalive in `namespace` was last renewed, if it has lapsed (lapsed_since); None while it is
    renewed, or when there is none (no virtual kubelet ran yet, or a release before keepalives: nothing to
    judge by)."""
    lease = ignore_not_found(k8s.CoordinationV1Api(api).read_namespaced_lease, CONSUMER_KEEPALIVE_LEASE, namespace)
    return None if lease is None else lapsed_since(lease, time_to_live_seconds=time_to_live_seconds, now=now)


def lapsed_since(lease: k8s.V1Lease, *, time_to_live_seconds: int, now: datetime) -> datetime | None:
    """When a keepalive was last renewed, if that is longer ago than its grace (keepalive_grace, from the
    Advertisement's `time_to_live_seconds` and the period the Lease declares); None otherwise. Timed by the API
    server's own clock (the time its managed fields record for each write), never the renewTime the consumer
    wrote with its clock: a consumer whose clock runs behind must not look silent."""
    if lease.metadata is None:
        return None
    written = [entry.time for entry in lease.metadata.managed_fields or [] if entry.time is not None]
    renewed = max(written, default=None)
    declared = lease.spec.lease_duration_seconds if lease.spec is not None else None
    grace = keepalive_grace(time_to_live_seconds, declared or KEEPALIVE_RENEW_SECONDS)
    if renewed is None or now - renewed < grace:
        return None
    return renewed
