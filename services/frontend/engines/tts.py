"""The `tts` engine: speaks oracle answers with the piper voice once the caller's turn ends.

No speech LM: the agent says the oracle's text, in the embedded piper voice
(`kame_common.voice`, 24 kHz). It runs on any CPU. In tandem it is a
speculative cascade: the oracle's LLM starts on partial transcripts while the
caller talks, and the agent speaks a candidate only when the caller's turn has
ended and the candidate answers what the caller actually said; otherwise it
holds the floor briefly (a hold phrase or silence), and it never splices two
candidates into one utterance. That policy is `commit.AnswerPolicy` (pure, its
rules in its docstring); this module is the audio around it.

Turns. A turn detector watches the caller frames: SPEECH_START after two
voiced frames, TURN_END after the session's `turn_end_silence_s` of pause or,
when it leaves that 0, as the replica's turn-taking says (semantic_turns.py:
Smart Turn early in the pause, else a longer fallback pause; or a fixed
pause). The caller's transcripts reach the detector too. Both go to the
policy; a TURN_END is also reported in that frame's StepOutput (`turn_end_s`,
where the speech ended) so the service can tell the gateway, and stt can
finalize at once. Caller speech while the agent talks pauses it on that frame
(silent from the second frame of caller speech on) until the caller's words
say whether it was a backchannel ("uh-huh": the agent goes on where it
paused) or a barge-in (what it was saying is dropped): backchannel.py. With manual
turns (push-to-talk) the detector's TURN_END is neither given to the policy
nor reported: the caller's END_TURN and RESPOND end turns and start answers
(the policy's module doc), and caller speech over the agent stops it at
once. The caller's CANCEL and typed messages stop the agent at once too; the
next frame reports it (`cancelled`).

Lines. The policy hands out lines (a hold phrase, a phrase of an answer, the
repair phrase) one at a time, in the order they are to be said; each is
synthesized (or taken from the engine's cache: hold and repair phrases are
synthesized once per engine) and queued in the Player, which reports back
which lines began to play. A cut from the policy drops queued audio: all of it
(barge-in), or all but the phrase being played (an answer replaced
mid-speech, a hold that ran out). A frame that is due to carry speech but
finds no audio ready carries silence and is counted
(kame_frontend_late_audio_frames_total).

Speculation. While the caller talks, the newest candidate's first phrase (if
it still matches the caller's words) is synthesized ahead and kept aside; when
the policy commits that candidate, its first line is already audio, and the
agent usually speaks on the turn-end frame itself.

Synthesis runs phrase by phrase in one worker thread shared by the engine's
sessions (piper's phonemizer is process-global, and onnxruntime already
spreads one synthesis over the cores), never on the event loop. Phrases for a
session with nothing queued jump the worker's queue ahead of other sessions'
later phrases.

Word timing: phrases.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE, Samples
from kame_common.models import piper_voice_path
from kame_common.voice import load_voice
from services.frontend import metrics
from services.frontend.engines.backchannel import Backchannels, Overlap, Verdict
from services.frontend.engines.base import (
    CandidateSource,
    Engine,
    EngineSession,
    InvalidSessionConfig,
    SessionParams,
    SlotsExhausted,
    StepOutput,
    Transcript,
)
from services.frontend.engines.commit import (
    REPAIR_PHRASE,
    AnswerPolicy,
    Cut,
    Floor,
    Line,
    LineKind,
)
from services.frontend.engines.phrases import (
    Phrase,
    Player,
    Rendered,
    SynthesisWorker,
    synthesize_phrase,
)
from services.frontend.engines.semantic_turns import SmartTurnDetector, TurnDetectors, TurnTaking
from services.frontend.engines.turns import TurnEvent

log = logging.getLogger(__name__)

# Hold and repair phrases kept synthesized per engine; the oldest goes first
# (clients choose hold phrases, so the cache must not grow without bound).
CACHED_PHRASES = 64


# --- sessions ---


@dataclass
class _Synthesis:
    """The one synthesis a session waits for."""

    line: Line
    future: Future[Phrase]
    play: bool  # False: a first phrase synthesized ahead, kept aside until its line is due
    owned: bool  # False: a phrase from the engine's cache, shared with other sessions


def _same_words(a: Line, b: Line) -> bool:
    return (a.kind, a.generation, a.start, a.words) == (b.kind, b.generation, b.start, b.words)


class TtsSession(EngineSession):
    def __init__(self, engine: TtsEngine, params: SessionParams) -> None:
        self._engine = engine
        self._turns = engine.turn_detectors.for_session(params.turn_end_silence_s)
        self._manual = params.manual_turns
        self._player = Player()
        self._policy = AnswerPolicy(
            params.hold_phrases,
            params.hold_max_s,
            manual=self._manual,
            hold_delay_s=params.hold_delay_s,
        )
        self._cancelled = False  # a request of the caller's cut the agent since the last step
        # Asked for now, so they are synthesized by the time a turn needs them.
        self._cached = {
            phrase_key(text): engine.cached_phrase(text)
            for text in (*params.hold_phrases, REPAIR_PHRASE)
            if text.split()
        }
        self._job: _Synthesis | None = None
        self._prepared: tuple[Line, Phrase] | None = None  # a first phrase synthesized ahead
        self._frame_index = 0
        self._closed = False
        self._backchannels = engine.backchannels
        self._overlap: Overlap | None = None  # caller speech over the agent, undecided
        self._nods: set[str] = set()  # utterances heard as backchannels
        self._stt_asked_at_s: float | None = None  # the speech end stt was asked to finalize

    async def step(self, frame: Samples) -> StepOutput:
        event = self._turns.push(frame)
        turn_end_s, barged_in = None, False
        cancelled, self._cancelled = self._cancelled, False
        if event is TurnEvent.SPEECH_START:
            barged_in = self._caller_speech_started()
        elif event is TurnEvent.TURN_END and not self._manual:  # manual: the caller's call
            turn_end_s = self._caller_turn_ended()
        if self._overlap is not None:
            if self._overlap.frame(self._turns.frames, self._turns.silent_frames):
                turn_end_s = self._overlap.speech_end_s  # stt finalizes the words at once
            barged_in = self._follow_overlap() or barged_in
        self._policy.tick()
        self._follow_policy()
        held = self._overlap is not None
        if held:  # paused: the answer waits where it was
            rendered = Rendered(np.zeros(FRAME_SAMPLES, dtype=np.float32), [], 0, [])
        else:
            rendered = self._player.render(self._frame_index * FRAME_SECONDS)
            if rendered.filled < FRAME_SAMPLES and self._job is not None and self._job.play:
                metrics.LATE_AUDIO_FRAMES.inc()
        self._frame_index += 1
        self._policy.lines_started(rendered.started)
        return StepOutput(
            rendered.pcm,
            speaking=rendered.filled > 0,
            words=rendered.words,
            turn_end_s=turn_end_s,
            barged_in=barged_in or cancelled,
            cancelled=cancelled and not barged_in,
            held=held,
        )

    # --- caller speech over the agent: a barge-in or a backchannel (backchannel.py) ---

    def _caller_speech_started(self) -> bool:
        """The detector's SPEECH_START; True when it stopped the agent now."""
        audible = self._player.queued_samples > 0 or self._policy.floor is Floor.ANSWERING
        if audible and self._backchannels.enabled and not self._manual:
            self._overlap = Overlap(self._backchannels, self._turns.speech_start_s)
            return False
        return self._caller_takes_turn(self._turns.speech_start_s)

    def _caller_takes_turn(self, speech_start_s: float) -> bool:
        """The caller's speech starts a turn of its own; True when it cut audio."""
        barged_in = self._player.queued_samples > 0
        if barged_in:
            metrics.BARGE_INS.inc()
        self._policy.caller_speech_started(speech_start_s)
        return barged_in

    def _caller_turn_ended(self) -> float | None:
        """The detector's TURN_END: where the speech ended, to report to the gateway
        (None: stt was already asked to finalize it, or it waits for a verdict)."""
        if self._overlap is not None:
            self._overlap.turn_ended = True
            return None
        metrics.TURN_ENDS.inc()
        speech_end_s = self._turns.speech_end_s
        self._policy.caller_turn_ended(speech_end_s)
        return None if speech_end_s == self._stt_asked_at_s else speech_end_s

    def _follow_overlap(self) -> bool:
        """Act on the overlap's verdict once there is one; True on a barge-in."""
        overlap = self._overlap
        if overlap is None or overlap.verdict is Verdict.WAIT:
            return False
        self._overlap = None
        if overlap.verdict is Verdict.RESUME:
            metrics.BACKCHANNELS.inc()
            self._nods.update(t.utterance_id for t in overlap.held)
            self._turns.drop_turn()
            return False
        self._stt_asked_at_s = overlap.speech_end_s
        barged_in = self._caller_takes_turn(overlap.speech_start_s)
        for transcript in overlap.held:
            self._hear(transcript)
        if overlap.turn_ended:
            metrics.TURN_ENDS.inc()
            self._policy.caller_turn_ended(self._turns.speech_end_s)
        return barged_in

    def _settle_overlap(self) -> None:
        """A request of the caller's comes while the agent is paused: the speech
        was the caller taking the turn."""
        if self._overlap is not None:
            self._overlap.verdict = Verdict.BARGE_IN
            self._follow_overlap()

    def oracle_reset(
        self, generation: int, text: str = "", source: CandidateSource | None = None
    ) -> None:
        self._policy.candidate_reset(generation, text, source)
        self._follow_policy()

    def oracle_append(self, generation: int, text: str) -> None:
        self._policy.candidate_append(generation, text)
        self._follow_policy()

    def user_transcript(self, transcript: Transcript) -> None:
        if transcript.utterance_id in self._nods:
            return  # a backchannel the agent went on through
        if self._overlap is not None and self._overlap.heard(transcript):
            return  # decides whether the agent goes on; the policy waits for the verdict
        self._hear(transcript)

    def _hear(self, transcript: Transcript) -> None:
        if isinstance(self._turns, SmartTurnDetector):
            self._turns.heard(transcript.text, transcript.end_s)
        self._policy.transcript(transcript)
        self._follow_policy()

    def end_turn(self) -> None:
        self._settle_overlap()
        self._policy.end_turn(self._caller_speech_end_s())
        self._follow_policy()

    def respond(self) -> None:
        self._settle_overlap()
        self._policy.respond(self._caller_speech_end_s())
        self._follow_policy()

    def cancel(self) -> None:
        self._settle_overlap()
        self._note_cut_by_caller()
        self._policy.cancel()
        self._follow_policy()

    def user_text(self, transcript: Transcript) -> None:
        self._settle_overlap()
        self._note_cut_by_caller()
        self._policy.typed_turn(transcript, self._frame_index * FRAME_SECONDS)
        self._follow_policy()

    def _note_cut_by_caller(self) -> None:
        """A caller's request is about to stop the agent: the next frame says so
        if there was audio to stop."""
        playing = self._job is not None and self._job.play
        if self._player.queued_samples or playing:
            self._cancelled = True

    def _caller_speech_end_s(self) -> float:
        """Where the caller's speech ended, for a turn the caller ends: now, if the
        turn detector hears the caller still speaking."""
        if self._turns.caller_speaking:
            return self._frame_index * FRAME_SECONDS
        return self._turns.speech_end_s

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._drop_job()
            self._player.clear()
            self._prepared = None
        finally:
            self._engine.release_slot()  # even when dropping the job fails

    # --- glue: the policy's decisions to audio ---

    def _follow_policy(self) -> None:
        if self._closed:
            return
        self._apply_cut(self._policy.take_cut())
        self._collect_synthesis()
        self._queue_lines()

    def _apply_cut(self, cut: Cut) -> None:
        if cut is Cut.NONE:
            return
        if cut is Cut.NOW:
            self._player.clear()
        else:
            self._player.finish_current_phrase()
        if self._job is not None and self._job.play:  # its line was dropped with the cut
            self._drop_job()

    def _drop_job(self) -> None:
        if self._job is not None and self._job.owned:
            self._job.future.cancel()  # a cached phrase stays for other sessions
        self._job = None

    def _collect_synthesis(self) -> None:
        job = self._job
        if job is None or not job.future.done():
            return
        self._job = None
        if job.future.cancelled():
            return
        if job.future.exception() is not None:
            log.error("synthesis failed; skipping a phrase", exc_info=job.future.exception())
            return
        if job.play:
            self._player.add(job.line, job.future.result())
        else:
            self._prepared = (job.line, job.future.result())

    def _queue_lines(self) -> None:
        """Hand the policy's next lines to synthesis, one at a time and in order;
        lines whose audio is ready go straight to the player."""
        while self._job is None or not self._job.play:
            line = self._policy.next_line(self._player.queued_samples / SAMPLE_RATE)
            if line is None:
                break
            self._start_line(line)
        if self._job is None:
            self._synthesize_ahead(self._policy.speculative_line())

    def _start_line(self, line: Line) -> None:
        if self._prepared is not None and _same_words(self._prepared[0], line):
            self._player.add(line, self._prepared[1])
            self._prepared = None
            return
        ahead = self._job
        if ahead is not None and _same_words(ahead.line, line):
            ahead.line, ahead.play = line, True  # the phrase being synthesized ahead is due now
            return
        self._drop_job()
        if line.kind is LineKind.ANSWER:
            self._synthesize(line, play=True)
            return
        cached = self._cached[phrase_key(" ".join(line.words))]
        if cached.done() and not cached.cancelled() and cached.exception() is None:
            self._player.add(line, cached.result())
        else:
            self._job = _Synthesis(line, cached, play=True, owned=False)

    def _synthesize_ahead(self, line: Line | None) -> None:
        if line is None or (self._prepared is not None and _same_words(self._prepared[0], line)):
            return
        self._synthesize(line, play=False)

    def _synthesize(self, line: Line, play: bool) -> None:
        voice, words = self._engine.voice, list(line.words)
        urgent = self._player.queued_samples == 0
        future = self._engine.worker.submit(lambda: synthesize_phrase(voice, words), urgent)
        self._job = _Synthesis(line, future, play, owned=True)


