"""The images and the container health check. No Docker engine runs here: the one service
Dockerfile is resolved for each image's build arguments (as compose passes them) and checked
against the services (command, settings, dependency sets, copied code), the CUDA image's lock
override runs on the real lock, and the health check script runs against real gRPC and HTTP
servers. Ports are checked in test_ports.py."""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import http.server
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kame_cli import llama_build
from kame_common import turn_model
from kame_common.models import ModelNotInstalled
from kame_common.ports import SERVICE_PORTS
from kame_common.server import ServiceRuntime
from services.stt.config import SttSettings
from services.telephony.config import TelephonySettings
from services.telephony.server import serve as serve_telephony
from services.web.config import WebSettings
from services.web.server import serve as serve_web
from tests.deploy.conftest import (
    HTTP_SERVICES,
    LLM_DOCKERFILE,
    ROOT,
    SERVICE_DOCKERFILE,
    Image,
    build_image,
    compose_config,
    compose_image,
    containers,
    env_of,
    free_port,
    instructions,
)

HEALTHCHECK = ROOT / "deploy" / "docker" / "healthcheck.py"


def compose_builds() -> dict[str, tuple[str | None, Image]]:
    """{compose service: (KAME service or None, image)} of every image compose builds."""
    services = compose_config("--profile", "gpu", "--profile", "observability")["services"]
    result = {}
    for name, spec in services.items():
        if "build" in spec:
            args = spec["build"].get("args") or {}
            result[name] = (args.get("SERVICE"), compose_image(spec))
    return result


BUILDS = compose_builds()


@pytest.fixture(params=sorted(BUILDS))
def image(request) -> tuple[str | None, Image]:
    return BUILDS[request.param]


def test_compose_builds_every_service_from_the_one_dockerfile():
    """gateway, stt, oracle, web, telephony and both frontends come from
    deploy/docker/service.Dockerfile; only the llm (a C++ build of llama.cpp, HTTP,
    `kame llm-server`) has its own."""
    services = compose_config("--profile", "gpu")["services"]
    dockerfiles = {
        name: Path(spec["build"]["context"]) / spec["build"]["dockerfile"]
        for name, spec in services.items()
        if "build" in spec
    }
    assert {n for n, path in dockerfiles.items() if path == SERVICE_DOCKERFILE} == {
        "gateway",
        "stt",
        "oracle",
        "frontend",
        "frontend-gpu",
        "web",
        "telephony",
    }
    assert dockerfiles["llm"] == LLM_DOCKERFILE
    assert not list((ROOT / "services").rglob("Dockerfile*"))
    deps = {
        name: services[name]["build"]["args"].get("DEPS") for name in ("frontend", "frontend-gpu")
    }
    assert deps == {"frontend": "frontend-cpu", "frontend-gpu": "frontend-cuda"}


def test_a_service_name_the_dockerfile_does_not_know_fails_the_build():
    with pytest.raises(KeyError, match="service-nothing"):
        build_image(SERVICE_DOCKERFILE, {"SERVICE": "nothing"})
    stages = [a.split(" AS ")[-1] for kw, a in instructions(SERVICE_DOCKERFILE) if " AS " in a]
    assert {s.removeprefix("service-") for s in stages if s.startswith("service-")} == {
        *SERVICE_PORTS,
        *HTTP_SERVICES,
    }


def _deps_python_check() -> str:
    """The shell `case` with which the deps-python stage refuses a wrong SERVICE."""
    run = next(
        args
        for args in build_image(SERVICE_DOCKERFILE, {"SERVICE": "stt"}).arguments("RUN")
        if "case" in args
    )
    return re.search(r"case .*? esac", run).group(0)


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ("stt", None),
        ("frontend", "DEPS=frontend-cpu or DEPS=frontend-cuda"),
        ("web", None),
        ("telephony", None),
        ("", "expected gateway, stt, oracle, frontend, web or telephony"),
    ],
)
def test_the_plain_python_dependency_stage_refuses_the_frontend_and_unknown_names(service, message):
    result = subprocess.run(
        ["sh", "-c", _deps_python_check()],
        env={"SERVICE": service, "PATH": os.defpath},
        capture_output=True,
        text=True,
    )
    assert (result.returncode == 0) == (message is None)
    assert message is None or message in result.stderr


