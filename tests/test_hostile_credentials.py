"""Credentials are data, not code (issue 34): each side rewrites the kubeconfig the other reads, with the
credentials tidepool really gave it, and nothing in it runs, is read from the reader's disk, or is sent
anywhere but to a verified https server.

One real peering for the module (two clusters of its own, both workers, the consumer's virtual kubelet run
by the kubelet stand-in): the provider, with its identity on the consumer (the kubeconfig `tidepool peer`
minted for it, which the provider keeps in `tidepool-peer-<consumer>`), rewrites the kubeconfig it gave
the consumer's virtual kubelet (`tidepool-kubeconfig-<provider>`); the virtual kubelet loads none of it,
keeps the credentials it had, and says which field it refused in a Warning Event on its node. The
consumer's kubeconfig, handed to the provider in a PeeringRequest's Secret, is refused the same way by the
provider's worker. Where cheap, the same kubeconfig given to the Kubernetes client's full loader shows
the attack working, so that a passing test means the defence held."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import create_cluster, delete_cluster
from deploy.localenv.deployments import DeploymentRunner
from deploy.localenv.env import EnvState, temporal_namespace
from kube.clients import client_from_peer_kubeconfig_text
from kube.objects import read_cluster_object
from models.names import (
    PEERING_REQUESTS,
    SYSTEM_NAMESPACE,
    credentials_secret_name,
    virtual_kubelet_name,
    virtual_node_name,
)
from tests.faults import Pair, WorkerProcess, convergence_problems, prepare_pair
from tests.running import eventually
from tests.tls import local_certificate
from workers.network import NetworkModule
from workers.peer import request_peering, request_secret_name, write_peering_request

pytestmark = [pytest.mark.hostile, pytest.mark.env]

EXEC_CREDENTIAL = '{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": "x"}}'
STOLEN = "the-consumers-own-serviceaccount-token"


@dataclass
class Peered:
    pair: Pair
    provider: k8s.ApiClient  # admin
    consumer: k8s.ApiClient  # admin
    attacker: k8s.ApiClient  # the provider's identity on the consumer: what it really holds
    original: str  # the kubeconfig the provider wrote for the virtual kubelet
    directory: Path
    runner: DeploymentRunner  # the consumer's kubelet stand-in, which runs the virtual kubelet


@pytest.fixture(scope="module")
async def peered(localenv: EnvState, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peered]:
    directory = tmp_path_factory.mktemp("hostile-credentials")
    unique = os.urandom(4).hex()
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    names = [f"prov-{unique}", f"cons-{unique}"]
    workers: list[WorkerProcess] = []
    network: NetworkModule | None = None
    try:
        provider_cluster, consumer_cluster = (create_cluster(n, binaries=binaries, workdir=workdir) for n in names)
        pair = Pair(provider_cluster, consumer_cluster, *names)
        provider, consumer = pair.provider.api_client(), pair.consumer.api_client()
        prepare_pair(provider, consumer)
        workers = [
            WorkerProcess(cluster=pair.provider, cluster_id=pair.provider_id, temporal_address=localenv.temporal_address,
                          namespace=temporal_namespace("a"), pod_cidr="10.1.0.0/16", log=directory / "provider.log"),
            WorkerProcess(cluster=pair.consumer, cluster_id=pair.consumer_id, temporal_address=localenv.temporal_address,
                          namespace=temporal_namespace("b"), pod_cidr="10.2.0.0/16", log=directory / "consumer.log"),
        ]  # fmt: skip
        network = NetworkModule(consumer, local_pod_cidr="10.2.0.0/16").start()
        for worker in workers:
            worker.start()
        with DeploymentRunner(pair.consumer.kubeconfig, log_dir=directory) as runner:
            request_peering(provider, consumer, provider_id=pair.provider_id, consumer_id=pair.consumer_id)
            await eventually(lambda: not convergence_problems(pair, peered=True), timeout=120, what="peered")
            await eventually(lambda: _node_ready(consumer, pair.provider_id) == "KubeletReady", timeout=60,
                             what="the virtual node Ready")  # fmt: skip
            yield Peered(pair=pair, provider=provider, consumer=consumer,
                         attacker=client_from_peer_kubeconfig_text(_secret_text(provider, request_secret_name(pair.consumer_id))),
                         original=_secret_text(consumer, credentials_secret_name(pair.provider_id)), directory=directory,
                         runner=runner)  # fmt: skip
    finally:
        for worker in workers:
            worker.stop()
        if network is not None:
            network.stop()
        for name in names:
            delete_cluster(name, binaries=binaries, workdir=workdir)


def _secret_text(api: k8s.ApiClient, name: str) -> str:
    secret = k8s.CoreV1Api(api).read_namespaced_secret(name, SYSTEM_NAMESPACE)
    return base64.b64decode((secret.data or {})["kubeconfig"]).decode()


def _node_ready(consumer: k8s.ApiClient, provider_id: str) -> str | None:
    node = k8s.CoreV1Api(consumer).read_node(virtual_node_name(provider_id))
    ready = next((c for c in (node.status.conditions or []) if c.type == "Ready"), None)
    return None if ready is None else f"{ready.reason}" if ready.status == "True" else f"not ready: {ready.reason}"


def _refusals(api: k8s.ApiClient, name: str) -> dict[str, str]:
    """The InvalidCredentials Events about object `name` (a node or a PeeringRequest): message by Event name."""
    events = k8s.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return {str(e.metadata.name): e.message or "" for e in events if e.reason == "InvalidCredentials"}


def _rewritten(text: str, *, cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None) -> str:
    document = yaml.safe_load(text)
    document["clusters"][0]["cluster"].update(cluster or {})
    if user is not None:
        document["users"][0]["user"] = user
    return str(yaml.safe_dump(document))


def _exec_user(marker: Path) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
                     "args": ["-c", f"touch {marker}; echo '{EXEC_CREDENTIAL}'"]}}  # fmt: skip


class _Listener:
    """A server on 127.0.0.1 that records the Authorization header of every request it is sent."""

    def __init__(self, directory: Path, *, tls: bool) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                seen.append(self.headers.get("Authorization", ""))
                body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.certificate = local_certificate(directory) if tls else None
        if self.certificate is not None:
            self.http.socket = self.certificate.server_context().wrap_socket(self.http.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def carried(self, token: str) -> bool:
        return any(token in auth for auth in self.seen)


@pytest.fixture
def listener(peered: Peered, request: pytest.FixtureRequest) -> Iterator[Callable[[bool], _Listener]]:
    made: list[_Listener] = []

    def make(tls: bool) -> _Listener:
        directory = peered.directory / f"{request.node.name}-{len(made)}"
        directory.mkdir()
        made.append(_Listener(directory, tls=tls))
        return made[-1]

    yield make
    for server in made:
        server.http.shutdown()


def _full_loader_request(text: str) -> None:
    """What the consumer did before: the Kubernetes client's own loader, and one request."""
    with contextlib.suppress(Exception):
        api = k8s_config.new_client_from_config_dict(yaml.safe_load(text))
        k8s.CoreV1Api(api).list_namespaced_pod("default", _request_timeout=5)


