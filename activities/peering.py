"""The provider's activities: push an Advertisement (with fresh credentials) to a foreign cluster, read
the foreign decision, withdraw. Built once per worker with the home cluster's client; foreign clients
come from the kubeconfig Secrets PeeringRequests name. Every write is a server-side apply or a delete
that treats 'gone' as success, so a retried activity never leaves a second object behind."""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.credentials import (
    enforce_offer,
    ensure_foreign_access,
    issue_kubeconfig,
    record_token,
    revoke_foreign_access,
    revoke_older_tokens,
)
from kube.capacity import HomeCapacity
from kube.clients import PeerSecretClients
from kube.clock import utcnow
from kube.copies import (
    delete_all_copies,
    delete_remote_namespace_requests,
    drop_keepalive,
    keepalive_lapsed_since,
)
from kube.errors import CREDENTIALS_EXPIRED, INVALID_CREDENTIALS
from kube.identity import bearer_token_life, renew_provider_token
from kube.metrics import Metrics
from kube.objects import (
    apply_cluster_object,
    apply_core,
    delete_cluster_object,
    finalizers_after,
    ignore_not_found,
    list_cluster_objects,
    patch_cluster_object,
    read_cluster_object,
    record_event,
)
from kube.status import CustomObjectStatus, write_status
from models.api import ClusterConfig
from models.api.advertisement import offered_advertisement
from models.api.clusterconfig import OutgoingConfig
from models.api.common import SecretReference
from models.api.conditions import PeeringCredentialsReason, condition
from models.api.peeringrequest import PeeringRequestPhase
from models.credentials import TokenGeneration, access_verified_until, renewal_due, renewal_reason, token_expired
from models.enforcement import PodSecurityLevel
from models.explain import OfferDerivation
from models.names import (
    ADVERTISEMENTS,
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    FORCE_UNPEER_ANNOTATION,
    FOREIGN_CLEANUP_FINALIZER,
    LABEL_MANAGED_BY,
    LABEL_PROVIDER,
    MANAGED_BY,
    OFFER_DERIVATION_ANNOTATION,
    PEERING_FINALIZER,
    PEERING_REQUESTS,
    PROVIDER_WITHDRAWN_ANNOTATION,
    SPARE_CAPACITY_ANNOTATION,
    SYSTEM_NAMESPACE,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
    provider_identity_name,
    service_account_subject,
)
from models.peering import (
    CleanForeignRequest,
    CleanForeignResult,
    DecisionRequest,
    ForeignDecision,
    PushRequest,
    PushResult,
    Withdraw,
    WithdrawRequest,
    WithdrawResult,
    decide_push,
    foreign_decision,
    phase_after_push,
)
from models.resources import Resources
from models.settings import WorkerSettings
from models.sharing import shared_resources, spare
from models.times import format_rfc3339

# Added to two push periods for the lifetime of a renewed consumer token: the next push's own delay and retries.
CONSUMER_TOKEN_RENEWAL_MARGIN_SECONDS = 300
# A push's independent calls go out at once: its three reads (ClusterConfig, PeeringRequest, the foreign
# kubeconfig Secret), the objects of the foreign namespace, the revocations, and on a periodic push the
# Advertisement beside the access check. Only single API calls run here (the activity's own thread waits for
# them, so none waits on another): a few threads serve every push of the worker.
PUSH_CALL_THREADS = 16


