"""What a reopened side stream is sent first, so that a restart loses no words.

When stt restarts (or its connection breaks) in the middle of a question, the
new stream would start at the caller's next frame: the transcript would be the
question's tail ("Japan" for "What is the capital city of Japan?"). So the
gateway keeps the caller frames that stt has not finished with, the frames of
every utterance stt opened and has not finalized, plus a little before them,
and sends them to the new stream first (`SttReplay`).

When the oracle restarts, the turn it was answering is lost with it: the new
stream loads the conversation from Redis, but nothing asks it to answer the
caller's last question. So the gateway keeps the caller's latest final
transcript until an oracle candidate answers it, and a reopened oracle stream
gets it first (`OracleReplay`); the oracle then answers it without saving it
twice (services/oracle/session.py).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from kame_common.audio import FRAME_SECONDS
from kame_common.words import normalize_words
from kamepb import common_pb2

# Audio kept before an utterance's speech start, and, while no utterance is open,
# at the end of what was heard: the VAD flags speech a little after it starts.
LEAD_IN_S = 1.0


@dataclass(frozen=True)
class SttRestart:
    frames: list[common_pb2.AudioFrame]  # to send first, oldest first
    unfinished: list[str]  # the old stream's utterances without a final
    turn_end_s: (
        float | None
    )  # the end of an unfinished utterance's turn, if the caller's turn ended


class SttReplay:
    """The caller frames an stt stream still needs, at most `max_s` of them.

    An utterance stays open, and its frames kept, until its final or until a
    newer stream has answered: a reopening that fails (stt still restarting)
    must leave the next one the same replay. A frame that made stt fail is thus
    sent again until a stream answers or `max_s` of newer audio pushed it out."""

    def __init__(self, max_s: float) -> None:
        self._frames: collections.deque[common_pb2.AudioFrame] = collections.deque(
            maxlen=max(1, round(max_s / FRAME_SECONDS))
        )
        # utterance id -> (speech start in session seconds, the stream that opened it)
        self._open: dict[str, tuple[float, int]] = {}
        self._stream = 0  # streams opened before the current one
        self.turn_end_s: float | None = None  # the caller's latest turn end, session seconds

    def add(self, frame: common_pb2.AudioFrame) -> None:
        self._frames.append(frame)
        self._trim()

    def speech_started(self, utterance_id: str, at_s: float) -> None:
        self._open.setdefault(utterance_id, (at_s, self._stream))

    def heard(self, event: common_pb2.TranscriptEvent) -> None:
        """A transcript (on the session's clock): a final closes its utterance."""
        if event.is_final:
            self._open.pop(event.utterance_id, None)
            self._trim()
        elif event.utterance_id not in self._open:
            start = event.span.start_s if event.HasField("span") else self._end_s()
            self._open[event.utterance_id] = (start, self._stream)

    def answered(self) -> None:
        """The current stream answered: the utterances of the failed ones are its
        business now (it heard their frames again)."""
        self._open = {u: o for u, o in self._open.items() if o[1] == self._stream}
        self._trim()

    def restart(self) -> SttRestart:
        """What a new stream needs first."""
        self._trim()
        turn_end_s = self.turn_end_s
        ended_an_open_one = turn_end_s is not None and any(
            start < turn_end_s for start, _ in self._open.values()
        )
        self._stream += 1
        return SttRestart(
            list(self._frames), list(self._open), turn_end_s if ended_an_open_one else None
        )

    def _end_s(self) -> float:
        return (self._frames[-1].seq + 1) * FRAME_SECONDS if self._frames else 0.0

    def _trim(self) -> None:
        """Drop the frames before what the open utterances (or the lead-in) need."""
        starts = [start for start, _ in self._open.values()]
        keep_from_s = min(starts, default=self._end_s()) - LEAD_IN_S
        while self._frames and (self._frames[0].seq + 1) * FRAME_SECONDS <= keep_from_s:
            self._frames.popleft()


class OracleReplay:
    """The caller's latest final transcript until an oracle candidate answers it."""

    def __init__(self) -> None:
        self.unanswered: common_pb2.TranscriptEvent | None = None

    def final(self, event: common_pb2.TranscriptEvent) -> None:
        if event.is_final and event.text.strip():
            self.unanswered = event

    def update(self, update: common_pb2.OracleUpdate) -> None:
        """A candidate made from the final's words answers it (one made from a
        partial that the final then revised does not)."""
        pending, source = self.unanswered, update.source
        if (
            pending is not None
            and source.utterance_id == pending.utterance_id
            and normalize_words(source.text) == normalize_words(pending.text)
        ):
            self.unanswered = None


def shift_transcript(
    event: common_pb2.TranscriptEvent, offset_s: float
) -> common_pb2.TranscriptEvent:
    """A transcript of a stt stream that began `offset_s` into the session, with
    its audio times moved onto the session's clock."""
    if offset_s:
        if event.HasField("span"):
            event.span.start_s += offset_s
            event.span.end_s += offset_s
        for word in event.words:
            word.start_s += offset_s
            word.end_s += offset_s
    return event
