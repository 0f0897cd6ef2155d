"""When to (re)start the oracle's LLM stream: KAME's restart policy.

Pure logic with an injectable clock, so tests drive it tick by tick. The
session calls `decide()` every `poll_interval_s`, and at once after a final
that wants a start, and starts a new LLM stream (cancelling the previous one)
whenever it returns a reason.

`tandem` (the KAME reference policy):
- the first stream of a session starts as soon as there is user text that no
  stream has seen yet (one word is enough), or a final transcript landed;
- afterwards a stream restarts on >= `min_new_words` new user words or on a
  final. Words are counted over the committed finals plus the LONGEST partial
  of each open utterance (a shrinking partial is a revision, not new speech);
- a settled partial (stt says every word of it is stable: the early final's
  words, decoded as soon as the caller pauses) wants a start at once, like a
  final: its candidate is the one a final with the same words keeps;
- a final or settled partial that is already answered (the session found that
  the stream in flight, or the one just finished, was started from the same
  words) commits its words but wants no start;
- at most `max_starts` starts in any sliding window of `start_window_s`: a
  start that would exceed it stays pending until the window frees up;
- `partial_starts` off: ordinary partials start nothing (only settled
  partials and finals do);
- `final_priority` (a priority, not niceness): once stt starts decoding the
  final (`on_final_decode`), ordinary partials start nothing until that
  decode's words arrive (a settled partial or the final), a partial covers
  speech after the decoded audio (the caller went on), or FINAL_DECODE_YIELD_S
  passed; the session also cancels the stream in flight if a partial
  started it. On a CPU the LLM and Whisper share the cores, and a turn waits
  for the final, never for a speculative candidate.

`cascade` (the baseline): the LLM runs only when a final transcript landed.
"""

from __future__ import annotations

import collections
import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

POLICY_NAMES = ("tandem", "cascade")
# The service's partial_starts setting: "auto" decides per session (config.py).
PARTIAL_STARTS = ("auto", "on", "off")
# The longest speculation yields to one final decode (a safety bound: the decode's
# words normally arrive in well under a second, and end the yield).
FINAL_DECODE_YIELD_S = 2.0


class StartReason(enum.Enum):
    FIRST_TEXT = "first_text"  # the session's first user words
    NEW_WORDS = "new_words"  # >= min_new_words since the last start
    FINAL = "final"  # a final transcript landed since the last start
    SETTLED = "settled"  # a partial whose every word is stable (tandem)


@dataclass(frozen=True)
class PolicyParams:
    name: str = "tandem"
    poll_interval_s: float = 0.5
    min_new_words: int = 2
    max_starts: int = 5
    start_window_s: float = 2.0
    partial_starts: bool = True  # tandem: ordinary partials may start a stream
    final_priority: bool = True  # tandem: speculation yields to stt's final decode

    def validate(self) -> None:
        """Raise ValueError naming the first bad parameter."""
        if self.name not in POLICY_NAMES:
            allowed = ", ".join(repr(n) for n in POLICY_NAMES)
            raise ValueError(f"policy {self.name!r} is unknown; choose one of {allowed}")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.min_new_words < 1:
            raise ValueError(f"min_new_words must be >= 1, got {self.min_new_words}")
        if self.max_starts < 1:
            raise ValueError(f"max_starts must be >= 1, got {self.max_starts}")
        if self.start_window_s <= 0:
            raise ValueError(f"start_window_s must be > 0, got {self.start_window_s}")


def count_words(text: str) -> int:
    return len(text.split())


