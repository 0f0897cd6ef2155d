"""Text in and out of the LM: oracle text to token ids, agent tokens to timed words."""

from __future__ import annotations

from dataclasses import dataclass

import sentencepiece

from kame_common.audio import FRAME_SECONDS
from services.frontend.engines.base import SpokenWord

WORD_START = "\u2581"  # SentencePiece's marker for a piece that starts a word


def oracle_token_ids(tokenizer: sentencepiece.SentencePieceProcessor, text: str) -> list[int]:
    """Tokens of whole words. SentencePiece never merges across whitespace, so
    tokenizing the words one by one gives what the whole text would, and APPEND
    chunks (whole words each) concatenate to the tokens of the full answer."""
    ids: list[int] = []
    for word in text.split():
        ids.extend(tokenizer.encode(word))
    return ids


@dataclass
class _OpenWord:
    text: str
    start_frame: int
    last_frame: int
    generation: int


class WordAssembler:
    """Turns the agent's text tokens, one per frame, into SpokenWords.

    A word is reported once it is complete (the next word starts, or a
    padding/special token follows it), so it arrives one or more frames after
    it started; its start_s/end_s are the frames its pieces were spoken in.
    """

    def __init__(
        self, tokenizer: sentencepiece.SentencePieceProcessor, padding_ids: tuple[int, ...]
    ) -> None:
        self._tokenizer = tokenizer
        self._padding_ids = frozenset(padding_ids)
        self._word: _OpenWord | None = None

    def push(self, token: int | None, frame_index: int, generation: int) -> list[SpokenWord]:
        piece = self._piece(token)
        if piece is None:
            return self._close()
        if piece.startswith(WORD_START) or self._word is None:
            done = self._close()
            text = piece.removeprefix(WORD_START)
            self._word = _OpenWord(text, frame_index, frame_index, generation)
            return done
        self._word.text += piece
        self._word.last_frame = frame_index
        return []

    def flush(self) -> list[SpokenWord]:
        """The open word, reported now: nothing follows it (the session ended)."""
        return self._close()

    def _piece(self, token: int | None) -> str | None:
        tokenizer = self._tokenizer
        if token is None or token in self._padding_ids:
            return None
        if not 0 <= token < tokenizer.vocab_size():
            return None
        if tokenizer.is_control(token) or tokenizer.is_unknown(token):
            return None
        return tokenizer.id_to_piece(token)

    def _close(self) -> list[SpokenWord]:
        word, self._word = self._word, None
        if word is None or not word.text:
            return []
        return [
            SpokenWord(
                word.text,
                word.start_frame * FRAME_SECONDS,
                (word.last_frame + 1) * FRAME_SECONDS,
                word.generation,
            )
        ]
