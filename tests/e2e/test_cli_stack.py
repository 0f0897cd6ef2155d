"""The stack as the user runs it: `kame demo` (what `make demo` runs) prints
the question, transcript, answer and latency; `kame up` comes up on loopback
(the web page included) and Ctrl-C takes every process it started down with it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kame_cli.bench import startup
from tests.support import word_recall

pytestmark = pytest.mark.slow


def kame(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kame_cli", *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **popen,
    )


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def test_kame_demo_prints_the_conversation(tmp_path):
    process = kame("demo", "--out-dir", str(tmp_path))
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert re.search(r"Question:\s+What is the capital of France\?", output)
    transcript = re.search(r"Transcript:\s+(.*)", output).group(1)
    assert word_recall("What is the capital of France?", transcript) >= 0.6, output
    answer = re.search(r"Agent's answer:\s+(.*)", output).group(1)
    assert answer and not answer.startswith("("), output
    assert re.search(r"Response latency:\s+\d+\.\d+ s", output), output
    assert re.search(r"Answer latency:\s+\d+\.\d+ s", output), output
    for name in ("question.wav", "answer.wav", "timeline.json", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_kame_up_serves_until_ctrl_c_then_stops_everything(tmp_path, espeak_questions):
    process = kame("up", "--free-ports", "--log-dir", str(tmp_path), start_new_session=True)
    lines = [process.stdout.readline()]
    try:
        # A call placed the moment the gateway accepts, as a phone or a browser would
        # (they read no log line): refused with a retry hint, or answered whole.
        question = espeak_questions[0]
        early, _ = startup.call_at_first_accept(startup.gateway_named(lines[0]), question.audio)
        print(f"call at the first accept: {early.status} {early.status_details} {early.finals}")
        assert startup.outcome(early, question.text) != startup.LOST, early.events
        deadline = time.monotonic() + 240
        while not lines or "Ctrl-C stops everything" not in lines[-1]:
            line = process.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        endpoints = dict(
            re.findall(
                r"^\s+(stt|oracle|frontend|gateway)\s+127\.0\.0\.1:(\d+)", "".join(lines), re.M
            )
        )
        llm_port = int(re.search(r"llm\s+http://127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
        page = re.search(r"open (http://127\.0\.0\.1:(\d+)/)", "".join(lines))
        with urllib.request.urlopen(page.group(1), timeout=5) as reply:
            assert b'<canvas id="timeline"' in reply.read()
        ports = [int(p) for p in endpoints.values()] + [llm_port, int(page.group(2))]
        assert len(endpoints) == 4 and all(answers("127.0.0.1", p) for p in ports)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:  # the test failed early: still stop what kame up started
            process.terminate()
            process.wait(timeout=60)
    assert not [p for p in ports if answers("127.0.0.1", p)], "a process outlived kame up"
    assert "stopping" in process.stdout.read()
