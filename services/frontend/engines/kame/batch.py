"""N independent sessions stepped together through one LMGen and one Mimi.

Each session owns one batch row ("slot"). A step runs the rows given to it and
leaves the others untouched through moshi's exec mask: their streaming state
(KV caches, conv buffers, LMGen offsets) stays as if the step never happened.
A slot that changes hands is reset with a mask, which clears exactly its row,
its oracle feed and its step count. Rows never mix: each row's audio codes,
oracle token and sampled tokens are its own, so no session sees another's
audio or oracle.

This class is synchronous and not thread-safe: the engine calls it from its
single model thread, `kame replay` from the main thread. It is the one step
path both use. `close()` ends its streaming state (KV caches, CUDA graphs), so
that the same LM and Mimi can serve another batch, of any size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMGen

from kame_common.audio import FRAME_SAMPLES, Samples
from services.frontend.engines.kame.oracle import KameLMModel, OracleFeed


@dataclass
class SlotOutput:
    tokens: list[int] | None  # [text, agent audio codes...]; None while the acoustic delay fills
    pcm: Samples | None  # FRAME_SAMPLES of agent audio; None when tokens is None


class SlotBatch:
    def __init__(
        self,
        lm: KameLMModel,
        slots: int,
        *,
        mimi: MimiModel | None = None,
        use_sampling: bool = True,
        sampling_params: Mapping[str, Any] | None = None,
        with_oracle: bool = True,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.lm = lm
        self.slots = slots
        self.with_oracle = with_oracle
        lm.oracle_enabled = with_oracle
        self.user_codebooks = lm.n_q - lm.dep_q
        self._device = lm.device
        # support_out_of_sync: LMGen then reports "no output yet" per row (offsets
        # and exec mask) instead of with one counter shared by the whole batch.
        self._gen = LMGen(
            lm, use_sampling=use_sampling, support_out_of_sync=True, **dict(sampling_params or {})
        )
        self._streaming = ExitStack()
        self._streaming.enter_context(self._gen.streaming(slots))
        self._mimi = mimi
        if mimi is not None:
            self._streaming.enter_context(mimi.streaming(slots))
        self._feeds = [
            OracleFeed(lm.text_initial_token_id, lm.text_padding_token_id) for _ in range(slots)
        ]
        self._steps = [0] * slots

    def warm_up(self, steps: int = 3) -> None:
        """Step every slot on silence, then reset them all. A fresh model's first
        steps are slow (allocations, kernel choice, CUDA graph capture on GPUs):
        better before the first caller than during their first frames."""
        silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        for _ in range(steps):
            self.step_audio({slot: silence for slot in range(self.slots)})
        self.reset(range(self.slots))

    def close(self) -> None:
        """Leave streaming: the LM and Mimi drop this batch's state (KV caches,
        CUDA graphs) and may serve a new SlotBatch. Idempotent."""
        self._streaming.close()

    def reset(self, slots: Iterable[int]) -> None:
        """Give these rows a fresh stream: model state, oracle and step count."""
        slots = list(slots)
        if not slots:
            return
        mask = self._mask(slots)
        self._gen.reset_streaming(mask)
        if self._mimi is not None:
            self._mimi.reset_streaming(mask)
        for slot in slots:
            self._feeds[slot].clear()
            self._steps[slot] = 0

    def oracle_reset(self, slot: int) -> None:
        """New oracle for this slot, anchored at its next step."""
        self._feeds[slot].reset(self._steps[slot])

    def oracle_append(self, slot: int, tokens: Sequence[int]) -> int:
        """Extend the slot's oracle; returns how many tokens came too late to be fed."""
        return self._feeds[slot].append(self._steps[slot], list(tokens))

    def step_codes(self, user_codes: Mapping[int, Sequence[int]]) -> dict[int, list[int] | None]:
        """One LM step for the given slots, fed user audio codes directly."""
        codes = torch.zeros(
            (self.slots, self.user_codebooks, 1), dtype=torch.long, device=self._device
        )
        for slot, slot_codes in user_codes.items():
            codes[slot, :, 0] = torch.as_tensor(list(slot_codes), dtype=torch.long)
        out = self._step_lm(codes, self._mask(user_codes))
        return {slot: self._tokens(out[slot]) for slot in user_codes}

    def step_audio(self, frames: Mapping[int, Samples]) -> dict[int, SlotOutput]:
        """One 80 ms step for the given slots: Mimi encode, LM step, Mimi decode."""
        if self._mimi is None:
            raise RuntimeError("step_audio needs Mimi; this batch was built without it")
        active = self._mask(frames)
        pcm = torch.zeros((self.slots, 1, FRAME_SAMPLES), dtype=torch.float32)
        for slot, frame in frames.items():
            pcm[slot, 0] = torch.from_numpy(np.asarray(frame, dtype=np.float32))
        with torch.no_grad():
            self._mimi.set_exec_mask(active)
            user_codes = self._mimi.encode(pcm.to(self._device))
            out = self._step_lm(user_codes[:, : self.user_codebooks], active)
            has_output = active & (out >= 0).all(dim=1)
            agent_pcm = self._decode(out, has_output) if bool(has_output.any()) else None
        return {
            slot: SlotOutput(
                self._tokens(out[slot]),
                agent_pcm[slot] if agent_pcm is not None and has_output[slot] else None,
            )
            for slot in frames
        }

    def _step_lm(self, user_codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        self._gen.set_exec_mask(active)
        if self.with_oracle:
            oracle = [
                feed.token_for(step) for feed, step in zip(self._feeds, self._steps, strict=True)
            ]
            self.lm.set_oracle_tokens(torch.tensor(oracle, dtype=torch.long))
        out = self._gen.step(user_codes)
        assert out is not None  # support_out_of_sync: never None (rows without output hold -1)
        for slot in torch.nonzero(active).flatten().tolist():
            self._steps[slot] += 1
        return out[:, :, 0]

    def _decode(self, out: torch.Tensor, has_output: torch.Tensor) -> Samples:
        assert self._mimi is not None
        self._mimi.set_exec_mask(has_output)
        # Rows without output are masked out; zeros only keep the lookup in range.
        agent_codes = out[:, 1 : 1 + self.lm.dep_q].clamp(min=0)[:, :, None]
        agent_audio: torch.Tensor = self._mimi.decode(agent_codes)  # [slots, 1, FRAME_SAMPLES]
        return agent_audio[:, 0].float().cpu().numpy()

    def _mask(self, slots: Iterable[int]) -> torch.Tensor:
        mask = torch.zeros(self.slots, dtype=torch.bool)
        for slot in slots:
            if not 0 <= slot < self.slots:
                raise IndexError(f"slot {slot} out of range 0..{self.slots - 1}")
            mask[slot] = True
        return mask.to(self._device)

    @staticmethod
    def _tokens(row: torch.Tensor) -> list[int] | None:
        values = row.tolist()
        return None if any(value < 0 for value in values) else values
