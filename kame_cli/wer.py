"""Word error rate: how many words a transcript got wrong against what was said.

Both texts are normalized first (lower case, no punctuation, digits spelled
out), so "What is 12 times 4?" and "what is twelve times four" are the same
words: Whisper writes numbers either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# "o 'clock", "I 'm": a word's ending Whisper's word timings split off it.
_SPLIT_CLITIC = re.compile(r"(\w) '(clock|s|re|m|ll|ve|d|t)\b")
# Longer digit runs are read digit by digit (a phone number, a code).
SPELLED_DIGITS_MAX = 6


def number_words(number: int) -> list[str]:
    """0 <= number < 1_000_000 spelled out ("one hundred twenty three")."""
    if number < 20:
        return [_ONES[number]]
    if number < 100:
        return [_TENS[number // 10]] + (number_words(number % 10) if number % 10 else [])
    for size, name in ((1000, "thousand"), (100, "hundred")):
        if number >= size:
            rest = number % size
            return number_words(number // size) + [name] + (number_words(rest) if rest else [])
    raise AssertionError("unreachable")


def normalize(text: str) -> list[str]:
    """Lowercase words without punctuation, digits spelled out ("12" -> "twelve"),
    so "What is 12 times 4?" and "what is twelve times four" compare equal. An
    ending split off its word ("o 'clock": Whisper's word timings cut it there,
    and the stack joins its words with spaces) is joined again."""
    words = []
    glued = _SPLIT_CLITIC.sub(r"\1'\2", text.lower())
    for token in re.findall(r"[a-z0-9']+", glued.replace("-", " ")):
        if token.isdigit():
            words += (
                number_words(int(token))
                if len(token) <= SPELLED_DIGITS_MAX
                else [_ONES[int(d)] for d in token]
            )
        else:
            words.append(token.strip("'"))
    return [w for w in words if w]


@dataclass(frozen=True)
class Errors:
    """The edits that turn the reference's words into the hypothesis's."""

    substitutions: int
    deletions: int
    insertions: int
    reference_words: int

    @property
    def edits(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        return self.edits / max(self.reference_words, 1)

    def __add__(self, other: Errors) -> Errors:
        return Errors(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_words + other.reference_words,
        )


NO_ERRORS = Errors(0, 0, 0, 0)


def word_errors(reference: str, hypothesis: str) -> Errors:
    """The fewest substitutions, deletions and insertions (Levenshtein over the
    normalized words; among equally short alignments, the first found)."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    # Each cell: (edits, substitutions, deletions, insertions) of the best alignment.
    row = [(j, 0, 0, j) for j in range(len(hyp) + 1)]
    for i, ref_word in enumerate(ref, start=1):
        previous = row
        row = [(i, 0, i, 0)]
        for j, hyp_word in enumerate(hyp, start=1):
            diagonal = previous[j - 1]
            miss = ref_word != hyp_word
            candidates = (
                (diagonal[0] + miss, diagonal[1] + miss, diagonal[2], diagonal[3]),
                (previous[j][0] + 1, previous[j][1], previous[j][2] + 1, previous[j][3]),
                (row[j - 1][0] + 1, row[j - 1][1], row[j - 1][2], row[j - 1][3] + 1),
            )
            row.append(min(candidates, key=lambda cell: cell[0]))
    _, substitutions, deletions, insertions = row[len(hyp)]
    return Errors(substitutions, deletions, insertions, len(ref))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, after normalize()."""
    return word_errors(reference, hypothesis).rate
