"""Semantic end of turn: a short pause ends the turn only if the caller sounds finished.

A fixed pause cannot tell "What is the capital of France?" from "What is
the capital of ... France?": 0.4 s cuts off every caller who stops for
0.6-0.9 s mid-question, and a longer one makes every finished question
wait. `SmartTurnDetector` is the level-VAD turn detector of turns.py with
another rule for the pause:

- after `first_ask_s` of silence, and on each of the next `asks - 1` frames,
  it asks Smart Turn v3.2 (kame_common.turn_model: does this audio sound like
  a finished turn?) about the turn's audio so far, in a worker thread: the
  frame's step never waits for it; an answer is read on a later frame;
- all `asks` answers >= `threshold` -> TURN_END at once;
- any answer below it (or a failed call) -> no more asking in this pause: the
  turn ends after `fallback_s` of silence, longer than the pauses people make
  mid-sentence. A caller who speaks again before that keeps the turn.
- the transcript rule: when the caller's latest transcript (stt's, relayed
  by the gateway) covers the end of the speech and its last word is one no
  English question ends with ("of", "the", "is"...), the turn waits for the
  fallback whatever the model says;
- the words rule: when that transcript covers the end of the speech and is a
  finished question (Whisper's question mark closes it, its last word does
  not dangle), the turn ends after `words_end_s` (0.24 s) of silence, whatever
  the model says. The three signals together, by how long the pause already
  is: 0.16-0.32 s, the model's two asks or the words; 1.04 s, the silence.

Why the words may overrule the model: on espeak-ng's voices (and at 8 kHz)
Smart Turn scores the part of a question before a mid-sentence pause as
complete more often than the whole question (turn_bench.json's clips: both
asks >= 0.5 for 57-71 % of the prefixes, 43 % of the whole questions), so no
threshold on it ends their finished questions early without cutting paused
callers off; Whisper's "?" is what tells them apart. A question mark on a
part of a question (stt guessing one on "What is the capital?") cuts that
caller off: docs/turn-taking.md says how often the bench sees it.

Why ask only early in the pause, and demand a high threshold: the model's
"complete" grows with the silence it hears, on unfinished questions as
well (kame_cli/bench/turn_bench.py: asked on every frame, 71-100 % of questions cut
0.6-0.9 s before their end were cut off at any threshold). Asked at 0.16 and
0.24 s with 0.96, replayed through this detector (the same script, the
README's Turn-taking section), it ends 61 % of piper's finished questions
0.32 s into the pause and cuts off 5 of 56 questions paused mid-way (the
fixed 0.4 s pause: all 56). It hears espeak-ng's formant voices as people
rarely sound and almost never says "complete" at 0.96 for them, so their
turns wait for the fallback (the safe side).

The replica's settings (FrontendSettings.turn_*) pick the mode; a session
that names its own `turn_end_silence_s` gets that fixed pause. Without the
model file the replica logs it once and uses the fixed pause.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE, Samples, resample
from kame_common.models import ModelNotInstalled
from kame_common.turn_model import MODEL_RATE, WINDOW_S, SmartTurn
from services.frontend.engines.base import DEFAULT_TURN_END_SILENCE_S
from services.frontend.engines.turns import LevelVad, TurnDetector, TurnEvent

log = logging.getLogger(__name__)

# Audio kept before the voiced run that started the turn: the model was
# trained on turns with a little silence ahead of the speech.
PREROLL_S = 0.24
# The transcript covers the end of the speech when its audio reaches within
# this much of it (the level VAD and stt's Silero VAD differ by a frame or two).
COVER_TOLERANCE_S = 0.16
# Words no English question ends with: a caller whose words so far end in one
# has more to say. Function words only ("first", "now"... can end a question).
DANGLING_WORDS = frozenset(
    "a an the of in on at to for from with by about into than as and or but if "
    "is are was were be do does did can could will would should has have had "
    "what which who whose where when how why my your his her their our its this that".split()
)


def asks_a_finished_question(text: str) -> bool:
    """The words end a question: a question mark (closing quotes or brackets
    after it allowed) and a last word that does not dangle."""
    return bool(re.search(r"\?['\")\]]*\s*$", text)) and not ends_unfinished(text)


def ends_unfinished(text: str) -> bool:
    """The words end in one no question ends with (no words: not unfinished)."""
    words = re.findall(r"[a-z0-9']+", text.lower())
    return bool(words) and words[-1] in DANGLING_WORDS


@dataclass(frozen=True)
class TurnTaking:
    """The replica's turn-taking for sessions that leave turn_end_silence_s 0
    (FrontendSettings.turn_*: their help says what each is)."""

    mode: str = "smart_turn"
    silence_s: float = DEFAULT_TURN_END_SILENCE_S
    threshold: float = 0.96
    first_ask_s: float = 0.16
    asks: int = 2
    fallback_s: float = 1.04
    words_end_s: float = 0.24  # the words rule (the module doc); 0 = off


class TurnDetectors:
    """Makes each session's turn detector. Loads Smart Turn once per replica
    and runs its calls on one worker thread for all sessions (a call takes
    35 ms on one core; a session's asks are two frames apart)."""

    def __init__(self, taking: TurnTaking, model_path: Path | None = None) -> None:
        self.taking = taking
        self.model: SmartTurn | None = None
        self._executor: ThreadPoolExecutor | None = None
        if taking.mode != "smart_turn":
            return
        try:
            self.model = SmartTurn(model_path)
        except ModelNotInstalled as exc:
            log.warning(
                "turn detection falls back to a fixed %g s pause: %s", taking.silence_s, exc
            )
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="smart-turn")
        log.info("turn detection: Smart Turn (%s), threshold %g", self.model.path, taking.threshold)

    def for_session(self, turn_end_silence_s: float = 0.0) -> TurnDetector:
        """A session's detector: its own fixed pause if it names one, else the replica's."""
        if turn_end_silence_s > 0:
            return TurnDetector(turn_end_silence_s)
        if self.model is None or self._executor is None:
            return TurnDetector(self.taking.silence_s)
        return SmartTurnDetector(self.model.predict, self._executor, self.taking)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)


