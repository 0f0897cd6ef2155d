"""The one place that touches the moshi package's private parts.

Written for the version constraints.txt pins: moshi 0.2.13. Its public API
lacks a few things the kame and moshi engines, `kame replay`, the benchmarks
and the tests need, so this module reaches into its internals, and only this
module: everything else uses what it offers and moshi's public API. Each
private name relied on, and why (GUARDED holds them all, with the shape
expected, and `missing_private_names` checks them with
kame_common/private_names.py; reading a checkpoint does so first, and
tests/kame/test_moshi_adapter.py on every test run, with a check that no other
file spells one):

- `moshi.models.loaders._lm_kwargs`, `_mimi_config`: the Moshi 7B LMModel
  arguments and the Mimi config that moshi's loader applies to a repository
  without config.json (kyutai/moshiko-*); a plain moshiko checkpoint is read
  with them (checkpoint.py), and the benchmarks and tests shape smaller models
  after them (`builtin_lm_kwargs`, `builtin_mimi_config`: copies).
- `moshi.models.lm_utils._delay_sequence(delays, tensor, padding)`: how LMModel
  shifts a stream by its delays; the oracle stream of the teacher-forced path
  is shifted exactly as the text stream (`delay_sequence`).
- `moshi.models.lm_utils._init_layer(m, zero_bias_init)`: LMModel's
  initialisation of its embeddings, for the oracle table (`init_layer`).
- `moshi.modules.streaming.StreamingContainer._init_streaming_state(batch_size)`
  and `._streaming_state`: the hook that makes a module's streaming state and
  where it is kept. The oracle token of each batch row lives in the LM's own
  state (a fixed tensor that CUDA graphs keep reading), so the LM makes a state
  of its own kind: `StreamingStateLM` (`new_streaming_state`, `streaming_state`).
- `moshi.utils.compile._is_cuda_graph_enabled()`: whether LMGen captures CUDA
  graphs (NO_CUDA_GRAPH and moshi's own switch), which the GPU check reports
  (`cuda_graphs_enabled`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import moshi
import moshi.models.lm_utils
import moshi.modules.streaming
import moshi.utils.compile
import torch
from moshi.models import loaders
from moshi.models.lm import LMModel
from moshi.modules.streaming import State

from kame_common import private_names
from kame_common.private_names import Guarded

PINNED = {"moshi": "0.2.13"}  # as constraints.txt has it

# What checkpoint.py requires of any LMModel arguments, and what get_mimi reads.
LM_KEYS = ("n_q", "dep_q", "card", "text_card", "dim", "delays")
MIMI_KEYS = ("sample_rate", "channels", "frame_rate", "seanet", "quantizer", "transformer")


def _container(owner: type) -> object:
    """A streaming module as moshi makes one, with its streaming state unset."""
    return owner()


GUARDED = [
    Guarded("moshi.models.loaders", "_lm_kwargs", keys=LM_KEYS),
    Guarded("moshi.models.loaders", "_mimi_config", keys=MIMI_KEYS),
    Guarded("moshi.models.lm_utils", "_delay_sequence", params=("delays", "tensor", "padding")),
    Guarded("moshi.models.lm_utils", "_init_layer", params=("m", "zero_bias_init")),
    Guarded(
        "moshi.modules.streaming.StreamingContainer",
        "_init_streaming_state",
        params=("batch_size",),
    ),
    Guarded("moshi.modules.streaming.StreamingContainer", "_streaming_state", sample=_container),
    Guarded("moshi.utils.compile", "_is_cuda_graph_enabled", params=()),
]


def missing_private_names(packages: Mapping[str, object] | None = None) -> list[str]:
    """What of GUARDED the installed moshi (or `packages["moshi"]`) lacks or has
    in another shape; empty when all is as this module expects."""
    return private_names.missing(GUARDED, packages or {"moshi": moshi})


def check_private_names() -> None:
    """Refuse to load a model on a moshi this module does not fit (an upgrade that
    renamed one of the names above): private_names.IncompatibleLibraries, naming
    what went, instead of an AttributeError while a call runs."""
    private_names.check(
        "services/frontend/engines/kame/moshi_adapter.py", PINNED, missing_private_names()
    )


def builtin_lm_kwargs() -> dict[str, Any]:
    """The Moshi 7B LMModel arguments moshi's loader applies to a repository
    without config.json (a copy, read at each call)."""
    return copy.deepcopy(loaders._lm_kwargs)


def builtin_mimi_config() -> dict[str, Any]:
    """The Mimi config moshi's loader applies when none is named (a copy)."""
    return copy.deepcopy(loaders._mimi_config)


def delay_sequence(delays: list[int], tensor: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """`tensor` ([B, K, T]) with stream k shifted right by delays[k], `padding`
    in front: as LMModel shifts its streams."""
    shifted: torch.Tensor = moshi.models.lm_utils._delay_sequence(delays, tensor, padding)
    return shifted


def init_layer(module: torch.nn.Module) -> None:
    """Initialise `module` as LMModel initialises its own layers."""
    moshi.models.lm_utils._init_layer(module)


def cuda_graphs_enabled() -> bool:
    """Whether moshi captures CUDA graphs (off with NO_CUDA_GRAPH=1)."""
    return bool(moshi.utils.compile._is_cuda_graph_enabled())


class StreamingStateLM(LMModel):
    """Moshi's LMModel whose streaming state a subclass may make itself: moshi
    asks `_init_streaming_state` for it when streaming starts, and keeps it in
    `_streaming_state` until streaming ends."""

    def new_streaming_state(self, batch_size: int) -> State:
        """The state of `batch_size` rows this model keeps while streaming;
        moshi's plain one unless a subclass says otherwise."""
        state: State = super()._init_streaming_state(batch_size)
        return state

    @property
    def streaming_state(self) -> State | None:
        """The model's own streaming state; None when it is not streaming."""
        state: State | None = self._streaming_state
        return state

    def _init_streaming_state(self, batch_size: int) -> State:
        return self.new_streaming_state(batch_size)
