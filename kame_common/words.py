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
