"""The stack as `kame up` runs it, for breaking under a live call: every
service and the LLM server its own process (kame_cli.stack.Stack, on free
ports), so that a test can stop, continue, kill and restart one of them.

The stack uses its own Redis database (11) so that the frontend capacity
registry it reads holds only this stack's replica, whatever other test runs
share the Redis server.
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

import pytest

from kame_cli.stack import Child, Ports, Stack, StackOptions
from tests.e2e.conftest import with_db

FAULT_DB = 11


@pytest.fixture(scope="module")
def process_stack(redis_url):
    # Not under pytest's base temp: a concurrent pytest run may prune that while
    # the stack still writes its logs there.
    with tempfile.TemporaryDirectory(prefix="kame-faults-") as log_dir:
        options = StackOptions(
            ports=Ports.free(),
            redis_url=with_db(redis_url, FAULT_DB),
            log_dir=Path(log_dir),
        )
        with Stack(options) as stack:
            yield stack


def child(stack: Stack, name: str) -> Child:
    return next(c for c in stack.children if c.name == name)


def restart(stack: Stack, name: str, timeout_s: float = 120.0) -> float:
    """SIGKILL one service and start it again on its port; the seconds until it
    answered SERVING. A start that exits at once is tried again (twice): this
    is about the call surviving the restart, not about the restart itself."""
    process = child(stack, name)
    process.signal(signal.SIGKILL)
    assert process.process is not None
    process.process.wait()
    started = time.monotonic()
    for attempt in range(3):
        process.start(stack.log_dir)
        while process.running() and not process.ready():
            assert time.monotonic() - started < timeout_s, f"{name} did not come back"
            time.sleep(0.2)
        if process.running():
            return time.monotonic() - started
        print(f"{name} exited at start (attempt {attempt + 1}):\n{process.log_tail()}")
        time.sleep(1.0 + attempt)  # what made it exit (its log says) may pass meanwhile
    raise AssertionError(f"{name} did not start again: {process.log_tail()}")
