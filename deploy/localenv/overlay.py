"""tidepool installed in a local cluster the way a user installs it: a kustomize overlay of deploy/base (what
a user writes beside deploy/overlays/* for their own cluster), applied with `kubectl apply -k`. Its worker
runs from the image built here (deploy/containers/images.py) on a real node (deploy/localenv/realnode.py),
whose pods reach this machine's loopback servers at its address: the environment's Temporal, and the
cluster's own API server through the `kubernetes` Service, as any in-cluster client does."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from deploy.localenv.binaries import Binaries
from models.settings import VirtualKubeletSettings

BASE = Path(__file__).resolve().parents[1] / "base"


def _released_image() -> str:
    """The image name deploy/base sets (its `images` entry), which an overlay's `images` replaces."""
    base = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return str(base["images"][0]["newName"])


def write_overlay(directory: Path, *, image: str, settings: Mapping[str, str], replicas: int = 1,
                  node_selector: Mapping[str, str] | None = None,
                  tolerations: Sequence[Mapping[str, Any]] = ()) -> Path:  # fmt: skip
    """The overlay in `directory`: the worker's settings (TIDEPOOL_<PART>_<FIELD>, merged into deploy/base's
    ConfigMap), the virtual kubelets' image equal to the worker's (a local tag, never pulled: its tag is not
    `latest`), and `replicas` workers (one node here: a second replica would share the first one's fate).
    `node_selector` and `tolerations` place tidepool's pods, the worker's and the virtual kubelets', on the
    nodes a user keeps for their system (a real node among kwok's fakes, here)."""
    name, _, tag = image.rpartition(":")
    if not name or not tag:
        raise ValueError(f"image {image!r}: a local image is referenced as name:tag")
    # Checked as the worker checks its settings, so that a bad one fails here, not as a pod that crash-loops.
    placed = VirtualKubeletSettings.model_validate({"node_selector": dict(node_selector or {}),
                                                    "tolerations": list(tolerations)})  # fmt: skip
    placement = placed.placement()
    literals = {**settings, "TIDEPOOL_VIRTUAL_KUBELET_IMAGE": image}
    if placed.node_selector:
        literals["TIDEPOOL_VIRTUAL_KUBELET_NODE_SELECTOR"] = json.dumps(placement["nodeSelector"])
    if placed.tolerations:
        literals["TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS"] = json.dumps(placement["tolerations"])
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, directory)],
        "configMapGenerator": [{"name": "tidepool-worker", "namespace": "tidepool-system", "behavior": "merge",
                                "literals": [f"{k}={v}" for k, v in sorted(literals.items())]}],
        "images": [{"name": _released_image(), "newName": name, "newTag": tag}],
        "replicas": [{"name": "tidepool-worker", "count": replicas}],
    }  # fmt: skip
    if placement:
        kustomization["patches"] = [{"target": {"kind": "Deployment", "name": "tidepool-worker"}, "patch": yaml.safe_dump({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "tidepool-worker", "namespace": "tidepool-system"},
            "spec": {"template": {"spec": placement}}})}]  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(
        "# Written by deploy/localenv/overlay.py: the local environment's install of deploy/base.\n"
        + yaml.safe_dump(kustomization, sort_keys=False))  # fmt: skip
    return directory


def apply_overlay(directory: Path, *, kubeconfig: Path, binaries: Binaries) -> None:
    """`kubectl apply --server-side -k`, as docs/deployment.md has users do. The CRDs and the namespace are
    there already (the local environment applies them at the cluster's creation, with the same manager)."""
    subprocess.run([str(binaries.kubectl), "--kubeconfig", str(kubeconfig), "apply", "--server-side",
                    "--force-conflicts", "-k", str(directory)], check=True, capture_output=True, text=True)  # fmt: skip
