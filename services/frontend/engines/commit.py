"""The tts engine's commit policy: which words the agent says, and when. Pure: no audio.

The tts engine cannot unsay a word, so in tandem it is a speculative cascade:
the oracle's LLM starts on partial transcripts while the caller talks, and the
agent speaks a candidate answer only if that candidate answers what the
caller actually said. `AnswerPolicy` decides; `tts.TtsSession` turns its
decisions into synthesis and playback. The policy is fed the caller's
transcripts, the oracle's RESET/APPEND, the caller's speech start and turn end
(from the engine's turn detector), clock ticks, and which of its lines began
to play; it answers with the next line to say (`next_line`) and with cuts of
what is queued (`take_cut`). Its clock is injected, so tests drive it with a
fake one.

Fresh. A candidate is fresh when its source (the utterance the oracle
answered) is the caller's latest utterance, its normalized words equal that
utterance's latest hypothesis, and that hypothesis belongs to this turn and
is settled: it is final, or it is a partial that covers the end of speech
(its audio reaches to within COVER_TOLERANCE_S of the turn's speech end) and
whose every word stt marks stable. Whisper revises the last word of a
partial often enough (measured with `kame bench`: one spoken answer in six
that came from a covering partial had to be repaired after the final) that an
unsettled partial is not worth speaking on: the final, which the turn end asks
stt for at once (EndOfTurn), is the usual source. The tolerance is two 80 ms frames:
the turn detector's level VAD and stt's Silero VAD place the end of speech a
frame or two apart (a soft last consonant, a breath), while a whole short word
lasts longer than that. A hypothesis belongs to this turn when its audio
reaches past the start of the turn's speech, so a transcript of an earlier
utterance (even a final) never makes a candidate fresh. The latest utterance
is the one stt spoke of last; a late event of an utterance already superseded
is ignored, and so is a hypothesis without words (stt heard a cough or a
breath: that says nothing new about what the caller asked).

Turn end. A fresh candidate with words is committed and spoken at once (its
first phrase was usually synthesized ahead while the caller talked: see
`speculative_line`). Otherwise the agent holds the floor: it says one hold
phrase (the session's list, rotating turn by turn; none = it holds in
silence) and waits. As soon as a candidate becomes fresh (a RESET whose
source matches, or a transcript that makes the newest candidate fresh), it is
committed; its words follow the hold phrase, which is never cut. With
`hold_delay_s` the hold phrase waits that long after the turn end, and a
candidate that becomes fresh meanwhile is said with no hold phrase. No dead
air: once a hold phrase has been over for QUIET_HOLD_S with no answer yet (a
restarting stt or oracle, a slow LLM, a tool), the next hold phrase of the
list, a different one, follows, and so on while the turn has phrases it has
not said (the caller hears at most about QUIET_HOLD_S of silence plus a
frame or two per hold; the defaults have two: "Hmm," then "Let me see,"). After
`hold_max_s` from the turn end without a fresh candidate the agent gives the
floor back: what it has not started saying is dropped, and it stays silent
until the caller speaks again or a fresh answer comes after all (the oracle
was restarting, or its LLM was slow: late is better than never, and the
caller has not moved on, or the answer would not be fresh).

One answer per utterance. While the agent speaks candidate A, a newer
candidate B that is fresh replaces it (a stale B is kept aside and ignored
unless a later transcript makes it fresh). The phrase being played is
finished and everything of A after it is dropped. Then B's words are compared,
position by position (normalized), with the words the agent has said of this
answer: while B repeats them, nothing is decided (B may still be short of
them); once B covers them all, it is the same answer and the agent goes on
with B's remaining words, without a repair. At the first word that differs it
is a different answer: the agent says the repair phrase ("Sorry,") and then B
from its first word, as its own sentence. Lines never mix two candidates'
words.

Barge-in. Caller speech stops whatever the agent is saying (cut now); the
candidate being spoken is closed and never resumed.

Phrases. An answer line is one phrase of a candidate: it ends at punctuation
or at a word limit that grows with the audio already queued (3 words for a
candidate's first phrase, so its first audio comes quickly and can be
prepared ahead; 6 with under MID_PHRASE_QUEUED_S queued, then 12). A phrase the
oracle has not finished yet (no punctuation, under the limit) waits for more
text while LOW_WATER_S of audio or more is queued.

Candidates without a source, and APPENDs of a generation that is neither the
newest candidate's nor the one being spoken, are never spoken.

The caller's own turn controls (push-to-talk). `end_turn` ends the caller's
turn now, as the turn detector would (a no-op unless the caller holds the
turn); `respond` asks for the answer (it ends an open turn first; a no-op once
the turn is answered or when nothing was said); `cancel` stops the agent like
a barge-in, and an answer it was holding the floor for is not said late.
In manual mode (`manual=True`) the turn detector's turn ends are not given to
the policy, and a turn the caller ends waits (Floor.WAITING, the first phrase
of a fresh candidate synthesized ahead) until `respond`, which answers it as a
turn end does in auto mode: commit a fresh candidate or hold. Caller speech
still cuts the agent.

Typed messages. `typed_turn` is a caller turn that starts and ends at once
(it cuts the agent as speech would), whose text is the latest hypothesis,
final, of this turn whatever its audio position; the next caller speech
starts a turn it is not part of.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kame_common.hold import DEFAULT_HOLD_MAX_S
from kame_common.words import normalize_word, normalize_words
from services.frontend import metrics
from services.frontend.engines.base import CandidateSource, Transcript

COVER_TOLERANCE_S = 0.16
REPAIR_PHRASE = "Sorry,"
FIRST_PHRASE_WORDS = 3
MID_PHRASE_WORDS = 6
MAX_PHRASE_WORDS = 12
MID_PHRASE_QUEUED_S = 1.5  # below this much queued audio, phrases stay mid-sized
LOW_WATER_S = 0.5  # an unfinished phrase is said once less audio than this is queued
# Silence after a hold phrase before the next one: under the ~1.5 s a caller
# hears as dead air, with room for the phrase's start (its audio is cached).
QUIET_HOLD_S = 1.0
_CLAUSE_END = re.compile(r"[.,!?;:]['\")\]]*$")


class Floor(enum.Enum):
    IDLE = enum.auto()  # nobody holds the turn (before the caller speaks, after a hold ran out)
    LISTENING = enum.auto()  # the caller holds the turn
    HOLDING = enum.auto()  # the caller's turn ended; no answer to it yet
    WAITING = enum.auto()  # manual mode: the caller's turn ended; no answer asked for yet
    ANSWERING = enum.auto()  # the agent speaks a committed candidate


class LineKind(enum.Enum):
    HOLD = enum.auto()
    ANSWER = enum.auto()
    REPAIR = enum.auto()


class Cut(enum.Enum):
    NONE = 0
    AFTER_PHRASE = 1  # finish the phrase being played; drop everything queued after it
    NOW = 2  # stop at once and drop everything


@dataclass(frozen=True, eq=False)
class Line:
    """Words to say as one phrase; lines are identities (two lines with the same
    words are different lines)."""

    kind: LineKind
    words: tuple[str, ...]
    generation: int = 0  # the candidate's; 0 for hold and repair lines
    start: int = 0  # answer lines: index of the first word in the candidate


@dataclass(frozen=True)
class Hypothesis:
    """The caller's latest utterance as stt last heard it."""

    utterance_id: str
    words: tuple[str, ...]
    is_final: bool
    settled: bool  # final, or a partial whose every word is stable
    end_s: float
    typed: bool = False  # a message the caller typed: of the turn it made, wherever it ends