def phrase_key(text: str) -> str:
    return " ".join(text.split())


class TtsEngine(Engine):
    name = "tts"

    def __init__(
        self,
        voice_path: str = "",
        slots: int = 4,
        turns: TurnTaking | None = None,
        backchannels: Backchannels | None = None,
    ) -> None:
        path = Path(voice_path) if voice_path else piper_voice_path()
        if not path.is_file():
            raise FileNotFoundError(f"piper voice {path} does not exist")
        self.voice = load_voice(voice_path)
        self.voice_name = path.stem
        self._accepted_voices = {"", str(path), path.name, path.stem}
        self.worker = SynthesisWorker()
        self.turn_detectors = TurnDetectors(turns or TurnTaking())
        self.backchannels = backchannels or Backchannels()
        self._slots = slots
        self._open = 0
        self._cached: OrderedDict[str, Future[Phrase]] = OrderedDict()

    @property
    def total_slots(self) -> int:
        return self._slots

    @property
    def free_slots(self) -> int:
        return self._slots - self._open

    async def open_session(self, params: SessionParams) -> TtsSession:
        if params.voice not in self._accepted_voices:
            raise InvalidSessionConfig(
                f"voice {params.voice!r} is not served here; use '' or {self.voice_name!r}"
            )
        if self._open >= self._slots:
            raise SlotsExhausted(f"all {self._slots} tts sessions of this replica are in use")
        self._open += 1
        return TtsSession(self, params)

    def release_slot(self) -> None:
        self._open -= 1

    def cached_phrase(self, text: str) -> Future[Phrase]:
        """A fixed phrase (hold or repair), synthesized once per engine and shared."""
        key = phrase_key(text)
        future = self._cached.pop(key, None)
        if future is None or future.cancelled() or (future.done() and future.exception()):
            voice, words = self.voice, key.split()
            future = self.worker.submit(lambda: synthesize_phrase(voice, words), urgent=False)
        self._cached[key] = future
        while len(self._cached) > CACHED_PHRASES:
            self._cached.popitem(last=False)
        return future

    async def close(self) -> None:
        await asyncio.to_thread(self.worker.close)
        await asyncio.to_thread(self.turn_detectors.close)
