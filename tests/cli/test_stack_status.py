"""A real `kame up` (every process, on free ports): a second `kame up` on the
same ports refuses to start and names the busy port, and `kame status` reports
every service (the web and telephony ingress too), the Redis registry and the
gateway's latencies after a call."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kame_cli.say import write_wav
from kame_cli.stack import stack_file
from kame_common.audio import SAMPLE_RATE
from tests.cli.conftest import ROOT, assert_fails_in_one_line, kame


@dataclass(frozen=True)
class RunningStack:
    process: subprocess.Popen
    output: str
    ports: dict[str, int]  # gateway, frontend, stt, oracle, llm

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.ports['gateway']}"


@pytest.fixture(scope="module")
def running_stack(tmp_path_factory) -> Iterator[RunningStack]:
    log_dir = tmp_path_factory.mktemp("kame-up")
    process = subprocess.Popen(
        [sys.executable, "-m", "kame_cli", "up", "--free-ports", "--log-dir", str(log_dir)],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not lines or "Ctrl-C stops everything" not in lines[-1]:
            line = process.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        output = "".join(lines)
        ports = {
            name: int(port)
            for name, port in re.findall(
                r"^\s+(stt|oracle|frontend|gateway)\s+127\.0\.0\.1:(\d+)", output, re.M
            )
        }
        ports["llm"] = int(re.search(r"llm\s+http://127\.0\.0\.1:(\d+)", output).group(1))
        yield RunningStack(process, output, ports)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=60)


def test_a_second_kame_up_on_the_same_ports_refuses_and_names_the_busy_port(
    running_stack, tmp_path
):
    ports = running_stack.ports
    flags = [f"--{name}-port={port}" for name, port in ports.items()]
    result = kame("up", *flags, "--log-dir", str(tmp_path), timeout=120)
    gateway_pid = json.loads(stack_file(ports["gateway"]).read_text())["processes"]["gateway"]
    line = assert_fails_in_one_line(
        result,
        1,
        rf"^kame up: port {ports['gateway']} \(gateway\) is in use by PID {gateway_pid['pid']} "
        r"\(.*services\.gateway\)",
    )
    assert "is up" not in result.stdout and "starting" not in result.stdout, result.stdout
    assert "another `kame up`" in line
    assert not list(tmp_path.glob("*.log")), "the second kame up started a process"
    assert running_stack.process.poll() is None, "the first stack went down"


def test_kame_status_reports_every_service_and_the_latency_of_a_call(
    running_stack, tmp_path, speak
):
    question = tmp_path / "question.wav"
    write_wav(question, speak("What is the capital of France?"), SAMPLE_RATE)
    talk = kame(
        "talk",
        "--wav",
        str(question),
        "--out",
        str(tmp_path / "answer.wav"),
        "--timeline",
        str(tmp_path / "timeline.json"),
        "--gateway",
        running_stack.gateway,
        timeout=180,
    )
    assert talk.returncode == 0, talk.stdout + talk.stderr

    table = kame("status", "--gateway", running_stack.gateway, timeout=60)
    assert table.returncode == 0, table.stdout + table.stderr
    print(table.stdout)  # what README shows
    for service in ("web", "telephony", "gateway", "stt", "oracle", "frontend"):
        row = re.search(
            rf"^{service}\s+SERVING\s+0\.1\.0\s+\d+m\d\ds\s+\d+\s+\d+\s", table.stdout, re.M
        )
        assert row, table.stdout
    assert re.search(r"^llm\s+ok \(gemma-3-270m\)", table.stdout, re.M), table.stdout
    assert re.search(r"response latency\s+p50 \d+", table.stdout), table.stdout

    data = json.loads(kame("status", "--gateway", running_stack.gateway, "--json").stdout)
    services = {s["name"]: s for s in data["services"]}
    described = json.loads(stack_file(running_stack.ports["gateway"]).read_text())
    for name, service in services.items():
        assert service["health"] == "SERVING"
        assert service["pid"] == described["processes"][name]["pid"]
        assert 0 < service["uptime_s"] < 600
    assert services["gateway"]["free_capacity"] == services["gateway"]["limit"] == 64
    # The ingress services answer on HTTP; their limits are their own.
    assert services["telephony"]["free_capacity"] == services["telephony"]["limit"] == 32
    assert services["web"]["address"].endswith("/healthz") and services["web"]["limit"] == 16
    assert data["redis"]["ok"]
    frontend = f"127.0.0.1:{running_stack.ports['frontend']}"  # Redis db 0 is shared
    (replica,) = [r for r in data["frontend_registry"] if r["address"] == frontend]
    # The call's slot comes back once the frontend has closed its session, which may
    # be a moment after `kame talk` returned, on a loaded machine.
    deadline = time.monotonic() + 10.0
    while replica["free_slots"] != replica["total_slots"] and time.monotonic() < deadline:
        time.sleep(0.5)
        data = json.loads(kame("status", "--gateway", running_stack.gateway, "--json").stdout)
        (replica,) = [r for r in data["frontend_registry"] if r["address"] == frontend]
    assert replica["free_slots"] == replica["total_slots"] > 0
    latencies = {latency["name"]: latency for latency in data["latencies"]}
    assert latencies["response latency"]["count"] >= 1
    assert 0 < latencies["response latency"]["quantiles_s"]["p50"] < 10
    frames = latencies["frame round trip"]
    assert frames["count"] > 20 and 0 <= frames["late_share"] <= 1
    assert 0 < data["latency_window_s"] <= 330
