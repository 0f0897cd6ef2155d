"""`python -m services.stt` as operators run it: flags, health, and a drain on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def test_a_bad_flag_exits_2_naming_the_field():
    process = subprocess.run(
        [sys.executable, "-m", "services.stt", "--device", "tpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 2
    assert "device: 'tpu' is not allowed; choose one of 'cpu', 'cuda', 'auto'" in process.stderr


def test_serves_health_and_drains_on_sigterm():
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.stt",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "0",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = None
        deadline = time.monotonic() + 60
        while address is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if match := re.search(r"stt serving .* on (\S+:\d+)", line):
                address = match.group(1)
        assert address, "the service never said where it listens"
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service="kame.v1.Stt"), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()