class SmartTurnDetector(TurnDetector):
    """TurnDetector whose pause ends the turn early when Smart Turn hears the
    caller finished (the module doc). `predict(audio_16k) -> p(complete)` runs
    on `executor`."""

    def __init__(
        self,
        predict: Callable[[Samples], float],
        executor: Executor,
        settings: TurnTaking,
        onset_frames: int = 2,
        vad: LevelVad | None = None,
    ) -> None:
        super().__init__(settings.fallback_s, onset_frames, vad)
        self.settings = settings
        self._predict = predict
        self._executor = executor
        self._first_ask_frames = max(1, round(settings.first_ask_s / FRAME_SECONDS))
        words_frames = round(settings.words_end_s / FRAME_SECONDS)
        self._words_frames = max(1, words_frames) if settings.words_end_s > 0 else None
        self._recent: deque[Samples] = deque(maxlen=round((WINDOW_S + PREROLL_S) / FRAME_SECONDS))
        self._answers: list[Future[float]] = []  # this pause's asks, in order
        self._gave_up = False  # an answer said "incomplete": the fallback decides
        self._heard = ("", -1.0)  # the latest transcript's text and end_s
        # The last pause's answers and how its turn ended ("model" or "silence").
        self.probabilities: list[float] = []
        self.ended_by = ""

    def push(self, frame: Samples) -> TurnEvent:
        self._recent.append(frame)
        return super().push(frame)

    def heard(self, text: str, end_s: float) -> None:
        """The caller's latest transcript (a partial or a final) and where its audio ends."""
        self._heard = (text, end_s)

    def _pause_ends_turn(self) -> bool:
        silent = self.silent_frames
        if silent == 0:  # the caller speaks: a later pause starts over
            self._answers, self._gave_up = [], False
            return False
        if silent >= self.end_frames:
            self.ended_by = "silence"
            return True
        if self._words_end_question(silent):
            self.ended_by = "words"
            return True
        if self._gave_up:
            return False
        if self._model_says_complete():
            self.ended_by = "model"
            return True
        last_ask = self._first_ask_frames + self.settings.asks - 1
        if self._first_ask_frames <= silent <= last_ask:
            try:
                self._answers.append(self._executor.submit(self._ask, self._turn_audio()))
            except RuntimeError:  # the engine is closing: the fallback decides
                self._gave_up = True
        return False

    def _model_says_complete(self) -> bool:
        """Reads the answers that are in (asked on earlier frames); True once all
        `asks` say complete and the transcript does not dangle."""
        probabilities = []
        for answer in self._answers:
            if not answer.done():
                return False
            probability = self._probability(answer)
            probabilities.append(probability)
            if probability < self.settings.threshold:
                self._gave_up = True
                break
        self.probabilities = probabilities
        if self._gave_up or len(probabilities) < self.settings.asks:
            return False
        if self._transcript_dangles():
            self._gave_up = True
            return False
        return True

    @staticmethod
    def _probability(answer: Future[float]) -> float:
        error = answer.exception()
        if error is not None:
            log.error("Smart Turn failed; this pause waits for the fallback", exc_info=error)
            return 0.0
        return answer.result()

    def _words_end_question(self, silent: int) -> bool:
        """The words rule: `silent` frames are enough and the transcript that
        covers the speech's end is a finished question."""
        if self._words_frames is None or silent < self._words_frames:
            return False
        return self._transcript_covers_end() and asks_a_finished_question(self._heard[0])

    def _transcript_dangles(self) -> bool:
        return self._transcript_covers_end() and ends_unfinished(self._heard[0])

    def _transcript_covers_end(self) -> bool:
        speech_end_s = (self.frames - self.silent_frames) * FRAME_SECONDS
        return self._heard[1] >= speech_end_s - COVER_TOLERANCE_S

    def _turn_audio(self) -> Samples:
        """The turn's audio so far at 24 kHz (from just before its speech, at
        most the model's window), a copy the worker may keep."""
        turn_frames = self.frames - round(self.speech_start_s / FRAME_SECONDS)
        keep = min(len(self._recent), turn_frames + round(PREROLL_S / FRAME_SECONDS))
        return np.concatenate(list(self._recent)[-keep:])

    def _ask(self, audio_24k: Samples) -> float:
        return self._predict(resample(audio_24k, SAMPLE_RATE, MODEL_RATE))