class PeeringActivities:
    def __init__(self, *, home: k8s.ApiClient, capacity: HomeCapacity, settings: WorkerSettings) -> None:
        self._home = home
        self._capacity = capacity
        self._settings = settings
        self._peering_requests = CustomObjectStatus(home, PEERING_REQUESTS)
        # The foreign clusters' clients, from the PeeringRequests' kubeconfig Secrets: the provider's decision
        # watches use these too (workers/provider.py), one client per foreign cluster.
        self.foreign_clients = PeerSecretClients(home)
        self._calls = ThreadPoolExecutor(PUSH_CALL_THREADS, thread_name_prefix="push-call")

    @property
    def _home_id(self) -> str:
        return self._settings.cluster.cluster_id

    def _cluster_config(self) -> tuple[ClusterConfig, int]:
        """The home ClusterConfig and its generation; a cluster without one shares with the defaults."""
        obj = read_cluster_object(self._home, CLUSTER_CONFIGS, CLUSTER_CONFIG_NAME)
        if obj is None:
            return ClusterConfig.from_kubernetes({"metadata": {"name": CLUSTER_CONFIG_NAME}, "spec": {}}), 0
        return ClusterConfig.from_kubernetes(obj), int(obj["metadata"].get("generation", 0))

    def _live_peering_request(self, name: str | None) -> tuple[bool, dict[str, Any] | None, bool]:
        """Whether the peering's PeeringRequest is gone (deleted or being deleted), the request while it
        lives, and whether its deletion is forced (`tidepool unpeer --force` marks it before deleting it: a push
        that reads the deletion first must not start the withdrawal that waits on the consumer). A peering
        started from the CLI without one is never gone: only a signal withdraws it."""
        if name is None:
            return False, None, False
        obj = read_cluster_object(self._home, PEERING_REQUESTS, name)
        if obj is None:
            return True, None, False
        if obj["metadata"].get("deletionTimestamp"):
            return True, None, FORCE_UNPEER_ANNOTATION in (obj["metadata"].get("annotations") or {})
        return False, obj, False

    def _ensure_finalizer(self, peering_request: dict[str, Any]) -> None:
        """Make the PeeringRequest's deletion wait for our withdrawal (`_release` lets it go)."""
        metadata = peering_request["metadata"]
        finalizers = finalizers_after(metadata.get("finalizers"), PEERING_FINALIZER, present=True)
        if finalizers is not None:
            patch_cluster_object(self._home, PEERING_REQUESTS, metadata["name"], {"metadata": {
                "finalizers": finalizers, "resourceVersion": metadata["resourceVersion"]}})

    @activity.defn
    def push_advertisement(self, request: PushRequest) -> PushResult | Withdraw:
        """Read, decide (models.peering.decide_push), then push the Advertisement and fresh credentials, or
        answer `Withdraw` and leave the withdrawal to the workflow. The first push writes the credentials
        before the Advertisement that names them; later ones write the Advertisement first, and a push a
        signal asked for skips the access check while the last one's holds (`access_verified_until`)."""
        reading_config = self._calls.submit(self._cluster_config)
        reading_request = self._calls.submit(self._live_peering_request, request.peering_request)
        # Read now, used only if the push goes ahead: a withdrawal needs no foreign credentials to decide.
        reading_foreign = self._calls.submit(self.foreign_clients.get, name=request.kube_config_ref.name,
                                             namespace=request.kube_config_ref.namespace)  # fmt: skip
        config, generation = reading_config.result()
        outgoing = config.spec.outgoing
        gone, peering_request, forced = reading_request.result()
        if peering_request is not None:
            self._ensure_finalizer(peering_request)
        action = decide_push(
            peering_request_gone=gone, forced=forced, broadcaster_enabled=outgoing.enable_broadcaster,
            requested_percentage=request.sharing_percentage, configured_percentage=outgoing.sharing_percentage,
        )  # fmt: skip
        if isinstance(action, Withdraw):
            return action
        percent = action.sharing_percentage
        allocatable, used, consumer_own = self._capacity.snapshot(request.foreign_cluster_id)
        advertised = shared_resources(allocatable=allocatable, used=used, percent=percent)
        derivation = OfferDerivation(allocatable=allocatable, used=used, consumer_own=consumer_own,
                                     sharing_percentage=percent, advertised=advertised)  # fmt: skip
        spare_capacity = spare(allocatable=allocatable, used=used)
        now = utcnow().replace(microsecond=0)  # to the second, as the times the push writes
        ttl = now + timedelta(seconds=outgoing.advertisement_time_to_live_seconds)
        period = timedelta(seconds=outgoing.advertisement_period_seconds)
        if request.periodic:  # whether or not the consumer answers: it may be gone for good
            self._clean_after_silent_consumer(request.foreign_cluster_id, peering_request, now=now,
                                              time_to_live_seconds=outgoing.advertisement_time_to_live_seconds)
        metrics, started = Metrics.of_activity(), time.monotonic()
        try:
            foreign = reading_foreign.result()
            self._renew_consumer_token(foreign, request.kube_config_ref, foreign_cluster_id=request.foreign_cluster_id,
                                       now=now, period=period)  # fmt: skip
            verified = request.access_verified_until
            level = outgoing.pod_security_level
            if verified is None:  # no push wrote the credentials yet: they come before the Advertisement naming them
                verified = self._ensure_access(foreign, request.foreign_cluster_id, now=now, period=period,
                                               offered=advertised, pod_security=level)  # fmt: skip
                applied = self._apply_advertisement(foreign, derivation, spare_capacity, outgoing, now=now, ttl=ttl)
            else:  # the Advertisement at once: it is what the consumer waits for
                applying = self._calls.submit(self._apply_advertisement, foreign, derivation, spare_capacity, outgoing,
                                              now=now, ttl=ttl)  # fmt: skip
                ensured = request.periodic or now >= verified
                try:
                    if ensured:
                        verified = self._ensure_access(foreign, request.foreign_cluster_id, now=now, period=period,
                                                       offered=advertised, pod_security=level)  # fmt: skip
                finally:
                    applied = applying.result()
                if not ensured:  # the quota follows every offer; the labels, a ClusterConfig edited since the last
                    # push. Once the Advertisement is written: on a busy machine a write beside it delays it.
                    edited = request.config_generation is None or generation > request.config_generation
                    enforce_offer(self._home, request.foreign_cluster_id, offered=advertised,
                                  pod_security=level if edited else None, calls=self._calls)  # fmt: skip
        except Exception as e:
            metrics.pushed(foreign_cluster=request.foreign_cluster_id, outcome="failed",
                           latency=timedelta(seconds=time.monotonic() - started))  # fmt: skip
            kind = e.type if isinstance(e, ApplicationError) else None
            reason: PeeringCredentialsReason | None = ("CredentialsExpired" if kind == CREDENTIALS_EXPIRED else
                                                       "InvalidCredentials" if kind == INVALID_CREDENTIALS else None)  # fmt: skip
            changed = self._record(request.peering_request, "Unreachable", message=f"push failed: {e}", reason=reason)
            if reason == "InvalidCredentials" and changed and peering_request is not None:
                # The consumer's kubeconfig was refused, the field named: nothing in it was loaded or run.
                record_event(self._home, peering_request, reason=reason, message=str(e), warning=True)
            raise
        metrics.pushed(foreign_cluster=request.foreign_cluster_id, outcome="ok",
                       latency=timedelta(seconds=time.monotonic() - started))  # fmt: skip
        metrics.advertised(foreign_cluster=request.foreign_cluster_id, resources=advertised)
        self._capacity.pushed(request.foreign_cluster_id, spare_capacity)  # early pushes' baseline (other replicas: the annotation)
        if PROVIDER_WITHDRAWN_ANNOTATION in (applied["metadata"].get("annotations") or {}):
            # Peered again while the withdrawn Advertisement was still held by the consumer's teardown.
            patch_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(self._home_id),
                                 {"metadata": {"annotations": {PROVIDER_WITHDRAWN_ANNOTATION: None}}})  # fmt: skip
        decision = foreign_decision(applied)
        self._record(request.peering_request, phase_after_push(decision), decision=decision, pushed=now)
        activity.logger.info("pushed %s to %s: %s", advertisement_name(self._home_id), request.foreign_cluster_id,
                             advertised.to_kubernetes())  # fmt: skip
        return PushResult(
            advertisement=advertisement_name(self._home_id),
            advertised=advertised,
            allocatable=allocatable,
            used=used,
            consumer_own=consumer_own,
            sharing_percentage=percent,
            configured_percentage=outgoing.sharing_percentage,
            config_generation=generation,
            period_seconds=outgoing.advertisement_period_seconds,
            capacity_change_threshold_percent=outgoing.capacity_change_threshold_percent,
            timestamp=now,
            time_to_live=ttl,
            foreign_phase=decision.phase,
            remote_remapped_pod_cidr=decision.remote_remapped_pod_cidr,
            access_verified_until=verified,
        )

    def _clean_after_silent_consumer(self, foreign_cluster_id: str, peering_request: dict[str, Any] | None, *,
                                     now: datetime, time_to_live_seconds: int) -> None:  # fmt: skip
        """A consumer whose virtual kubelet has not renewed its keepalive here for an Advertisement's time to
        live is gone (its cluster deleted, or unpeered with --force while this one was out of its reach):
        nobody else would ever delete its copies, which hold this cluster's capacity. Delete them, then the
        keepalive, and say so; its RemoteNamespaces too (the namespaces made for them go). Its access stays: a consumer that comes back gets a virtual kubelet that
        makes the copies again."""
        namespace = foreign_namespace(foreign_cluster_id)
        try:
            silent_since = keepalive_lapsed_since(self._home, namespace, time_to_live_seconds=time_to_live_seconds,
                                                  now=now)  # fmt: skip
            if silent_since is None:
                return
            cleaning = delete_all_copies(self._home, namespace, foreign_cluster_id, now=now)  # its remote namespaces' too
            # Its remote namespaces too: their requests go, and the controller deletes each namespace with them.
            delete_remote_namespace_requests(self._home, namespace)
            if not cleaning.going:
                drop_keepalive(self._home, namespace)
            if not cleaning.deleted:  # nothing left but pods already terminating: said when they were deleted
                return
            message = (f"{foreign_cluster_id}'s virtual kubelet has not renewed its keepalive since "
                       f"{silent_since:%Y-%m-%d %H:%M:%S} UTC: its copies here were deleted ({cleaning.deleted} pod{'s' * (cleaning.deleted != 1)})")
            activity.logger.warning(message)
            if peering_request is not None:
                record_event(self._home, peering_request, reason="ConsumerSilent", message=message, warning=True)
        except ApiException as e:  # the push itself must not fail over it (a ClusterRole without the right)
            activity.logger.warning("could not clean after %s's lapsed keepalive: %s %s", foreign_cluster_id,
                                    e.status, e.reason)  # fmt: skip

    def _apply_advertisement(self, foreign: k8s.ApiClient, derivation: OfferDerivation, spare_capacity: Resources,
                             outgoing: OutgoingConfig, *, now: datetime, ttl: datetime) -> dict[str, Any]:  # fmt: skip
        advertisement = offered_advertisement(
            provider_id=self._home_id, offered=derivation.advertised, pod_cidr=self._settings.cluster.pod_cidr,
            prices=outgoing.prices, timestamp=now, time_to_live=ttl,
            annotations={SPARE_CAPACITY_ANNOTATION: json.dumps(spare_capacity.to_kubernetes(), sort_keys=True),
                         OFFER_DERIVATION_ANNOTATION: derivation.to_annotation()})  # fmt: skip
        return apply_cluster_object(foreign, ADVERTISEMENTS, advertisement.to_apply())

    def _ensure_access(self, foreign: k8s.ApiClient, foreign_cluster_id: str, *, now: datetime, period: timedelta,
                       offered: Resources, pod_security: PodSecurityLevel) -> datetime:  # fmt: skip
        """The foreign cluster's access to this one: its namespace, ServiceAccount and binding at home (and what
        this cluster enforces there: Pod Security, the offer as a quota), a token not due for renewal, held in the
        credentials Secret there. Returns until when a signalled push may skip this
        (models.credentials.access_verified_until)."""
        namespace, held = ensure_foreign_access(self._home, foreign_cluster_id, offered=offered,
                                                pod_security=pod_security, calls=self._calls)  # fmt: skip
        current = self._renew_credentials(foreign, secret=credentials_secret_name(self._home_id), namespace=namespace,
                                          held=held, now=now, period=period)  # fmt: skip
        return access_verified_until(current, checked_at=now, period=period)

    def _renew_credentials(
        self, foreign: k8s.ApiClient, *, secret: str, namespace: str, held: TokenGeneration | None, now: datetime,
        period: timedelta,
    ) -> TokenGeneration:
        """Leave the foreign cluster's Secret as it is while it holds the current token and that token is
        younger than half its life and outlives the next push; otherwise issue the next generation, write
        it, record it, and revoke the one before the previous (models/credentials.py)."""
        held_secret = ignore_not_found(k8s.CoreV1Api(foreign).read_namespaced_secret, secret, SYSTEM_NAMESPACE)
        held_version = held_secret.metadata.resource_version if held_secret and held_secret.metadata else None
        reason = renewal_reason(held, held_version=held_version, now=now, period=period)
        if held is not None and reason is None:
            return held
        generation = (held.number if held else 0) + 1
        issued = issue_kubeconfig(
            self._home, namespace=namespace, generation=generation,
            lifetime_seconds=self._settings.provider.token_lifetime_seconds,
            server=self._settings.cluster.api_server_for_peers,
        )  # fmt: skip
        written = self._write_credentials(foreign, secret, issued.text)
        current = TokenGeneration(
            number=generation, issued_at=now, expires_at=issued.expires_at,
            secret_version=written["metadata"]["resourceVersion"],
        )  # fmt: skip
        record_token(self._home, namespace, current)
        revoked = revoke_older_tokens(self._home, namespace, current=generation, calls=self._calls)
        activity.logger.info("credentials for %s: generation %d issued (%s), expires %s; revoked %s", namespace,
                             generation, reason, format_rfc3339(issued.expires_at), revoked or "none")  # fmt: skip
        return current

    def _renew_consumer_token(
        self, foreign: k8s.ApiClient, ref: SecretReference, *, foreign_cluster_id: str, now: datetime, period: timedelta
    ) -> None:
        """The token `tidepool peer` minted for this provider on the consumer (kube/identity.py), renewed
        with itself by the rule of our own tokens (models/credentials.renewal_due) into the home Secret the
        peering reads, which SecretClients reloads by its resourceVersion. Once expired, only `tidepool peer`
        can mint the next: said, and not retried. A kubeconfig without a ServiceAccount token (an
        administrator's, written by hand) is not ours to renew."""
        life = bearer_token_life(foreign)
        if life is None or life.subject != service_account_subject(provider_identity_name(self._home_id)):
            return  # not the identity `tidepool peer` minted for us (an administrator's token, say)
        if token_expired(life, now=now):
            raise ApplicationError(
                f"the token this provider holds for {foreign_cluster_id} expired at {format_rfc3339(life.expires_at)}: "
                f"run `tidepool peer` again to mint a new one", type=CREDENTIALS_EXPIRED, non_retryable=True,
            )  # fmt: skip
        reason = renewal_due(life, now=now, period=period)
        if reason is None:
            return
        # Never shorter than two periods and a margin: a token that dies before the next push cannot renew itself.
        lifetime = max(life.lifetime_seconds, 2 * int(period.total_seconds()) + CONSUMER_TOKEN_RENEWAL_MARGIN_SECONDS)
        kubeconfig = renew_provider_token(foreign, provider_id=self._home_id, lifetime_seconds=lifetime)
        k8s.CoreV1Api(self._home).patch_namespaced_secret(
            ref.name, ref.namespace, {"data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}})  # fmt: skip
        activity.logger.info("token on %s renewed (%s), the previous one expires %s", foreign_cluster_id, reason,
                             format_rfc3339(life.expires_at))  # fmt: skip

    def _write_credentials(self, foreign: k8s.ApiClient, name: str, kubeconfig: str) -> dict[str, Any]:
        # The namespace is the consumer's, made by `tidepool peer`: this provider may not create namespaces there.
        return apply_core(foreign, {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE,
                         "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: self._home_id}},
            "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
        })  # fmt: skip

    @activity.defn
    def read_foreign_decision(self, request: DecisionRequest) -> ForeignDecision:
        foreign = self.foreign_clients.get(name=request.kube_config_ref.name, namespace=request.kube_config_ref.namespace)
        obj = read_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(self._home_id))
        decision = foreign_decision(obj)
        phase = phase_after_push(decision)
        if decision.exists and phase != request.phase:
            self._record(request.peering_request, phase, decision=decision)
        return decision

    @activity.defn
    def withdraw_peering(self, request: WithdrawRequest) -> WithdrawResult:
        """Home first (revoking the credentials cannot depend on the foreign cluster being up), then the
        Advertisement and the Secret on the foreign cluster. Everything here is found by name: an attempt that
        finds the request made again under its name (a retry after an earlier attempt released it, and the
        user peered again at once) leaves what the new peering owns alone; that attempt's work was done."""
        if self._replaced(request.peering_request, request.peering_request_uid):
            return WithdrawResult(foreign_cleaned=False, home_cleaned=True,
                                  note="withdrawn already; the PeeringRequest was made again since")  # fmt: skip
        revoke_foreign_access(self._home, request.foreign_cluster_id)
        Metrics.of_activity().advertised(foreign_cluster=request.foreign_cluster_id, resources=Resources())
        self._record(request.peering_request, "Withdrawn", message=f"withdrawn: {request.reason}")
        foreign_cleaned, note = False, "the foreign cluster was not reached; its Advertisement expires on its own"
        if not request.skip_foreign:
            cleaned = self.clean_foreign(CleanForeignRequest(foreign_cluster_id=request.foreign_cluster_id,
                                                             kube_config_ref=request.kube_config_ref))  # fmt: skip
            foreign_cleaned, note = cleaned.cleaned, cleaned.note
        if request.hold_credentials:  # before the release: the request's deletion takes its Secret with it
            self._hold_credentials(request.kube_config_ref, held=True)
        self._release(request.peering_request)
        return WithdrawResult(foreign_cleaned=foreign_cleaned, home_cleaned=True, note=note or request.reason)

    @activity.defn
    def clean_foreign(self, request: CleanForeignRequest) -> CleanForeignResult:
        """The foreign half of a withdrawal: our Advertisement and the Secret the consumer gave its virtual
        kubelet. Fails while the foreign cluster does not answer."""
        try:
            foreign = self.foreign_clients.get(name=request.kube_config_ref.name, namespace=request.kube_config_ref.namespace)
        except ApplicationError as e:  # no credentials left: nothing more we can do there
            return CleanForeignResult(cleaned=False, note=str(e))
        # Said before the deletion that the virtual kubelet reacts to: its credentials are already refused
        # (the namespace went), and this tells it that the provider cleaned up itself.
        ignore_not_found(patch_cluster_object, foreign, ADVERTISEMENTS, advertisement_name(self._home_id),
                         {"metadata": {"annotations": {PROVIDER_WITHDRAWN_ANNOTATION: format_rfc3339(utcnow())}}})  # fmt: skip
        delete_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(self._home_id))
        ignore_not_found(k8s.CoreV1Api(foreign).delete_namespaced_secret,
                         credentials_secret_name(self._home_id), SYSTEM_NAMESPACE)  # fmt: skip
        return CleanForeignResult(cleaned=True)

    @activity.defn
    def release_credentials(self, ref: SecretReference) -> None:
        """A forced withdrawal is done with the foreign side: the credentials Secret goes, unless a live
        PeeringRequest names it now (peered again meanwhile: it holds the new request's kubeconfig). The
        deletion is conditional on the uid and resourceVersion just read: written in between, it is looked at
        again (the retry)."""
        core = k8s.CoreV1Api(self._home)
        secret = ignore_not_found(core.read_namespaced_secret, ref.name, ref.namespace)
        if secret is None or secret.metadata is None:
            return
        meta = secret.metadata
        finalizers = finalizers_after(meta.finalizers, FOREIGN_CLEANUP_FINALIZER, present=False)
        if finalizers is not None:
            patched = core.patch_namespaced_secret(ref.name, ref.namespace, {"metadata": {
                "finalizers": finalizers, "resourceVersion": meta.resource_version}},
                _content_type="application/merge-patch+json")  # fmt: skip
            meta = patched.metadata or meta
        if self._requested_with(ref):
            activity.logger.info("kept %s/%s: a live PeeringRequest names it", ref.namespace, ref.name)
            return
        preconditions = k8s.V1Preconditions(uid=meta.uid, resource_version=meta.resource_version)
        ignore_not_found(core.delete_namespaced_secret, ref.name, ref.namespace,
                         body=k8s.V1DeleteOptions(preconditions=preconditions))  # fmt: skip

    def _requested_with(self, ref: SecretReference) -> bool:
        """Whether a PeeringRequest not being deleted names this Secret."""
        wanted = {"name": ref.name, "namespace": ref.namespace}
        return any(not obj["metadata"].get("deletionTimestamp") and (obj.get("spec") or {}).get("kubeConfigRef") == wanted
                   for obj in list_cluster_objects(self._home, PEERING_REQUESTS))  # fmt: skip

    def _hold_credentials(self, ref: SecretReference, *, held: bool) -> None:
        """Our finalizer on the credentials Secret, and no PeeringRequest owning it: the garbage collector would
        otherwise delete it with its released request, and a request made again meanwhile (which writes it
        under the same name) would lose it to that deletion. release_credentials deletes it, if nobody
        asked again."""
        core = k8s.CoreV1Api(self._home)
        secret = ignore_not_found(core.read_namespaced_secret, ref.name, ref.namespace)
        if secret is None or secret.metadata is None:
            return
        meta = secret.metadata
        patch: dict[str, Any] = {"resourceVersion": meta.resource_version}
        finalizers = finalizers_after(meta.finalizers, FOREIGN_CLEANUP_FINALIZER, present=held)
        if finalizers is not None:
            patch["finalizers"] = finalizers
        owners = meta.owner_references or []
        if held and any(o.kind == "PeeringRequest" for o in owners):
            patch["ownerReferences"] = [self._home.sanitize_for_serialization(o) for o in owners if o.kind != "PeeringRequest"]
        if len(patch) > 1:
            core.patch_namespaced_secret(ref.name, ref.namespace, {"metadata": patch},
                                         _content_type="application/merge-patch+json")  # fmt: skip

    def _replaced(self, peering_request: str | None, uid: str | None) -> bool:
        """Whether a PeeringRequest of another uid than `uid` lives under the name `peering_request`."""
        if peering_request is None or uid is None:
            return False
        obj = read_cluster_object(self._home, PEERING_REQUESTS, peering_request)
        return obj is not None and obj["metadata"].get("uid") != uid

    def _release(self, peering_request: str | None) -> None:
        """Let the PeeringRequest's deletion finish (and its Secret go): the withdrawal is done."""
        if peering_request is None:
            return
        obj = read_cluster_object(self._home, PEERING_REQUESTS, peering_request)
        if obj is None:
            return
        finalizers = finalizers_after(obj["metadata"].get("finalizers"), PEERING_FINALIZER, present=False)
        if finalizers is not None:
            patch_cluster_object(self._home, PEERING_REQUESTS, peering_request, {"metadata": {
                "finalizers": finalizers, "resourceVersion": obj["metadata"]["resourceVersion"]}})

    def _record(
        self,
        peering_request: str | None,
        phase: PeeringRequestPhase,
        *,
        decision: ForeignDecision | None = None,
        pushed: datetime | None = None,
        message: str = "",
        reason: PeeringCredentialsReason | None = None,
    ) -> bool:
        """Mirror the peering's phase into its PeeringRequest status, for kubectl users; the Ready
        condition's reason is the phase unless a `reason` says more. True when the Ready condition's reason
        or message changed (an Event about it is then news)."""
        current = None if peering_request is None else read_cluster_object(self._home, PEERING_REQUESTS, peering_request)
        if peering_request is None or current is None:
            return False
        fields: dict[str, Any] = {"phase": phase}
        if decision is not None:
            fields["advertisementStatus"] = decision.phase
            fields["remoteRemappedPodCIDR"] = decision.remote_remapped_pod_cidr
        if pushed is not None:
            fields["lastPushTime"] = format_rfc3339(pushed)
        ready = condition("Ready", phase in ("Advertised", "Accepted"), reason or phase, message or f"peering is {phase}")
        write_status(self._peering_requests, current, fields=fields, conditions=[ready])
        previous = (current.get("status") or {}).get("conditions") or []
        old: dict[str, Any] = next((c for c in previous if c.get("type") == "Ready"), {})
        return (old.get("reason"), old.get("message")) != (ready.reason, ready.message)
