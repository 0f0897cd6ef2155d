"""Helpers of the CLI tests: run `kame` as a user would (a real process) and
check that a failure is one line on stderr with a non-zero exit status; a real
gateway process with TLS and bearer tokens to be refused by."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kame_cli.child import grpc_serving
from kame_cli.say import write_wav
from kame_cli.stack_options import free_ports
from tests.security.certs import CertificateAuthority

ROOT = Path(__file__).resolve().parents[2]


def kame(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0):
    """`kame ARGS` as a process, from the repository root; its CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "kame_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def assert_fails_in_one_line(result, code: int, pattern: str) -> str:
    """The failure is exactly one line on stderr matching `pattern`, with exit
    status `code` and no traceback anywhere; returns the line."""
    output = f"status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == code, output
    assert "Traceback" not in result.stderr + result.stdout, output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, output
    assert re.search(pattern, lines[0]), output
    return lines[0]


@pytest.fixture
def wav(tmp_path) -> Path:
    """A valid caller WAV: 16-bit mono, a second of tone at 16 kHz."""
    path = tmp_path / "caller.wav"
    t = np.arange(16_000) / 16_000
    write_wav(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16_000)
    return path


@dataclass(frozen=True)
class TlsGateway:
    address: str
    ca_file: Path  # signed the gateway's certificate
    other_ca_file: Path  # did not
    token: str


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory, redis_url) -> Iterator[TlsGateway]:
    """A real gateway process serving TLS and requiring a bearer token."""
    folder = tmp_path_factory.mktemp("gateway-tls")
    ca, other = CertificateAuthority("kame test CA"), CertificateAuthority("unrelated CA")
    cert, key = ca.server().write(folder, "server")
    port, token = free_ports(1)[0], "a-test-token-of-32-characters-xx"
    env = {
        "KAME_GATEWAY_HOST": "127.0.0.1",
        "KAME_GATEWAY_PORT": str(port),
        "KAME_GATEWAY_METRICS_PORT": "0",
        "KAME_GATEWAY_REDIS_URL": redis_url,
        "KAME_GATEWAY_AUTH_TOKENS": token,
        "KAME_GATEWAY_TLS_CERT_FILE": str(cert),
        "KAME_GATEWAY_TLS_KEY_FILE": str(key),
        # No upstreams here: without the readiness check it serves (and refuses) at once.
        "KAME_GATEWAY_READINESS_INTERVAL_S": "0",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "services.gateway"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not grpc_serving(f"127.0.0.1:{port}", ca.pem):
            assert process.poll() is None, "the gateway exited at start"
            assert time.monotonic() < deadline, "the gateway did not serve within 60 s"
            time.sleep(0.2)
        yield TlsGateway(
            f"127.0.0.1:{port}", ca.write(folder, "ca"), other.write(folder, "other-ca"), token
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
