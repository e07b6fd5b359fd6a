"""The provider's identity on a consumer (issue 15 item 5): what `tidepool peer` mints there may do
exactly what the provider does (kube/identity.py) and nothing else, checked both ways with the API
server's own authorizer and with real calls; its token is renewed by the provider itself at half its life
(models/credentials.py, activities/peering.py); an expired one says so and `tidepool peer` mends it."""

from __future__ import annotations

import base64
import functools
import json
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import peering as peering_module
from activities.peering import PeeringActivities
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.capacity import HomeCapacity
from kube.clients import PeerSecretClients, client_from_peer_kubeconfig_text
from kube.errors import CREDENTIALS_EXPIRED
from kube.identity import bearer_token_life, mint_provider_identity, renew_provider_token
from kube.objects import (
    apply_cluster_object,
    apply_core,
    delete_cluster_object,
    ignore_not_found,
    list_cluster_objects,
    read_cluster_object,
)
from models.api.common import SecretReference
from models.credentials import TokenLife, renewal_due, token_expired
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    FOREIGN_CLEANUP_FINALIZER,
    GROUP,
    PEERING_FINALIZER,
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    VERSION,
    advertisement_name,
    credentials_secret_name,
    foreign_namespace,
    provider_identity_name,
)
from models.peering import PushRequest, PushResult, WithdrawRequest
from models.times import format_rfc3339
from tests.conftest import Clusters
from tests.kube import create_node
from tests.running import worker_settings
from workers.peer import cancel_peering, request_peering, request_secret_name

pytestmark = pytest.mark.federation

ISSUED = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
HOUR = TokenLife(issued_at=ISSUED, expires_at=ISSUED + timedelta(hours=1))
PERIOD = timedelta(minutes=10)


def _jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.signature"


@pytest.mark.parametrize(
    ("token", "life"),
    [
        pytest.param(_jwt({"iat": int(ISSUED.timestamp()), "exp": int(ISSUED.timestamp()) + 3600}), HOUR,
                     id="a ServiceAccount token says when it was issued and expires"),
        pytest.param(_jwt({"sub": "someone"}), None, id="a JWT without the claims is not one to renew"),
        pytest.param("not-a-jwt", None, id="an opaque token is not one to renew"),
        pytest.param("a.%%%.c", None, id="an unreadable payload is not one to renew"),
    ],
)  # fmt: skip
def test_a_token_s_life_is_read_from_its_own_claims(token: str, life: TokenLife | None) -> None:
    assert TokenLife.of_jwt(token) == life


@pytest.mark.parametrize(
    ("now", "period", "due", "expired"),
    [
        pytest.param(ISSUED + timedelta(minutes=10), PERIOD, None, False, id="a young token is kept"),
        pytest.param(ISSUED + timedelta(minutes=30), PERIOD, "HalfLife", False, id="at half its life it is renewed"),
        pytest.param(ISSUED + timedelta(minutes=10), timedelta(minutes=50), "ExpiresBeforeNextPush", False,
                     id="one that would expire before the next push is renewed now"),
        pytest.param(ISSUED + timedelta(minutes=59, seconds=59), PERIOD, "HalfLife", False,
                     id="a second before its end it still renews itself"),
        pytest.param(ISSUED + timedelta(hours=1), PERIOD, "HalfLife", True,
                     id="at its end it is expired: only tidepool peer mints the next"),
    ],
)  # fmt: skip
def test_the_provider_renews_its_consumer_token_at_half_life_and_not_once_it_expired(
    now: datetime, period: timedelta, due: str | None, expired: bool
) -> None:
    assert renewal_due(HOUR, now=now, period=period) == due
    assert token_expired(HOUR, now=now) is expired


@functools.cache
def _kubectl() -> Path:
    return ensure_binaries().kubectl


