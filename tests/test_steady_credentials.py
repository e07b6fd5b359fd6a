"""Credentials that rotate, without a cluster: when a push renews and what it revokes (models/credentials.py),
the client that follows its kubeconfig file (kube/), the kubelet stand-in's atomic Secret
volumes, and when a virtual kubelet writes its node's status."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from deploy.localenv.deployments import write_volume_atomically
from kube.clients import PeerKubeconfigFileClient
from models.credentials import (
    MIN_TOKEN_LIFETIME_SECONDS,
    TokenGeneration,
    access_verified_until,
    anchors_to_revoke,
    renewal_deadline,
    renewal_due,
    renewal_reason,
    token_lifetime_seconds,
)
from models.names import token_anchor_name
from models.virtual_kubelet import node_status_report_due, reflected_name, virtual_node
from tests.tls import LocalCertificate, local_certificate

pytestmark = pytest.mark.steady

ISSUED = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
HELD = TokenGeneration(number=3, issued_at=ISSUED, expires_at=ISSUED + timedelta(hours=1), secret_version="42")
PERIOD, LONG_PERIOD = timedelta(minutes=10), timedelta(minutes=50)


@pytest.mark.parametrize(
    ("held", "version", "now", "reason", "period"),
    [
        pytest.param(None, None, ISSUED, "NoToken", PERIOD, id="a first push issues a token"),
        pytest.param(None, "42", ISSUED, "NoToken", PERIOD, id="a Secret from before rotation is replaced"),
        pytest.param(HELD, "42", ISSUED + timedelta(minutes=10), None, PERIOD, id="a young token is left as it is"),
        pytest.param(HELD, "42", ISSUED + timedelta(minutes=29, seconds=59), None, PERIOD, id="just before half its life"),
        pytest.param(HELD, "42", ISSUED + timedelta(minutes=30), "HalfLife", PERIOD, id="at half its life it is renewed"),
        pytest.param(HELD, "42", ISSUED + timedelta(minutes=10), "ExpiresBeforeNextPush", LONG_PERIOD,
                     id="a young token that would expire before a push a long period away is renewed now"),
        pytest.param(HELD, None, ISSUED + timedelta(minutes=1), "SecretMissing", PERIOD, id="a deleted Secret is rewritten"),
        pytest.param(HELD, "43", ISSUED + timedelta(minutes=1), "SecretChanged", PERIOD, id="a changed Secret is rewritten"),
    ],
)  # fmt: skip
def test_a_push_renews_at_half_life_before_expiry_or_when_the_foreign_secret_no_longer_holds_the_token(
    held: TokenGeneration | None, version: str | None, now: datetime, reason: str | None, period: timedelta
) -> None:
    assert renewal_reason(held, held_version=version, now=now, period=period) == reason


@pytest.mark.parametrize("period", [PERIOD, LONG_PERIOD], ids=["production period", "a period close to the lifetime"])
def test_the_renewal_deadline_is_the_first_moment_a_push_would_renew(period: timedelta) -> None:
    deadline = renewal_deadline(HELD.life, period=period)
    assert renewal_due(HELD.life, now=deadline - timedelta(seconds=1), period=period) is None
    assert renewal_due(HELD.life, now=deadline, period=period) is not None


@pytest.mark.parametrize(
    ("checked_at", "period", "until"),
    [
        pytest.param(ISSUED, PERIOD, ISSUED + PERIOD, id="a young token: one period, then the periodic push checks"),
        pytest.param(ISSUED + timedelta(minutes=25), PERIOD, ISSUED + timedelta(minutes=30),
                     id="never past the token's half life"),
        pytest.param(ISSUED, LONG_PERIOD, ISSUED + timedelta(minutes=8),
                     id="nor past the moment it would expire before the next push"),
    ],
)  # fmt: skip
def test_a_signalled_push_skips_the_access_check_for_one_period_at_most_and_never_past_the_renewal(
    checked_at: datetime, period: timedelta, until: datetime
) -> None:
    assert access_verified_until(HELD, checked_at=checked_at, period=period) == until


@pytest.mark.parametrize(
    ("current", "revoked"),
    [
        pytest.param(1, [], id="the first token revokes nothing"),
        pytest.param(2, [], id="the previous token stays valid"),
        pytest.param(3, [1], id="the one before the previous goes"),
        pytest.param(9, [5, 6, 7], id="older ones an interrupted rotation left go too, within the lookback"),
    ],
)  # fmt: skip
def test_issuing_a_token_revokes_all_but_it_and_the_previous_one(current: int, revoked: list[int]) -> None:
    assert anchors_to_revoke(current=current) == revoked


def test_an_anchor_name_can_never_be_a_secret_the_virtual_kubelet_copies() -> None:
    # A consumer namespace `tidepool` with a Secret `token.3` would be copied as `tidepool-token.3`.
    assert "-" not in token_anchor_name(3)
    assert reflected_name("tidepool", "token.3") != token_anchor_name(3)


def test_the_token_generation_round_trips_through_annotations_and_an_unreadable_one_means_none() -> None:
    assert TokenGeneration.from_annotations(HELD.to_annotations()) == HELD
    assert TokenGeneration.from_annotations({**HELD.to_annotations(), "tidepool.io/token-generation": "x"}) is None
    assert TokenGeneration.from_annotations(None) is None
    assert "token" not in json.dumps(HELD.to_annotations()).replace("token-", "")  # names only, no credential


def test_a_token_lifetime_below_the_api_servers_minimum_is_raised_to_it() -> None:
    assert token_lifetime_seconds(60) == MIN_TOKEN_LIFETIME_SECONDS == 600
    assert token_lifetime_seconds(3600) == 3600


# A virtual node's status ------------------------------------------------------------------------------


def _status(*, ready: bool = True, cpu: str = "4", heartbeat: str = "2026-01-01T08:00:00Z") -> dict[str, object]:
    node = virtual_node(provider_id="p", resources={"cpu": cpu}, ready=ready, reason="KubeletReady" if ready else "X",
                        message="m", heartbeat=heartbeat, transition="2026-01-01T07:00:00Z")  # fmt: skip
    status: dict[str, object] = node["status"]
    return status


@pytest.mark.parametrize(
    ("previous", "current", "since", "due"),
    [
        pytest.param(None, _status(), 0, True, id="the first pass reports"),
        pytest.param(_status(), _status(heartbeat="2026-01-01T08:00:10Z"), 10, False,
                     id="a heartbeat alone writes nothing"),
        pytest.param(_status(), _status(ready=False), 10, True, id="a Ready change is written at once"),
        pytest.param(_status(), _status(cpu="2"), 10, True, id="a capacity change is written at once"),
        pytest.param(_status(), _status(heartbeat="2026-01-01T08:05:00Z"), 300, True,
                     id="an unchanged status is written every 5 minutes"),
    ],
)  # fmt: skip
def test_the_node_status_is_written_when_it_changes_and_otherwise_every_five_minutes(
    previous: dict[str, object] | None, current: dict[str, object], since: float, due: bool
) -> None:
    assert node_status_report_due(previous, current, since_last_report=since, report_every=300) is due


# The kubelet stand-in's Secret volumes ----------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_secret_volume_is_swapped_atomically_like_a_kubelets(tmp_path: Path) -> None:
    target = tmp_path / "volume"
    write_volume_atomically(target, {"kubeconfig": _b64("one"), "old": _b64("x")})
    first = (target / "..data").resolve()
    inode = os.stat(target / "kubeconfig").st_ino
    write_volume_atomically(target, {"kubeconfig": _b64("two")})
    assert (target / "kubeconfig").read_text() == "two"
    assert os.stat(target / "kubeconfig").st_ino != inode  # a new file, so a follower's stat sees the change
    assert not (target / "old").exists()  # a key that went disappears
    assert not first.exists()  # the previous version is removed
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith("..")) == ["kubeconfig"]


# The client that follows its kubeconfig file ------------------------------------------------------------


class _Server:
    """An API server stand-in on 127.0.0.1 (https, its own CA) that accepts one bearer token and counts
    what it was sent."""

    def __init__(self, certificate: LocalCertificate) -> None:
        self.ca = certificate.pem
        self.accepted = "token-b"
        self.seen: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                auth = self.headers.get("Authorization", "")
                server.seen.append(auth)
                ok = auth == f"Bearer {server.accepted}"
                body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []} if ok else
                                  {"kind": "Status", "code": 401, "reason": "Unauthorized"}).encode()  # fmt: skip
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = certificate.server_context()
        self.http.socket = context.wrap_socket(self.http.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    s = _Server(local_certificate(tmp_path_factory.mktemp("tls")))
    yield s
    s.http.shutdown()


def _write_kubeconfig(path: Path, server: _Server, token: str, user: Mapping[str, object] | None = None) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "p", "cluster": {"server": server.url,
                                               "certificate-authority-data": base64.b64encode(server.ca).decode()}}],
        "users": [{"name": "u", "user": {"token": token, **(user or {})}}],
        "contexts": [{"name": "c", "context": {"cluster": "p", "user": "u", "namespace": "ns"}}],
    }))  # fmt: skip


def test_the_client_uses_a_renewed_kubeconfig_file_from_the_next_request_on(server: _Server, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    _write_kubeconfig(path, server, "token-a")
    core = k8s.CoreV1Api(PeerKubeconfigFileClient(str(path)))
    with pytest.raises(ApiException) as refused:
        core.list_namespaced_pod("ns")
    assert refused.value.status == 401
    assert server.seen == ["Bearer token-a"]  # unchanged file: the refusal stands, no blind retry
    _write_kubeconfig(tmp_path / "next", server, "token-b")
    os.replace(tmp_path / "next", path)  # renewed as a kubelet does: a new file in place
    assert core.list_namespaced_pod("ns").items == []
    assert server.seen[1:] == ["Bearer token-b"]  # the stat saw the change: no refused request first


def test_a_401_makes_the_client_read_its_file_again_and_retry_once_unseen_by_the_caller(
    server: _Server, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    _write_kubeconfig(path, server, "token-a")
    client = PeerKubeconfigFileClient(str(path))
    # Rewritten in place with the same size and modification time: no stat can tell (a coarse clock, a
    # file updated within the same tick), only the server's 401 does.
    stat = os.stat(path)
    _write_kubeconfig(path, server, "token-b")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_ino == stat.st_ino and os.stat(path).st_size == stat.st_size
    # Without preloading the client returns urllib3's response, not the V1PodList it is typed to return.
    response: object = k8s.CoreV1Api(client).list_namespaced_pod("ns", _preload_content=False)
    assert isinstance(response, urllib3.BaseHTTPResponse) and response.status == 200
    assert server.seen == ["Bearer token-a", "Bearer token-b"]
    # And with the model deserialisation path, on the next request: the new token straight away.
    assert k8s.CoreV1Api(client).list_namespaced_pod("ns").items == []
    assert server.seen[2:] == ["Bearer token-b"]


def test_a_refused_kubeconfig_file_loads_nothing_and_the_client_keeps_the_credentials_it_had(
    server: _Server, tmp_path: Path
) -> None:
    path, marker = tmp_path / "kubeconfig", tmp_path / "ran"
    _write_kubeconfig(path, server, "token-b")
    client = PeerKubeconfigFileClient(str(path))
    assert k8s.CoreV1Api(client).list_namespaced_pod("ns").items == []
    exec_plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
                            "args": ["-c", f"touch {marker}; echo '{{}}'"]}}  # fmt: skip
    _write_kubeconfig(tmp_path / "next", server, "token-evil", user=exec_plugin)
    os.replace(tmp_path / "next", path)
    assert k8s.CoreV1Api(client).list_namespaced_pod("ns").items == []
    assert server.seen == ["Bearer token-b", "Bearer token-b"]  # the refused file's token never sent
    assert client.refusal is not None and client.refusal.field == "users[0].user.exec"
    assert not marker.exists()


def test_a_client_whose_first_kubeconfig_is_refused_sends_nothing_until_a_good_one_comes(
    server: _Server, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    _write_kubeconfig(path, server, "token-b", user={"tokenFile": str(tmp_path / "secret-token")})
    client = PeerKubeconfigFileClient(str(path))
    with pytest.raises(ApplicationError) as refused:
        k8s.CoreV1Api(client).list_namespaced_pod("ns")
    assert (refused.value.type, refused.value.non_retryable) == ("InvalidCredentials", True)
    assert "users[0].user.tokenFile" in refused.value.message
    assert server.seen == []
    _write_kubeconfig(tmp_path / "next", server, "token-b")
    os.replace(tmp_path / "next", path)
    assert k8s.CoreV1Api(client).list_namespaced_pod("ns").items == []
    assert (server.seen, client.refusal) == (["Bearer token-b"], None)
