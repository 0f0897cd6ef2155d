"""Prefix-stable partial transcripts by local agreement of consecutive hypotheses.

Each partial re-decodes the whole open utterance, so consecutive hypotheses
overlap. A word becomes stable once two consecutive hypotheses agree on it
(and every word before it) and it is not the last word of the newest one (the
last word sits at the audio edge and is often cut off). Stable words are
never revised: a later hypothesis only supplies the tail after them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NOT_WORD = re.compile(r"[^\w']+")


@dataclass(frozen=True)
class Word:
    text: str
    start_s: float  # stream seconds
    end_s: float
    probability: float

    @property
    def key(self) -> str:
        """The word as compared between hypotheses: case and punctuation ignored."""
        return _NOT_WORD.sub("", self.text.lower())

    @property
    def midpoint_s(self) -> float:
        return (self.start_s + self.end_s) / 2


def join_words(words: list[Word]) -> str:
    return " ".join(word.text for word in words)


class LocalAgreement:
    """The stable prefix of one utterance, updated with each new hypothesis."""

    def __init__(self) -> None:
        self.stable: list[Word] = []
        self._previous_tail: list[Word] = []

    def _tail_after_stable(self, hypothesis: list[Word]) -> list[Word]:
        """The part of `hypothesis` that follows the stable words. When the hypothesis
        repeats them, that is what follows; when it revised one, the words heard after
        the last stable word (by time) are kept."""
        count = len(self.stable)
        if [w.key for w in hypothesis[:count]] == [w.key for w in self.stable]:
            return hypothesis[count:]
        stable_end = self.stable[-1].end_s
        return [word for word in hypothesis if word.midpoint_s > stable_end]

    def update(self, hypothesis: list[Word]) -> list[Word]:
        """Take a new hypothesis; returns its unstable tail (after `self.stable`)."""
        tail = self._tail_after_stable(hypothesis)
        agreed = 0
        # `_previous_tail` follows the same stable words (only this method extends them).
        # The newest hypothesis's last word is never committed.
        for old, new in zip(self._previous_tail, tail[:-1], strict=False):
            if old.key != new.key or not new.key:
                break
            agreed += 1
        self.stable.extend(tail[:agreed])
        self._previous_tail = tail[agreed:]
        return tail[agreed:]

    def settled(self, decoded: list[Word]) -> list[Word] | None:
        """A final decode's words as a partial whose every word is stable: the stable
        words spelled as partials already said them ("i" stays "i" where the beam
        decode says "I"), since stable words are never revised, then the decode's
        own; None when the decode revised a stable word (it is not settled then)."""
        count = len(self.stable)
        if [word.key for word in decoded[:count]] != [word.key for word in self.stable]:
            return None
        return [*self.stable, *decoded[count:]]

    def stability(self, tail: list[Word]) -> float:
        """Share of the hypothesis's words that are settled, in [0, 1]."""
        total = len(self.stable) + len(tail)
        return len(self.stable) / total if total else 0.0
