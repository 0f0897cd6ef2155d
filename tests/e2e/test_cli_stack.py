"""The stack as the user runs it: `kame demo` (what `make demo` runs) prints
the question, what stt heard (and whether that was the question), the answer
and latency; `kame up` comes up on loopback
(the web page included) and Ctrl-C takes every process it started down with it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request

from kame_cli.bench import startup
from kame_cli.demo import hearing_verdict
from tests.e2e.kame_up import KameUp
from tests.support import word_recall

CLI_DB = 8  # the stack's own Redis database
STARTING_WITHIN_S = 60.0  # its first line comes before anything starts


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def test_kame_demo_prints_the_conversation(tmp_path):
    demo = subprocess.run(
        [sys.executable, "-m", "kame_cli", "demo", "--out-dir", str(tmp_path)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    output = demo.stdout
    assert demo.returncode == 0, output
    assert re.search(r"Question asked:\s+What is the capital of France\?", output)
    transcript, verdict = re.search(r"What stt heard:\s+(.*)\n\s+(.*)", output).groups()
    assert word_recall("What is the capital of France?", transcript) >= 0.6, output
    assert verdict == hearing_verdict("What is the capital of France?", transcript), output
    answer = re.search(r"Agent's answer:\s+(.*)", output).group(1)
    assert answer and not answer.startswith("("), output
    assert re.search(r"Response latency:\s+\d+\.\d+ s", output), output
    assert re.search(r"Answer latency:\s+\d+\.\d+ s", output), output
    for name in ("question.wav", "answer.wav", "timeline.json", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_kame_up_serves_until_ctrl_c_then_stops_everything(tmp_path, redis_url, espeak_questions):
    up = KameUp([], tmp_path, redis_url, CLI_DB)
    try:
        # A call placed the moment the gateway accepts, as a phone or a browser would
        # (they read no log line): refused with a retry hint, or answered whole.
        first_line = up.wait_for("starting the stack", STARTING_WITHIN_S)
        question = espeak_questions[0]
        early, _ = startup.call_at_first_accept(startup.gateway_named(first_line), question.audio)
        print(f"call at the first accept: {early.status} {early.status_details} {early.finals}")
        assert startup.outcome(early, question.text) != startup.LOST, early.events
        printed = up.wait_until_up()
        endpoints = dict(
            re.findall(r"^\s+(stt|oracle|frontend|gateway)\s+127\.0\.0\.1:(\d+)", printed, re.M)
        )
        llm_port = int(re.search(r"llm\s+http://127\.0\.0\.1:(\d+)", printed).group(1))
        page = re.search(r"open (http://127\.0\.0\.1:(\d+)/)", printed)
        with urllib.request.urlopen(page.group(1), timeout=5) as reply:
            assert b'<canvas id="timeline"' in reply.read()
        ports = [int(p) for p in endpoints.values()] + [llm_port, int(page.group(2))]
        assert len(endpoints) == 4 and all(answers("127.0.0.1", p) for p in ports)
        assert up.stop() == 0  # a Ctrl-C to its group: what Ctrl-C in the terminal does
    finally:
        up.stop()  # nothing once stopped; if the test failed early, stops what kame up started
    assert not [p for p in ports if answers("127.0.0.1", p)], "a process outlived kame up"
    assert "stopping" in up.output()
