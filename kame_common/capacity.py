"""How many more sessions a replica can serve in time, from its own measurements,
and the heartbeat that publishes it in the Redis capacity registry.

A service has one bottleneck: stt its Whisper decode workers, the oracle its
LLM server. `LoadMeter` measures how busy that resource was over the last
`window_s` (the time-average of the work in progress, each unit of work
counted up to the resource's parallelism). `SessionCapacity` turns that into
sessions:

    per-session load = utilization / the time-averaged number of open sessions
    limit            = floor(target_utilization / per-session load), at least 1,
                       and at most the answer-time bound (kame_common.answer_time)
    free             = limit - open sessions, and 0 while utilization >= target

Until sessions have been measured for a whole window the per-session load is
the service's prior (stt times a decode at start-up; the oracle's is a
setting), then an average that moves a third of the way to each new window's
measurement, so a quiet minute does not open the doors to a crowd. A replica
always takes one session: the limit protects latency, it never refuses the
only caller.

`CapacityPublisher` keeps the counts in the registry (kame_common.store)
where the gateway reads them: the frontend's batch slots, stt's and the
oracle's estimates (`publish_measured_capacity`, with their gauges).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import Gauge
from redis.exceptions import RedisError

from kame_common import store
from kame_common.answer_time import AnswerTimes
from kame_common.config import MeasuredCapacitySettings
from kame_common.server import ServiceRuntime

log = logging.getLogger(__name__)

UTILIZATION = Gauge(
    "kame_capacity_utilization",
    "Share of the replica's bottleneck in use over the last window (stt: decode workers, "
    "oracle: the LLM)",
    ["service"],
)
SESSION_LOAD = Gauge(
    "kame_capacity_session_load",
    "Share of the bottleneck one session takes (measured, or the prior before any was)",
    ["service"],
)
SESSION_LIMIT = Gauge(
    "kame_capacity_sessions",
    "Sessions the replica can serve at its target utilization",
    ["service"],
)
PREDICTED_ANSWER = Gauge(
    "kame_capacity_predicted_answer_seconds",
    "Predicted median answer time (a decode, an LLM request) with one more session "
    "(0 until measured; see kame_common.answer_time)",
    ["service"],
)
FREE_SESSIONS = Gauge(
    "kame_capacity_free_sessions", "Sessions the replica can still take now", ["service"]
)

WITHDRAW_TIMEOUT_S = 2.0
# Each full window with sessions moves the per-session load this far towards its measurement.
LOAD_SMOOTHING = 1 / 3


class LoadMeter:
    """Work in progress on a resource that runs `parallelism` units at once, and its
    utilization over the last `window_s` (0..1). Thread-safe: stt's decode
    workers are threads."""

    def __init__(
        self,
        parallelism: int = 1,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        busy_is_answer: bool = True,
    ) -> None:
        self.parallelism = parallelism
        # Whether a unit of work's duration is what a caller waits for (stt: a decode);
        # the oracle's caller waits for an LLM request's first token, told by `answered`.
        self.busy_is_answer = busy_is_answer
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._level = 0  # units of work in progress now
        # (time, level from then on), oldest first; the first one may predate the window.
        self._steps: collections.deque[tuple[float, int]] = collections.deque([(clock(), 0)])
        # Told each answer time (kame_common.answer_time).
        self.on_done: list[Callable[[float], None]] = []

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Counts one unit of work in progress while the block runs."""
        started = self._clock()
        self._add(1)
        try:
            yield
        finally:
            self._add(-1)
            if self.busy_is_answer:
                self.answered(self._clock() - started)

    def answered(self, seconds: float) -> None:
        """A caller waited `seconds` for an answer from this resource."""
        for observer in self.on_done:
            observer(seconds)

    def _add(self, change: int) -> None:
        with self._lock:
            self._level += change
            self._steps.append((self._clock(), self._level))

    def utilization(self) -> float:
        """Average share of the resource in use over the last window."""
        with self._lock:
            return _time_average(self._steps, self._clock(), self.window_s, self.parallelism)


class SessionCount:
    """Open sessions over time, for the average over a window (not thread-safe:
    sessions open and close on the event loop)."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self.open = 0
        self.started_at = clock()
        self._steps: collections.deque[tuple[float, int]] = collections.deque([(clock(), 0)])

    def changed(self, open_sessions: int) -> None:
        self.open = open_sessions
        self._steps.append((self._clock(), open_sessions))

    def average(self) -> float:
        return _time_average(self._steps, self._clock(), self.window_s, limit=math.inf)


class SessionCapacity:
    """Free sessions of one replica, from its bottleneck's `meter` (see the module doc)."""

    def __init__(
        self,
        meter: LoadMeter,
        prior_session_load: float,
        target_utilization: float = 0.8,
        max_sessions: int = 0,
        clock: Callable[[], float] = time.monotonic,
        answers: AnswerTimes | None = None,
    ) -> None:
        if prior_session_load <= 0:
            raise ValueError(f"prior_session_load must be positive, got {prior_session_load}")
        self.meter = meter
        self.session_load = prior_session_load
        self.target_utilization = target_utilization
        self.max_sessions = max_sessions  # 0: no fixed cap
        self._clock = clock
        self.sessions = SessionCount(meter.window_s, clock)
        self._measured_until = clock()  # end of the last window folded into session_load
        self.answers = answers  # None: no answer-time bound
        if answers is not None:
            meter.on_done.append(lambda seconds: answers.answered(seconds, self.sessions.open))

    def sessions_changed(self, open_sessions: int) -> None:
        self.sessions.changed(open_sessions)

    @property
    def total_slots(self) -> int:
        """Sessions this replica can serve at the target utilization."""
        self._measure()
        limit = max(1, math.floor(self.target_utilization / self.session_load + 1e-9))
        if self.answers is not None and (bound := self.answers.limit()) is not None:
            limit = min(limit, bound)
        return min(limit, self.max_sessions) if self.max_sessions else limit

    @property
    def free_slots(self) -> int:
        total = self.total_slots
        if self.sessions.open and self.meter.utilization() >= self.target_utilization:
            return 0  # saturated now, whatever the estimate says
        return max(0, total - self.sessions.open)

    def _measure(self) -> None:
        """Fold in the last window when it has passed and held sessions throughout."""
        now = self._clock()
        window = self.meter.window_s
        if now - self._measured_until < window or now - self.sessions.started_at < window:
            return
        self._measured_until = now
        sessions = self.sessions.average()
        if sessions < 0.5:
            return  # too few sessions to tell what one costs
        measured = self.meter.utilization() / sessions
        self.session_load += LOAD_SMOOTHING * (measured - self.session_load)
        self.session_load = max(self.session_load, 1e-3)