class RestartPolicy:
    def __init__(self, params: PolicyParams, clock: Callable[[], float] = time.monotonic) -> None:
        params.validate()
        self.params = params
        self._clock = clock
        self._final_words = 0
        self._longest_partial: dict[str, int] = {}  # open utterance id -> most words seen
        self._final_pending = False
        self._settled_pending = False
        self._words_at_last_start: int | None = None  # None: no stream started yet
        self._recent_starts: collections.deque[float] = collections.deque()
        # While stt decodes a final: the end of its audio and when the yield began.
        self._final_decode: tuple[float, float] | None = None

    def on_partial(
        self,
        utterance_id: str,
        text: str,
        settled: bool = False,
        answered: bool = False,
        end_s: float = math.inf,
    ) -> None:
        """A partial (its audio ends at `end_s`); a `settled` one that is not `answered`
        wants a start (tandem). A settled one, or one past the final decode's audio,
        ends that decode's yield."""
        if self._final_decode is not None and (settled or end_s > self._final_decode[0]):
            self._final_decode = None
        words = count_words(text)
        if words > self._longest_partial.get(utterance_id, 0):
            self._longest_partial[utterance_id] = words
        if settled and words > 0 and not answered:
            self._settled_pending = True

    def on_final(self, utterance_id: str, text: str, answered: bool = False) -> None:
        """Commit an utterance. A blank final (nothing was said after all) only
        drops the utterance's partials; an `answered` one starts nothing."""
        self._longest_partial.pop(utterance_id, None)
        self._final_decode = None
        words = count_words(text)
        self._final_words += words
        self._final_pending = self._final_pending or (words > 0 and not answered)

    def on_final_decode(self, end_s: float) -> bool:
        """stt started decoding a final over the audio up to `end_s`: whether
        speculation yields to it (tandem with final_priority)."""
        if self.params.name != "tandem" or not self.params.final_priority:
            return False
        self._final_decode = (end_s, self._clock())
        return True

    def _yielding_to_final(self) -> bool:
        if self._final_decode is None:
            return False
        if self._clock() - self._final_decode[1] >= FINAL_DECODE_YIELD_S:
            self._final_decode = None
            return False
        return True

    def on_answer_deferred(self) -> None:
        """The final still wants a candidate of its own: the one it was kept for
        (already answered) stopped short of a tool with side effects, or the
        final's candidate could not reach the LLM server (FinalRetry): start one."""
        self._final_pending = True

    @property
    def user_words(self) -> int:
        """Committed final words plus the longest partial of every open utterance."""
        return self._final_words + sum(self._longest_partial.values())

    def _wanted(self) -> StartReason | None:
        if self._final_pending:
            return StartReason.FINAL
        if self.params.name == "cascade":
            return None
        if self._settled_pending:
            return StartReason.SETTLED
        if not self.params.partial_starts or self._yielding_to_final():
            return None
        if self._words_at_last_start is None:
            return StartReason.FIRST_TEXT if self.user_words > 0 else None
        if self.user_words - self._words_at_last_start >= self.params.min_new_words:
            return StartReason.NEW_WORDS
        return None

    def _window_has_room(self, now: float) -> bool:
        while self._recent_starts and self._recent_starts[0] <= now - self.params.start_window_s:
            self._recent_starts.popleft()
        return len(self._recent_starts) < self.params.max_starts

    def decide(self) -> StartReason | None:
        """Whether to start a new LLM stream now; a returned reason counts as a start."""
        reason = self._wanted()
        if reason is None:
            return None
        now = self._clock()
        if not self._window_has_room(now):
            return None
        self._recent_starts.append(now)
        self.started_from_now()
        return reason

    def started_from_now(self) -> None:
        """The stream being started takes the transcript as it is now: nothing that
        has arrived is pending any more. The session says so again once the previous
        stream is closed, since what landed while it closed (a final: the new
        stream's source) must not start a second stream that cancels the first."""
        self._words_at_last_start = self.user_words
        self._final_pending = self._settled_pending = False


class FinalRetry:
    """A final whose candidate could not reach the LLM server (a restart: the
    connection was refused or broke) is asked again, for `for_s` from its first
    failure, while no newer utterance came; a newer utterance starts the count
    anew."""

    def __init__(self, for_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.for_s = for_s
        self._clock = clock
        self._utterance_id = ""
        self._since = 0.0

    def failed(self, utterance_id: str) -> bool:
        """A candidate of this final failed to reach the LLM: whether to try again."""
        now = self._clock()
        if utterance_id != self._utterance_id:
            self._utterance_id, self._since = utterance_id, now
        return now - self._since < self.for_s
