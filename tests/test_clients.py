"""The foreign clients' kept-alive connections: closed once their client idles, never under a request, and
the client works on after."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s

from kube import clients
from kube.clients import close_idle_connections
from tests.http import JsonAnswers, serving

pytestmark = [pytest.mark.steady]


class _Handler(JsonAnswers):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    opened: set[int] = set()  # client ports whose connection the server still holds

    def setup(self) -> None:
        super().setup()
        _Handler.opened.add(self.client_address[1])

    def finish(self) -> None:
        _Handler.opened.discard(self.client_address[1])
        super().finish()

    def answer(self, path: str) -> bytes:
        return b'{"kind": "NamespaceList", "items": [], "metadata": {}}'


@pytest.fixture
def server() -> Iterator[str]:
    with serving(_Handler) as url:
        yield url


def _eventually(check: Callable[[], bool], timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_idle_connections_are_closed_and_the_client_opens_a_new_one_when_asked_again(server: str) -> None:
    api = k8s.ApiClient(k8s.Configuration(host=server))
    core = k8s.CoreV1Api(api)
    core.list_namespace()
    assert _eventually(lambda: len(_Handler.opened) == 1)  # kept alive after the answer
    close_idle_connections(api)
    assert _eventually(lambda: not _Handler.opened)  # the server saw it closed
    core.list_namespace()  # the pool stays open: a new connection
    assert _eventually(lambda: len(_Handler.opened) == 1)
    close_idle_connections(api)
    assert _eventually(lambda: not _Handler.opened)


def test_a_client_nobody_asked_for_since_the_idle_time_loses_its_connections_at_the_next_sweep(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = k8s.ApiClient(k8s.Configuration(host=server))
    secrets = clients.PeerSecretClients(k8s.ApiClient())
    secrets._cache = {("ns", "a"): ("1", api), ("ns", "b"): ("1", k8s.ApiClient(k8s.Configuration(host=server)))}
    monkeypatch.setattr(secrets, "_get", lambda *, name, namespace, key: secrets._cache[(namespace, name)][1])
    now = [1000.0]
    monkeypatch.setattr(clients, "monotonic", lambda: now[0])
    k8s.CoreV1Api(secrets.get(name="a", namespace="ns")).list_namespace()
    assert _eventually(lambda: len(_Handler.opened) == 1)
    now[0] += clients.IDLE_CONNECTION_SECONDS / 2
    secrets.get(name="b", namespace="ns")  # another client asked for: a is not idle long enough yet
    time.sleep(0.3)  # long enough for the server to see a close
    assert len(_Handler.opened) == 1
    now[0] += clients.IDLE_CONNECTION_SECONDS
    secrets.get(name="b", namespace="ns")
    assert _eventually(lambda: not _Handler.opened)
