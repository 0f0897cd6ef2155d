"""`kame llm-server`: serves the embedded model, warms it up, prints its URL, stops
cleanly; `kame up` waits for its ready line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kame_cli import llm_server
from kame_cli.stack import Stack
from kame_cli.stack_options import Ports, StackOptions, free_ports
from services.oracle.prompts import gemma_prefix, warm_up_chat_messages


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_llm_server_prints_its_url_serves_gemma_and_stops(stop_signal, tmp_path):
    port = free_ports(1)[0]
    log = tmp_path / "stderr.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "kame_cli", "llm-server", "--port", str(port), "--threads", "1"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        line = process.stdout.readline()  # blocks until the server answers (or the CLI exits)
        url = f"http://127.0.0.1:{port}/v1"
        assert line.startswith(f"LLM server ready at {url} (model gemma-3-270m)"), line
        assert "kame llm-server: warmed up in" in log.read_text()  # before it said ready
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


def test_kame_up_waits_until_the_llm_server_is_warm(tmp_path):
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path))
    llm = stack._llm_child()
    try:
        stack.start_and_wait([llm])
        # Ready means warmed up: the ready line comes after the warm-up, and only it counts.
        assert llm.has_logged(llm_server.READY_LINE)
        lines = llm.log_path.read_text().splitlines()
        warmed = next(i for i, line in enumerate(lines) if "warmed up in" in line)
        ready = next(i for i, line in enumerate(lines) if line.startswith(llm_server.READY_LINE))
        assert warmed < ready
    finally:
        stack.stop()


def test_kame_llm_server_warms_with_the_prefix_the_oracle_sends():
    path, body = llm_server.warm_up_request(llm_server.EMBEDDED_ALIAS)
    assert (path, body["prompt"], body["max_tokens"]) == ("/completions", gemma_prefix(), 1)
    path, body = llm_server.warm_up_request("qwen2.5-7b-instruct")
    assert (path, body["messages"], body["max_tokens"]) == (
        "/chat/completions",
        warm_up_chat_messages(),
        1,
    )