def _write(peered: Peered, api: k8s.ApiClient, kubeconfig: str) -> None:
    data = {"data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}}
    k8s.CoreV1Api(api).patch_namespaced_secret(credentials_secret_name(peered.pair.provider_id), SYSTEM_NAMESPACE, data)


async def _attack(peered: Peered, kubeconfig: str, field: str) -> str:
    """The provider rewrites the virtual kubelet's kubeconfig with its own identity on the consumer; the
    virtual kubelet's Warning Event naming `field` is returned, after which the original is put back."""
    node = virtual_node_name(peered.pair.provider_id)
    before = set(_refusals(peered.consumer, node))
    _write(peered, peered.attacker, kubeconfig)  # its RBAC allows this: the Secret is its own
    try:
        said = await eventually(lambda: [m for e, m in _refusals(peered.consumer, node).items()
                                         if e not in before and field in m],
                                timeout=30, what=f"an InvalidCredentials Event naming {field}")  # fmt: skip
        # The credentials it had are kept: the node stays Ready, its pods keep running.
        assert _node_ready(peered.consumer, peered.pair.provider_id) == "KubeletReady"
        return str(said[0])
    finally:
        _write(peered, peered.consumer, peered.original)


async def test_an_exec_plugin_the_provider_writes_is_never_run_by_the_consumers_virtual_kubelet(
    peered: Peered, tmp_path: Path
) -> None:
    marker = tmp_path / "ran-on-the-consumer"
    said = await _attack(peered, _rewritten(peered.original, user=_exec_user(marker)), "users[0].user.exec")
    assert "runs a program" in said and "previous credentials are kept" in said
    await eventually(lambda: _node_ready(peered.consumer, peered.pair.provider_id) == "KubeletReady", timeout=60)
    assert not marker.exists(), "the provider's exec plugin ran on the consumer"
    control = tmp_path / "ran-with-the-full-loader"
    _full_loader_request(_rewritten(peered.original, user=_exec_user(control)))
    assert control.exists(), "the attack would not have worked anyway: the test proves nothing"


async def test_a_token_file_on_the_consumers_disk_is_never_read_nor_sent_where_the_provider_says(
    peered: Peered, tmp_path: Path, listener: Callable[[bool], _Listener]
) -> None:
    token_file = tmp_path / "serviceaccount-token"
    token_file.write_text(STOLEN)
    catcher = listener(True)
    assert catcher.certificate is not None
    evil = _rewritten(peered.original, user={"tokenFile": str(token_file)}, cluster={
        "server": catcher.url, "certificate-authority-data": base64.b64encode(catcher.certificate.pem).decode()})  # fmt: skip
    await _attack(peered, evil, "users[0].user.tokenFile")
    assert catcher.seen == [], "the virtual kubelet sent requests where the provider pointed it"
    _full_loader_request(evil)
    assert catcher.carried(STOLEN), "the full loader would not have sent it anyway: the test proves nothing"


async def test_a_plain_http_server_is_refused_and_no_token_goes_to_it(
    peered: Peered, listener: Callable[[bool], _Listener]
) -> None:
    catcher = listener(False)
    token = yaml.safe_load(peered.original)["users"][0]["user"]["token"]
    said = await _attack(peered, _rewritten(peered.original, cluster={"server": catcher.url}), "clusters[0].cluster.server")
    assert "https" in said
    assert not catcher.carried(token) and catcher.seen == []


async def test_a_kubeconfig_that_skips_tls_verification_is_refused(
    peered: Peered, listener: Callable[[bool], _Listener]
) -> None:
    catcher = listener(True)  # a certificate no CA in the kubeconfig vouches for
    evil = _rewritten(peered.original, cluster={"server": catcher.url, "insecure-skip-tls-verify": True})
    await _attack(peered, evil, "clusters[0].cluster.insecure-skip-tls-verify")
    assert catcher.seen == []


async def test_a_virtual_kubelet_that_starts_on_a_refused_kubeconfig_runs_nothing_and_its_node_says_why(
    peered: Peered, tmp_path: Path
) -> None:
    """No earlier credentials to keep: the node is NotReady, InvalidCredentials, naming the field, until the
    provider writes a kubeconfig it accepts."""
    marker = tmp_path / "ran-at-start"
    evil = _rewritten(peered.original, user=_exec_user(marker))
    _write(peered, peered.attacker, evil)
    vk = virtual_kubelet_name(peered.pair.provider_id)
    volume = peered.runner._running[vk].secret_volumes[credentials_secret_name(peered.pair.provider_id)][0]
    try:
        pid = await eventually(lambda: peered.runner.pid(vk), what="the virtual kubelet's pid")
        await eventually(lambda: (volume / "kubeconfig").read_text() == evil, what="the Secret volume rewritten")
        os.kill(pid, signal.SIGKILL)  # restarted by the stand-in, on the kubeconfig in its volume now
        await eventually(lambda: _node_ready(peered.consumer, peered.pair.provider_id) == "not ready: InvalidCredentials",
                         timeout=60, what="the node NotReady, InvalidCredentials")  # fmt: skip
        node = k8s.CoreV1Api(peered.consumer).read_node(virtual_node_name(peered.pair.provider_id))
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert "users[0].user.exec" in str(ready.message) and "nothing was loaded" in str(ready.message)
        assert not marker.exists(), "the provider's exec plugin ran when the virtual kubelet started"
    finally:
        _write(peered, peered.consumer, peered.original)
    await eventually(lambda: _node_ready(peered.consumer, peered.pair.provider_id) == "KubeletReady", timeout=60,
                     what="the node Ready again on the accepted kubeconfig")  # fmt: skip


async def test_an_exec_plugin_in_the_consumers_kubeconfig_is_never_run_by_the_providers_worker(
    peered: Peered, tmp_path: Path
) -> None:
    """The consumer's side of the same attack: the kubeconfig a consumer hands over for a PeeringRequest
    (its real one, from `tidepool peer`) with an exec plugin. The provider's worker refuses it, the
    PeeringRequest says which field, and nothing runs."""
    marker = tmp_path / "ran-on-the-provider"
    real = _secret_text(peered.provider, request_secret_name(peered.pair.consumer_id))
    evil_id = f"evil-{peered.pair.consumer_id}"
    write_peering_request(peered.provider, consumer_id=evil_id, kubeconfig=_rewritten(real, user=_exec_user(marker)))

    def ready() -> dict[str, Any] | None:
        obj = read_cluster_object(peered.provider, PEERING_REQUESTS, evil_id) or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("reason") == "InvalidCredentials"), None)

    condition = await eventually(ready, timeout=60, what="the PeeringRequest's InvalidCredentials condition")
    assert condition["status"] == "False" and "users[0].user.exec" in condition["message"]
    await eventually(lambda: any("users[0].user.exec" in m for m in _refusals(peered.provider, evil_id).values()),
                     what="the InvalidCredentials Event, recorded after the condition")  # fmt: skip
    assert not marker.exists(), "the consumer's exec plugin ran on the provider"
