"""Backchannels are not barge-ins: caller speech over the agent pauses it until
the caller's words say whether they took the turn. Pure: no audio.

"Uh-huh", "yeah", "okay" said while the agent talks tell it to go on; "Wait."
or "Stop." tell it to stop, and both last 240-640 ms to the level VAD
(kame_cli/bench/backchannel_bench.py): their length cannot tell them apart, and the
agent must be silent within 200 ms of a real interruption. So the agent does
not stop at once; it pauses: the tts engine stops playing on the frame the
caller's speech starts (its second voiced frame) and keeps what it was to say.
Its silent frames until the verdict are `held` (AgentAudio.held), so that a
client does not take the pause for the end of the answer.
An `Overlap` then follows that stretch of speech:

- speech longer than `max_speech_s` is a barge-in (a question, not a nod);
- once the caller pauses (PAUSE_FRAMES silent frames) the engine reports a
  turn end at the speech's end, so the gateway sends stt EndOfTurn and stt
  finalizes the words at once; the caller speaking again after that is a
  barge-in;
- the utterance's final (a transcript whose audio reaches past the speech's
  start) decides: all its words are backchannel phrases (or it has none: a
  cough) -> the agent resumes where it paused; any other word -> barge-in;
- no final within `wait_s` of the speech's end -> barge-in (the safe side: an
  agent that stops for a nod costs less than one that talks over a question).

Until the verdict the caller's transcripts of that speech are held back from
the answer policy (a barge-in hands them over; a backchannel never reaches it,
so the answer in progress stays the one that answers the caller's question).
The detector's own turn end of the speech is held too: it ends a caller turn
only after a barge-in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kame_common.audio import FRAME_SECONDS
from kame_common.words import (
    BACKCHANNEL_PHRASES,
    is_backchannel,
    normalize_words,
    parse_phrases,
)
from services.frontend.engines.base import Transcript

# Silent frames after which the caller has paused: the speech's end is known.
PAUSE_FRAMES = 2


@dataclass(frozen=True)
class Backchannels:
    """The replica's backchannel rule (FrontendSettings.backchannel_*: their help)."""

    phrases: str = ", ".join(BACKCHANNEL_PHRASES)
    max_speech_s: float = 0.72  # 0: every caller speech over the agent barges in
    wait_s: float = 0.8

    @property
    def enabled(self) -> bool:
        return self.max_speech_s > 0

    @property
    def phrase_words(self) -> tuple[tuple[str, ...], ...]:
        return parse_phrases(self.phrases)


class Verdict(enum.Enum):
    WAIT = enum.auto()  # the agent stays paused
    RESUME = enum.auto()  # a backchannel: the agent goes on
    BARGE_IN = enum.auto()  # the caller takes the turn: the agent stops


@dataclass
class Overlap:
    """One stretch of caller speech that started while the agent spoke."""

    rule: Backchannels
    speech_start_s: float
    verdict: Verdict = Verdict.WAIT
    speech_end_s: float | None = None  # set once the caller paused (stt was asked)
    held: list[Transcript] = field(default_factory=list)  # this speech's, kept from the policy
    turn_ended: bool = False  # the detector ended the caller's turn while we waited
    _final: Transcript | None = None

    def frame(self, frames: int, silent_frames: int) -> bool:
        """After the turn detector took frame number `frames`; True when stt should
        be asked to finalize now (the caller just paused: `speech_end_s`)."""
        if self.verdict is not Verdict.WAIT:
            return False
        voiced_until_s = (frames - silent_frames) * FRAME_SECONDS
        if voiced_until_s - self.speech_start_s > self.rule.max_speech_s:
            self.verdict = Verdict.BARGE_IN
        elif silent_frames == 0:
            if self.speech_end_s is not None:  # speaking again after a pause
                self.verdict = Verdict.BARGE_IN
        elif silent_frames >= PAUSE_FRAMES:
            asked = self.speech_end_s is None
            self.speech_end_s = voiced_until_s
            self._decide(frames * FRAME_SECONDS)
            return asked
        return False

    def heard(self, transcript: Transcript) -> bool:
        """A caller transcript; True when it is of this speech and held back."""
        if self.verdict is Verdict.BARGE_IN or transcript.end_s <= self.speech_start_s:
            return False
        self.held.append(transcript)
        if transcript.is_final:
            self._final = transcript
        return True

    def _decide(self, now_s: float) -> None:
        assert self.speech_end_s is not None
        if self._final is not None:
            text = self._final.text
            nod = not normalize_words(text) or is_backchannel(text, self.rule.phrase_words)
            self.verdict = Verdict.RESUME if nod else Verdict.BARGE_IN
        elif now_s - self.speech_end_s >= self.rule.wait_s:
            self.verdict = Verdict.BARGE_IN