def _can(consumer: LocalCluster, who: str, *args: str) -> bool:
    result = subprocess.run([str(_kubectl()), "--kubeconfig", str(consumer.kubeconfig), "auth", "can-i", f"--as={who}",
                             *args], capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


def _advertisement(provider_id: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "apiVersion": API_VERSION, "kind": "Advertisement",
        "metadata": {"name": advertisement_name(provider_id)},
        "spec": {"clusterId": provider_id, "resourceQuota": {"hard": {"cpu": "1"}}, "network": {"podCIDR": "10.9.0.0/16"},
                 "kubeConfigRef": {"name": credentials_secret_name(provider_id), "namespace": SYSTEM_NAMESPACE},
                 "timestamp": format_rfc3339(now),
                 "timeToLive": format_rfc3339(now + timedelta(minutes=5))},
    }  # fmt: skip


@pytest.mark.env
def test_the_minted_identity_may_do_what_its_provider_does_on_the_consumer_and_nothing_else(
    clusters: Clusters, unique: str
) -> None:
    consumer = clusters.b
    mine, other = f"p-{unique}", f"q-{unique}"
    admin = consumer.api_client()
    kubeconfig = mint_provider_identity(admin, provider_id=mine, lifetime_seconds=600)
    mint_provider_identity(admin, provider_id=other, lifetime_seconds=600)
    me = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{provider_identity_name(mine)}"
    advert, others_advert = f"advertisements.{GROUP}/{advertisement_name(mine)}", f"advertisements.{GROUP}/{advertisement_name(other)}"
    secret, others_secret = f"secrets/{credentials_secret_name(mine)}", f"secrets/{credentials_secret_name(other)}"
    may = [
        ("get", advert), ("list", advert), ("watch", advert), ("create", advert), ("patch", advert), ("delete", advert),
        ("get", advert, "--subresource=status"),
        ("get", secret, "-n", SYSTEM_NAMESPACE), ("create", secret, "-n", SYSTEM_NAMESPACE),
        ("patch", secret, "-n", SYSTEM_NAMESPACE),
        ("delete", secret, "-n", SYSTEM_NAMESPACE),
        ("create", f"serviceaccounts/{provider_identity_name(mine)}", "--subresource=token", "-n", SYSTEM_NAMESPACE),
    ]  # fmt: skip
    may_not = [
        ("get", others_advert), ("patch", others_advert), ("delete", others_advert), ("list", f"advertisements.{GROUP}"),
        ("patch", advert, "--subresource=status"),  # the decision is the consumer's
        ("get", others_secret, "-n", SYSTEM_NAMESPACE), ("list", "secrets", "-n", SYSTEM_NAMESPACE),
        ("get", "secrets", "-A"), ("create", "secrets", "-n", SYSTEM_NAMESPACE), ("create", others_secret, "-n", SYSTEM_NAMESPACE),
        ("create", f"advertisements.{GROUP}"), ("create", "namespaces"),
        ("create", f"serviceaccounts/{provider_identity_name(other)}", "--subresource=token", "-n", SYSTEM_NAMESPACE),
        ("create", "serviceaccounts/tidepool-virtual-kubelet", "--subresource=token", "-n", SYSTEM_NAMESPACE),
        ("list", "nodes"), ("list", "pods", "-A"), ("create", f"peeringrequests.{GROUP}"),
    ]  # fmt: skip
    assert [a for a in may if not _can(consumer, me, *a)] == []
    assert [a for a in may_not if _can(consumer, me, *a)] == []

    # The calls the provider makes, made for real with the minted kubeconfig: a server-side apply that
    # creates (authorized as a patch), the decision watch's list and watch by name, its Secret.
    identity = client_from_peer_kubeconfig_text(kubeconfig)
    custom = k8s.CustomObjectsApi(identity)
    try:
        created = apply_cluster_object(identity, ADVERTISEMENTS, _advertisement(mine))
        assert created["metadata"]["name"] == advertisement_name(mine)
        by_name = f"metadata.name={advertisement_name(mine)}"
        listed = list_cluster_objects(identity, ADVERTISEMENTS, field_selector=by_name)
        assert [o["metadata"]["name"] for o in listed] == [advertisement_name(mine)]
        watch = custom.list_cluster_custom_object(GROUP, VERSION, ADVERTISEMENTS, field_selector=by_name, watch=True,
                                                  timeout_seconds=1, _preload_content=False)  # fmt: skip
        assert isinstance(watch, urllib3.BaseHTTPResponse) and watch.status == 200
        # Read the watch to its end (the server closes it after timeout_seconds) before its connection goes
        # back to the pool: released unread, the next request on it read the watch's leftovers and failed.
        watch.drain_conn()
        watch.release_conn()
        apply_core(identity, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                              "metadata": {"name": credentials_secret_name(mine), "namespace": SYSTEM_NAMESPACE},
                              "data": {"kubeconfig": base64.b64encode(b"x").decode()}})  # fmt: skip
        refused: dict[str, Callable[[], object]] = {
            "list every Advertisement": lambda: custom.list_cluster_custom_object(GROUP, VERSION, ADVERTISEMENTS),
            "another's Advertisement": lambda: read_cluster_object(identity, ADVERTISEMENTS, advertisement_name(other)),
            "another's Secret": lambda: k8s.CoreV1Api(identity).read_namespaced_secret(credentials_secret_name(other),
                                                                                     SYSTEM_NAMESPACE),
            "a namespace": lambda: apply_core(identity, {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": f"ns-{unique}"}}),
        }  # fmt: skip
        for what, call in refused.items():
            with pytest.raises(ApiException) as error:
                call()
            assert error.value.status == 403, what
        # Its own next token, asked for with the current one, works as well.
        renewed = client_from_peer_kubeconfig_text(renew_provider_token(identity, provider_id=mine, lifetime_seconds=600))
        assert read_cluster_object(renewed, ADVERTISEMENTS, advertisement_name(mine)) is not None
    finally:
        delete_cluster_object(identity, ADVERTISEMENTS, advertisement_name(mine))
        ignore_not_found(k8s.CoreV1Api(identity).delete_namespaced_secret, credentials_secret_name(mine), SYSTEM_NAMESPACE)


@pytest.fixture
def peered(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], unique: str
) -> Iterator[tuple[PeeringActivities, k8s.ApiClient, PushRequest]]:
    """A provider of its own, peered with b by request_peering (a 600 s token), and its activities,
    called directly: no worker runs, so the test says what time it is."""
    provider = make_cluster("prov")
    api = provider.api_client()
    create_node(api, "n1", cpu="4", memory="8Gi")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    request_peering(api, clusters.b.api_client(), provider_id=provider_id, consumer_id=consumer_id,
                    token_lifetime_seconds=600)  # fmt: skip
    capacity = HomeCapacity(api).start()  # what a push offers is read before its credentials
    activities = PeeringActivities(home=api, capacity=capacity, settings=worker_settings(localenv, provider, provider_id))
    ref = SecretReference(name=request_secret_name(consumer_id), namespace=SYSTEM_NAMESPACE)
    yield activities, api, PushRequest(foreign_cluster_id=consumer_id, kube_config_ref=ref, peering_request=consumer_id,
                                       sharing_percentage=None, phase="Pending")  # fmt: skip
    capacity.stop()
    delete_cluster_object(clusters.b.api_client(), ADVERTISEMENTS, advertisement_name(provider_id))
    k8s.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, PEERING_REQUESTS, consumer_id,
                                                          {"metadata": {"finalizers": None}})  # fmt: skip
    cancel_peering(api, consumer_id=consumer_id)


