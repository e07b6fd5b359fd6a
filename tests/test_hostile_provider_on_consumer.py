"""A hostile provider on its consumer (issue 34 item 3: "decisions can be written only by whoever decides"),
with the provider's real credentials there: the kubeconfig `tidepool peer` mints on the consumer and writes
into the provider's `tidepool-peer-<consumer>` Secret, loaded as the provider's worker loads it.

RBAC lets that identity create, patch and delete its own Advertisement, annotations and finalizers
included; the consumer's policy (deploy/base/consumer-decisions.yaml) refuses its writes of the consumer's
annotations (the manual decision and its reason, the refused offer, the forced unpeer) and of the
finalizers. Every attack is a real write against the consumer's API server, followed by what admission
makes of the Advertisement as stored; the provider's legitimate push and withdrawal still work and leave
the consumer's fields as they were. What the identity may call at all is tests/test_provider_identity.py's."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.testing import ActivityEnvironment

from activities import peering as peering_module
from activities.consumer import ConsumerActivities
from activities.peering import PeeringActivities
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import create_cluster, delete_cluster
from deploy.localenv.env import EnvState
from kube.capacity import HomeCapacity
from kube.clients import PeerSecretClients
from kube.identity import revoke_provider_identity
from kube.objects import (
    apply_cluster_object,
    apply_core,
    ignore_not_found,
    patch_cluster_object,
    read_cluster_object,
)
from models.admission import AdmissionSnapshot, Decision, KeptRefusals, candidate, decide, kept_refusals
from models.api.common import SecretReference
from models.consumer import EnsureFinalizerInput, ManualDecision, RefuseNotReadyInput
from models.names import (
    ADVERTISEMENT_FINALIZER,
    ADVERTISEMENTS,
    API_VERSION,
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    DECISION_ANNOTATION,
    DECISION_REASON_ANNOTATION,
    FORCE_UNPEER_ANNOTATION,
    GROUP,
    PROVIDER_WITHDRAWN_ANNOTATION,
    REFUSED_OFFER_ANNOTATION,
    SPARE_CAPACITY_ANNOTATION,
    SYSTEM_NAMESPACE,
    VERSION,
    advertisement_name,
    credentials_secret_name,
)
from models.peering import CleanForeignRequest, PushRequest
from tests.conftest import Clusters
from tests.kube import create_node, wait_for
from tests.running import worker_settings
from workers.peer import request_peering, request_secret_name

pytestmark = [pytest.mark.hostile, pytest.mark.env, pytest.mark.consumer]

POLICY = "tidepool-consumer-decisions"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Peering:
    provider_id: str
    advertisement: str
    provider: PeeringActivities  # the provider's worker, its pushes made with the credentials below
    push: PushRequest
    attacker: k8s.ApiClient  # the provider's identity on the consumer, as `tidepool peer` handed it over
    consumer: ConsumerActivities  # the consumer's worker (its writes are the consumer's)
    admin: k8s.ApiClient  # the consumer's operator


@pytest.fixture(scope="module")
def peering(localenv: EnvState, clusters: Clusters) -> Iterator[Peering]:
    """A provider cluster of this module's own (its offer must not see other tests' pods) peered with cluster b:
    `tidepool peer` for real (an identity on b, its kubeconfig in the provider's Secret), then the provider's
    own activities, called directly (no worker runs for these ids, so nothing but the test writes)."""
    suffix = uuid.uuid4().hex[:8]
    provider_id, consumer_id = f"evil-{suffix}", f"mark-{suffix}"
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    cluster = create_cluster(provider_id, binaries=binaries, workdir=workdir)
    home, admin = cluster.api_client(), clusters.b.api_client()
    capacity = HomeCapacity(home)
    ref = SecretReference(name=request_secret_name(consumer_id), namespace=SYSTEM_NAMESPACE)
    try:
        create_node(home, "n1", cpu="4", memory="8Gi")
        request_peering(home, admin, provider_id=provider_id, consumer_id=consumer_id, token_lifetime_seconds=600)
        capacity.start()  # what a push offers is read before its credentials
        yield Peering(
            provider_id=provider_id, advertisement=advertisement_name(provider_id),
            provider=PeeringActivities(home=home, capacity=capacity,
                                       settings=worker_settings(localenv, cluster, provider_id)),
            push=PushRequest(foreign_cluster_id=consumer_id, kube_config_ref=ref, peering_request=consumer_id,
                             sharing_percentage=None, phase="Pending"),
            attacker=PeerSecretClients(home).get(name=ref.name, namespace=ref.namespace),
            consumer=ConsumerActivities(home=admin, settings=worker_settings(localenv, clusters.b, consumer_id)),
            admin=admin,
        )  # fmt: skip
    finally:
        capacity.stop()
        _remove(admin, advertisement_name(provider_id))
        ignore_not_found(k8s.CoreV1Api(admin).delete_namespaced_secret, credentials_secret_name(provider_id),
                         SYSTEM_NAMESPACE)  # fmt: skip
        revoke_provider_identity(admin, provider_id=provider_id)
        delete_cluster(provider_id, binaries=binaries, workdir=workdir)


def _remove(admin: k8s.ApiClient, name: str) -> None:
    """The operator's way out: finalizers dropped, the object deleted, and gone."""
    ignore_not_found(patch_cluster_object, admin, ADVERTISEMENTS, name, {"metadata": {"finalizers": None}})
    ignore_not_found(k8s.CustomObjectsApi(admin).delete_cluster_custom_object, GROUP, VERSION, ADVERTISEMENTS, name)
    wait_for(lambda: read_cluster_object(admin, ADVERTISEMENTS, name) is None, timeout=30, what=f"{name} gone")


@pytest.fixture
def pushed(peering: Peering) -> Peering:
    """A fresh Advertisement, pushed by the provider's own activity as its worker pushes it."""
    _remove(peering.admin, peering.advertisement)
    ActivityEnvironment().run(peering.provider.push_advertisement, peering.push)
    return peering


def _stored(p: Peering) -> dict[str, Any]:
    obj = read_cluster_object(p.admin, ADVERTISEMENTS, p.advertisement)
    assert obj is not None
    return obj


def _admission(p: Peering) -> tuple[str, str]:
    """(phase, reason) admission gives the Advertisement as stored, under acceptPolicy Manual."""
    now = datetime.now(UTC)
    c = candidate(_stored(p), now)
    snapshot = AdmissionSnapshot(policy="Manual", maximum=5, allowed=frozenset(), denied=frozenset(), candidates=(c,),
                                 now=now)  # fmt: skip
    decided = {d.name: (d.phase, d.reason) for d in decide(snapshot)}
    return decided.get(c.name) or (str(c.phase), str(c.reason))


def _auto_pass(p: Peering, kept: dict[str, KeptRefusals]) -> tuple[Decision, dict[str, KeptRefusals]]:
    """One admission pass over the Advertisement as stored, under AutoAcceptMax with places free, given the
    refusals the admission workflow kept from the pass before: (its decision, what the workflow keeps next)."""
    now = datetime.now(UTC)
    snapshot = AdmissionSnapshot(policy="AutoAcceptMax", maximum=5, allowed=frozenset(), denied=frozenset(),
                                 candidates=(candidate(_stored(p), now),), now=now, kept=kept)  # fmt: skip
    (decision,) = decide(snapshot)  # nothing writes its status here: every pass decides it
    return decision, kept_refusals(snapshot)


def _refused_by_the_policy(write: Callable[[], object], *named: str) -> None:
    with pytest.raises(ApiException) as refused:
        write()
    body = str(refused.value.body)
    assert refused.value.status == 403 and POLICY in body, body
    for name in named:
        assert name in body, body


def _merge(p: Peering, metadata: dict[str, Any]) -> Callable[[], object]:
    return lambda: patch_cluster_object(p.attacker, ADVERTISEMENTS, p.advertisement, {"metadata": metadata})


def _refuse_by_hand(p: Peering) -> None:
    ActivityEnvironment().run(p.consumer.record_manual_decision,
                              ManualDecision(advertisement=p.advertisement, decision="refuse", reason="not this one"))  # fmt: skip


def _refuse_as_not_ready(p: Peering) -> None:
    ActivityEnvironment().run(p.consumer.refuse_not_ready, RefuseNotReadyInput(advertisement=p.advertisement))


def _hold_for_teardown(p: Peering) -> None:
    ActivityEnvironment().run(p.consumer.ensure_finalizer, EnsureFinalizerInput(advertisement=p.advertisement))


def _nothing(_: Peering) -> None:
    pass


def test_rbac_alone_would_let_the_provider_annotate_its_advertisement_so_the_policy_is_what_refuses(
    pushed: Peering,
) -> None:
    review = k8s.AuthorizationV1Api(pushed.attacker).create_self_subject_access_review(
        k8s.V1SelfSubjectAccessReview.model_validate({"spec": {"resourceAttributes": {
            "group": GROUP, "resource": ADVERTISEMENTS, "name": pushed.advertisement, "verb": "patch"}}}))  # fmt: skip
    assert review.status.allowed
    # Its own annotations it may still write: only the consumer's are refused.
    _merge(pushed, {"annotations": {SPARE_CAPACITY_ANNOTATION: "{}"}})()
    _refused_by_the_policy(_merge(pushed, {"annotations": {DECISION_ANNOTATION: "accept"}}), DECISION_ANNOTATION)


@pytest.mark.parametrize(
    ("before", "annotations", "named", "admitted"),
    [
        pytest.param(_nothing, {DECISION_ANNOTATION: "accept", DECISION_REASON_ANNOTATION: "said the provider"},
                     DECISION_ANNOTATION, ("Pending", "AwaitingManualDecision"),
                     id="the provider accepts its own offer under acceptPolicy Manual"),
        pytest.param(_refuse_by_hand, {DECISION_ANNOTATION: None}, DECISION_ANNOTATION, ("Refused", "ManuallyRefused"),
                     id="the provider lifts an operator's refusal"),
        pytest.param(_refuse_by_hand, {DECISION_ANNOTATION: "accept"}, DECISION_ANNOTATION, ("Refused", "ManuallyRefused"),
                     id="the provider turns an operator's refusal into an acceptance"),
        pytest.param(_refuse_by_hand, {DECISION_REASON_ANNOTATION: "you agreed"}, DECISION_REASON_ANNOTATION,
                     ("Refused", "ManuallyRefused"), id="the provider rewrites the reason an operator gave"),
        pytest.param(_refuse_as_not_ready, {REFUSED_OFFER_ANNOTATION: None}, REFUSED_OFFER_ANNOTATION,
                     ("Refused", "VirtualNodeNotReady"),
                     id="the provider lifts the refusal of an offer whose virtual node was never Ready"),
        pytest.param(_refuse_as_not_ready, {REFUSED_OFFER_ANNOTATION: "0000000000000000"}, REFUSED_OFFER_ANNOTATION,
                     ("Refused", "VirtualNodeNotReady"),
                     id="the provider rewrites the refused offer so that its same offer is decided afresh"),
        pytest.param(_nothing, {FORCE_UNPEER_ANNOTATION: "2026-01-01T00:00:00Z"}, FORCE_UNPEER_ANNOTATION,
                     ("Pending", "AwaitingManualDecision"),
                     id="the provider marks its Advertisement force-unpeered, so that teardown would not wait for it"),
    ],
)  # fmt: skip
def test_the_provider_cannot_write_the_consumer_s_annotations_and_admission_decides_as_before(
    pushed: Peering,
    before: Callable[[Peering], None],
    annotations: dict[str, str | None],
    named: str,
    admitted: tuple[str, str],
) -> None:
    before(pushed)
    kept = {k: v for k, v in (_stored(pushed)["metadata"].get("annotations") or {}).items() if k in annotations}
    _refused_by_the_policy(_merge(pushed, {"annotations": annotations}), named)
    assert {k: v for k, v in (_stored(pushed)["metadata"].get("annotations") or {}).items() if k in annotations} == kept
    assert _admission(pushed) == admitted


def test_the_provider_cannot_accept_its_offer_by_server_side_apply_either(pushed: Peering) -> None:
    stored = _stored(pushed)
    body = {"apiVersion": API_VERSION, "kind": "Advertisement", "spec": stored["spec"],
            "metadata": {"name": pushed.advertisement, "annotations": {DECISION_ANNOTATION: "accept"}}}  # fmt: skip
    _refused_by_the_policy(lambda: apply_cluster_object(pushed.attacker, ADVERTISEMENTS, body), DECISION_ANNOTATION)
    assert _admission(pushed) == ("Pending", "AwaitingManualDecision")


def test_the_provider_cannot_create_its_advertisement_already_accepted(pushed: Peering) -> None:
    spec = _stored(pushed)["spec"]
    ignore_not_found(k8s.CustomObjectsApi(pushed.attacker).delete_cluster_custom_object, GROUP, VERSION, ADVERTISEMENTS,
                     pushed.advertisement)  # fmt: skip
    wait_for(lambda: read_cluster_object(pushed.admin, ADVERTISEMENTS, pushed.advertisement) is None, timeout=30,
             what="the withdrawn Advertisement gone")  # fmt: skip
    for metadata, named in (({"annotations": {DECISION_ANNOTATION: "accept"}}, DECISION_ANNOTATION),
                            ({"finalizers": [ADVERTISEMENT_FINALIZER]}, ADVERTISEMENT_FINALIZER)):  # fmt: skip
        body = {"apiVersion": API_VERSION, "kind": "Advertisement", "spec": spec,
                "metadata": {"name": pushed.advertisement, **metadata}}  # fmt: skip
        _refused_by_the_policy(functools.partial(apply_cluster_object, pushed.attacker, ADVERTISEMENTS, body), named)
    assert read_cluster_object(pushed.admin, ADVERTISEMENTS, pushed.advertisement) is None


def test_the_provider_cannot_shed_an_operator_s_refusal_by_withdrawing_and_pushing_again(pushed: Peering) -> None:
    """Withdrawing is the provider's right, and the new Advertisement carries none of the consumer's annotations:
    the refusal is kept by the admission workflow, by the uid of the Advertisement it was made on."""
    _refuse_by_hand(pushed)
    refused, kept = _auto_pass(pushed, {})
    assert (refused.phase, refused.reason) == ("Refused", "ManuallyRefused")
    first = _stored(pushed)["metadata"]["uid"]
    k8s.CustomObjectsApi(pushed.attacker).delete_cluster_custom_object(GROUP, VERSION, ADVERTISEMENTS,
                                                                       pushed.advertisement)  # fmt: skip
    wait_for(lambda: read_cluster_object(pushed.admin, ADVERTISEMENTS, pushed.advertisement) is None, timeout=30,
             what="the refused Advertisement withdrawn")  # fmt: skip
    ActivityEnvironment().run(pushed.provider.push_advertisement, pushed.push)
    again = _stored(pushed)["metadata"]
    assert again["uid"] != first and DECISION_ANNOTATION not in (again.get("annotations") or {})
    assert _auto_pass(pushed, {})[0].reason == "WithinMaximum"  # the attack, had admission not kept the refusal
    still, kept = _auto_pass(pushed, kept)
    assert (still.phase, still.reason) == ("Refused", "ManuallyRefused")
    assert f"refused by hand on an earlier Advertisement of cluster {pushed.provider_id!r} (uid {first})" in still.message
    ActivityEnvironment().run(pushed.consumer.record_manual_decision,
                              ManualDecision(advertisement=pushed.advertisement, decision="accept", reason="lifted"))  # fmt: skip
    accepted, kept = _auto_pass(pushed, kept)
    assert (accepted.phase, accepted.reason, kept) == ("Accepted", "ManuallyAccepted", {})


@pytest.mark.parametrize(
    ("write", "named"),
    [
        pytest.param(lambda p: _merge(p, {"finalizers": None}), ADVERTISEMENT_FINALIZER,
                     id="the provider removes the consumer's teardown finalizer by merge patch"),
        pytest.param(lambda p: lambda: k8s.CustomObjectsApi(p.attacker).patch_cluster_custom_object(
                         GROUP, VERSION, ADVERTISEMENTS, p.advertisement,
                         [{"op": "remove", "path": "/metadata/finalizers/0"}], _content_type=JSON_PATCH),
                     ADVERTISEMENT_FINALIZER, id="the provider removes the consumer's teardown finalizer by JSON patch"),
        pytest.param(lambda p: _merge(p, {"finalizers": [ADVERTISEMENT_FINALIZER, "example.com/never"]}),
                     "example.com/never",
                     id="the provider adds a finalizer that would hold its Advertisement past the consumer's deletion"),
    ],
)  # fmt: skip
def test_the_provider_cannot_touch_the_finalizers_of_its_accepted_advertisement(
    pushed: Peering, write: Callable[[Peering], Callable[[], object]], named: str
) -> None:
    _hold_for_teardown(pushed)
    _refused_by_the_policy(write(pushed), named)
    assert _stored(pushed)["metadata"]["finalizers"] == [ADVERTISEMENT_FINALIZER]


def test_the_provider_cannot_remake_its_credentials_secret_as_a_service_account_token(pushed: Peering) -> None:
    """Deleted and made again as a kubernetes.io/service-account-token Secret naming one of the consumer's
    ServiceAccounts, the consumer's token controller would fill it with a never-expiring token of it, for the
    provider to read. RBAC alone lets it: the Secret is its own, by name, and RBAC cannot say of which type."""
    name, core = credentials_secret_name(pushed.provider_id), k8s.CoreV1Api(pushed.attacker)
    for verb in ("delete", "create", "patch"):
        review = k8s.AuthorizationV1Api(pushed.attacker).create_self_subject_access_review(
            k8s.V1SelfSubjectAccessReview.model_validate({"spec": {"resourceAttributes": {
                "resource": "secrets", "namespace": SYSTEM_NAMESPACE, "name": name, "verb": verb}}}))  # fmt: skip
        assert review.status.allowed, verb
    token = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
             "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE,
                          "annotations": {"kubernetes.io/service-account.name": "tidepool-worker"}}}  # fmt: skip
    held = k8s.CoreV1Api(pushed.admin).read_namespaced_secret(name, SYSTEM_NAMESPACE)
    core.delete_namespaced_secret(name, SYSTEM_NAMESPACE)
    try:
        # The API server itself takes the Secret: the operator's dry run of it (the policy matches provider
        # identities only).
        k8s.CoreV1Api(pushed.admin).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate(token),
                                                             dry_run="All")  # fmt: skip
        # By server-side apply, as its worker writes the Secret (a create by name; a POST names none, and RBAC's
        # names refuse it).
        with pytest.raises(ApiException) as refused:
            apply_core(pushed.attacker, token)
        body = str(refused.value.body)
        assert refused.value.status == 403 and "tidepool-provider-secrets" in body and "type" in body, body
        assert ignore_not_found(core.read_namespaced_secret, name, SYSTEM_NAMESPACE) is None
    finally:
        k8s.CoreV1Api(pushed.admin).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate(
            {"metadata": {"name": name, "labels": held.metadata.labels}, "type": held.type, "data": held.data}))