def test_runs_as_a_numeric_non_root_user(image):
    _, built = image
    (user,) = built.arguments("USER")[-1:]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user  # numeric: Kubernetes runAsNonRoot can verify
    assert any(f"--uid {uid}" in args for args in built.arguments("RUN"))


def test_command_runs_the_service_module_as_pid_1(image):
    service, built = image
    (command,) = built.arguments("CMD")
    if service is None:
        module = re.match(r'\["python", "-m", "([a-z_.]+)"', command).group(1)
        assert module == "kame_cli"
        return
    # The shell form expands KAME_SERVICE and `exec`s python, so python gets SIGTERM itself.
    argv = json.loads(command)
    assert argv[:2] == ["sh", "-c"]
    script = argv[2].replace("${KAME_SERVICE}", built.env["KAME_SERVICE"])
    assert shlex.split(script) == ["exec", "python", "-m", f"services.{service}"]
    assert importlib.util.find_spec(f"services.{service}") is not None
    assert built.arguments("STOPSIGNAL") == ["SIGTERM"]


def test_health_check_asks_the_service_or_the_llm(image):
    service, built = image
    (check,) = built.arguments("HEALTHCHECK")
    argv = json.loads(check[check.index("CMD ") + 4 :])
    assert argv[:2] == ["python", "deploy/docker/healthcheck.py"]
    if service is None:
        assert argv[2:4] == ["http", "--url"] and argv[4].endswith("/v1/models")
    else:
        assert argv[2:] == ["service"] and built.env["KAME_SERVICE"] == service


def test_image_settings_are_real_fields(image, configs):
    service, built = image
    # KAME_SERVICE names the service; $KAME_SMART_TURN_MODEL (the frontend's) is read by
    # kame_common/turn_model.py, no service's setting.
    not_settings = {"KAME_SERVICE", turn_model.PATH_ENV}
    settings = {
        k: v for k, v in built.env.items() if k.startswith("KAME_") and k not in not_settings
    }
    if service is None:
        # The llm image runs kame llm-server, no service: its one setting names the
        # llama-server binary its build stage compiled and copied in.
        (copied,) = [a for a in built.arguments("COPY") if "llama-server" in a]
        assert settings == {llama_build.BINARY_ENV: copied.split()[-1]}
        return
    config = configs[service]
    assert all(config.env_fields([name])[name] in config.fields for name in settings), settings
    config.load(settings)


def test_dependencies_come_from_the_lock(image):
    service, built = image
    installs = [
        install
        for args in built.arguments("RUN")
        for install in re.findall(r"pip (?:install|wheel) [^&]+", args)
    ]
    assert installs
    for install in installs:
        assert re.search(r"-c (\S*constraints[\w-]*\.txt)", install), install
    requirements = {
        r.strip('"').replace("${SERVICE}", service or "")
        for i in installs
        for r in re.findall(r"-r (\S+)", i)
    }
    assert requirements
    for name in requirements - {"requirements/frontend-cuda.txt"}:
        assert (ROOT / name).is_file(), name
    if service == "frontend":
        assert requirements & {"requirements/frontend.txt", "requirements/frontend-cuda.txt"}
        (moshi,) = [i for i in installs if re.search(r"\bmoshi\b", i)]
        assert "--no-deps" in moshi
    else:
        assert requirements == {f"requirements/{service or 'llm'}.txt"}


