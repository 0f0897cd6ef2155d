"""What the agent answered, read from one call's events: when the answer itself
began (answer latency), and whether its words are one generation's text
(coherence).

The agent's words arrive as `agent_text` events: `text`, `start_s` (the words'
position on the agent's audio stream) and `generation`, the oracle generation
they came from. Generation 0 means words of no generation: a hold phrase said
while no fresh answer is ready ("Hmm,", "Let me see,"), a repair ("Sorry,"), a
filler, or a speech LM speaking on its own. None of these is the answer. The
oracle updates (`oracle_reset`, `oracle_append`; the bench always asks for
them) carry each generation's text.

An agent_text event reaches the client with, not at, its audio, so each one is
placed in time where its first sample reached the client (`heard_t`): the
bench asks for 24 kHz PCM16, whose sample i is the agent stream's sample i.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kame_cli.bench.questions import words
from kame_common.audio import SAMPLE_RATE

NO_GENERATION = 0
ORACLE_UPDATES = ("oracle_reset", "oracle_append")


def place_agent_words(events: list[dict[str, Any]], agent_t: list[np.ndarray]) -> None:
    """Set each agent_text event's `heard_t`: when the client received the first
    sample of its audio (None when that audio never arrived). `agent_t` holds the
    receive time of every agent sample, chunk by chunk, as `kame talk` records it."""
    arrivals = np.concatenate(agent_t) if agent_t else np.zeros(0)
    for event in events:
        if event["type"] == "agent_text":
            index = round(event["start_s"] * SAMPLE_RATE)
            inside = 0 <= index < len(arrivals)
            event["heard_t"] = round(float(arrivals[index]), 4) if inside else None


def _when(event: dict[str, Any]) -> float:
    heard_t = event.get("heard_t")
    return event["t"] if heard_t is None else heard_t


def answer_words(events: list[dict[str, Any]], speech_start_s: float | None) -> list[dict]:
    """The agent_text events of the answer: those heard after the caller began speaking."""
    return [
        e
        for e in events
        if e["type"] == "agent_text" and (speech_start_s is None or _when(e) > speech_start_s)
    ]


def answer_latency_s(
    events: list[dict[str, Any]], speech_start_s: float | None, speech_end_s: float | None
) -> float | None:
    """The caller's end of speech -> the first word of the answer itself (the
    first agent word of a generation, after any hold phrase), as heard at the
    client; None when no answer word was spoken."""
    if speech_end_s is None:
        return None
    first = next(
        (e for e in answer_words(events, speech_start_s) if e["generation"] != NO_GENERATION),
        None,
    )
    return None if first is None else _when(first) - speech_end_s


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


def generation_words(events: list[dict[str, Any]], generation: int) -> list[str]:
    """A generation's text as the oracle updates show it (RESET, then APPENDs), as words."""
    texts = [
        e["text"] for e in events if e["type"] in ORACLE_UPDATES and e["generation"] == generation
    ]
    return words(" ".join(texts))


def coherence(events: list[dict[str, Any]], speech_start_s: float | None) -> Coherence:
    """The answer's words are coherent when, after an optional leading hold phrase
    (generation-0 words), they are a prefix of ONE generation's text, compared on
    normalized words. Two generations spliced together, a generation-0 word in
    the middle (a repair) or words that leave the generation's text are not."""
    spoken = answer_words(events, speech_start_s)
    lead = next((i for i, e in enumerate(spoken) if e["generation"] != NO_GENERATION), len(spoken))
    hold = sum(len(words(e["text"])) for e in spoken[:lead])
    rest = spoken[lead:]
    repairs = sum(len(words(e["text"])) for e in rest if e["generation"] == NO_GENERATION)
    order = list(dict.fromkeys(e["generation"] for e in rest if e["generation"] != NO_GENERATION))
    generation = order[0] if order else NO_GENERATION

    def verdict(note: str) -> Coherence:
        return Coherence(not note, generation, len(order), hold, repairs, note)

    if not order:
        return verdict("no answer words")
    if len(order) > 1:
        return verdict(f"{len(order)} generations spliced: {', '.join(map(str, order))}")
    if repairs:
        return verdict(f"{repairs} repair word(s) inside the answer")
    said = words(" ".join(e["text"] for e in rest))
    text = generation_words(events, generation)
    if not text:
        return verdict(f"generation {generation} is in no oracle update")
    for index, word in enumerate(said):
        if index >= len(text) or text[index] != word:
            expected = text[index] if index < len(text) else "(its end)"
            return verdict(
                f"word {index + 1} {word!r} is not generation {generation}'s {expected!r}"
            )
    return verdict("")