def test_the_provider_cannot_write_its_advertisement_s_status(pushed: Peering) -> None:
    """RBAC refuses the status subresource; status carried by a write of the object itself is dropped."""
    stored = _stored(pushed)
    accepted = {"phase": "Accepted", "reason": "ManuallyAccepted"}
    with pytest.raises(ApiException) as refused:
        k8s.CustomObjectsApi(pushed.attacker).patch_cluster_custom_object_status(
            GROUP, VERSION, ADVERTISEMENTS, pushed.advertisement, {"status": accepted})  # fmt: skip
    assert refused.value.status == 403
    apply_cluster_object(pushed.attacker, ADVERTISEMENTS, {
        "apiVersion": API_VERSION, "kind": "Advertisement", "metadata": {"name": pushed.advertisement},
        "spec": stored["spec"], "status": accepted})  # fmt: skip
    assert _stored(pushed).get("status") == stored.get("status")
    assert _admission(pushed) == ("Pending", "AwaitingManualDecision")


def test_the_provider_cannot_decide_on_another_provider_s_advertisement(pushed: Peering) -> None:
    other = advertisement_name(f"rival-{uuid.uuid4().hex[:8]}")
    apply_cluster_object(pushed.admin, ADVERTISEMENTS, {
        "apiVersion": API_VERSION, "kind": "Advertisement", "metadata": {"name": other},
        "spec": {**_stored(pushed)["spec"], "clusterId": other.removeprefix("advertisement-")}})  # fmt: skip
    try:
        for annotations in ({DECISION_ANNOTATION: "refuse"}, {DECISION_ANNOTATION: "accept"}):
            with pytest.raises(ApiException) as refused:  # RBAC: its own Advertisement only, by name
                patch_cluster_object(pushed.attacker, ADVERTISEMENTS, other, {"metadata": {"annotations": annotations}})
            assert refused.value.status == 403
        with pytest.raises(ApiException) as refused:
            k8s.CustomObjectsApi(pushed.attacker).delete_cluster_custom_object(GROUP, VERSION, ADVERTISEMENTS, other)
        assert refused.value.status == 403
    finally:
        _remove(pushed.admin, other)


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda p: patch_cluster_object(p.attacker, CLUSTER_CONFIGS, CLUSTER_CONFIG_NAME, {"spec": {"incoming": {
                         "acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 1000000, "deniedClusters": []}}}),
                     id="the provider turns the consumer's acceptance policy automatic and takes it off the deny list"),
        pytest.param(lambda p: apply_cluster_object(p.attacker, ADVERTISEMENTS, {
                         "apiVersion": API_VERSION, "kind": "Advertisement", "metadata": {"name": advertisement_name("x")},
                         "spec": {**_stored(p)["spec"], "clusterId": "x"}}),
                     id="the provider offers again under another provider's name, a refusal of its own not following it"),
    ],
)  # fmt: skip
def test_the_provider_cannot_decide_through_the_consumer_s_other_objects(
    pushed: Peering, write: Callable[[Peering], object]
) -> None:
    with pytest.raises(ApiException) as refused:  # RBAC: none of them is the provider's
        write(pushed)
    assert refused.value.status == 403


def test_the_provider_s_push_still_works_and_keeps_the_consumer_s_annotations_and_finalizer(
    pushed: Peering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server-side apply removes only the fields its own manager applied before and no longer applies: the
    consumer's annotations, written by the consumer's manager, stay whatever the provider's apply omits."""
    later = datetime.now(UTC) + timedelta(minutes=1)  # a push stamps spec.timestamp: a later one writes for sure
    monkeypatch.setattr(peering_module, "utcnow", lambda: later)
    _hold_for_teardown(pushed)  # first: holding an accepted one drops an earlier refused offer
    _refuse_as_not_ready(pushed)
    _refuse_by_hand(pushed)
    before = _stored(pushed)
    consumers = {k: v for k, v in before["metadata"]["annotations"].items()
                 if k in (DECISION_ANNOTATION, DECISION_REASON_ANNOTATION, REFUSED_OFFER_ANNOTATION)}  # fmt: skip
    assert len(consumers) == 3
    ActivityEnvironment().run(pushed.provider.push_advertisement, pushed.push)
    after = _stored(pushed)
    assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]  # the push wrote
    assert {k: after["metadata"]["annotations"].get(k) for k in consumers} == consumers
    assert after["metadata"]["finalizers"] == [ADVERTISEMENT_FINALIZER]
    assert after["status"]["phase"] == before["status"]["phase"]


def test_the_provider_s_withdrawal_still_works_and_waits_for_the_consumer_s_teardown(pushed: Peering) -> None:
    _hold_for_teardown(pushed)
    result = ActivityEnvironment().run(pushed.provider.clean_foreign, CleanForeignRequest(
        foreign_cluster_id=pushed.push.foreign_cluster_id, kube_config_ref=pushed.push.kube_config_ref))  # fmt: skip
    assert result.cleaned
    held = _stored(pushed)
    assert held["metadata"].get("deletionTimestamp") and held["metadata"]["finalizers"] == [ADVERTISEMENT_FINALIZER]
    assert PROVIDER_WITHDRAWN_ANNOTATION in held["metadata"]["annotations"]
