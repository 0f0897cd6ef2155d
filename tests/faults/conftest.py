"""The stack as `kame up` runs it, for breaking under a live call: every
service and the LLM server its own process (kame_cli.stack.Stack, on free
ports), so that a test can stop, continue, kill and restart one of them.

The stack uses its own Redis database (11) so that the frontend capacity
registry it reads holds only this stack's replica, whatever other test runs
share the Redis server. `kame up`'s supervisor runs beside it, as in `kame up`
(a shorter backoff): a killed process is started again by it, not by the test.
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

import pytest

from kame_cli.child import Child
from kame_cli.stack import Stack
from kame_cli.stack_options import Ports, StackOptions
from kame_cli.supervise import Supervisor
from tests.support.redis import with_db

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
        with Stack(options) as stack, Supervisor(stack, backoff_s=0.2, backoff_max_s=2.0).running():
            yield stack


def child(stack: Stack, name: str) -> Child:
    return next(c for c in stack.children if c.name == name)


def restart(stack: Stack, name: str, timeout_s: float = 120.0) -> float:
    """SIGKILL one service and wait until the supervisor has started it again and
    it answers; the seconds that took."""
    process = child(stack, name)
    restarts = process.restarts
    process.signal(signal.SIGKILL)
    started = time.monotonic()
    while process.restarts == restarts or not process.ready():
        assert time.monotonic() - started < timeout_s, f"{name} did not come back"
        time.sleep(0.1)
    return time.monotonic() - started