@dataclass
class Candidate:
    """One oracle answer (a generation) and how far the agent got through it."""

    generation: int
    source: CandidateSource | None
    words: list[str] = field(default_factory=list)
    next_index: int = 0  # first word not yet handed out in a line
    closed: bool = False  # a barge-in ended it; never spoken again

    def next_phrase(self, limit: int) -> tuple[list[str], bool]:
        """Up to `limit` words from next_index, ending early after a clause's punctuation;
        complete is True when the phrase ends at punctuation or reaches the limit."""
        phrase: list[str] = []
        for word in self.words[self.next_index : self.next_index + limit]:
            phrase.append(word)
            if _CLAUSE_END.search(word):
                return phrase, True
        return phrase, len(phrase) == limit


def phrase_limit(queued_s: float, first: bool) -> int:
    if first:
        return FIRST_PHRASE_WORDS
    return MID_PHRASE_WORDS if queued_s < MID_PHRASE_QUEUED_S else MAX_PHRASE_WORDS


class AnswerPolicy:
    """Decides what the agent says (module docstring). Not thread-safe: one event loop."""

    def __init__(
        self,
        hold_phrases: Sequence[str] = (),
        hold_max_s: float = DEFAULT_HOLD_MAX_S,
        clock: Callable[[], float] = time.monotonic,
        manual: bool = False,
        hold_delay_s: float = 0.0,
    ) -> None:
        self._manual = manual  # the caller ends turns and asks for answers (module doc)
        self._hold_lines = [tuple(p.split()) for p in hold_phrases if p.split()]
        self._hold_max_s = hold_max_s
        self._hold_delay_s = hold_delay_s
        self._clock = clock
        self.floor = Floor.IDLE
        self._latest: Hypothesis | None = None
        self._superseded: set[str] = set()  # utterances stt has moved on from
        self._candidate: Candidate | None = None  # the newest RESET
        self._answer: Candidate | None = None  # the one being spoken (ANSWERING)
        self._echo: list[str] | None = None  # a replacement's undecided words (module doc)
        self._said: list[str] = []  # normalized words of the answer's lines that began
        self._repair_due = False
        self._hold_due = False
        self._holds_said = 0
        self._holds_this_turn = 0
        self._quiet_since: float | None = None  # the hold phrases said are over since
        self._unstarted: list[Line] = []  # handed out, not yet begun to play
        self._cut = Cut.NONE
        self._turn_start_s = 0.0
        self._speech_end_s = 0.0
        self._turn_end_at: float | None = None
        self._first_audio_due = False
        self._answer_due = False
        # The last turn's hold ran out with no answer, and the caller has not spoken
        # since: a fresh answer to that turn is still said, late.
        self._hold_ran_out = False

    # --- inputs ---

    def transcript(self, event: Transcript) -> None:
        words = normalize_words(event.text)
        if not words or event.utterance_id in self._superseded:
            return  # a noise, or late news of an utterance stt has already moved on from
        if self._latest is not None and self._latest.utterance_id != event.utterance_id:
            self._superseded.add(self._latest.utterance_id)
        self._latest = Hypothesis(
            event.utterance_id, words, event.is_final, event.is_final or event.settled, event.end_s
        )
        self._consider(self._candidate)

    def candidate_reset(self, generation: int, text: str, source: CandidateSource | None) -> None:
        self._candidate = Candidate(generation, source, text.split())
        self._consider(self._candidate)

    def candidate_append(self, generation: int, text: str) -> None:
        words = text.split()
        for candidate in {id(c): c for c in (self._candidate, self._answer) if c}.values():
            if candidate.generation == generation and not candidate.closed:
                candidate.words.extend(words)
        if self._answer is not None and self._answer.generation == generation:
            self._resolve_echo()
        self._consider(self._candidate)  # a fresh candidate without words gets its first ones

    def caller_speech_started(self, at_s: float) -> None:
        """The caller took the turn (a barge-in if the agent held the floor)."""
        if self.floor is Floor.HOLDING:
            metrics.HOLDS.labels(outcome="barged_in").inc()
        if self._answer is not None:
            self._answer.closed = True
        self._stop_speaking(Cut.NOW, Floor.LISTENING)
        self._turn_start_s = at_s
        self._hold_ran_out = False
        if self._latest is not None and self._latest.typed:  # a typed turn is over
            self._superseded.add(self._latest.utterance_id)
            self._latest = None

    def caller_turn_ended(self, speech_end_s: float) -> None:
        """The caller's turn ended (the turn detector in auto mode, `end_turn`):
        answer it, or in manual mode wait to be asked."""
        self._speech_end_s = speech_end_s
        if self._manual:
            self.floor = Floor.WAITING
        else:
            self._answer_turn()

    def end_turn(self, speech_end_s: float) -> None:
        """The caller says its turn is over: nothing to do unless it holds the turn."""
        if self.floor is Floor.LISTENING:
            self.caller_turn_ended(speech_end_s)

    def respond(self, speech_end_s: float) -> None:
        """The caller asks for the answer to its last turn (ending it if still open)."""
        self.end_turn(speech_end_s)
        if self.floor is Floor.WAITING:
            self._answer_turn()

    def cancel(self) -> None:
        """The caller stops the agent: what it says or holds the floor for is dropped."""
        if self.floor not in (Floor.HOLDING, Floor.ANSWERING):
            return
        if self._answer is not None:
            self._answer.closed = True
        self._stop_speaking(Cut.NOW, Floor.IDLE)
        self._hold_ran_out = False

    def typed_turn(self, event: Transcript, at_s: float) -> None:
        """A message the caller typed, at stream position `at_s`: a whole turn."""
        self.caller_speech_started(at_s)
        if self._latest is not None:
            self._superseded.add(self._latest.utterance_id)
        words = normalize_words(event.text)
        self._latest = Hypothesis(event.utterance_id, words, True, True, at_s, typed=True)
        self.caller_turn_ended(at_s)

    def _answer_turn(self) -> None:
        """The turn ended and is to be answered: a fresh candidate now, or hold."""
        self._turn_end_at = self._clock()
        self._first_audio_due = self._answer_due = True
        self._holds_this_turn, self._quiet_since = 0, None
        candidate = self._candidate
        if candidate is not None and candidate.words and self._is_fresh(candidate):
            self._commit(candidate)
        else:
            self.floor = Floor.HOLDING
            self._hold_due = bool(self._hold_lines)

    def tick(self) -> None:
        """Give the floor back once a hold has lasted hold_max_s."""
        if self.floor is Floor.HOLDING and self._turn_end_at is not None:
            if self._clock() - self._turn_end_at >= self._hold_max_s:
                metrics.HOLDS.labels(outcome="timed_out").inc()
                self._stop_speaking(Cut.AFTER_PHRASE, Floor.IDLE)
                self._hold_ran_out = True

    def lines_started(self, lines: Iterable[Line]) -> None:
        """These lines' audio began to play (in this order)."""
        for line in lines:
            self._unstarted = [u for u in self._unstarted if u is not line]
            if self._turn_end_at is not None and self._first_audio_due:
                metrics.FIRST_AUDIO_SECONDS.observe(self._clock() - self._turn_end_at)
                self._first_audio_due = False
            if line.kind is LineKind.ANSWER and line.generation == self._generation_spoken():
                self._said.extend(normalize_word(w) for w in line.words)
                if self._turn_end_at is not None and self._answer_due:
                    metrics.ANSWER_SECONDS.observe(self._clock() - self._turn_end_at)
                    self._answer_due = False

    # --- outputs ---

    def take_cut(self) -> Cut:
        """What to drop of the audio queued or being synthesized (once per decision)."""
        cut, self._cut = self._cut, Cut.NONE
        return cut

    def next_line(self, queued_s: float) -> Line | None:
        """The next line to synthesize and queue, given the audio already queued;
        None when there is nothing to say yet."""
        if self.floor is Floor.HOLDING and not self._hold_due:
            self._hold_again_if_quiet(queued_s)
        if self.floor is Floor.HOLDING and self._hold_due and self._hold_delay_over():
            self._hold_due = False
            hold = self._hold_lines[self._holds_said % len(self._hold_lines)]
            self._holds_said += 1
            self._holds_this_turn += 1
            self._quiet_since = None
            return self._hand_out(Line(LineKind.HOLD, hold))
        if self.floor is not Floor.ANSWERING or self._answer is None:
            return None
        if self._repair_due:
            self._repair_due = False
            return self._hand_out(Line(LineKind.REPAIR, tuple(REPAIR_PHRASE.split())))
        if self._echo is not None:
            return None  # is the replacement the same answer? wait for its words
        answer = self._answer
        start = answer.next_index
        words, complete = answer.next_phrase(phrase_limit(queued_s, first=start == 0))
        if not words or (not complete and queued_s >= LOW_WATER_S):
            return None
        answer.next_index += len(words)
        return self._hand_out(Line(LineKind.ANSWER, tuple(words), answer.generation, start))

    def speculative_line(self) -> Line | None:
        """While the caller holds the turn (or waits to be asked to answer it, in manual
        mode): the newest candidate's first line, if it
        still matches what the caller said and the line is complete, so the session
        can synthesize it ahead. Nothing is handed out: `next_line` gives the same
        line if the candidate is committed."""
        candidate = self._candidate
        if self.floor not in (Floor.LISTENING, Floor.WAITING):
            return None
        if candidate is None or candidate.closed:
            return None
        if not self._matches_latest(candidate):
            return None
        words, complete = candidate.next_phrase(FIRST_PHRASE_WORDS)
        if not words or not complete:
            return None
        return Line(LineKind.ANSWER, tuple(words), candidate.generation, 0)

    # --- decisions ---

    def _matches_latest(self, candidate: Candidate) -> bool:
        latest, source = self._latest, candidate.source
        return (
            latest is not None
            and source is not None
            and source.utterance_id == latest.utterance_id
            and normalize_words(source.text) == latest.words
        )

    def _is_fresh(self, candidate: Candidate) -> bool:
        latest = self._latest
        if candidate.closed or latest is None or not self._matches_latest(candidate):
            return False
        of_this_turn = latest.typed or latest.end_s > self._turn_start_s
        covers_end = latest.end_s >= self._speech_end_s - COVER_TOLERANCE_S
        return of_this_turn and (latest.is_final or (latest.settled and covers_end))

    def _consider(self, candidate: Candidate | None) -> None:
        """Commit or switch to `candidate` if it has become a fresh answer with words."""
        if candidate is None or not candidate.words or candidate is self._answer:
            return
        if self.floor in (Floor.LISTENING, Floor.WAITING) or not self._is_fresh(candidate):
            return
        if self.floor is Floor.HOLDING:
            metrics.HOLDS.labels(outcome="answered").inc()
            self._commit(candidate)
        elif self.floor is Floor.IDLE:
            if self._hold_ran_out:  # late, but the caller still waits for it
                self._commit(candidate)
        else:
            self._replace(candidate)

    def _commit(self, candidate: Candidate) -> None:
        self.floor = Floor.ANSWERING
        self._hold_due = False
        self._answer = candidate
        self._said = []

    def _replace(self, candidate: Candidate) -> None:
        """A fresh candidate replaces the one being spoken (module docstring)."""
        self._drop_queued(Cut.AFTER_PHRASE)
        self._answer = candidate
        self._echo = list(self._said)
        self._resolve_echo()

    def _resolve_echo(self) -> None:
        echo, answer = self._echo, self._answer
        if echo is None or answer is None:
            return
        repeated = [normalize_word(w) for w in answer.words[: len(echo)]]
        if repeated != echo[: len(repeated)]:
            metrics.REPAIRS.inc()
            self._echo = None
            self._repair_due = True
            self._said = []
            answer.next_index = 0
        elif len(repeated) == len(echo):
            self._echo = None
            answer.next_index = len(echo)

    def _stop_speaking(self, cut: Cut, floor: Floor) -> None:
        """The agent leaves the floor: to the caller (LISTENING) or to nobody (IDLE)."""
        self._drop_queued(cut)
        self.floor = floor
        self._answer = None
        self._echo = None
        self._repair_due = self._hold_due = False
        self._said = []
        self._turn_end_at = None

    def _drop_queued(self, cut: Cut) -> None:
        """Lines handed out but not begun are dropped with the cut; a dropped
        repair line is still owed."""
        if any(line.kind is LineKind.REPAIR for line in self._unstarted):
            self._repair_due = True
        self._unstarted = []
        self._cut = max(self._cut, cut, key=lambda c: c.value)

    def _hand_out(self, line: Line) -> Line:
        self._unstarted.append(line)
        return line

    def _hold_again_if_quiet(self, queued_s: float) -> None:
        """Another hold phrase is due once the turn's last has been over (nothing
        queued or waiting to start) for QUIET_HOLD_S, if the turn has a phrase
        it has not said: never the same one twice in a row."""
        if not 0 < self._holds_this_turn < len(self._hold_lines):
            return
        if queued_s > 0 or self._unstarted:
            self._quiet_since = None
            return
        now = self._clock()
        if self._quiet_since is None:
            self._quiet_since = now
        elif now - self._quiet_since >= QUIET_HOLD_S:
            self._hold_due = True

    def _hold_delay_over(self) -> bool:
        waited = self._clock() - self._turn_end_at if self._turn_end_at is not None else 0.0
        return waited >= self._hold_delay_s

    def _generation_spoken(self) -> int | None:
        return self._answer.generation if self._answer is not None else None
