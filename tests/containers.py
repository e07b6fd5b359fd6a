"""Throwaway containers for the tests, through testcontainers on Podman: the Temporal dev server (the
shared environment's, and the fault tests' own) and tidepool's own image running the worker.

Podman's API service and testcontainers' variables come from tests/conftest.py (`podman_service`);
images from deploy/containers/images.py; the dev server's arguments from deploy/localenv/temporal.py, the
same as for the binary run directly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testcontainers.core.container import DockerContainer

from deploy.containers.images import temporal_image, tidepool_image
from deploy.containers.podman import owner_labels
from deploy.localenv.temporal import TemporalEndpoint, free_port, start_dev_args, wait_ready

FRONTEND_PORT, UI_PORT = 7233, 8233
DATA_DIR = "/data"  # where a persistent server's database file lives, a volume from the host


@dataclass
class TemporalContainer:
    container: DockerContainer
    endpoint: TemporalEndpoint
    startup_seconds: float

    @property
    def name(self) -> str:
        return str(self.container.get_wrapped_container().name)

    def wait_ready(self) -> None:
        wait_ready(self.endpoint, self._exit_code, f"`podman logs {self.name}`")

    def _exit_code(self) -> int | None:
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return int(wrapped.attrs["State"]["ExitCode"]) if wrapped.status in ("exited", "dead") else None

    def restart(self) -> None:
        """Stops the server (SIGTERM, as a node drain would) and starts it again on the same ports."""
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        before = wrapped.attrs["State"]["StartedAt"]
        wrapped.stop(timeout=20)
        wrapped.start()
        wrapped.reload()
        assert wrapped.attrs["State"]["StartedAt"] != before, "the server's container was not restarted"
        self.wait_ready()

    def pause(self) -> None:
        """Freezes every process of the server: connections stay open and nothing answers."""
        self.container.get_wrapped_container().pause()

    def unpause(self) -> None:
        self.container.get_wrapped_container().unpause()


@contextmanager
def temporal_container(
    *, namespaces: list[str], dynamic_config: dict[str, str] | None = None, data_dir: Path | None = None
) -> Iterator[TemporalContainer]:
    """The dev server in a container, its frontend and Web UI published on free ports of 127.0.0.1 (fixed
    for the container's life, so that a restart keeps its address). With `data_dir`, its state lives in a
    database file there, and survives a restart; otherwise in memory. Removed on exit."""
    port, ui_port = free_port(), free_port()
    args = start_dev_args(ip="0.0.0.0", port=FRONTEND_PORT, ui_port=UI_PORT, namespaces=namespaces,
                          dynamic_config=dynamic_config,
                          db_file=None if data_dir is None else f"{DATA_DIR}/temporal.db")  # fmt: skip
    container = DockerContainer(temporal_image()).with_command(args).with_kwargs(labels=owner_labels())
    # Published on loopback only: docker-py takes (host ip, host port), which with_bind_ports cannot express.
    container.ports.update({str(FRONTEND_PORT): ("127.0.0.1", port), str(UI_PORT): ("127.0.0.1", ui_port)})  # type: ignore[dict-item]
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        container.with_volume_mapping(data_dir, DATA_DIR, "rw")
    started = time.monotonic()
    container.start()
    try:
        endpoint = TemporalEndpoint(address=f"127.0.0.1:{port}", ui_url=f"http://127.0.0.1:{ui_port}", pid=0)
        server = TemporalContainer(container=container, endpoint=endpoint, startup_seconds=0.0)
        server.wait_ready()
        server.startup_seconds = round(time.monotonic() - started, 2)
        yield server
    finally:
        container.stop()


@contextmanager
def worker_container(*, command: list[str], environment: dict[str, str], mounts: list[Path]) -> Iterator[DockerContainer]:
    """tidepool's own image running `command` on the host's network (the local clusters and Temporal
    listen on 127.0.0.1), with `mounts` bound read-only at the same paths. Removed on exit."""
    container = DockerContainer(tidepool_image()).with_command(command)
    container.with_kwargs(network_mode="host", labels=owner_labels())
    for key, value in environment.items():
        container.with_env(key, value)
    for path in mounts:
        container.with_volume_mapping(path, str(path), "ro")
    container.start()
    try:
        yield container
    finally:
        container.stop()
