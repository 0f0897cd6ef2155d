"""Build the stack's CPU images with podman: `make images`.

    python scripts/images.py [--only gateway,stt] [--rebuild-base]

Where no registry can be reached (these machines), the base the Dockerfiles name
(`PYTHON_IMAGE`, python:3.11-slim-bookworm) cannot be pulled, so a stand-in is built
first: a debootstrap of Debian bookworm with its Python 3.11 in a venv on PATH,
imported as `localhost/kame-base:bookworm`. The images then build FROM it through the
Dockerfiles' build argument. Two more images stand in for the compose file's Redis and
Prometheus images (Debian's packages, deploy/docker/peers.Dockerfile).

pip's cache is a build cache mount (`RUN --mount=type=cache`), so a rebuild after a
code edit reuses the installed layers and a requirements change downloads only what
changed. Prints a table of image sizes and build times and writes it as JSON
(build/images.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = os.environ.get("KAME_TAG", "0.1.0")
REGISTRY = os.environ.get("KAME_REGISTRY", "kame")
BASE_IMAGE = "localhost/kame-base:bookworm"
DEBIAN_MIRROR = os.environ.get("KAME_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PODMAN_CONFIG = ROOT / "deploy" / "podman"
# Where pip finds wheels that are on this machine's disk and not on PyPI (the CPU torch).
LOCAL_WHEELS = os.environ.get("PIP_FIND_LINKS", "")
# The CA bundle this machine's pip trusts (a TLS-intercepting proxy's CA may be in it, and not
# in the image's); mounted into the builds where one is set.
HOST_CA = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE", "")
BUILD_CA = "/run/kame-build-ca.crt"


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: str
    build_args: dict[str, str] = field(default_factory=dict)
    tag: str = ""

    @property
    def reference(self) -> str:
        return self.tag or f"{REGISTRY}/{self.name}:{TAG}"


SERVICE_DOCKERFILE = "deploy/docker/service.Dockerfile"
PEERS_DOCKERFILE = "deploy/docker/peers.Dockerfile"
IMAGES = [
    *(
        Image(name, SERVICE_DOCKERFILE, {"SERVICE": name, "DEPS": "python"})
        for name in ("gateway", "stt", "oracle", "web", "telephony")
    ),
    Image(
        "frontend",
        SERVICE_DOCKERFILE,
        {"SERVICE": "frontend", "DEPS": "frontend-cpu"},
        tag=f"{REGISTRY}/frontend:{TAG}-cpu",
    ),
    Image("llm", "deploy/docker/llm.Dockerfile"),
    Image("redis", PEERS_DOCKERFILE, {"PEER": "redis"}, tag="localhost/kame-peers/redis:bookworm"),
    Image(
        "prometheus",
        PEERS_DOCKERFILE,
        {"PEER": "prometheus"},
        tag="localhost/kame-peers/prometheus:bookworm",
    ),
]


@dataclass
class Built:
    image: str
    reference: str
    build_s: float
    size_mb: float


def require_programs(*programs: str) -> None:
    missing = [program for program in programs if shutil.which(program) is None]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: apt-get install {' '.join(missing)}")


def use_project_podman_config() -> None:
    """podman (and `podman system service`) with deploy/podman's runtime, cgroup manager,
    ulimits and storage driver, unless the caller chose its own files."""
    os.environ.setdefault("CONTAINERS_CONF", str(PODMAN_CONFIG / "containers.conf"))
    os.environ.setdefault("CONTAINERS_STORAGE_CONF", str(PODMAN_CONFIG / "storage.conf"))


def podman(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], check=True, text=True, capture_output=capture)


def image_exists(reference: str) -> bool:
    return subprocess.run(["podman", "image", "exists", reference]).returncode == 0


def image_size_mb(reference: str) -> float:
    size = podman("image", "inspect", "--format", "{{.Size}}", reference, capture=True).stdout
    return int(size.strip()) / 1e6


def build_base() -> None:
    """Debian bookworm (debootstrap) with python3.11 in /opt/venv, as BASE_IMAGE."""
    print(f"building {BASE_IMAGE}: debootstrap of bookworm from {DEBIAN_MIRROR} (a few minutes)")
    with tempfile.TemporaryDirectory(prefix="kame-base-") as work:
        rootfs = Path(work) / "rootfs"
        packages = "python3,python3-venv,ca-certificates"
        debootstrap = ["debootstrap", "--variant=minbase", f"--include={packages}"]
        subprocess.run(
            [*debootstrap, "bookworm", str(rootfs), DEBIAN_MIRROR],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # A venv, so that pip installs as in python:3.11-slim (Debian's own pip refuses
        # to touch the system Python, PEP 668).
        subprocess.run(["chroot", str(rootfs), "python3", "-m", "venv", "/opt/venv"], check=True)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        archive = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        podman(
            "import",
            "--change",
            "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change",
            "ENV LANG=C.UTF-8",
            "--change",
            'CMD ["python3"]',
            str(archive),
            BASE_IMAGE,
        )


def build_args(image: Image) -> list[str]:
    args = {"PYTHON_IMAGE": BASE_IMAGE, **image.build_args}
    if LOCAL_WHEELS:
        # The CPU torch from this disk instead of PyTorch's index (not reachable here).
        args |= {"PIP_FIND_LINKS": LOCAL_WHEELS, "TORCH_CPU_INDEX": ""}
    if HOST_CA:
        args |= {"PIP_CERT": BUILD_CA, "SSL_CERT_FILE": BUILD_CA}
    return [flag for name, value in args.items() for flag in ("--build-arg", f"{name}={value}")]


def build_volumes() -> list[str]:
    """What the builds mount from this machine (never copied into a layer)."""
    mounts = [f"{LOCAL_WHEELS}:{LOCAL_WHEELS}:ro"] if LOCAL_WHEELS else []
    mounts += [f"{HOST_CA}:{BUILD_CA}:ro"] if HOST_CA else []
    return [flag for mount in mounts for flag in ("--volume", mount)]


def build(image: Image) -> Built:
    volumes = build_volumes()
    started = time.monotonic()
    print(f"building {image.reference} ({image.dockerfile} {image.build_args or ''})", flush=True)
    podman(
        "build",
        # Docker's image format: OCI's has no HEALTHCHECK (podman drops it with a warning).
        "--format",
        "docker",
        "--network",
        "host",
        *volumes,
        *build_args(image),
        "--file",
        image.dockerfile,
        "--tag",
        image.reference,
        str(ROOT),
    )
    took = time.monotonic() - started
    return Built(image.name, image.reference, round(took, 1), round(image_size_mb(image.reference)))


def table(built: list[Built]) -> str:
    lines = [f"{'image':<12} {'reference':<44} {'build s':>8} {'size MB':>8}"]
    lines += [f"{b.image:<12} {b.reference:<44} {b.build_s:>8.1f} {b.size_mb:>8.0f}" for b in built]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated image names (default: all)")
    parser.add_argument("--rebuild-base", action="store_true", help="debootstrap the base again")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "images.json")
    args = parser.parse_args(argv)
    wanted = [name for name in args.only.split(",") if name]
    unknown = set(wanted) - {image.name for image in IMAGES}
    if unknown:
        parser.error(f"unknown images {sorted(unknown)}; known: {[i.name for i in IMAGES]}")
    require_programs("podman", "runc", "debootstrap")
    use_project_podman_config()
    if args.rebuild_base or not image_exists(BASE_IMAGE):
        build_base()
    built = [build(image) for image in IMAGES if not wanted or image.name in wanted]
    print(table(built))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([asdict(b) for b in built], indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
