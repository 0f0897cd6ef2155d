"""The Dockerfiles and the container health check. No Docker engine runs here: the Dockerfiles
are parsed and checked against the services (ports, commands, settings, dependency sets), the
CUDA image's lock override is executed on the real lock, and the health check script runs
against a real gRPC server and a real HTTP server."""

from __future__ import annotations

import asyncio
import fnmatch
import http.server
import importlib.util
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from kame_common.ports import LLM_PORT
from kame_common.server import ServiceRuntime
from services.stt.config import SttSettings
from tests.deploy.conftest import METRICS_PORTS, PORTS, ROOT

HEALTHCHECK = ROOT / "deploy" / "docker" / "healthcheck.py"
IMAGES = {
    "gateway": ("gateway", "services/gateway/Dockerfile"),
    "stt": ("stt", "services/stt/Dockerfile"),
    "oracle": ("oracle", "services/oracle/Dockerfile"),
    "frontend-cpu": ("frontend", "services/frontend/Dockerfile.cpu"),
    "frontend-cuda": ("frontend", "services/frontend/Dockerfile"),
    "llm": (None, "deploy/docker/llm.Dockerfile"),
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuations joined, comments dropped."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        result.append((keyword.upper(), arguments.strip()))
        pending = ""
    return result


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def arguments_of(path: Path, keyword: str) -> list[str]:
    return [args for kw, args in final_stage(path) if kw == keyword]


@pytest.fixture(params=sorted(IMAGES))
def image(request) -> tuple[str | None, Path]:
    service, dockerfile = IMAGES[request.param]
    return service, ROOT / dockerfile


def test_runs_as_a_numeric_non_root_user(image):
    _, dockerfile = image
    (user,) = arguments_of(dockerfile, "USER")[-1:]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user  # numeric: Kubernetes runAsNonRoot can verify
    assert any(f"--uid {uid}" in args for kw, args in final_stage(dockerfile) if kw == "RUN")


def test_health_check_matches_the_service_port(image):
    service, dockerfile = image
    (check,) = arguments_of(dockerfile, "HEALTHCHECK")
    assert "deploy/docker/healthcheck.py" in check
    if service is None:
        assert f"http://127.0.0.1:{LLM_PORT}/v1/models" in check
    else:
        variable, default = re.search(r"\$\{(KAME_[A-Z_]+):-(\d+)\}", check).groups()
        assert variable == f"KAME_{service.upper()}_PORT" and int(default) == PORTS[service]
        assert " grpc " in check


def test_command_module_exists_and_ports_are_exposed(image):
    service, dockerfile = image
    (command,) = arguments_of(dockerfile, "CMD")
    module = re.match(r'\["python", "-m", "([a-z_.]+)"', command).group(1)
    assert importlib.util.find_spec(module) is not None
    (exposed,) = arguments_of(dockerfile, "EXPOSE")
    expected = {LLM_PORT} if service is None else {PORTS[service], METRICS_PORTS[service]}
    assert {int(p) for p in exposed.split()} == expected


def test_image_settings_are_real_fields(image, configs):
    service, dockerfile = image
    settings = {}
    for args in arguments_of(dockerfile, "ENV"):
        settings.update(re.findall(r"(KAME_[A-Z_]+)=(\S+)", args))
    if service is None:
        assert not settings
        return
    config = configs[service]
    assert all(config.env_fields([name])[name] in config.fields for name in settings), settings
    config.load(settings)


def test_dependencies_come_from_the_lock(image):
    service, dockerfile = image
    installs = [
        args
        for kw, args in instructions(dockerfile)
        if kw == "RUN"
        for args in re.findall(r"pip (?:install|wheel) [^&]+", args)
    ]
    assert installs
    for install in installs:
        assert re.search(r"-c (\S*constraints[\w-]*\.txt)", install), install
    requirements = {r for i in installs for r in re.findall(r"-r (requirements/[\w.-]+)", i)}
    assert requirements
    for name in requirements - {"requirements/frontend-cuda.txt"}:
        assert (ROOT / name).is_file(), name
    expected = f"requirements/{service or 'llm'}.txt"
    assert expected in requirements or (dockerfile.name == "Dockerfile" and service == "frontend")
    if service == "frontend":
        (moshi,) = [i for i in installs if re.search(r"\bmoshi\b", i)]
        assert "--no-deps" in moshi


def test_copied_sources_exist_and_are_in_the_build_context(image):
    _, dockerfile = image
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for args in arguments_of(dockerfile, "COPY"):
        if args.startswith("--from"):
            continue
        for source in args.split()[:-1]:
            assert (ROOT / source).exists(), source
            top = source.rstrip("/")
            assert not any(fnmatch.fnmatch(top, pattern) for pattern in ignored), source


# Imports a service the way its image runs it: only the copied tree on the path, and without the
# editable install's finder, which would otherwise find the whole repository.
_IMPORT_AS_IN_IMAGE = """
import importlib, importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
sys.path.insert(0, sys.argv[1])
for module in sys.argv[3:]:
    importlib.import_module(module)
assert importlib.util.find_spec(sys.argv[2]) is not None, sys.argv[2]
ours = ("services", "kame_common", "kamepb", "kame_cli")
for name, module in sorted(sys.modules.items()):
    if name.split(".")[0] in ours and getattr(module, "__file__", None):
        assert module.__file__.startswith(sys.argv[1]), (name, module.__file__)
print("ok")
"""


def copy_like_the_image(dockerfile: Path, app: Path) -> None:
    """Lay out /app as the final stage's COPY instructions do."""
    for args in arguments_of(dockerfile, "COPY"):
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


def test_the_copied_code_is_all_the_service_imports(image, tmp_path):
    """A service whose code imports project modules its image does not copy fails here."""
    service, dockerfile = image
    copy_like_the_image(dockerfile, tmp_path)
    if service is None:
        main, modules = "kame_cli.__main__", ["kame_cli.main", "kame_cli.llm_server"]
    else:
        main, modules = (
            f"services.{service}.__main__",
            [f"services.{service}.config", f"services.{service}.server"],
        )
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_AS_IN_IMAGE, str(tmp_path), main, *modules],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_dockerignore_keeps_local_state_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_cuda_frontend_uses_a_torch_moshi_accepts():
    dockerfile = ROOT / "services/frontend/Dockerfile"
    (base,) = [
        args
        for kw, args in instructions(dockerfile)
        if kw == "ARG" and args.startswith("TORCH_IMAGE=")
    ]
    major, minor = re.search(r"pytorch/pytorch:(\d+)\.(\d+)\.\d+-cuda", base).groups()
    assert (int(major), int(minor)) < (2, 10)
    assert "FROM ${TORCH_IMAGE}" in [
        f"FROM {a}" for kw, a in instructions(dockerfile) if kw == "FROM"
    ]


def test_cuda_lock_override_keeps_the_base_torch_and_the_rest_of_the_lock(tmp_path):
    """Run the CUDA Dockerfile's own filter commands on the real lock: torch (pinned to the CPU
    build there) goes, every other pin stays."""
    dockerfile = ROOT / "services/frontend/Dockerfile"
    run = next(args for kw, args in instructions(dockerfile) if kw == "RUN" and "grep" in args)
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
    assert "moshi" not in pins(cuda_lock) or "moshi" in pins(lock)
    frontend = (ROOT / "requirements/frontend.txt").read_text().splitlines()
    cuda_frontend = (tmp_path / "requirements/frontend-cuda.txt").read_text().splitlines()
    assert [line for line in frontend if line not in cuda_frontend] == [
        line for line in frontend if re.match(r"torch\W", line)
    ]


def test_cpu_frontend_gets_the_cpu_torch_of_the_lock():
    dockerfile = (ROOT / "services/frontend/Dockerfile.cpu").read_text()
    assert "download.pytorch.org/whl/cpu" in dockerfile
    (torch_pin,) = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert "+" not in torch_pin or torch_pin.endswith("+cpu")


# ---- the health check script against real servers --------------------------------------------


async def run_healthcheck(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HEALTHCHECK),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
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