def _ignored() -> list[str]:
    return [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_copied_sources_exist_and_are_in_the_build_context(image):
    _, built = image
    for args in built.arguments("COPY"):
        if args.startswith("--from"):
            continue
        for source in args.split()[:-1]:
            assert (ROOT / source).exists(), source
            top = source.rstrip("/")
            assert not any(fnmatch.fnmatch(top, pattern) for pattern in _ignored()), source


# Imports a service the way its image runs it: only the copied tree on the path, and without the
# editable install's finder, which would otherwise find the whole repository.
_IMPORT_AS_IN_IMAGE = """
import importlib, importlib.abc, importlib.util, json, sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
sys.path.insert(0, sys.argv[1])
installed = set(json.loads(sys.argv[3]))  # what the image's pip installs provide

class OnlyWhatTheImageInstalls(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top.startswith("_") or top in installed:
            return None
        if top in ("services", "kame_common", "kame_client", "kamepb", "kame_cli"):
            return None
        # ModuleNotFoundError, as for a missing package: optional imports catch that
        raise ModuleNotFoundError(f"{name}: no package the image installs provides it")

sys.meta_path.insert(0, OnlyWhatTheImageInstalls())
for module in sys.argv[4:]:
    importlib.import_module(module)
assert importlib.util.find_spec(sys.argv[2]) is not None, sys.argv[2]
ours = ("services", "kame_common", "kame_client", "kamepb", "kame_cli")
for name, module in sorted(sys.modules.items()):
    if name.split(".")[0] in ours and getattr(module, "__file__", None):
        assert module.__file__.startswith(sys.argv[1]), (name, module.__file__)
print("ok")
"""


def copy_like_the_image(built: Image, app: Path) -> None:
    """Lay out /app as the final stage's COPY instructions do."""
    for args in built.arguments("COPY"):
        if args.startswith("--from"):
            continue
        *sources, destination = args.split()
        target = app / destination
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(
                    path, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)


def requirement_closure(files: list[Path], extra: list[str]) -> set[str]:
    """The (canonical) names of the distributions pip installs for these requirement files and
    `extra` requirements, with their dependencies, as this venv has them."""
    wanted: list[Requirement] = [Requirement(line) for line in extra]
    for path in files:
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("-r "):
                wanted += [Requirement(r) for r in _requirement_lines(path.parent / line[3:])]
            elif line:
                wanted.append(Requirement(line))
    seen: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:  # not installed here (moshi's own deps)
            continue
        extras = {"", *requirement.extras}
        for text in requires:
            dependency = Requirement(text)
            marker = dependency.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras):
                wanted.append(dependency)
    return seen


def _requirement_lines(path: Path) -> list[str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("-")]


def installed_modules(service: str | None, built: Image) -> set[str]:
    """Top-level modules the image's pip installs provide: their requirement files (and a
    package installed by name, moshi), with dependencies."""
    installs = [i for a in built.arguments("RUN") for i in re.findall(r"pip install [^&]+", a)]
    files = {
        ROOT / r.strip('"').replace("${SERVICE}", service or "")
        for i in installs
        for r in re.findall(r"-r (\S+)", i)
    }
    # The CUDA image writes frontend-cuda.txt at build time: frontend.txt without torch, which
    # its base image brings.
    files = {p.with_name("frontend.txt") if p.name == "frontend-cuda.txt" else p for p in files}
    named = ["moshi"] if any(re.search(r"\bmoshi\b", i) for i in installs) else []
    distributions = requirement_closure(sorted(p for p in files if p.is_file()), named)
    return {
        module
        for module, owners in metadata.packages_distributions().items()
        if any(canonicalize_name(owner) in distributions for owner in owners)
    }


def test_the_copied_code_is_all_the_service_imports(image, tmp_path):
    """A service whose code imports project modules its image does not copy fails here, and so
    does the health check, which imports kame_common.ports from the image's /app. So does a
    third-party import no package the image installs provides (the llm image once crashed
    at start: `kame llm-server` imported grpc through kame_cli.errors)."""
    service, built = image
    copy_like_the_image(built, tmp_path)
    if service is None:
        main, modules = "kame_cli.__main__", ["kame_cli.main", "kame_cli.llm_server"]
    else:
        main, modules = (
            f"services.{service}.__main__",
            [f"services.{service}.config", f"services.{service}.server", "kame_common.ports"],
        )
    provided = json.dumps(sorted(installed_modules(service, built)))
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_AS_IN_IMAGE, str(tmp_path), main, provided, *modules],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
    assert (tmp_path / "deploy/docker/healthcheck.py").is_file()


