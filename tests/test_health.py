"""The health probes a worker serves for its kubelet (workers/health.py): /readyz says 503 until the process
says it serves, /healthz answers all along, and a stopped process answers nothing."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from deploy.localenv.temporal import free_port
from workers.health import HealthProbes


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_ready_only_once_serving_and_not_once_stopped() -> None:
    probes = HealthProbes(free_port(), host="127.0.0.1").start()
    port = probes.port
    assert port is not None
    try:
        assert (_status(port, "/healthz"), _status(port, "/readyz")) == (200, 503)
        probes.ready()
        assert (_status(port, "/healthz"), _status(port, "/readyz")) == (200, 200)
        assert _status(port, "/metrics") == 404
    finally:
        probes.stop()
    with pytest.raises(urllib.error.URLError):
        _status(port, "/healthz")


def test_port_0_serves_no_probe() -> None:
    probes = HealthProbes(0).start()
    assert probes.port is None
    probes.ready()
    probes.stop()
