"""`kame up` keeps its processes running: one that dies is started again.

A process of the stack that exits (a crash, an OOM kill, a `kill -9` in a
test) is restarted on its own ports after a backoff that doubles from
`backoff_s` up to `backoff_max_s`, and starts over once the process has stayed
up for `stable_s`. Every step is printed (`say`): the exit with its status and
the last line of its log, the restart with its new PID, and when it answers
again. Calls in progress ride the restart out: the gateway reopens its side
streams and replays what they missed (services/gateway/replay.py).

The count of restarts per process goes into the stack file, which `kame
status` shows. `poll()` does one round; `kame up`'s main loop calls it, and
tests run it in a thread (`running`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kame_cli.up runs the supervisor
    from kame_cli.child import Child
    from kame_cli.stack import Stack


@dataclass
class _Watch:
    failures: int = 0  # deaths since the process was last up for stable_s
    restart_at: float | None = None  # when a dead process is started again
    started_at: float = 0.0  # monotonic time of the latest start
    back: bool = True  # answered since its latest start


class Supervisor:
    def __init__(
        self,
        stack: Stack,
        say: Callable[[str], None] = print,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_s: float = 60.0,
    ) -> None:
        self.stack = stack
        self.say = say
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stable_s = stable_s
        self._watches: dict[str, _Watch] = {}

    def poll(self) -> None:
        """Look at every process once: note deaths, restart what is due."""
        now = time.monotonic()
        for child in list(self.stack.children):
            watch = self._watches.setdefault(child.name, _Watch(started_at=now))
            if child.running():
                self._watch_running(child, watch, now)
            elif watch.restart_at is None:
                self._note_death(child, watch, now)
            elif now >= watch.restart_at:
                self._restart(child, watch, now)

    def _watch_running(self, child: Child, watch: _Watch, now: float) -> None:
        if not watch.back and child.ready():
            watch.back = True
            self.stack.check_owner(child)
            self.say(f"kame up: {child.name} is back after {now - watch.started_at:.1f} s")
        if watch.back and now - watch.started_at >= self.stable_s:
            watch.failures = 0

    def _note_death(self, child: Child, watch: _Watch, now: float) -> None:
        watch.failures += 1
        delay = min(self.backoff_s * 2 ** (watch.failures - 1), self.backoff_max_s)
        watch.restart_at = now + delay
        assert child.process is not None
        self.say(
            f"kame up: {child.name} exited with status {child.process.returncode} "
            f"({child.last_log_line() or 'no output'}); restarting it in {delay:g} s "
            f"(log {child.log_path})"
        )

    def _restart(self, child: Child, watch: _Watch, now: float) -> None:
        child.start(self.stack.log_dir)
        child.restarts += 1
        watch.restart_at, watch.started_at, watch.back = None, now, False
        assert child.process is not None
        self.say(
            f"kame up: {child.name} restarted (pid {child.process.pid}, restart {child.restarts})"
        )
        self.stack.write_stack_file()

    @contextlib.contextmanager
    def running(self, interval_s: float = 0.2) -> Iterator[Supervisor]:
        """`poll()` every `interval_s` in a thread, for the duration of the block."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval_s):
                self.poll()

        thread = threading.Thread(target=loop, name="kame-supervisor", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