def _held(home: k8s.ApiClient, ref: SecretReference) -> tuple[str, k8s.ApiClient]:
    """The home Secret's resourceVersion and a client of the kubeconfig it holds now."""
    secret = k8s.CoreV1Api(home).read_namespaced_secret(ref.name, ref.namespace)
    return str(secret.metadata.resource_version), PeerSecretClients(home).get(name=ref.name, namespace=ref.namespace)


@pytest.mark.env
def test_the_provider_renews_the_token_with_itself_at_half_life_and_the_new_one_works(
    peered: tuple[PeeringActivities, k8s.ApiClient, PushRequest],
) -> None:
    activities, home, push = peered
    ref, renew = push.kube_config_ref, ActivityEnvironment().run
    version, foreign = _held(home, ref)
    life = bearer_token_life(foreign)
    assert life is not None and life.lifetime_seconds == 600
    short = timedelta(seconds=60)  # 600 s tokens are otherwise renewed on every 10-minute push
    renew(activities._renew_consumer_token, foreign, ref, foreign_cluster_id=push.foreign_cluster_id,
          now=life.issued_at, period=short)  # fmt: skip
    assert _held(home, ref)[0] == version, "a young token was renewed"
    renew(activities._renew_consumer_token, foreign, ref, foreign_cluster_id=push.foreign_cluster_id,
          now=life.half_life(), period=short)  # fmt: skip
    renewed_version, renewed = _held(home, ref)
    assert renewed_version != version
    renewed_life = bearer_token_life(renewed)
    assert renewed_life is not None and renewed_life.lifetime_seconds == 600
    assert renewed.configuration.api_key != foreign.configuration.api_key
    assert read_cluster_object(renewed, ADVERTISEMENTS, advertisement_name(activities._home_id)) is None  # allowed