def test_dockerignore_keeps_local_state_and_keys_out():
    ignored = set(_ignored())
    assert {".git", ".venv", "tests", "certs", "**/*.key", "**/*.pem"} <= ignored


def test_cuda_frontend_uses_a_torch_moshi_accepts():
    built = build_image(SERVICE_DOCKERFILE, {"SERVICE": "frontend", "DEPS": "frontend-cuda"})
    major, minor = re.match(r"pytorch/pytorch:(\d+)\.(\d+)\.\d+-cuda", built.base).groups()
    assert (int(major), int(minor)) < (2, 10)
    assert built.env["KAME_FRONTEND_DEVICE"] == "cuda"
    cpu = build_image(SERVICE_DOCKERFILE, {"SERVICE": "frontend", "DEPS": "frontend-cpu"})
    assert cpu.base.startswith("python:3.11") and "KAME_FRONTEND_DEVICE" not in cpu.env


def test_cuda_lock_override_keeps_the_base_torch_and_the_rest_of_the_lock(tmp_path):
    """Run the CUDA stage's own filter commands on the real lock: torch (pinned to the CPU
    build there) goes, every other pin stays."""
    built = build_image(SERVICE_DOCKERFILE, {"SERVICE": "frontend", "DEPS": "frontend-cuda"})
    run = next(args for args in built.arguments("RUN") if "grep" in args)
    filters = re.findall(r"grep [^&]*?> \S+", run)
    assert len(filters) == 2
    (tmp_path / "requirements").mkdir()
    for source in (ROOT / "requirements").glob("*.txt"):
        (tmp_path / "requirements" / source.name).write_text(source.read_text())
    (tmp_path / "constraints.txt").write_text((ROOT / "constraints.txt").read_text())
    for command in filters:
        subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)

    def pins(text: str) -> set[str]:
        return {line.split("==")[0].lower() for line in text.splitlines() if "==" in line}

    lock = (ROOT / "constraints.txt").read_text()
    cuda_lock = (tmp_path / "constraints-cuda.txt").read_text()
    assert "torch" in pins(lock) and "torch" not in pins(cuda_lock)
    assert pins(lock) - pins(cuda_lock) <= {"torch", "triton"} | {
        p for p in pins(lock) if p.startswith("nvidia-")
    }
    frontend = (ROOT / "requirements/frontend.txt").read_text().splitlines()
    cuda_frontend = (tmp_path / "requirements/frontend-cuda.txt").read_text().splitlines()
    assert [line for line in frontend if line not in cuda_frontend] == [
        line for line in frontend if re.match(r"torch\W", line)
    ]


def test_cpu_frontend_gets_the_cpu_torch_of_the_lock():
    built = build_image(SERVICE_DOCKERFILE, {"SERVICE": "frontend", "DEPS": "frontend-cpu"})
    assert any("download.pytorch.org/whl/cpu" in a for a in built.arguments("ARG"))
    (torch_pin,) = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert "+" not in torch_pin or torch_pin.endswith("+cpu")


# ---- the Smart Turn model in the frontend images ----------------------------------------------

FRONTEND_DEPS = ("frontend-cpu", "frontend-cuda")


def frontend_args(deps: str) -> dict[str, str]:
    return {"SERVICE": "frontend", "DEPS": deps}


def frontend_image(deps: str) -> Image:
    return build_image(SERVICE_DOCKERFILE, frontend_args(deps))


def model_copy(built: Image) -> tuple[str, str, str]:
    """(stage, source, destination) of the frontend's one COPY of the model out of a stage."""
    (copy,) = [
        args for args in built.arguments("COPY") if args.startswith("--from=smart-turn-model ")
    ]
    flag, source, destination = copy.split()
    return flag.removeprefix("--from="), source, destination


def own_steps(build_args: dict[str, str], stage: str, keyword: str) -> list[str]:
    """The `keyword` instructions of `stage` itself, not of the stages it is built on."""
    chain = build_image(SERVICE_DOCKERFILE, build_args, target=stage)
    base = build_image(SERVICE_DOCKERFILE, build_args, target=chain.stages[-2])
    return chain.arguments(keyword)[len(base.arguments(keyword)) :]


