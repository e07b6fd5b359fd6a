"""The local environment's stand-in for a kubelet, for tidepool's own Deployments only: the local
clusters have no kubelet to run the virtual kubelet's pod, so this runs each Deployment's container
command as a local process (its Secret volumes written to a private directory, its kubeconfig for the
cluster given by TIDEPOOL_VK_CONSUMER_KUBECONFIG), restarts it when it fails, and stops it when the
Deployment goes. Like a kubelet, it keeps Secret volumes current while the process runs (a renewed
credential reaches the program without a restart), with the kubelet's atomic symlink swap, so that a
reader never sees half a file. Production runs the same program as the Deployment's container.

`python -m deploy.localenv.deployments --kubeconfig PATH` (the demo starts one per cluster)."""

from __future__ import annotations

import argparse
import base64
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from deploy.localenv.temporal import free_port
from kube.clients import client_from_own_kubeconfig_file
from kube.informer import Informer
from kube.process import wait_for_termination
from models.names import LABEL_MANAGED_BY, MANAGED_BY, SYSTEM_NAMESPACE

log = logging.getLogger("tidepool.localenv.kubelet")
RESTART_BACKOFF_SECONDS = 2.0


@dataclass
class Running:
    generation: int
    process: subprocess.Popen[bytes] | None
    workdir: Path
    finished_ok: bool = False
    failures: int = 0
    next_start: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)
    metrics_port: int | None = None
    # Secret name -> (volume directory, the data written there), for the volumes it mounts.
    secret_volumes: dict[str, tuple[Path, Mapping[str, str | bytes]]] = field(default_factory=dict)


