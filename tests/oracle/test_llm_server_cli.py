"""`kame llm-server`: serves the embedded model, prints its URL, stops cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kame_cli.stack import free_ports


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_llm_server_prints_its_url_serves_gemma_and_stops(stop_signal):
    port = free_ports(1)[0]
    process = subprocess.Popen(
        [sys.executable, "-m", "kame_cli", "llm-server", "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline()  # blocks until the server answers (or the CLI exits)
        url = f"http://127.0.0.1:{port}/v1"
        assert line.startswith(f"LLM server ready at {url} (model gemma-3-270m)"), line
        request = urllib.request.Request(
            f"{url}/completions",
            method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"prompt": "User: Hi!\nAssistant:", "max_tokens": 4}).encode(),
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.load(response)["choices"][0]["text"].strip()
        process.send_signal(stop_signal)
        assert process.wait(30) == 0
        deadline = time.monotonic() + 10
        while port_open(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not port_open(port), "the llama.cpp child outlived the CLI"
    finally:
        process.kill()
        process.wait()


def test_a_missing_model_file_is_reported():
    result = subprocess.run(
        [sys.executable, "-m", "kame_cli", "llm-server", "--model", "/nonexistent/m.gguf"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "model file /nonexistent/m.gguf does not exist" in result.stderr