@pytest.mark.parametrize("deps", FRONTEND_DEPS)
def test_the_frontend_images_carry_the_smart_turn_model(deps):
    """The old recipe had no model: a containerized tts engine logged `turn detection falls
    back to ...` and ended every turn on the fixed pause. Both frontend images now copy it out
    of the stage that fetches it, to where $KAME_SMART_TURN_MODEL points, and that stage is
    built on the image's own dependency stage (its --check runs the model on the image's
    onnxruntime)."""
    built = frontend_image(deps)
    path = Path(built.env[turn_model.PATH_ENV])
    assert path.is_absolute() and path.name == turn_model.MODEL_FILE
    # compose's tmpfs and the chart's emptyDir cover the cache; /app holds the copied code.
    assert not path.is_relative_to("/home/kame") and not path.is_relative_to("/app")
    stage, source, destination = model_copy(built)
    assert source.rstrip("/") == destination.rstrip("/") == str(path.parent)
    fetch = build_image(SERVICE_DOCKERFILE, frontend_args(deps), target=stage)
    assert fetch.stages[:-1] == built.stages[: len(fetch.stages) - 1]
    assert fetch.stages[-2] == f"deps-{deps}"
    assert fetch.env[turn_model.PATH_ENV] == str(path)
    (run,) = own_steps(frontend_args(deps), stage, "RUN")
    assert run.startswith("--mount=type=cache,target=/var/cache/pip ")
    commands = [c.strip() for c in run.split(" ", 1)[1].split("&&")]
    assert commands == [turn_model.FETCH_COMMAND, f"{turn_model.FETCH_COMMAND} --check"]
    declared = {args.partition("=")[0] for args in own_steps(frontend_args(deps), stage, "ARG")}
    assert {"PIP_CACHE_DIR", "PIP_CERT", "PIP_FIND_LINKS"} <= declared
    for args in own_steps(frontend_args(deps), stage, "COPY"):
        for copied in args.split()[:-1]:
            assert (ROOT / copied).exists(), copied
            assert not any(fnmatch.fnmatch(copied.rstrip("/"), p) for p in _ignored()), copied


def test_only_the_frontend_images_carry_the_model(image):
    service, built = image
    copies = [args for args in built.arguments("COPY") if "smart-turn-model" in args]
    assert bool(copies) == (service == "frontend"), service
    assert (turn_model.PATH_ENV in built.env) == (service == "frontend"), service


def test_the_model_pin_has_one_home():
    """The wheel, its version, the member and the hash are kame_common/turn_model.py's: the
    recipe runs kame_cli/smart_turn_model.py, which reads them from there, and names none of
    them itself (its comments aside). The path's file name is turn_model.MODEL_FILE, checked
    above."""
    recipe = " ".join(args for _, args in instructions(SERVICE_DOCKERFILE))
    for pinned in (
        turn_model.SOURCE_PACKAGE,
        turn_model.SOURCE_VERSION,
        turn_model.SOURCE_MEMBER,
        turn_model.MODEL_SHA256,
    ):
        assert pinned not in recipe, pinned


