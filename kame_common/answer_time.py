"""Admission by what callers feel: the answer time of the calls a replica holds.

Utilization (kame_common.capacity) says how busy a resource is, not how long a
caller waits; on two shared cores the two part ways. `AnswerTimes` records
each answer (stt: a decode, the oracle: an LLM request, the gateway: the
caller's end of speech -> the answer's first word) with the number of calls
held when it was given, and predicts the median answer time at n calls:

    unloaded u   = median of the answers given while one call was held
                   (until MIN_UNLOADED of them: the fastest answer seen, which
                   errs towards refusing)
    growth s     = median over loaded answers (n >= 2) of (t / u - 1) / (n - 1)
    predicted(n) = u * (1 + s * (n - 1))

and a replica admits calls while the predicted median stays within
`factor` x u, i.e. up to 1 + (factor - 1) / s calls. The samples are kept
by number, not by age: a quiet spell does not forget what a crowd cost.

Until an answer was given with two calls or more held, answer time sets no
limit (the utilization estimate still applies): answers one at a time say
nothing about what load costs, and a stack that has only served single
callers must not turn away the third caller of its first busy moment. Once
load was measured, a prediction is trusted up to twice the most calls an
answer was measured at (EXTRAPOLATION), like a slow start: a crowd is
admitted in steps as its answers come in. One call is always admitted.

`retry_after_s` is when a held call is expected to end (the median length of
the calls that ended, less the age of the oldest held call): what a refused
caller is told, rather than a constant.
"""

from __future__ import annotations

import collections
import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable

SAMPLES = 64  # loaded answers the growth is the median of
# How far past the most calls measured a prediction is trusted (x that many calls).
EXTRAPOLATION = 2
MIN_UNLOADED = 3
MIN_RETRY_AFTER_S = 1.0
# Before any call has ended: about one capacity heartbeat (kame_common.store, TTL / 3).
DEFAULT_RETRY_AFTER_S = 3.0


class AnswerTimes:
    """Answer times by calls held, and the calls the answer-time bound admits.
    Thread-safe (stt records its decodes from worker threads)."""

    def __init__(self, factor: float = 1.5, clock: Callable[[], float] = time.monotonic) -> None:
        if factor < 1:
            raise ValueError(f"factor must be at least 1, got {factor:g}")
        self.factor = factor
        self._clock = clock
        self._lock = threading.Lock()
        self._unloaded: collections.deque[float] = collections.deque(maxlen=SAMPLES)
        self._loaded: collections.deque[tuple[float, int]] = collections.deque(maxlen=SAMPLES)
        self._fastest = math.inf
        self._most_measured = 0  # the most calls held when an answer was given
        self._held: dict[int, float] = {}  # call number -> when it started
        self._lengths: collections.deque[float] = collections.deque(maxlen=SAMPLES)
        self._numbers = itertools.count()

    def answered(self, seconds: float, calls_held: int) -> None:
        """One answer took `seconds` while `calls_held` calls were held."""
        if not math.isfinite(seconds) or seconds <= 0 or calls_held < 1:
            return
        with self._lock:
            self._fastest = min(self._fastest, seconds)
            self._most_measured = max(self._most_measured, calls_held)
            if calls_held == 1:
                self._unloaded.append(seconds)
            else:
                self._loaded.append((seconds, calls_held))

    def unloaded_s(self) -> float | None:
        with self._lock:
            return self._unloaded_s()

    def _unloaded_s(self) -> float | None:
        if len(self._unloaded) >= MIN_UNLOADED:
            return statistics.median(self._unloaded)
        return self._fastest if math.isfinite(self._fastest) else None

    def growth(self) -> float | None:
        """Relative answer time added per extra call held (None: not measured yet)."""
        with self._lock:
            unloaded = self._unloaded_s()
            if unloaded is None or not self._loaded:
                return None
            return max(
                0.0, statistics.median((t / unloaded - 1) / (n - 1) for t, n in self._loaded)
            )

    def predicted_s(self, calls: int) -> float | None:
        """Predicted median answer time with `calls` held (None: not measured yet)."""
        unloaded, growth = self.unloaded_s(), self.growth()
        if unloaded is None:
            return None
        return unloaded * (1 + (growth or 0.0) * max(0, calls - 1))

    def limit(self) -> int | None:
        """Most calls whose predicted answer median stays within factor x unloaded,
        and at most EXTRAPOLATION x the most calls measured (at least 1); None
        before an answer under load (the module doc)."""
        with self._lock:
            measured = self._most_measured
        growth = self.growth()
        if growth is None:
            return None
        limit = EXTRAPOLATION * measured
        if growth:  # 0: answers did not slow with load
            limit = min(limit, math.floor(1 + (self.factor - 1) / growth + 1e-9))
        return max(1, limit)

    def admits(self, calls_held: int) -> bool:
        """Whether one more call keeps the predicted median within the bound."""
        limit = self.limit()
        return limit is None or calls_held + 1 <= limit

    def call_started(self) -> int:
        """A call is held from now on; returns its number for `call_ended`."""
        number = next(self._numbers)
        with self._lock:
            self._held[number] = self._clock()
        return number

    def call_ended(self, number: int) -> None:
        with self._lock:
            started = self._held.pop(number, None)
            if started is not None:
                self._lengths.append(self._clock() - started)

    @property
    def calls_held(self) -> int:
        with self._lock:
            return len(self._held)

    def retry_after_s(self) -> float:
        """When a held call is expected to end, freeing a place (at least
        MIN_RETRY_AFTER_S; DEFAULT_RETRY_AFTER_S before any call has ended)."""
        with self._lock:
            if not self._lengths or not self._held:
                return DEFAULT_RETRY_AFTER_S
            typical = statistics.median(self._lengths)
            oldest_age = self._clock() - min(self._held.values())
        return round(max(MIN_RETRY_AFTER_S, typical - oldest_age), 1)
