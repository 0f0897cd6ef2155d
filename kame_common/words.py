"""How the services compare words: the oracle decides that a final is already
answered, and the tts engine that a candidate answers the latest transcript, by
the same normalization, so a final the oracle keeps is one the frontend finds fresh."""

from __future__ import annotations

import re

_NOT_IN_WORD = re.compile(r"[^\w']")


def normalize_word(word: str) -> str:
    """Lower case without punctuation: "Paris," and "paris" are one word."""
    return _NOT_IN_WORD.sub("", word.lower())


def normalize_words(text: str) -> tuple[str, ...]:
    """The words of a text without case or punctuation: "What is it?" and
    "what is it" are the same words; a word that was only punctuation is gone."""
    return tuple(word for word in (normalize_word(w) for w in text.split()) if word)


def keypress_text(digit: str) -> str:
    """How a key the caller pressed stands in the conversation the LLM reads: on
    the caller's side, in words no speech recognizer would produce."""
    return f"(pressed {digit} on the keypad)"


# What a listener says to show it follows, not to take the turn: spoken while the
# agent talks, the agent goes on (the frontend's tts engine) and the oracle keeps
# it as context instead of answering it, and the web service's Realtime endpoint
# tells a client no turn for it. The three read this one list (their
# `backchannel_phrases` settings default to it); stt spells "uh-huh" and "mm-hmm"
# with or without the hyphen, which normalization drops, and Whisper writes a hum
# as "m", "mm" or "mmm", a short "uh-huh" as "oh" or "ah"
# (kame_cli/bench/backchannel_bench.py: the words stt heard in each clip).
BACKCHANNEL_PHRASES = (
    "yeah",
    "yes",
    "yep",
    "yup",
    "uh-huh",
    "mm-hmm",
    "mhm",
    "uh huh",
    "mm hmm",
    "m",
    "mm",
    "mmm",
    "hmm",
    "oh",
    "ah",
    "okay",
    "ok",
    "right",
    "sure",
    "i see",
    "got it",
    "all right",
    "alright",
)


def parse_phrases(text: str) -> tuple[tuple[str, ...], ...]:
    """A comma-separated phrase list (a setting's value) as normalized word tuples."""
    return tuple(words for words in (normalize_words(p) for p in text.split(",")) if words)


def is_backchannel(text: str, phrases: tuple[tuple[str, ...], ...]) -> bool:
    """The words are one or more of the phrases in a row ("Yeah, okay.") and nothing
    else; no words is not a backchannel."""
    words = normalize_words(text)
    # ends[i]: words[:i] splits into phrases
    ends = [True] + [False] * len(words)
    for i in range(len(words)):
        if ends[i]:
            for phrase in phrases:
                if words[i : i + len(phrase)] == phrase:
                    ends[i + len(phrase)] = True
    return bool(words) and ends[-1]
