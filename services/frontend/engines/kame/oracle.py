"""KAME's oracle stream on top of Moshi's LMModel.

The LM gets a second text embedding table, `oracle_emb` ([text_card + 1, dim],
built like `text_emb`). At every position the embedding of one oracle token is
added to the text embedding, and only that sum is added to the audio
embeddings: `LMModel.forward_text` sums the audio embeddings and then adds the
output of `text_emb`, so a forward hook on `text_emb` that returns
`text + oracle` reproduces the reference's order of float additions exactly
without copying moshi's code.

Where the oracle token comes from:
- streaming (`LMGen.step`): the model's streaming state holds one token per
  batch row, written by `set_oracle_tokens` before each step. It is a fixed
  tensor updated in place, so CUDA graphs captured by LMGen keep reading it.
  A streaming reset puts the reset rows back to padding;
- training path (`forward(codes, oracle_tokens=...)`): the oracle stream is
  shifted exactly like the text stream (the first position sees the initial
  text token, position t the oracle token of step t - 1).

`OracleFeed` is the per-session schedule that decides which token a step feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from moshi.conditioners.base import ConditionTensors
from moshi.models.lm import LMOutput
from moshi.models.lm_utils import ScaledEmbedding
from moshi.modules.streaming import State

from services.frontend.engines.kame.moshi_adapter import (
    StreamingStateLM,
    delay_sequence,
    init_layer,
)


@dataclass
class _KameLMState(State):
    oracle_tokens: torch.Tensor  # [batch, 1], long
    padding_token: int

    def reset(self, reset_mask: torch.Tensor) -> None:
        super().reset(reset_mask)
        # The reference keeps the previous session's oracle here: a reset row must
        # start with no oracle, i.e. padding.
        self.oracle_tokens[:, 0] = torch.where(
            reset_mask,
            torch.full_like(self.oracle_tokens[:, 0], self.padding_token),
            self.oracle_tokens[:, 0],
        )


class KameLMModel(StreamingStateLM):
    """Moshi's LMModel plus the oracle embedding.

    `oracle_enabled=False` is the plain Moshi model (engine `moshi`): the oracle
    embedding is loaded but never added, not even as zeros.
    """

    def __init__(
        self,
        *,
        norm_emb: bool = False,
        demux_second_text_stream: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            norm_emb=norm_emb,
            demux_second_text_stream=demux_second_text_stream,
            device=device,
            dtype=dtype,
            **kwargs,
        )
        # Same factory and initialisation as `text_emb` in LMModel.__init__.
        self.oracle_emb = ScaledEmbedding(
            self.text_card + 1,
            self.dim,
            norm=norm_emb,
            zero_idx=self.zero_token_id,
            demux_second_stream=demux_second_text_stream,
            device=device,
            dtype=dtype,
        )
        init_layer(self.oracle_emb)
        self.oracle_enabled = True
        self._forward_oracle: torch.Tensor | None = None
        self.text_emb.register_forward_hook(self._add_oracle_embedding)

    def _add_oracle_embedding(
        self, _module: torch.nn.Module, _args: tuple[Any, ...], text_embedding: torch.Tensor
    ) -> torch.Tensor:
        tokens = self._current_oracle_tokens()
        if tokens is None:
            return text_embedding
        oracle_embedding: torch.Tensor = self.oracle_emb(tokens)
        return text_embedding + oracle_embedding

    def _current_oracle_tokens(self) -> torch.Tensor | None:
        if self._forward_oracle is not None:
            return self._forward_oracle
        state = self.streaming_state
        if self.oracle_enabled and isinstance(state, _KameLMState):
            return state.oracle_tokens
        return None

    def new_streaming_state(self, batch_size: int) -> _KameLMState:
        device = next(iter(self.parameters())).device
        tokens = torch.full(
            (batch_size, 1), self.text_padding_token_id, dtype=torch.long, device=device
        )
        return _KameLMState(
            batch_size, device, oracle_tokens=tokens, padding_token=self.text_padding_token_id
        )

    def set_oracle_tokens(self, tokens: torch.Tensor) -> None:
        """The oracle token each batch row feeds at the next streaming step.

        `tokens` has one entry per session; with CFG the model streams twice as
        many rows, and both halves get the same token."""
        state = self.streaming_state
        if not isinstance(state, _KameLMState):
            raise RuntimeError("set_oracle_tokens needs the model in streaming mode (LMGen)")
        repeats = state.batch_size // tokens.shape[0]
        state.oracle_tokens[:, 0].copy_(tokens.to(state.oracle_tokens.device).repeat(repeats))

    def forward(
        self,
        codes: torch.Tensor,
        condition_tensors: ConditionTensors | None = None,
        oracle_tokens: torch.Tensor | None = None,
    ) -> LMOutput:
        """Teacher-forced training path; `oracle_tokens` is [B, T], aligned with `codes`."""
        if oracle_tokens is None or not self.oracle_enabled:
            return super().forward(codes, condition_tensors)
        batch = oracle_tokens.shape[0]
        initial = torch.full(
            (batch, 1, 1), self.text_initial_token_id, dtype=torch.long, device=oracle_tokens.device
        )
        delayed = delay_sequence(self.delays[:1], oracle_tokens[:, None], initial)
        self._forward_oracle = torch.cat([initial, delayed], dim=2)[:, 0, :-1]
        try:
            return super().forward(codes, condition_tensors)
        finally:
            self._forward_oracle = None


class OracleFeed:
    """Which oracle token each step of one session feeds.

    After a reset before step a, step n feeds `oracle[n - a]`, with `oracle =
    [text_initial_token_id] + appended tokens`; any other step feeds padding.
    An append never moves the anchor, so tokens whose step has passed are
    skipped; an append with no oracle yet is a reset first. A new feed (and a
    cleared one) has no oracle.
    """

    def __init__(self, initial_token: int, padding_token: int) -> None:
        self._initial = initial_token
        self._padding = padding_token
        self._anchor: int | None = None
        self._tokens: list[int] = []

    @property
    def has_oracle(self) -> bool:
        return self._anchor is not None

    def clear(self) -> None:
        self._anchor = None
        self._tokens = []

    def reset(self, next_step: int) -> None:
        self._anchor = next_step
        self._tokens = [self._initial]

    def append(self, next_step: int, tokens: list[int]) -> int:
        """Add tokens; returns how many of them are already too late to be fed."""
        if self._anchor is None:
            self.reset(next_step)
        assert self._anchor is not None  # reset() anchors it
        start = len(self._tokens)
        self._tokens.extend(tokens)
        first_future_index = next_step - self._anchor
        return max(0, min(len(tokens), first_future_index - start))

    def token_for(self, step: int) -> int:
        if self._anchor is None:
            return self._padding
        index = step - self._anchor
        if 0 <= index < len(self._tokens):
            return self._tokens[index]
        return self._padding
