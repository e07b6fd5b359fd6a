"""The consumer's activities: observe an Advertisement with its virtual kubelet and node, one activity
per lifecycle step (ensure_finalizer ... release_advertisement), record a manual decision, and the admission pass. Built once per worker with the
consumer cluster's client. Every step is idempotent: applying what exists, deleting what is gone,
patching a finalizer list with compare-and-swap."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from kube.clients import PeerSecretClients
from kube.clock import utcnow
from kube.copies import delete_offloaded, drop_keepalive
from kube.errors import MISSING_CREDENTIALS
from kube.metrics import Metrics
from kube.objects import (
    apply_core,
    delete_cluster_object,
    finalizers_after,
    ignore_not_found,
    list_cluster_objects,
    patch_cluster_object,
    read_cluster_config,
    read_cluster_object,
    record_event,
)
from kube.status import CustomObjectStatus, Event, write_status
from models.admission import (
    NOT_READY_MESSAGE,
    AdmissionSnapshot,
    KeptRefusals,
    decide,
    kept_refusals,
    live_entries,
    next_decision_deadline,
    offer_fingerprint,
)
from models.api import ClusterConfig
from models.api.conditions import (
    condition,
)
from models.consumer import (
    AdmissionResult,
    AdvertisementObservation,
    CleanProviderInput,
    CleanProviderResult,
    DeleteExpiredInput,
    DeleteVirtualKubeletInput,
    DeleteVirtualNodeInput,
    EnsureFinalizerInput,
    EnsureVirtualKubeletInput,
    ManualDecision,
    MarkDeletingInput,
    RefuseNotReadyInput,
    ReleaseAdvertisementInput,
    UnreachableTeardowns,
    Verdict,
    advertisement_view,
    lifecycle_settings,
    ready_condition,
    virtual_kubelet_view,
    virtual_node_view,
)
from models.explain import MAX_ADMISSION_RECORDS, AdmissionRecord, OfferDerivation
from models.names import (
    ADVERTISEMENT_FINALIZER,
    ADVERTISEMENTS,
    DECISION_ANNOTATION,
    DECISION_REASON_ANNOTATION,
    FORCE_UNPEER_ANNOTATION,
    GROUP,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    OFFER_DERIVATION_ANNOTATION,
    REFUSED_OFFER_ANNOTATION,
    SYSTEM_NAMESPACE,
    VERSION,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.settings import WorkerSettings
from models.times import format_rfc3339, parse_rfc3339
from models.virtual_kubelet import virtual_kubelet_deployment

VK_SERVICE_ACCOUNT = "tidepool-virtual-kubelet"
# The workflow judged the expiry by its own clock; tolerate this much behind it here, so that a slightly
# slower clock does not send the workflow round again (a renewal moves the expiry by minutes, not seconds).
EXPIRY_CLOCK_SKEW = timedelta(seconds=5)
# How long cleaning after a forced unpeer waits for the copies it deleted to end (half the activity's timeout).
TERMINATING_WAIT_SECONDS = 15


class ConsumerActivities:
    def __init__(self, *, home: k8s.ApiClient, settings: WorkerSettings) -> None:
        self._home = home
        self._settings = settings
        self._advertisements = CustomObjectStatus(home, ADVERTISEMENTS)
        # Clients for the providers, from the credentials Secrets they wrote here (`clean_provider` only:
        # everything else this worker does with a provider, its virtual kubelets do).
        self._providers = PeerSecretClients(home)

    def _config(self) -> ClusterConfig:
        return read_cluster_config(self._home)

    # Admission ---------------------------------------------------------------------------------------
    @activity.defn
    def admit_advertisements(self, cluster_id: str, now: datetime, unreachable: dict[str, UnreachableTeardowns],
                             refusals: dict[str, KeptRefusals]) -> AdmissionResult:  # fmt: skip
        """`now`: the workflow's time, or this clock's if later (a retried attempt): a deadline the workflow's
        timer waited for is past for the pass it starts.
        `unreachable`: the providers torn down as unreachable lately, which the workflow keeps (rule 6¾).
        `refusals`: the consumer's refusals kept past their Advertisements, which the workflow keeps; the
        result says what to keep next (models/admission.py kept_refusals)."""
        config = self._config()
        advertisements = list_cluster_objects(self._home, ADVERTISEMENTS)
        backoffs = {provider: (r.count, r.until) for provider, r in unreachable.items()}
        snapshot = AdmissionSnapshot.from_kubernetes(config=config, advertisements=advertisements, backoffs=backoffs,
                                                     kept=refusals, now=max(now, utcnow()))  # fmt: skip
        by_name = {a["metadata"]["name"]: a for a in advertisements}
        result = AdmissionResult(policy=config.spec.incoming.accept_policy,
                                 maximum=config.spec.incoming.max_acceptable_advertisements)  # fmt: skip
        decisions = decide(snapshot)
        metrics = Metrics.of_activity()
        order = {c.name: (position, c.arrival[0]) for position, c in enumerate(snapshot.live, start=1)}
        by_hand = {c.name: c.manual for c in snapshot.live if c.manual is not None}
        for decision in decisions:
            deadline = decision.decision_deadline
            write_status(self._advertisements, by_name[decision.name],
                         fields={"phase": decision.phase, "reason": decision.reason,
                                 "decisionDeadline": format_rfc3339(deadline) if deadline else None},
                         conditions=[condition("Accepted", decision.phase == "Accepted", decision.reason, decision.message)],
                         events=[Event(decision.reason, decision.message, warning=decision.phase == "Refused")])  # fmt: skip
            metrics.decided(provider=decision.provider, phase=decision.phase, reason=decision.reason)
            if len(result.records) < MAX_ADMISSION_RECORDS:
                position, arrived = order[decision.name]
                result.records.append(AdmissionRecord(
                    advertisement=decision.name, provider=decision.provider, phase=decision.phase,
                    reason=decision.reason, message=decision.message, position=position, arrived=arrived))  # fmt: skip
            else:
                result.records_omitted += 1
            if decision.phase == "Accepted":
                result.accepted.append(decision.name)
            elif decision.phase == "Refused":
                result.refused[decision.name] = decision.reason
            else:
                result.pending.append(decision.name)
            manual = by_hand.get(decision.name)
            if manual is not None:
                result.verdicts.append(Verdict(advertisement=decision.name, provider=decision.provider, decision=manual,
                                               phase=decision.phase, reason=decision.reason))  # fmt: skip
        phases = {name: (obj.get("status") or {}).get("phase") for name, obj in by_name.items()}
        phases.update({d.name: d.phase for d in decisions})
        result.total_accepted = sum(1 for phase in phases.values() if phase == "Accepted")
        result.next_decision_deadline = next_decision_deadline(snapshot, decisions)
        result.live = live_entries(snapshot, decisions)
        result.kept_refusals = kept_refusals(snapshot)
        return result

    @activity.defn
    def record_manual_decision(self, decision: ManualDecision) -> None:
        """The decision lives on the Advertisement (annotations), where kubectl users make it too. An
        acceptance lifts a refusal for a virtual node that was never Ready."""
        annotations: dict[str, str | None] = {DECISION_ANNOTATION: decision.decision,
                                              DECISION_REASON_ANNOTATION: decision.reason}  # fmt: skip
        if decision.decision == "accept":
            annotations[REFUSED_OFFER_ANNOTATION] = None
        patch_cluster_object(self._home, ADVERTISEMENTS, decision.advertisement,
                             {"metadata": {"annotations": annotations}})  # fmt: skip

    # One Advertisement's lifecycle -------------------------------------------------------------------
    @activity.defn
    def observe_advertisement(self, name: str) -> AdvertisementObservation:
        obj = read_cluster_object(self._home, ADVERTISEMENTS, name)
        if obj is None:
            return AdvertisementObservation(exists=False, **self._children(None))
        spec, meta = obj.get("spec") or {}, obj["metadata"]
        provider = str(spec.get("clusterId", ""))
        return AdvertisementObservation(
            exists=True,
            **advertisement_view(obj).observed(),
            time_to_live=parse_rfc3339(spec.get("timeToLive")),
            **lifecycle_settings(self._config()).observed(),
            offer=OfferDerivation.from_annotation((meta.get("annotations") or {}).get(OFFER_DERIVATION_ANNOTATION)),
            **self._children(provider),
        )

    def _children(self, provider: str | None) -> dict[str, Any]:
        """The virtual kubelet's and node's part of the observation: their views (the consumer's watcher
        keys on the same ones), and the unreachable node's transition time beside them."""
        if not provider:
            return {}
        apps, core = k8s.AppsV1Api(self._home), k8s.CoreV1Api(self._home)
        deployment = ignore_not_found(apps.read_namespaced_deployment, virtual_kubelet_name(provider), SYSTEM_NAMESPACE)
        node = ignore_not_found(core.read_node, virtual_node_name(provider))
        node_obj = self._home.sanitize_for_serialization(node) if node is not None else None
        since = parse_rfc3339(ready_condition(node_obj).get("lastTransitionTime"))
        return {
            **virtual_kubelet_view(self._home.sanitize_for_serialization(deployment) if deployment is not None else None).observed(),
            **virtual_node_view(node_obj).observed(unreachable_since=since),
        }  # fmt: skip

    # One activity per step, so that the history reads as the steps.
    @activity.defn
    def ensure_finalizer(self, request: EnsureFinalizerInput) -> None:
        """Holds an accepted Advertisement until its teardown is done. Accepted again (its offer changed), an
        earlier refusal for a virtual node never Ready no longer applies."""
        obj = read_cluster_object(self._home, ADVERTISEMENTS, request.advertisement)
        if obj is None:
            return
        self._set_finalizer(obj, present=True, dropping=(REFUSED_OFFER_ANNOTATION,))

    @activity.defn
    def ensure_virtual_kubelet(self, request: EnsureVirtualKubeletInput) -> None:
        obj = read_cluster_object(self._home, ADVERTISEMENTS, request.advertisement)
        if obj is not None:
            self._ensure_virtual_kubelet(obj, request.provider_id)

    @activity.defn
    def mark_deleting(self, request: MarkDeletingInput) -> None:
        """Teardown 1: says so on the Advertisement (phase Deleting, Ready False) and in an Event."""
        obj = read_cluster_object(self._home, ADVERTISEMENTS, request.advertisement)
        if obj is None:
            return
        write_status(self._advertisements, obj, fields={"phase": "Deleting", "reason": request.teardown},
                     conditions=[condition("Ready", False, "Deleting", f"tearing down: {request.teardown}")],
                     events=[Event("Deleting", f"teardown begins: {request.teardown}")])  # fmt: skip

    @activity.defn
    def refuse_not_ready(self, request: RefuseNotReadyInput) -> None:
        """NotReady 1: the offer refused is recorded first (admission keeps it refused while the offer is the
        same), then the phase, then an Event."""
        obj = read_cluster_object(self._home, ADVERTISEMENTS, request.advertisement)
        if obj is None:
            return
        patch_cluster_object(self._home, ADVERTISEMENTS, request.advertisement, {"metadata": {"annotations": {
            REFUSED_OFFER_ANNOTATION: offer_fingerprint(obj.get("spec") or {})}}})  # fmt: skip
        timeout = self._config().spec.incoming.virtual_node_ready_timeout_seconds
        write_status(self._advertisements, obj, fields={"phase": "Refused", "reason": "VirtualNodeNotReady"},
                     conditions=[condition("Accepted", False, "VirtualNodeNotReady", NOT_READY_MESSAGE)],
                     events=[Event("VirtualNodeNotReady", f"the virtual node was not Ready within {timeout} s of its "
                                   "virtual kubelet: refused, the virtual kubelet is removed", warning=True)])  # fmt: skip
        Metrics.of_activity().decided(provider=str((obj.get("spec") or {}).get("clusterId", "")), phase="Refused",
                                      reason="VirtualNodeNotReady")  # fmt: skip

    @activity.defn
    def delete_virtual_node(self, request: DeleteVirtualNodeInput) -> None:
        """Teardown 2: cordoned first, so that nothing lands on it while it goes."""
        core = k8s.CoreV1Api(self._home)
        node = virtual_node_name(request.provider_id)
        ignore_not_found(core.patch_node, node, {"spec": {"unschedulable": True}})
        ignore_not_found(core.delete_node, node)

    @activity.defn
    def delete_virtual_kubelet(self, request: DeleteVirtualKubeletInput) -> None:
        """Teardown 4, once the provider namespace is clean (or the wait for it timed out)."""
        ignore_not_found(k8s.AppsV1Api(self._home).delete_namespaced_deployment,
                         virtual_kubelet_name(request.provider_id), SYSTEM_NAMESPACE)  # fmt: skip

    @activity.defn
    def release_advertisement(self, request: ReleaseAdvertisementInput) -> None:
        """Teardown 5: drops the finalizer; an expired or unreachable one is deleted too (a fresh push
        brings it back). One refused as NotReady stays."""
        obj = read_cluster_object(self._home, ADVERTISEMENTS, request.advertisement)
        if obj is None:
            return
        self._set_finalizer(obj, present=False)
        if request.teardown not in ("Deleted", "NotReady"):
            delete_cluster_object(self._home, ADVERTISEMENTS, request.advertisement)

    @activity.defn
    def clean_provider(self, request: CleanProviderInput) -> CleanProviderResult:
        """After `tidepool unpeer --force`: the copies of this cluster's pods in the provider, then its
        RemoteNamespaces there (the provider deletes their namespaces), deleted with the credentials it gave
        us, then our keepalive there once none is left (pods still terminating keep it and the RemoteNamespaces:
        should one hang, the provider's own check force-deletes it once the keepalive lapses). A failure the
        workflow should try again after is raised; a provider refusing these credentials (expired, revoked)
        is not tried again."""
        consumer_id = self._settings.cluster.cluster_id
        namespace = foreign_namespace(consumer_id)
        try:
            remote = self._providers.get(name=credentials_secret_name(request.provider_id), namespace=SYSTEM_NAMESPACE)
        except ApplicationError as e:
            if e.type == MISSING_CREDENTIALS:
                return CleanProviderResult(cleaned=False, note="the credentials Secret it gave us is gone")
            raise
        try:
            # The virtual kubelet's own teardown order: the copies in the control namespace and in every remote
            # namespace, then, once none is left, the RemoteNamespaces (the provider's controller deletes the
            # namespace made for each).
            going = delete_offloaded(remote, namespace, consumer_id, now=utcnow()).going
            # Copies a kubelet ends at once are gone within seconds: then the RemoteNamespaces and the keepalive
            # go now, not after the provider's own check, minutes later. Within the activity's timeout.
            waited_until = time.monotonic() + TERMINATING_WAIT_SECONDS
            while going and time.monotonic() < waited_until:
                time.sleep(1)
                going = delete_offloaded(remote, namespace, consumer_id, now=utcnow()).going
            if not going:
                drop_keepalive(remote, namespace)
        except k8s.ApiException as e:
            if e.status == 404:  # the provider removed the namespace: nothing of ours is left there
                return CleanProviderResult(cleaned=True, note=f"{namespace} is gone")
            # The status only: the response would carry headers into the history.
            raise ApplicationError(f"{request.provider_id} answered {e.status} {e.reason}", type="ProviderRefused",
                                   non_retryable=e.status in (401, 403)) from None  # fmt: skip
        except Exception as e:  # noqa: BLE001 - out of reach: the workflow tries again; the class says enough
            raise ApplicationError(f"{request.provider_id} unreachable ({type(e).__name__})",
                                   type="ProviderUnreachable") from None  # fmt: skip
        if going:  # the provider's kubelets end them; our keepalive stays until they have, for its own check
            return CleanProviderResult(cleaned=True, note=f"the copies in {namespace} deleted, {going} "
                                                          f"pod{'s' * (going != 1)} still terminating there")  # fmt: skip
        return CleanProviderResult(cleaned=True, note=f"the copies in {namespace} deleted")

    @activity.defn
    def delete_provider_credentials(self, request: CleanProviderInput) -> bool:
        """The end of a forced unpeer: nothing needs the credentials the provider gave us any more, unless it
        pushed a new Advertisement meanwhile (peered again): then they are the new peering's, kept, and the
        answer is True. The deletion is conditional on the uid and resourceVersion read: a push that writes
        them in between fails it, and the retry looks again."""
        core = k8s.CoreV1Api(self._home)
        name = credentials_secret_name(request.provider_id)
        held = ignore_not_found(core.read_namespaced_secret, name, SYSTEM_NAMESPACE)
        advertisement = read_cluster_object(self._home, ADVERTISEMENTS, advertisement_name(request.provider_id))
        if advertisement is not None and not advertisement["metadata"].get("deletionTimestamp") \
                and FORCE_UNPEER_ANNOTATION not in (advertisement["metadata"].get("annotations") or {}):  # fmt: skip
            return True
        if held is None or held.metadata is None:
            return False
        preconditions = k8s.V1Preconditions(uid=held.metadata.uid, resource_version=held.metadata.resource_version)
        ignore_not_found(core.delete_namespaced_secret, name, SYSTEM_NAMESPACE,
                         body=k8s.V1DeleteOptions(preconditions=preconditions))  # fmt: skip
        return False

    @activity.defn
    def delete_expired(self, request: DeleteExpiredInput) -> bool:
        return self._delete_expired(read_cluster_object(self._home, ADVERTISEMENTS, request.advertisement))

    def _delete_expired(self, obj: dict[str, Any] | None) -> bool:
        """Deletes a never-accepted Advertisement whose timeToLive has passed, with an Event that says so;
        False when it is gone, renewed or accepted since it was observed (the deletion is conditional on
        the version checked, so a push or an acceptance racing with it wins)."""
        if obj is None:
            return False
        spec, status, meta = obj.get("spec") or {}, obj.get("status") or {}, obj["metadata"]
        expires = parse_rfc3339(spec.get("timeToLive"))
        phase = status.get("phase")
        if expires is None or expires > utcnow() + EXPIRY_CLOCK_SKEW or phase not in ("Pending", "Refused"):
            return False
        try:
            k8s.CustomObjectsApi(self._home).delete_cluster_custom_object(
                GROUP, VERSION, ADVERTISEMENTS, meta["name"],
                body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(resource_version=meta["resourceVersion"])),
            )  # fmt: skip
        except k8s.ApiException as e:
            if e.status in (404, 409):
                return False
            raise
        # After the deletion, so that a retried attempt does not say it twice.
        record_event(self._home, obj, reason="Expired", warning=True,
                    message=f"timeToLive {spec.get('timeToLive')} passed while {phase}: deleted")  # fmt: skip
        return True

    @activity.defn
    def report_pod_cidr_timeout(self, name: str) -> None:
        obj = read_cluster_object(self._home, ADVERTISEMENTS, name)
        if obj is None:
            return
        write_status(self._advertisements, obj, conditions=[condition(
            "PodCIDRReady", False, "RemappingTimedOut",
            "the network module has not set status.remoteRemappedPodCIDR within podCIDRWaitTimeoutSeconds; still waiting",
        )], events=[Event("RemappingTimedOut", "PodCIDR remapping not set in time", warning=True)])  # fmt: skip

    def _set_finalizer(self, obj: dict[str, Any], *, present: bool, dropping: tuple[str, ...] = ()) -> None:
        """Adds or removes our finalizer, and drops the `dropping` annotations, in one compare-and-swap write."""
        meta = obj["metadata"]
        finalizers = finalizers_after(meta.get("finalizers"), ADVERTISEMENT_FINALIZER, present=present)
        dropped = {k: None for k in dropping if k in (meta.get("annotations") or {})}
        if finalizers is not None or dropped:
            patch: dict[str, Any] = {"resourceVersion": meta["resourceVersion"]}
            if finalizers is not None:
                patch["finalizers"] = finalizers
            if dropped:
                patch["annotations"] = dropped
            patch_cluster_object(self._home, ADVERTISEMENTS, meta["name"], {"metadata": patch})

    def _ensure_virtual_kubelet(self, obj: dict[str, Any], provider: str) -> None:
        # The Secret and namespace the protocol assigns the provider, never spec.kubeConfigRef: admission
        # refused any other, and a ref edited after acceptance must not redirect the virtual kubelet.
        secret, namespace = credentials_secret_name(provider), SYSTEM_NAMESPACE
        apply_core(self._home, {"apiVersion": "v1", "kind": "ServiceAccount",
                                "metadata": {"name": VK_SERVICE_ACCOUNT, "namespace": namespace,
                                             "labels": {LABEL_MANAGED_BY: MANAGED_BY}}})  # fmt: skip
        deployment = virtual_kubelet_deployment(
            provider_id=provider, consumer_id=self._settings.cluster.cluster_id, advertisement=obj["metadata"]["name"],
            kubeconfig_secret=secret, namespace=namespace, settings=self._settings.virtual_kubelet,
        )  # fmt: skip
        apps = k8s.AppsV1Api(self._home)
        apps.patch_namespaced_deployment(deployment["metadata"]["name"], namespace, deployment,
                                         field_manager="tidepool", force=True,
                                         _content_type="application/apply-patch+yaml")  # fmt: skip
        write_status(self._advertisements, obj, fields={
            "vkReference": {"name": deployment["metadata"]["name"], "namespace": namespace},
            "vnodeReference": {"name": virtual_node_name(provider)},
        }, conditions=[condition("VirtualKubeletReady", True, "Created", "the virtual kubelet Deployment exists")],
            events=[Event("VirtualKubeletCreated", f"{deployment['metadata']['name']} created")])  # fmt: skip
