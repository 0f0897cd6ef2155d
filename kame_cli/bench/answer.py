"""What the agent answered, read from one call's events: when the answer itself
began (answer latency), and whether its words are one generation's text
(coherence).

The agent's words arrive as AgentText events: `text`, `start_s` (the words'
position on the agent's audio stream) and `generation`, the oracle generation
they came from. Generation 0 means words of no generation: a hold phrase said
while no fresh answer is ready ("Hmm,", "Let me see,"), a repair ("Sorry,"), a
filler, or a speech LM speaking on its own. None of these is the answer. The
oracle updates (OracleReset, OracleAppend; the bench always asks for them)
carry each generation's text.

An AgentText event reaches the client with, not at, its audio, so each one is
placed in time where its first sample reached the client (`heard_t`): the
bench asks for 24 kHz PCM16, whose sample i is the agent stream's sample i.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kame_cli.bench.questions import words
from kame_client.events import AgentText, OracleAppend, OracleReset
from kame_client.result import TalkResult
from kame_common.audio import SAMPLE_RATE

NO_GENERATION = 0
OracleUpdate = OracleReset | OracleAppend


@dataclass(frozen=True)
class Word:
    """Words the agent spoke, placed in time."""

    t: float  # when the event reached the client
    heard_t: float | None  # when the first sample of its audio did (None: it never came)
    said: AgentText

    @property
    def when(self) -> float:
        return self.t if self.heard_t is None else self.heard_t

    @property
    def generation(self) -> int:
        return self.said.generation

    def json(self) -> dict[str, Any]:
        """Its timeline JSON, with `heard_t`."""
        return {"t": self.t, "type": AgentText.TYPE, **asdict(self.said), "heard_t": self.heard_t}


def placed_words(result: TalkResult) -> list[Word]:
    """The agent's words, each placed where the client received the first sample
    of its audio. `result.agent_t` holds the receive time of every agent sample,
    chunk by chunk, as `kame talk` records it."""
    arrivals = np.concatenate(result.agent_t) if result.agent_t else np.zeros(0)
    placed = []
    for timed in result.of(AgentText):
        index = round(timed.event.start_s * SAMPLE_RATE)
        heard_t = round(float(arrivals[index]), 4) if 0 <= index < len(arrivals) else None
        placed.append(Word(timed.t, heard_t, timed.event))
    return placed


def oracle_updates(result: TalkResult) -> list[OracleUpdate]:
    """The oracle's updates, in the order they came."""
    return [t.event for t in result.events if isinstance(t.event, OracleReset | OracleAppend)]


def answer_words(spoken: list[Word], speech_start_s: float | None) -> list[Word]:
    """The words of the answer: those heard after the caller began speaking."""
    return [w for w in spoken if speech_start_s is None or w.when > speech_start_s]


def answer_latency_s(
    spoken: list[Word], speech_start_s: float | None, speech_end_s: float | None
) -> float | None:
    """The caller's end of speech -> the first word of the answer itself (the
    first agent word of a generation, after any hold phrase), as heard at the
    client; None when no answer word was spoken."""
    if speech_end_s is None:
        return None
    first = next(
        (w for w in answer_words(spoken, speech_start_s) if w.generation != NO_GENERATION), None
    )
    return None if first is None else first.when - speech_end_s


@dataclass(frozen=True)
class Coherence:
    """Whether the answer is one generation's text, optionally after a hold phrase."""

    coherent: bool
    generation: int  # the answer's generation (the first one spoken); 0 if none
    generations: int  # distinct generations whose words were spoken
    hold_words: int  # generation-0 words before the answer (the hold phrase)
    repairs: int  # generation-0 words after the answer began
    note: str  # why it is not coherent; empty when it is

    def fields(self) -> dict[str, Any]:
        """The record fields, prefixed so that they read well in the JSON."""
        data = asdict(self)
        return {
            "coherent": data.pop("coherent"),
            "coherence_note": data.pop("note"),
            **{f"answer_{key}": value for key, value in data.items()},
        }


def generation_words(updates: list[OracleUpdate], generation: int) -> list[str]:
    """A generation's text as the oracle updates show it (RESET, then APPENDs), as words."""
    return words(" ".join(u.text for u in updates if u.generation == generation))


def coherence(
    spoken: list[Word], updates: list[OracleUpdate], speech_start_s: float | None
) -> Coherence:
    """The answer's words are coherent when, after an optional leading hold phrase
    (generation-0 words), they are a prefix of ONE generation's text, compared on
    normalized words. Two generations spliced together, a generation-0 word in
    the middle (a repair) or words that leave the generation's text are not."""
    heard = answer_words(spoken, speech_start_s)
    lead = next((i for i, w in enumerate(heard) if w.generation != NO_GENERATION), len(heard))
    hold = sum(len(words(w.said.text)) for w in heard[:lead])
    rest = heard[lead:]
    repairs = sum(len(words(w.said.text)) for w in rest if w.generation == NO_GENERATION)
    order = list(dict.fromkeys(w.generation for w in rest if w.generation != NO_GENERATION))
    generation = order[0] if order else NO_GENERATION

    def verdict(note: str) -> Coherence:
        return Coherence(not note, generation, len(order), hold, repairs, note)

    if not order:
        return verdict("no answer words")
    if len(order) > 1:
        return verdict(f"{len(order)} generations spliced: {', '.join(map(str, order))}")
    if repairs:
        return verdict(f"{repairs} repair word(s) inside the answer")
    said = words(" ".join(w.said.text for w in rest))
    text = generation_words(updates, generation)
    if not text:
        return verdict(f"generation {generation} is in no oracle update")
    for index, word in enumerate(said):
        if index >= len(text) or text[index] != word:
            expected = text[index] if index < len(text) else "(its end)"
            return verdict(
                f"word {index + 1} {word!r} is not generation {generation}'s {expected!r}"
            )
    return verdict("")


def coherence_of(result: TalkResult) -> Coherence:
    """`coherence` of one call's words, placed, and oracle updates."""
    return coherence(placed_words(result), oracle_updates(result), result.speech_start_s)