def pipecat_wheel(folder: Path, model: bytes) -> Path:
    """A wheel named and described as the pinned pipecat-ai release that holds `model` where
    the release holds the Smart Turn file: what pip finds in PIP_FIND_LINKS (offline here)."""
    name = turn_model.SOURCE_PACKAGE.replace("-", "_")
    version = turn_model.SOURCE_VERSION
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    dist_info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(turn_model.SOURCE_MEMBER, model)
        archive.writestr(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: {turn_model.SOURCE_PACKAGE}\nVersion: {version}\n",
        )
        archive.writestr(
            f"{dist_info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: kame-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


def run_the_model_stage(tmp_path: Path, model: bytes) -> tuple[subprocess.CompletedProcess, Path]:
    """The smart-turn-model stage's own RUN, as the build runs it: in /app as the stage's COPYs
    lay it out, with the stage's ENV path (under tmp_path) and pip offline on a folder of wheels
    through PIP_FIND_LINKS, as scripts/images.py passes it. The result and where the file
    would be."""
    built = frontend_image("frontend-cpu")
    stage, _, _ = model_copy(built)
    fetch = build_image(SERVICE_DOCKERFILE, frontend_args("frontend-cpu"), target=stage)
    app, wheels = tmp_path / "app", tmp_path / "wheels"
    wheels.mkdir()
    pipecat_wheel(wheels, model)
    copy_like_the_image(fetch, app)
    (run,) = own_steps(frontend_args("frontend-cpu"), stage, "RUN")
    script = run.split(" ", 1)[1]  # without the cache mount
    target = tmp_path / "root" / fetch.env[turn_model.PATH_ENV].lstrip("/")
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.defpath}",
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(app),
        turn_model.PATH_ENV: str(target),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    result = subprocess.run(
        ["sh", "-c", script], cwd=app, env=env, capture_output=True, text=True, timeout=300
    )
    return result, target


def installed_model() -> bytes:
    try:
        return turn_model.smart_turn_path().read_bytes()
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))


def test_the_model_stage_fetches_checks_and_places_the_model(tmp_path):
    result, target = run_the_model_stage(tmp_path, installed_model())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sha256 ok" in result.stdout, result.stdout
    assert hashlib.sha256(target.read_bytes()).hexdigest() == turn_model.MODEL_SHA256
    assert target.stat().st_mode & 0o777 == 0o644  # the service's user (10001) reads root's file
    # The frontend copies the whole folder: nothing but the model may be in it.
    assert [p.name for p in target.parent.iterdir()] == [turn_model.MODEL_FILE]


def test_the_model_stage_fails_the_build_on_a_wheel_with_another_file(tmp_path):
    """A pipecat-ai release whose model is not the pinned one fails the build: no image
    carries a model the engine's thresholds were not measured on."""
    result, target = run_the_model_stage(tmp_path, installed_model()[:-1] + b"\0")
    assert result.returncode != 0
    assert f"not the pinned {turn_model.MODEL_SHA256}" in result.stderr, result.stderr[-2000:]
    assert not target.exists()


def test_compose_and_the_chart_leave_the_frontends_model_in_place(rendered):
    """Neither mounts over the folder the image carries the model in nor points
    $KAME_SMART_TURN_MODEL elsewhere (the image's path wins)."""
    path = Path(frontend_image("frontend-cpu").env[turn_model.PATH_ENV])

    def covers(mount: str) -> bool:
        return path.is_relative_to(mount.split(":")[0])

    for name, spec in compose_config("--profile", "gpu")["services"].items():
        if ((spec.get("build") or {}).get("args") or {}).get("SERVICE") != "frontend":
            continue
        mounts = [*(spec.get("tmpfs") or []), *(v["target"] for v in spec.get("volumes") or [])]
        assert not any(covers(m) for m in mounts), (name, mounts)
        assert turn_model.PATH_ENV not in (spec.get("environment") or {}), name
    container = containers(rendered.one("Deployment", "frontend"))[0]
    assert not any(covers(m["mountPath"]) for m in container.get("volumeMounts", []))
    assert turn_model.PATH_ENV not in env_of(container)


# ---- the health check script against real servers --------------------------------------------


async def run_healthcheck(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HEALTHCHECK),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    _, stderr = await process.communicate()
    return process.returncode, stderr.decode()


async def test_grpc_health_check_follows_serving_status():
    runtime = ServiceRuntime(SttSettings(host="127.0.0.1", port=0, metrics_port=0), ["kamepb.Stt"])
    await runtime.start(lambda server: None)
    try:
        code, reason = await run_healthcheck("grpc", "--port", str(runtime.port))
        assert code == 0 and "SERVING" in reason
        code, _ = await run_healthcheck(
            "grpc", "--port", str(runtime.port), "--service", "kamepb.Stt"
        )
        assert code == 0
        code, reason = await run_healthcheck(
            "grpc", "--port", str(runtime.port), "--service", "kamepb.Nothing"
        )
        assert code == 1 and "NOT_FOUND" in reason
        # What SIGTERM's drain does first: every status NOT_SERVING.
        await runtime.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        code, reason = await run_healthcheck("grpc", "--port", str(runtime.port))
        assert code == 1 and "NOT_SERVING" in reason
    finally:
        await runtime.stop()
    code, reason = await run_healthcheck("grpc", "--port", str(runtime.port), "--timeout", "1")
    assert code == 1 and "UNAVAILABLE" in reason