@pytest.mark.env
def test_an_expired_token_says_credentials_expired_and_peering_again_mends_it(
    peered: tuple[PeeringActivities, k8s.ApiClient, PushRequest], clusters: Clusters, monkeypatch: pytest.MonkeyPatch,
) -> None:
    activities, home, push = peered
    life = bearer_token_life(_held(home, push.kube_config_ref)[1])
    assert life is not None
    with monkeypatch.context() as later:  # the provider was down for longer than the token lived
        later.setattr(peering_module, "utcnow", lambda: life.expires_at + timedelta(seconds=1))
        with pytest.raises(ApplicationError) as error:
            ActivityEnvironment().run(activities.push_advertisement, push)
    assert error.value.type == CREDENTIALS_EXPIRED and error.value.non_retryable
    assert "tidepool peer" in error.value.message
    request = read_cluster_object(home, PEERING_REQUESTS, push.foreign_cluster_id)
    assert request is not None
    ready = next(c for c in request["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "CredentialsExpired")
    assert "tidepool peer" in ready["message"]

    consumer_id, provider_id = push.foreign_cluster_id, activities._home_id
    request_peering(home, clusters.b.api_client(), provider_id=provider_id, consumer_id=consumer_id, token_lifetime_seconds=600)
    result = ActivityEnvironment().run(activities.push_advertisement, push)
    assert isinstance(result, PushResult)
    request = read_cluster_object(home, PEERING_REQUESTS, consumer_id)
    assert request is not None
    assert next(c for c in request["status"]["conditions"] if c["type"] == "Ready")["reason"] == "Advertised"
    assert PEERING_FINALIZER in request["metadata"]["finalizers"]


@pytest.mark.env
def test_a_withdrawal_that_finds_its_request_made_again_leaves_the_new_peering_alone(
    peered: tuple[PeeringActivities, k8s.ApiClient, PushRequest],
) -> None:
    """A withdrawal attempt retried after an earlier one released the request (its completion lost with its
    worker) while the user peered again at once: what it touches is found by name, and is the new peering's."""
    activities, home, push = peered
    run, core, ref = ActivityEnvironment().run, k8s.CoreV1Api(home), push.kube_config_ref
    assert isinstance(run(activities.push_advertisement, push), PushResult)  # access, finalizer, status
    live = read_cluster_object(home, PEERING_REQUESTS, push.foreign_cluster_id)
    assert live is not None
    earlier = WithdrawRequest(foreign_cluster_id=push.foreign_cluster_id, kube_config_ref=ref,
                              peering_request=push.peering_request, reason="Forced", skip_foreign=True,
                              hold_credentials=True, peering_request_uid="uid-of-the-request-before")  # fmt: skip

    def namespace_live() -> bool:
        namespace = ignore_not_found(core.read_namespace, foreign_namespace(push.foreign_cluster_id))
        return namespace is not None and namespace.metadata.deletion_timestamp is None

    result = run(activities.withdraw_peering, earlier)
    assert result.home_cleaned and "made again" in result.note
    after = read_cluster_object(home, PEERING_REQUESTS, push.foreign_cluster_id)
    assert after is not None and PEERING_FINALIZER in after["metadata"]["finalizers"]
    assert after["status"]["phase"] != "Withdrawn"
    assert namespace_live(), "the new peering's access was revoked"
    secret = core.read_namespaced_secret(ref.name, ref.namespace)
    assert FOREIGN_CLEANUP_FINALIZER not in (secret.metadata.finalizers or [])
    assert [o.uid for o in secret.metadata.owner_references or []] == [live["metadata"]["uid"]]

    # The request's own withdrawal (credentials not held: the fixture's cleanup deletes the Secret with it).
    own = earlier.model_copy(update={"peering_request_uid": live["metadata"]["uid"], "hold_credentials": False})
    run(activities.withdraw_peering, own)
    after = read_cluster_object(home, PEERING_REQUESTS, push.foreign_cluster_id)
    assert after is not None and PEERING_FINALIZER not in (after["metadata"].get("finalizers") or [])
    assert after["status"]["phase"] == "Withdrawn"
    assert not namespace_live()
