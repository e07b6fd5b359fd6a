"""Podman for the tests, configured by tidepool's own files: a private containers.conf and storage.conf
(written from the templates beside this module into $TIDEPOOL_CACHE/podman, pointed to by CONTAINERS_CONF
and CONTAINERS_STORAGE_CONF), the `podman` CLI run with them, and Podman's Docker-compatible API served on
a private socket for testcontainers. No global configuration file is read or written.

Used by deploy/containers/images.py (builds) and tests/conftest.py (the API service and testcontainers'
environment)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent

# testcontainers' documented variables, besides DOCKER_HOST (the service's socket); it reads them when
# imported, so they are set before any test module is. These machines carry Docker's marker file at the
# root: testcontainers would believe it runs inside a container and look for a gateway, so it connects as
# on a host. Its reaper (moby-ryuk) can be neither pulled nor built here (the Go module proxy does not
# serve it): it is off. The fixtures remove what they start; every container carries its owner's pid
# (OWNER_LABEL), the session removes its own at the end and, at the start, those of owners that died.
TESTCONTAINERS_SETTINGS = {
    "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
    "TC_HOST": "127.0.0.1",
    "TESTCONTAINERS_RYUK_DISABLED": "true",
}


def cache_dir() -> Path:
    """Images and Podman's settings, kept across runs (beside the control-plane binaries)."""
    base = os.environ.get("TIDEPOOL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidepool"
    return Path(base) / "podman"


def run_dir() -> Path:
    """Podman's run-time state (locks, the running containers' state), in /tmp: not worth keeping after a
    reboot. A fixed path per storage, not $TMPDIR: the storage's database remembers it and refuses to
    open with another, and no two storages may share one."""
    storage = hashlib.sha256(str(cache_dir()).encode()).hexdigest()[:8]
    return Path("/tmp") / f"tidepool-podman-{os.getuid()}-{storage}"


def podman_environment() -> dict[str, str]:
    """Writes the private configuration (when it changed) and returns the variables that point Podman at it."""
    if shutil.which("podman") is None:
        raise FileNotFoundError("podman is missing: `make system-packages` installs it (deploy/system/packages.txt)")
    values = {"cache_dir": str(cache_dir()), "run_dir": str(run_dir())}
    env = {}
    for name, variable in (("containers.conf", "CONTAINERS_CONF"), ("storage.conf", "CONTAINERS_STORAGE_CONF")):
        text = Template((HERE / name).read_text()).substitute(values)
        target = cache_dir() / name
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{name}.{os.getpid()}")
            partial.write_text(text)
            partial.replace(target)  # atomically: concurrent runs may read it meanwhile
        env[variable] = str(target)
    return env


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs the `podman` CLI with the private configuration; a failure raises with Podman's own message."""
    env = {**os.environ, **podman_environment()}
    result = subprocess.run(["podman", *args], env=env, text=True, capture_output=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()[-3000:]}")
    return result


@dataclass
class PodmanService:
    """`podman system service` on a private socket: the Docker API that testcontainers drives."""

    socket: Path
    process: subprocess.Popen[bytes]

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.socket.unlink(missing_ok=True)


def start_service(socket: Path, *, log_file: Path) -> PodmanService:
    """Starts the API service (never idling out: `--time=0`) and waits until it answers."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"],
                                   env={**os.environ, **podman_environment()}, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    service = PodmanService(socket=socket, process=process)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"podman system service exited with {process.returncode}; see {log_file}")
        if _answers(socket):
            return service
        time.sleep(0.1)
    service.stop()
    raise TimeoutError(f"podman system service did not answer on {socket} within 30 s; see {log_file}")


def _answers(socket: Path) -> bool:
    import http.client
    import socket as sockets

    class _Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
            self.sock.connect(str(socket))

    try:
        connection = _Unix("localhost", timeout=2)
        connection.request("GET", "/_ping")
        return connection.getresponse().status == 200
    except OSError:
        return False


OWNER_LABEL = "io.tidepool.owner-pid"


def owner_labels() -> dict[str, str]:
    """The label that ties a container to the process that started it."""
    return {OWNER_LABEL: str(os.getpid())}


def remove_containers(*, owner: int | None = None) -> list[str]:
    """Removes (forcibly, with their anonymous volumes) the containers started by process `owner`, or, with
    no owner, those whose owner is no longer running (a run that was killed); returns their names. The
    safety net behind the fixtures' own clean-up, since the reaper is off."""
    listed = podman("ps", "-a", "--filter", f"label={OWNER_LABEL}",
                    "--format", f'{{{{.Names}}}} {{{{index .Labels "{OWNER_LABEL}"}}}}').stdout  # fmt: skip
    names = [name for name, pid in (line.split() for line in listed.splitlines() if line.strip())
             if (int(pid) == owner if owner is not None else not _alive(int(pid)))]  # fmt: skip
    if names:
        podman("rm", "-f", "-v", *names)
    return names


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> int:
    """`python -m deploy.containers.podman leftovers`: lists the tests' containers still there (any is a
    defect: CI runs it after the tests) and fails when there is one."""
    if sys.argv[1:] != ["leftovers"]:
        print("usage: python -m deploy.containers.podman leftovers", file=sys.stderr)
        return 2
    listed = podman("ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format", "{{.Names}} {{.Image}} {{.Status}}")
    print(listed.stdout, end="")
    return 1 if listed.stdout.strip() else 0


if __name__ == "__main__":
    sys.exit(main())
