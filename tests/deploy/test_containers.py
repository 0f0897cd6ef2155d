"""What `make images` builds and `make compose-smoke` runs, offline: scripts/images.py builds
every image the compose file builds, with the same Dockerfile, build arguments and tag; the
local override (deploy/compose/local.yml) replaces every image compose would pull with one
scripts/images.py builds; the KAME containers run on a read-only root filesystem as the chart's
pods do; pip's cache is a build cache mount, never a layer. The builds and the smoke themselves
need podman and take long: KAME_CONTAINER_SMOKE=1 runs them (test_smoke)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.conftest import (
    KAME_SERVICES,
    LLM_DOCKERFILE,
    ROOT,
    SERVICE_DOCKERFILE,
    compose_config,
    instructions,
)

LOCAL_OVERRIDE = ROOT / "deploy" / "compose" / "local.yml"
PEERS_DOCKERFILE = ROOT / "deploy" / "docker" / "peers.Dockerfile"


def load_script(name: str) -> ModuleType:
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # compose_smoke imports images by name, as when run
    spec.loader.exec_module(module)
    return module


images = load_script("images")


def local_services() -> dict[str, dict]:
    return compose_config("-f", "docker-compose.yml", "-f", str(LOCAL_OVERRIDE))["services"]


def test_images_builds_every_image_compose_builds():
    built = {image.reference: image for image in images.IMAGES}
    for name, spec in compose_config()["services"].items():
        if "build" not in spec:
            continue
        image = built.get(spec["image"])
        assert image, f"{name}: scripts/images.py does not build {spec['image']}"
        assert (
            ROOT / image.dockerfile == Path(spec["build"]["context"]) / spec["build"]["dockerfile"]
        )
        assert image.build_args == (spec["build"].get("args") or {}), name


def test_the_local_override_pulls_nothing():
    built = {image.reference for image in images.IMAGES}
    for name, spec in local_services().items():
        assert "build" in spec or spec["image"] in built, f"{name} pulls {spec['image']}"


def test_the_stand_ins_run_what_the_compose_file_asks_of_them():
    """The compose file's redis command and health check call redis-server and redis-cli; its
    prometheus command passes flags to the image's prometheus entrypoint. The redis command is
    a shell that hands the password to redis-server on stdin (not on its command line), with
    --protected-mode no, which the official image has by default and Debian's has not."""
    services = local_services()
    script = " ".join(services["redis"]["command"])
    assert services["redis"]["command"][:2] == ["sh", "-c"]
    assert "exec redis-server - " in script and "--protected-mode no" in script
    assert "redis-cli" in " ".join(services["redis"]["healthcheck"]["test"])
    assert all(flag.startswith("--") for flag in services["prometheus"]["command"])
    steps = instructions(PEERS_DOCKERFILE)
    stages = [args.split(" AS ")[-1] for kw, args in steps if kw == "FROM" and " AS " in args]
    assert stages == ["peer-redis", "peer-prometheus"]
    text = PEERS_DOCKERFILE.read_text()
    assert "install -y --no-install-recommends redis-server" in text  # redis-cli comes with it
    # The official image has no protected mode; Debian's would refuse the other containers.
    assert "exec redis-server --protected-mode no" in text
    assert 'ENTRYPOINT ["/usr/bin/prometheus"' in text


def test_kame_containers_have_a_read_only_root_with_tmp_as_the_chart():
    for name, spec in compose_config("--profile", "gpu")["services"].items():
        if "build" not in spec:
            continue
        assert spec.get("read_only") is True, name
        tmpfs = spec.get("tmpfs") or []
        assert "/tmp" in tmpfs, name
        if name.startswith("frontend"):
            # The chart mounts an emptyDir there (deploy/helm/kame/templates/frontend.yaml).
            assert "/home/kame/.cache" in tmpfs, name
    chart = (ROOT / "deploy" / "helm" / "kame" / "templates" / "frontend.yaml").read_text()
    assert '"mountPath" "/home/kame/.cache"' in chart


@pytest.mark.parametrize("dockerfile", [SERVICE_DOCKERFILE, LLM_DOCKERFILE], ids=lambda p: p.name)
def test_pip_downloads_into_a_build_cache_mount_never_into_a_layer(dockerfile):
    runs = [args for kw, args in instructions(dockerfile) if kw == "RUN"]
    downloading = [
        run
        for run in runs
        if re.search(r"pip (install|wheel) ", run) and "--no-index" not in run.split("&&")[0]
    ]
    assert downloading
    for run in downloading:
        assert run.startswith("--mount=type=cache,target="), run[:80]
    text = dockerfile.read_text()
    assert "ARG PIP_CACHE_DIR" in text or "PIP_CACHE_DIR=/build-cache" in text


def test_images_passes_the_local_wheels_and_the_local_base():
    args = images.build_args(images.IMAGES[0])
    pairs = dict(a.split("=", 1) for a in args[1::2])
    assert pairs["PYTHON_IMAGE"] == images.BASE_IMAGE
    if images.LOCAL_WHEELS:
        assert pairs["PIP_FIND_LINKS"] == images.LOCAL_WHEELS and pairs["TORCH_CPU_INDEX"] == ""
    for dockerfile in (SERVICE_DOCKERFILE, LLM_DOCKERFILE, PEERS_DOCKERFILE):
        assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in dockerfile.read_text()


def test_the_kame_services_are_the_ones_the_smoke_checks():
    services = {i.build_args.get("SERVICE") for i in images.IMAGES} - {None}
    assert services == set(KAME_SERVICES)


@pytest.mark.skipif(
    os.environ.get("KAME_CONTAINER_SMOKE") != "1",
    reason="builds every image with podman and runs the stack (long): KAME_CONTAINER_SMOKE=1",
)
def test_smoke():
    for script in ("images", "compose_smoke"):
        subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py")], check=True)


def test_health_checks_survive_podmans_docker_api():
    """podman 4.3's Docker-compatible API (what `docker compose` talks to there) splits each
    argument of an exec-form ("CMD") health check at its spaces: `python3 -c "import x; ..."`
    ran as `python3 -c import` and never passed. Checks with spaces use CMD-SHELL."""
    for profile in ((), ("--profile", "gpu"), ("--profile", "observability")):
        for name, spec in compose_config(*profile)["services"].items():
            test = (spec.get("healthcheck") or {}).get("test") or []
            if test and test[0] == "CMD":
                assert not any(" " in arg for arg in test[1:]), (name, test)


def test_every_service_build_names_its_dependency_set():
    """podman's builder (buildah 1.28) resolves `FROM deps-${DEPS}` to the stage only when DEPS
    is passed; left to its default it looked for an image called deps-python and failed."""
    for name, spec in compose_config("--profile", "gpu")["services"].items():
        build = spec.get("build") or {}
        if Path(build.get("context", "")) / build.get("dockerfile", "") == SERVICE_DOCKERFILE:
            assert (build.get("args") or {}).get("DEPS"), name
    for image in images.IMAGES:
        if ROOT / image.dockerfile == SERVICE_DOCKERFILE:
            assert image.build_args.get("DEPS"), image.name