def _time_average(
    steps: collections.deque[tuple[float, int]], now: float, window_s: float, limit: float
) -> float:
    """Time-average over [now - window_s, now] of min(level, limit) / limit, for a
    step function given as (time, level from then on); drops steps no longer needed."""
    start = now - window_s
    while len(steps) > 1 and steps[1][0] <= start:
        steps.popleft()
    total = 0.0
    for (at, level), following in zip(steps, [*list(steps)[1:], (now, 0)], strict=True):
        span = following[0] - max(at, start)
        if span > 0:
            total += span * (min(level, limit) / limit if math.isfinite(limit) else level)
    return total / window_s


class Capacity(Protocol):
    """What a replica publishes: sessions it can take now, and in all."""

    @property
    def free_slots(self) -> int: ...

    @property
    def total_slots(self) -> int: ...


class CapacityPublisher:
    """Keeps this replica's free slots in the Redis capacity registry: a heartbeat
    every third of the registry TTL, and at once whenever `changed()` is called.

    The loop stops on a flag rather than by cancellation: redis-py (8.1) can
    swallow a CancelledError that lands inside a command, which would leave a
    cancelled heartbeat running forever.
    """

    def __init__(
        self,
        service: str,
        redis_url: str,
        replica_id: str,
        capacity: Capacity,
        secret: str = "",
        redis_timeout_s: float = store.DEFAULT_TIMEOUT_S,
    ) -> None:
        self.replica_id = replica_id
        self.address = ""
        self._capacity = capacity
        self._client = store.connect(redis_url, redis_timeout_s)
        self._registry = store.CapacityRegistry(self._client, service, secret=secret)
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self, address: str) -> None:
        """Publish `address` (host:port the gateway dials) from now on."""
        self.address = address
        self._task = asyncio.create_task(self._heartbeat())

    def changed(self) -> None:
        """Publish the new slot count now rather than at the next heartbeat."""
        self._wake.set()

    async def _heartbeat(self) -> None:
        while not self._closing:
            self._wake.clear()
            try:
                await self._registry.publish(
                    self.replica_id,
                    self.address,
                    self._capacity.free_slots,
                    self._capacity.total_slots,
                )
            except (RedisError, OSError) as exc:
                log.warning("capacity registry unreachable (%s); retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._registry.ttl_s / 3)

    async def close(self) -> None:
        """Stop publishing and withdraw from the registry (best effort when Redis is down)."""
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            # A publish in flight finishes first (or gives up, when Redis is down).
            done, _ = await asyncio.wait([task], timeout=WITHDRAW_TIMEOUT_S)
            if not done:
                task.cancel()
            try:
                await asyncio.wait_for(self._registry.withdraw(self.replica_id), WITHDRAW_TIMEOUT_S)
            except (TimeoutError, RedisError, OSError) as exc:
                log.warning("could not withdraw %s from the registry: %s", self.replica_id, exc)
        await self._client.aclose()


def publish_measured_capacity(
    runtime: ServiceRuntime,
    settings: MeasuredCapacitySettings,
    meter: LoadMeter,
    prior_session_load: float,
) -> Callable[[], None]:
    """Measure the replica's capacity (gauges always; the registry when
    settings.publish_capacity). Returns what to call once the server listens."""
    service = settings.SERVICE
    answers = AnswerTimes(settings.answer_time_factor) if settings.answer_time_factor else None
    capacity = SessionCapacity(
        meter,
        prior_session_load,
        settings.target_utilization,
        settings.max_sessions,
        answers=answers,
    )
    UTILIZATION.labels(service=service).set_function(meter.utilization)
    SESSION_LOAD.labels(service=service).set_function(lambda: capacity.session_load)
    SESSION_LIMIT.labels(service=service).set_function(lambda: capacity.total_slots)
    if answers is not None:
        PREDICTED_ANSWER.labels(service=service).set_function(
            lambda: answers.predicted_s(capacity.sessions.open + 1) or 0.0
        )
    FREE_SESSIONS.labels(service=service).set_function(lambda: capacity.free_slots)
    runtime.on_sessions_changed(capacity.sessions_changed)
    if not settings.publish_capacity:
        return lambda: None
    publisher = CapacityPublisher(
        service,
        settings.redis_url,
        settings.resolved_replica_id(),
        capacity,
        settings.registry_secret,
        settings.redis_timeout_s,
    )
    runtime.on_sessions_changed(lambda _open: publisher.changed())
    runtime.on_drain(publisher.close)  # first, so gateways stop counting on this replica
    log.info(
        "%s publishes its capacity as replica %s (prior load per session %.3f)",
        service,
        publisher.replica_id,
        prior_session_load,
    )
    return lambda: publisher.start(settings.resolved_advertise_address(runtime.port))