async def test_service_health_check_asks_the_health_port_when_it_is_on():
    """The image's check (`service`): the container's KAME_SERVICE, on KAME_<SVC>_HEALTH_PORT
    when set, else on KAME_<SVC>_PORT; with TLS on and no health port it says what to set."""
    runtime = ServiceRuntime(SttSettings(host="127.0.0.1", port=0, metrics_port=0), ["kamepb.Stt"])
    await runtime.start(lambda server: None)
    try:
        plain = {"KAME_SERVICE": "stt", "KAME_STT_PORT": str(runtime.port)}
        code, reason = await run_healthcheck("service", env=plain)
        assert code == 0 and f"127.0.0.1:{runtime.port}: SERVING" in reason
        # The health port wins: nothing listens there, so the check fails although the gRPC
        # port would answer.
        elsewhere = free_port()
        code, reason = await run_healthcheck(
            "service", env={**plain, "KAME_STT_HEALTH_PORT": str(elsewhere)}
        )
        assert code == 1 and f"127.0.0.1:{elsewhere}" in reason
        code, reason = await run_healthcheck(
            "service", env={**plain, "KAME_STT_HEALTH_PORT": str(runtime.port)}
        )
        assert code == 0
        code, reason = await run_healthcheck(
            "service", env={**plain, "KAME_STT_TLS_CERT_FILE": "/etc/kame/tls/internal.crt"}
        )
        assert code == 1 and "KAME_STT_HEALTH_PORT" in reason
    finally:
        await runtime.stop()
    code, reason = await run_healthcheck("service", env={"KAME_SERVICE": "nothing"})
    assert code == 1 and "KAME_SERVICE='nothing'" in reason


class _ModelsHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def log_message(self, *args) -> None:
        pass


async def test_http_health_check():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ModelsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert (await run_healthcheck("http", "--url", f"{base}/v1/models"))[0] == 0
        code, reason = await run_healthcheck("http", "--url", f"{base}/nothing")
        assert code == 1 and "404" in reason
    finally:
        server.shutdown()
        thread.join()
    assert (await run_healthcheck("http", "--url", f"{base}/v1/models", "--timeout", "1"))[0] == 1


async def serve_web_for_probe() -> tuple[int, Any, Any]:
    server = await serve_web(WebSettings(host="127.0.0.1", port=0, metrics_port=0))
    return server.port, server, server.web.admission  # where draining is kept


async def serve_telephony_for_probe() -> tuple[int, Any, Any]:
    # HTTP only: the health check asks nothing of SIP or AudioSocket.
    settings = TelephonySettings(
        host="127.0.0.1", port=0, metrics_port=0, sip_port=-1, audiosocket_port=-1
    )
    server = await serve_telephony(settings)
    return server.port, server, server.telephony


@pytest.mark.parametrize(
    ("service", "start"),
    [("web", serve_web_for_probe), ("telephony", serve_telephony_for_probe)],
)
async def test_an_http_services_health_check_asks_healthz_and_fails_while_draining(service, start):
    """The image's check (`service`) of an HTTP service: GET /healthz on its port."""
    port, server, state = await start()
    env = {"KAME_SERVICE": service, f"KAME_{service.upper()}_PORT": str(port)}
    try:
        code, reason = await run_healthcheck("service", env=env)
        assert code == 0 and "HTTP 200" in reason and f":{port}/healthz" in reason, reason
        state.draining = True
        code, reason = await run_healthcheck("service", env=env)
        assert code == 1 and "503" in reason, reason
    finally:
        await server.stop()
    code, _ = await run_healthcheck("service", env=env)
    assert code == 1  # nothing listens any more
