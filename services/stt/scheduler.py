"""The decode queue every session of a process shares.

A fixed pool of worker threads runs Whisper decodes, finals before partials,
in batches: each round a worker takes up to `max_batch` waiting finals, or
when none waits up to `max_batch` partials, and hands them to `run_batch` in
one call, so concurrent sessions share one encoder and one decoder pass.
Finals never share a batch with partials: a batch takes longer than each of
its decodes, and a turn waits for its final (kame_cli/bench/stt_bench.py at 32
sessions: final lag p90 0.67 s alone, 1.01 s mixed in).
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
import itertools
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

from services.stt import metrics

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")
# Runs one batch of requests; returns one result per request, in order.
BatchRunner = Callable[[list[RequestT]], list[ResultT]]


class DecodeScheduler(Generic[RequestT, ResultT]):
    def __init__(
        self,
        workers: int,
        run_batch: BatchRunner[RequestT, ResultT],
        max_batch: int = 1,
        name: str = "stt-decode",
    ) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._finals: collections.deque[tuple[Hashable, Future[ResultT], RequestT]] = (
            collections.deque()
        )
        self._partials: collections.OrderedDict[Hashable, tuple[Future[ResultT], RequestT]] = (
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

    def submit_final(self, owner: Hashable, request: RequestT) -> Future[ResultT]:
        future: Future[ResultT] = Future()
        with self._cond:
            self._check_open()
            self._finals.append((owner, future, request))
            self._changed()
        return future

    def submit_partial(self, owner: Hashable, request: RequestT) -> Future[ResultT]:
        """Queue a partial for `owner`, replacing (and cancelling) one still waiting."""
        future: Future[ResultT] = Future()
        with self._cond:
            self._check_open()
            replaced = self._partials.pop(owner, None)
            if replaced is not None:
                replaced[0].cancel()
                metrics.PARTIALS_SKIPPED.labels(reason="superseded").inc()
            self._partials[owner] = (future, request)
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

    def cancel(self, future: Future[ResultT]) -> None:
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

    def _remove(self, match: Callable[[Hashable, Future[ResultT]], bool]) -> None:
        for owner, (future, _request) in list(self._partials.items()):
            if match(owner, future):
                future.cancel()
                del self._partials[owner]
        kept: collections.deque[tuple[Hashable, Future[ResultT], RequestT]] = collections.deque()
        for owner, future, request in self._finals:
            if match(owner, future):
                future.cancel()
            else:
                kept.append((owner, future, request))
        self._finals = kept
        self._changed()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the decode scheduler is closed")

    def _changed(self) -> None:
        metrics.DECODE_QUEUE_DEPTH.set(len(self._finals) + len(self._partials))
        self._cond.notify_all()

    def _runnable_partials(self, room: int) -> list[Hashable]:
        """Owners of the oldest partials that may start now (at most `room`)."""
        if len(self._running_partials) >= self._partial_workers:
            return []
        runnable = (owner for owner in self._partials if owner not in self._running_partials)
        return list(itertools.islice(runnable, room))

    def _next_batch(self) -> _Batch[RequestT, ResultT] | None:
        """The next round's batch (finals first, then partials); None to stop."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                batch: _Batch[RequestT, ResultT] = _Batch()
                while self._finals and len(batch.futures) < self._max_batch:
                    _owner, future, request = self._finals.popleft()
                    batch.add(future, request)
                # Finals go alone: a partial in their batch would delay the transcript
                # a turn waits for (a batch takes longer than each of its decodes).
                room = 0 if batch.futures else self._max_batch
                for owner in self._runnable_partials(room):
                    future, request = self._partials.pop(owner)
                    batch.add(future, request, partial_owner=owner)
                if batch.futures:
                    self._running_partials.update(batch.partial_owners)
                    self._changed()
                    return batch
                self._cond.wait()

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                batch.run(self._run_batch)
            finally:
                if batch.partial_owners:
                    with self._cond:
                        self._running_partials.difference_update(batch.partial_owners)
                        self._cond.notify_all()


class _Batch(Generic[RequestT, ResultT]):
    """The requests one worker runs in one call, and whoever waits for them."""

    def __init__(self) -> None:
        self.futures: list[Future[ResultT]] = []
        self.requests: list[RequestT] = []
        self.partial_owners: list[Hashable] = []

    def add(
        self, future: Future[ResultT], request: RequestT, partial_owner: Hashable | None = None
    ) -> None:
        self.futures.append(future)
        self.requests.append(request)
        if partial_owner is not None:
            self.partial_owners.append(partial_owner)

    def run(self, run_batch: BatchRunner[RequestT, ResultT]) -> None:
        """Run the requests whose waiters are still there; a failure reaches all of them."""
        live = [
            (future, request)
            for future, request in zip(self.futures, self.requests, strict=True)
            if future.set_running_or_notify_cancel()
        ]
        if not live:
            return
        metrics.DECODE_BATCH_SIZE.observe(len(live))
        try:
            results = run_batch([request for _future, request in live])
        except BaseException as exc:
            for future, _request in live:
                future.set_exception(exc)
            return
        for (future, _request), result in zip(live, results, strict=True):
            future.set_result(result)
