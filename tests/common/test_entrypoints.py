"""Every service process starts the same way: `--help` lists each setting with
its environment variable, and a bad setting exits 2 with a message naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {
    "gateway": "KAME_GATEWAY_PORT",
    "frontend": "KAME_FRONTEND_ENGINE",
    "stt": "KAME_STT_PARTIAL_INTERVAL_S",
    "oracle": "KAME_ORACLE_BACKEND",
    "web": "KAME_WEB_GATEWAY_ADDRESS",
}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_help_lists_settings_with_their_environment_variables(service):
    result = _run(f"services.{service}", "--help")
    assert result.returncode == 0, result.stderr
    assert SERVICES[service] in " ".join(result.stdout.split())


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_bad_setting_exits_2_naming_the_field(service):
    result = _run(f"services.{service}", "--port", "not-a-port")
    assert result.returncode == 2
    assert "port (--port): expected an integer, got 'not-a-port'" in result.stderr
