"""`kame up` as the e2e tests run it: the one way they start, watch and stop it.

`KameUp` runs `kame up --free-ports` in a Redis database of its own (its
gateway's frontend registry then holds only its replica, whatever else shares
the Redis server) and in a session of its own (a Ctrl-C to its group reaches
it alone). A thread reads its output for the whole run into a log file
(kame-up.log in its --log-dir, beside its children's logs): nobody else reads
the pipe once the stack is up, and a full pipe would stall `kame up` on its
next line. `running()` is the async form: up on entry, stopped on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from tests.support.redis import with_db

UP_LINE = "Ctrl-C stops everything."  # kame up's last line once the whole stack is up
UP_TIMEOUT_S = 300.0  # a cold start on a busy 2-core machine takes up to a minute or two
STOP_TIMEOUT_S = 60.0  # kame up stops its children (SIGTERM, then SIGKILL) within this
TAIL_LINES = 40


class KameUp:
    """One `kame up` subprocess, started at once, and everything it has printed."""

    def __init__(
        self,
        flags: Sequence[str],
        log_dir: Path,
        redis_url: str,
        db: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_path = log_dir / "kame-up.log"
        self.redis_url = with_db(redis_url, db)
        self.args = [
            *("up", "--free-ports", "--log-dir", str(log_dir)),
            *("--redis-url", self.redis_url),
            *("--startup-timeout-s", str(UP_TIMEOUT_S)),
            *flags,
        ]
        self.printed = ""  # its output up to UP_LINE, once wait_until_up() returned
        self._lines: list[str] = []
        self._ended = False
        self._stopped = False
        self._changed = threading.Condition()
        log_dir.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kame_cli", *self.args],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        # A daemon: should a child of kame up hold the pipe open, pytest still exits.
        self._drain = threading.Thread(target=self._read_output, name="kame-up", daemon=True)
        self._drain.start()

    def _read_output(self) -> None:
        assert self._process.stdout is not None
        with self.log_path.open("w") as log:
            for line in self._process.stdout:
                log.write(line)
                log.flush()
                with self._changed:
                    self._lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout_s: float) -> str:
        """Its output up to the first line with `text` in it (blocking); an
        AssertionError with its last lines if it exits or stays silent on it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for index, line in enumerate(self._lines):
                    if text in line:
                        return "".join(self._lines[: index + 1])
                remaining = deadline - time.monotonic()
                if self._ended or remaining <= 0:
                    why = "exited" if self._ended else f"did not say it within {timeout_s:.0f} s"
                    raise AssertionError(f"waiting for {text!r}, kame up {why}:\n{self.tail()}")
                self._changed.wait(remaining)

    def wait_until_up(self, timeout_s: float = UP_TIMEOUT_S) -> str:
        started = time.monotonic()
        self.printed = self.wait_for(UP_LINE, timeout_s)
        print(f"kame up was up after {time.monotonic() - started:.0f} s:\n{self.printed}")
        return self.printed

    def address(self, name: str) -> str:
        """A service's HOST:PORT as kame up printed it once up."""
        found = re.search(rf"^\s+{name}\s+(127\.0\.0\.1:\d+)", self.printed, re.M)
        assert found, f"no {name} in kame up's output:\n{self.printed}"
        return found.group(1)

    def output(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def tail(self) -> str:
        return f"... (all of it in {self.log_path})\n" + "".join(self._lines[-TAIL_LINES:])

    def stop(self) -> int:
        """Ctrl-C to its group (kame up stops what it started), SIGKILL if it is
        still there after STOP_TIMEOUT_S; its exit status. Its last lines are
        printed once: pytest shows them if the test fails."""
        if not self._stopped:
            self._stopped = True
            if self._process.poll() is None:
                self._signal_group(signal.SIGINT)
                try:
                    self._process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self._process.wait()
            self._drain.join(10)  # its output ends with it, unless a child holds the pipe
            with self._changed:
                print(f"kame up exited {self._process.returncode}; it printed:\n{self.tail()}")
        return self._process.returncode

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.killpg(self._process.pid, signum)


@contextlib.asynccontextmanager
async def running(
    flags: Sequence[str],
    log_dir: Path,
    redis_url: str,
    db: int,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[KameUp]:
    """`kame up FLAGS` started and up on entry, stopped on exit (even on an error)."""
    up = KameUp(flags, log_dir, redis_url, db, env)
    try:
        await asyncio.to_thread(up.wait_until_up)
        yield up
    finally:
        await asyncio.to_thread(up.stop)
