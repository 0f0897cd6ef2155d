"""Caller turns and their latency summary (pure logic, wall clock passed in).

A turn is what the caller says between two agent answers: one or more
utterances of the stt service (a pause inside a sentence can split it). The
turn is answered when the agent's audio starts leaving the gateway (speaking
goes from False to True). Two latencies, side by side:

- response latency: that first agent audio minus the caller's end of speech
  (the SPEECH_END of the turn's last utterance, mapped to wall time; with
  push-to-talk, when the caller asked for the answer, if later). Negative
  when the agent started before the caller stopped.
- answer latency: the first word of the answer itself (a word of an oracle
  candidate, or any agent word in s2s mode) minus the end of speech. A hold
  phrase ("Hmm,") that starts the agent's audio early makes the response
  early, not the answer.

The facts arrive in any order: stt reports SPEECH_END after its endpoint
silence, and a fast agent may already be talking. A turn's summary is ready
once the end of speech and the first audio are known, no utterance of the turn
is still open, and either the answer's first word is known or the turn is
closed (the caller started a new turn, or the session ended). Each turn is
summarized exactly once: `pop_ready()` hands over the turns that became ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kamepb import common_pb2, gateway_pb2


@dataclass
class Turn:
    started_wall: float
    utterances: dict[str, str] = field(default_factory=dict)  # id -> latest hypothesis
    open_utterances: set[str] = field(default_factory=set)  # started, no SPEECH_END yet
    speech_end_wall: float | None = None
    first_partial_wall: float | None = None
    final_wall: float | None = None
    stt_final_lag_s: float = 0.0
    first_oracle_update_wall: float | None = None
    answered_wall: float | None = None  # first agent audio
    answer_word_wall: float | None = None  # first word of the answer itself
    closed: bool = False
    summarized: bool = False
    traced: bool = False

    @property
    def user_text(self) -> str:
        return " ".join(text for text in self.utterances.values() if text)

    @property
    def last_utterance_id(self) -> str:
        return next(reversed(self.utterances), "")

    @property
    def response_latency_s(self) -> float | None:
        if self.answered_wall is None or self.speech_end_wall is None:
            return None
        return self.answered_wall - self.speech_end_wall

    @property
    def answer_latency_s(self) -> float | None:
        if self.answer_word_wall is None or self.speech_end_wall is None:
            return None
        return self.answer_word_wall - self.speech_end_wall

    @property
    def oracle_first_update_s(self) -> float:
        if self.first_partial_wall is None or self.first_oracle_update_wall is None:
            return 0.0
        return max(0.0, self.first_oracle_update_wall - self.first_partial_wall)

    @property
    def ready(self) -> bool:
        return (
            not self.summarized
            and not self.open_utterances
            and self.response_latency_s is not None
            and (self.answer_word_wall is not None or self.closed)
        )

    def summary(self) -> gateway_pb2.TurnSummary:
        return gateway_pb2.TurnSummary(
            utterance_id=self.last_utterance_id,
            user_text=self.user_text,
            response_latency_s=self.response_latency_s or 0.0,
            stt_final_lag_s=self.stt_final_lag_s,
            oracle_first_update_s=self.oracle_first_update_s,
            answer_latency_s=self.answer_latency_s or 0.0,
        )


class TurnTracker:
    """Feeds on stt events, oracle updates and the agent's audio and words."""

    def __init__(self) -> None:
        self.current: Turn | None = None  # the turn the caller is in, not yet answered
        self._by_utterance: dict[str, Turn] = {}
        self.turns: list[Turn] = []

    def _turn_for(self, utterance_id: str, wall: float) -> Turn:
        turn = self._by_utterance.get(utterance_id)
        if turn is None:
            if self.current is None:
                for earlier in self.turns:
                    earlier.closed = True
                self.current = Turn(started_wall=wall)
                self.turns.append(self.current)
            turn = self.current
            turn.utterances.setdefault(utterance_id, "")
            self._by_utterance[utterance_id] = turn
        return turn

    def on_speech_start(self, utterance_id: str, wall: float) -> None:
        self._turn_for(utterance_id, wall).open_utterances.add(utterance_id)

    def on_speech_end(self, utterance_id: str, end_wall: float) -> None:
        turn = self._turn_for(utterance_id, end_wall)
        turn.open_utterances.discard(utterance_id)
        if turn.speech_end_wall is None or end_wall > turn.speech_end_wall:
            turn.speech_end_wall = end_wall

    def on_answer_asked(self, wall: float) -> None:
        """Push-to-talk (MANUAL): the caller asked for the answer now. The agent may not
        answer before, so the turn's latencies count from here, not from an end of
        speech the caller then waited after."""
        turn = self.current
        if turn is not None and (turn.speech_end_wall is None or wall > turn.speech_end_wall):
            turn.speech_end_wall = wall

    def on_transcript(self, event: common_pb2.TranscriptEvent, wall: float) -> Turn:
        """Record a hypothesis; returns the turn it belongs to."""
        turn = self._turn_for(event.utterance_id, wall)
        turn.utterances[event.utterance_id] = event.text
        if turn.first_partial_wall is None:
            turn.first_partial_wall = wall
        if event.is_final:
            turn.final_wall = wall
            turn.stt_final_lag_s = event.lag_s
        return turn

    def on_oracle_update(self, wall: float) -> None:
        turn = self.current or (self.turns[-1] if self.turns else None)
        if turn is not None and turn.first_oracle_update_wall is None:
            turn.first_oracle_update_wall = wall

    def on_agent_audio_start(self, wall: float) -> None:
        """The agent started speaking: it answers the current turn, if any."""
        turn, self.current = self.current, None
        if turn is not None:
            turn.answered_wall = wall

    def on_answer_word(self, wall: float) -> None:
        """A word of the answer itself left the gateway: the first one after the
        agent started answering the latest turn counts."""
        answered = [t for t in self.turns if t.answered_wall is not None]
        if answered and answered[-1].answer_word_wall is None:
            answered[-1].answer_word_wall = wall

    def close(self) -> None:
        """The session ends: no turn waits any longer for an answer word."""
        for turn in self.turns:
            turn.closed = True

    def pop_ready(self) -> list[Turn]:
        """The turns whose summary became ready since the last call, once each."""
        ready = [turn for turn in self.turns if turn.ready]
        for turn in ready:
            turn.summarized = True
        return ready
