"""The decode queue every session of a process shares.

A fixed pool of worker threads runs Whisper decodes, finals before partials.
Each session has at most one partial waiting and one running: a newer partial
replaces the waiting one (its audio is a superset), which is how overload
turns into skipped partials instead of a growing backlog. Finals are never
dropped. With two or more workers, partials never hold the last free worker,
so a final starts as soon as it is queued instead of waiting for a partial.
The queue is thread-based, so it is independent of any asyncio loop; callers
await the concurrent futures it returns with `asyncio.wrap_future`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

from services.stt import metrics

# The queue holds jobs of any result type; each submit hands back a future typed
# with its own job's result.
Job = Callable[[], Any]
ResultT = TypeVar("ResultT")


class DecodeScheduler:
    def __init__(self, workers: int, name: str = "stt-decode") -> None:
        self._cond = threading.Condition()
        self._finals: collections.deque[tuple[Hashable, Future[Any], Job]] = collections.deque()
        self._partials: collections.OrderedDict[Hashable, tuple[Future[Any], Job]] = (
            collections.OrderedDict()
        )
        self._partial_workers = max(workers - 1, 1)
        self._running_partials: set[Hashable] = set()  # owners
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting for a worker."""
        with self._cond:
            return len(self._finals) + len(self._partials)

    def submit_final(self, owner: Hashable, job: Callable[[], ResultT]) -> Future[ResultT]:
        future: Future[ResultT] = Future()
        with self._cond:
            self._check_open()
            self._finals.append((owner, future, job))
            self._changed()
        return future

    def submit_partial(self, owner: Hashable, job: Callable[[], ResultT]) -> Future[ResultT]:
        """Queue a partial for `owner`, replacing (and cancelling) one still waiting."""
        future: Future[ResultT] = Future()
        with self._cond:
            self._check_open()
            replaced = self._partials.pop(owner, None)
            if replaced is not None:
                replaced[0].cancel()
                metrics.PARTIALS_SKIPPED.labels(reason="superseded").inc()
            self._partials[owner] = (future, job)
            self._changed()
        return future

    def withdraw_partial(self, owner: Hashable) -> bool:
        """Drop `owner`'s waiting partial, if any (its utterance is being finalized)."""
        with self._cond:
            queued = self._partials.pop(owner, None)
            if queued is not None:
                queued[0].cancel()
                self._changed()
        return queued is not None

    def cancel(self, future: Future[Any]) -> None:
        """Withdraw a job that has not started (a running one finishes; its result stays)."""
        with self._cond:
            self._remove(lambda _owner, queued: queued is future)

    def cancel_owner(self, owner: Hashable) -> None:
        """Withdraw every waiting job of `owner` (a session that went away)."""
        with self._cond:
            self._remove(lambda queued_owner, _future: queued_owner == owner)

    def close(self) -> None:
        """Stop the workers once they finish their current job; waiting jobs are cancelled."""
        with self._cond:
            self._closed = True
            self._remove(lambda _owner, _future: True)
        for thread in self._threads:
            thread.join()

    def _remove(self, match: Callable[[Hashable, Future[Any]], bool]) -> None:
        for owner, (future, _job) in list(self._partials.items()):
            if match(owner, future):
                future.cancel()
                del self._partials[owner]
        kept: collections.deque[tuple[Hashable, Future[Any], Job]] = collections.deque()
        for owner, future, job in self._finals:
            if match(owner, future):
                future.cancel()
            else:
                kept.append((owner, future, job))
        self._finals = kept
        self._changed()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the decode scheduler is closed")

    def _changed(self) -> None:
        metrics.DECODE_QUEUE_DEPTH.set(len(self._finals) + len(self._partials))
        self._cond.notify_all()

    def _runnable_partial(self) -> Hashable | None:
        """The owner of the oldest partial that may start now, if any."""
        if len(self._running_partials) >= self._partial_workers:
            return None
        return next(
            (owner for owner in self._partials if owner not in self._running_partials), None
        )

    def _next(self) -> tuple[Hashable | None, Future[Any], Job] | None:
        """The next job: (owner if it is a partial else None, future, job); None to stop."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._finals:
                    _owner, future, job = self._finals.popleft()
                    self._changed()
                    return None, future, job
                owner = self._runnable_partial()
                if owner is not None:
                    future, job = self._partials.pop(owner)
                    self._running_partials.add(owner)
                    self._changed()
                    return owner, future, job
                self._cond.wait()

    def _work(self) -> None:
        while (item := self._next()) is not None:
            partial_owner, future, job = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(job())
                    except BaseException as exc:
                        future.set_exception(exc)
            finally:
                if partial_owner is not None:
                    with self._cond:
                        self._running_partials.discard(partial_owner)
                        self._cond.notify_all()