class DeploymentRunner:
    def __init__(self, kubeconfig: Path, *, namespace: str = SYSTEM_NAMESPACE, log_dir: Path | None = None) -> None:
        self._kubeconfig = kubeconfig
        self._api = client_from_own_kubeconfig_file(str(kubeconfig))
        self._namespace = namespace
        self._log_dir = log_dir
        self._running: dict[str, Running] = {}
        self._wanted: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._informer = Informer(
            "local-kubelet", k8s.AppsV1Api(self._api).list_namespaced_deployment, namespace=namespace,
            label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}", on_sync=self._sync, on_event=self._event,
        )  # fmt: skip
        # Every Secret of the namespace, not only the mounted ones: which are mounted changes as Deployments
        # come and go, and a local cluster has few. A deleted Secret leaves its files as they were (a kubelet
        # keeps a volume's last content).
        self._secrets = Informer(
            "local-kubelet-secrets", k8s.CoreV1Api(self._api).list_namespaced_secret, namespace=namespace,
            on_sync=self._secrets_listed, on_event=self._secret_changed,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)

    def __enter__(self) -> DeploymentRunner:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def start(self) -> DeploymentRunner:
        self._informer.start()
        self._secrets.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop()
        self._secrets.stop()
        self._thread.join(timeout=10)
        with self._lock:
            for name in list(self._running):
                self._kill(name)

    def metrics_port(self, name: str) -> int | None:
        """Where the running process of Deployment `name` serves its metrics, if it does."""
        with self._lock:
            running = self._running.get(name)
            return running.metrics_port if running and running.process and running.process.poll() is None else None

    def pid(self, name: str) -> int | None:
        with self._lock:
            running = self._running.get(name)
            return running.process.pid if running and running.process and running.process.poll() is None else None

    def _sync(self, deployments: list[dict[str, Any]]) -> None:
        with self._lock:
            self._wanted = {d["metadata"]["name"]: d for d in deployments if not d["metadata"].get("deletionTimestamp")}

    def _event(self, kind: str, deployment: dict[str, Any]) -> None:
        with self._lock:
            name = deployment["metadata"]["name"]
            if kind == "DELETED" or deployment["metadata"].get("deletionTimestamp"):
                self._wanted.pop(name, None)
            else:
                self._wanted[name] = deployment

    def _secrets_listed(self, secrets: list[dict[str, Any]]) -> None:
        for secret in secrets:
            self._secret_changed("MODIFIED", secret)

    def _secret_changed(self, kind: str, secret: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        name, data = secret["metadata"]["name"], secret.get("data") or {}
        with self._lock:
            for running in self._running.values():
                volume = running.secret_volumes.get(name)
                if volume is not None and volume[1] != data:
                    write_volume_atomically(volume[0], data)
                    running.secret_volumes[name] = (volume[0], data)
                    log.info("updated Secret volume %s in %s", name, volume[0])

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for name in list(self._running):
                    if name not in self._wanted:
                        self._kill(name)
                for name, deployment in self._wanted.items():
                    self._keep_running(name, deployment)

    def _keep_running(self, name: str, deployment: dict[str, Any]) -> None:
        generation = int(deployment["metadata"].get("generation", 0))
        running = self._running.get(name)
        if running is not None and running.generation != generation:
            self._kill(name)  # a changed spec: like a rollout, start afresh
            running = None
        if running is None:
            running = self._running[name] = Running(generation=generation, process=None,
                                                    workdir=Path(tempfile.mkdtemp(prefix=f"{name}-")))  # fmt: skip
        if running.process is not None:
            code = running.process.poll()
            if code is None:
                return
            log.info("%s exited with %s", name, code)
            running.process = None
            if code == 0:
                running.finished_ok = True  # done (e.g. a virtual kubelet that finished its teardown)
            else:
                running.failures += 1
                running.next_start = time.monotonic() + min(60.0, RESTART_BACKOFF_SECONDS * 2 ** (running.failures - 1))
        if running.finished_ok or time.monotonic() < running.next_start:
            return
        try:
            running.process, running.metrics_port = self._start(name, deployment, running)
        except Exception as e:  # noqa: BLE001 - e.g. its Secret is not there yet: try again later
            log.warning("cannot start %s yet: %s", name, e)
            running.failures += 1
            running.next_start = time.monotonic() + RESTART_BACKOFF_SECONDS

    def _start(self, name: str, deployment: dict[str, Any], running: Running) -> tuple[subprocess.Popen[bytes], int | None]:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        mounts = {}
        core = k8s.CoreV1Api(self._api)
        for volume in pod.get("volumes") or []:
            secret = (volume.get("secret") or {}).get("secretName")
            if not secret:
                continue
            target = running.workdir / volume["name"]
            data = core.read_namespaced_secret(secret, self._namespace).data or {}
            write_volume_atomically(target, data)
            running.secret_volumes[secret] = (target, data)
            for mount in container.get("volumeMounts") or []:
                if mount["name"] == volume["name"]:
                    mounts[mount["mountPath"]] = str(target)
        env = dict(os.environ)
        for item in container.get("env") or []:
            value = str(item.get("value", ""))
            for mount_path, local in mounts.items():
                if value.startswith(mount_path):
                    value = local + value[len(mount_path):]
            env[item["name"]] = value
        env["TIDEPOOL_VK_CONSUMER_KUBECONFIG"] = str(self._kubeconfig)
        # Processes share one host: each gets a free port instead of the Deployment's.
        metrics_port = free_port() if int(env.get("TIDEPOOL_VK_METRICS_PORT") or 0) else None
        env["TIDEPOOL_VK_METRICS_PORT"] = str(metrics_port or 0)
        # The pod IP the downward API would give: this host, where the API servers dial its kubelet API.
        env["TIDEPOOL_VK_NODE_IP"] = "127.0.0.1"
        env["TIDEPOOL_VK_KUBELET_PORT"] = str(free_port())
        command = list(container.get("command") or []) + list(container.get("args") or [])
        if command and command[0] in ("python", "python3"):
            command[0] = sys.executable
        out = subprocess.DEVNULL if self._log_dir is None else open(self._log_dir / f"{name}.log", "ab")  # noqa: SIM115
        log.info("starting %s: %s", name, " ".join(command))
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
        return process, metrics_port

    def _kill(self, name: str) -> None:
        running = self._running.pop(name)
        process = running.process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(running.workdir, ignore_errors=True)


def write_volume_atomically(target: Path, data: Mapping[str, str | bytes]) -> None:
    """The kubelet's AtomicWriter layout: the files live in a fresh timestamped directory, `..data` is a
    symlink to it, swapped by a rename, and each key is a symlink through `..data`. A reader opening
    `target/<key>` sees the old content or the new one, never a mix; a key that went disappears."""
    target.mkdir(parents=True, exist_ok=True)
    version = Path(tempfile.mkdtemp(prefix=f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.", dir=target))
    for key, value in data.items():
        (version / key).write_bytes(base64.b64decode(value))
    data_link, new_link = target / "..data", target / "..data_tmp"
    previous = data_link.resolve() if data_link.is_symlink() else None
    new_link.unlink(missing_ok=True)
    new_link.symlink_to(version.name)
    os.replace(new_link, data_link)
    for key in data:
        if not (target / key).is_symlink():
            (target / key).symlink_to(f"..data/{key}")
    for entry in target.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in data:
            entry.unlink()
    if previous is not None and previous != version.resolve():
        shutil.rmtree(previous, ignore_errors=True)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m deploy.localenv.deployments", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path)
    args = parser.parse_args()
    runner = DeploymentRunner(args.kubeconfig, log_dir=args.log_dir).start()
    wait_for_termination()
    runner.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
