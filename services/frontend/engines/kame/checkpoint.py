"""KAME / Moshi checkpoints in the Hugging Face layout (kyutai/moshiko-*, SakanaAI/kame).

A checkpoint is a directory with `config.json` (LMModel keyword arguments plus
`moshi_name`, `mimi_name`, `tokenizer_name`, `model_type`, `lm_gen_config`,
optionally `mimi_config_name`), the LM safetensors, the Mimi safetensors and
the SentencePiece model. Only the LM is required: `kame replay` runs on an
LM-only checkpoint, the engine also needs Mimi and the tokenizer.

Key rule: a checkpoint without `oracle_emb.*` (plain Moshi) gets `oracle_emb`
cloned from `text_emb`; any other missing or unexpected key is an error that
names it. A Hugging Face repo id is fetched with `huggingface_hub` where the
network allows; offline that is a clear error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from safetensors.torch import load_file

from services.frontend.engines.kame.oracle import KameLMModel

CONFIG_NAME = "config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# config.json keys that describe the checkpoint rather than the LMModel.
_FILE_KEYS = ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name")
_IGNORED_KEYS = ("model_type", "lm_gen_config", "model_id", "tts_config", "stt_config")
# Features of the moshi package that these engines do not serve.
_UNSUPPORTED_KEYS = ("lora", "lora_name", "conditioners", "fuser", "quantize")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_LM_GEN_KEYS = ("temp", "temp_text", "top_k", "top_k_text")


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found or loaded; the message says which file or key."""


@dataclass
class Checkpoint:
    directory: Path
    lm_kwargs: dict[str, Any]
    lm_weights: Path
    mimi_weights: Path | None
    mimi_config: dict[str, Any] | None
    tokenizer_path: Path | None
    model_type: str = "moshi"
    lm_gen_config: dict[str, Any] = field(default_factory=dict)

    @property
    def user_codebooks(self) -> int:
        codebooks: int = self.lm_kwargs["n_q"]
        agent_codebooks: int = self.lm_kwargs["dep_q"]
        return codebooks - agent_codebooks

    def sampling_params(self) -> dict[str, Any]:
        """LMGen sampling parameters from `lm_gen_config` (moshi's defaults otherwise)."""
        return {key: self.lm_gen_config[key] for key in _LM_GEN_KEYS if key in self.lm_gen_config}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise CheckpointError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def resolve(spec: str) -> Path:
    """A local checkpoint directory, or one fetched for a Hugging Face repo id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if not _REPO_ID.match(spec) or path.exists():
        raise CheckpointError(
            f"checkpoint {spec!r} is not a directory nor a Hugging Face repo id (owner/name)"
        )
    return _fetch_from_hub(spec)


def _fetch_from_hub(repo_id: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        config_path = Path(hf_hub_download(repo_id, CONFIG_NAME))
        config = json.loads(config_path.read_text())
        for key in _FILE_KEYS:
            if key in config:
                hf_hub_download(repo_id, config[key])
        for key, default in (
            ("moshi_name", loaders.MOSHI_NAME),
            ("mimi_name", loaders.MIMI_NAME),
            ("tokenizer_name", loaders.TEXT_TOKENIZER_NAME),
        ):
            if key not in config:
                hf_hub_download(repo_id, default)
    except Exception as exc:  # offline, unknown repo, gated repo: all end the same way
        raise CheckpointError(
            f"could not fetch checkpoint {repo_id!r} from the Hugging Face Hub "
            f"({type(exc).__name__}: {exc}). Without network access, download it elsewhere "
            "and pass the local checkpoint directory instead"
        ) from exc
    return config_path.parent


def read(directory: str | Path) -> Checkpoint:
    """Parse `config.json` of a checkpoint directory and locate its files."""
    directory = Path(directory)
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} is missing: a checkpoint directory needs it")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc}") from exc
    unsupported = [key for key in _UNSUPPORTED_KEYS if raw.get(key)]
    if unsupported:
        raise CheckpointError(f"{config_path}: {', '.join(unsupported)} not supported")
    lm_kwargs = {
        key: value
        for key, value in raw.items()
        if key not in _FILE_KEYS + _IGNORED_KEYS + _UNSUPPORTED_KEYS
    }
    lm_kwargs.pop("depformer_causal", None)  # deprecated, as in moshi's loader
    if "demux_second_stream" in lm_kwargs:
        lm_kwargs["demux_second_text_stream"] = lm_kwargs.pop("demux_second_stream")
    for required in ("n_q", "dep_q", "card", "text_card", "dim", "delays"):
        if required not in lm_kwargs:
            raise CheckpointError(f"{config_path}: LMModel argument {required!r} is missing")

    lm_weights = directory / raw.get("moshi_name", loaders.MOSHI_NAME)
    if not lm_weights.is_file():
        raise CheckpointError(f"LM weights {lm_weights} are missing (config moshi_name)")
    mimi_weights = directory / raw.get("mimi_name", loaders.MIMI_NAME)
    tokenizer_path = directory / raw.get("tokenizer_name", loaders.TEXT_TOKENIZER_NAME)
    mimi_config = None
    if "mimi_config_name" in raw:
        mimi_config_path = directory / raw["mimi_config_name"]
        if not mimi_config_path.is_file():
            raise CheckpointError(f"Mimi config {mimi_config_path} is missing")
        mimi_config = json.loads(mimi_config_path.read_text())
    return Checkpoint(
        directory=directory,
        lm_kwargs=lm_kwargs,
        lm_weights=lm_weights,
        mimi_weights=mimi_weights if mimi_weights.is_file() else None,
        mimi_config=mimi_config,
        tokenizer_path=tokenizer_path if tokenizer_path.is_file() else None,
        model_type=raw.get("model_type", "moshi"),
        lm_gen_config=dict(raw.get("lm_gen_config") or {}),
    )


def load_lm(
    checkpoint: Checkpoint, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> KameLMModel:
    """Build the LM on the meta device and fill it from the safetensors (strict)."""
    try:
        model = KameLMModel(device="meta", dtype=dtype, **checkpoint.lm_kwargs)
    except (TypeError, AssertionError, ValueError) as exc:
        raise CheckpointError(
            f"{checkpoint.directory / CONFIG_NAME}: not valid LMModel arguments: {exc}"
        ) from exc
    state = load_file(str(checkpoint.lm_weights), device=str(device))
    state = {
        key: value.to(dtype) if value.dtype.is_floating_point else value
        for key, value in state.items()
    }
    if not any(key.startswith("oracle_emb.") for key in state):
        # A plain Moshi checkpoint: start the oracle table as a copy of the text table.
        for key in [key for key in state if key.startswith("text_emb.")]:
            state["oracle_emb." + key.removeprefix("text_emb.")] = state[key].clone()
    _check_keys(checkpoint.lm_weights, expected=set(model.state_dict()), found=set(state))
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def _check_keys(source: Path, expected: set[str], found: set[str]) -> None:
    missing = sorted(expected - found)
    unexpected = sorted(found - expected)
    problems = []
    if missing:
        problems.append(f"missing keys: {_name_keys(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_name_keys(unexpected)}")
    if problems:
        raise CheckpointError(f"{source}: {'; '.join(problems)}")


def _name_keys(keys: list[str], limit: int = 10) -> str:
    shown = ", ".join(keys[:limit])
    return shown if len(keys) <= limit else f"{shown} (and {len(keys) - limit} more)"


def load_mimi(checkpoint: Checkpoint, device: str | torch.device = "cpu") -> MimiModel:
    if checkpoint.mimi_weights is None:
        raise CheckpointError(
            f"{checkpoint.directory} has no Mimi weights (config mimi_name); the engine needs "
            "them to encode the caller's audio and decode the agent's"
        )
    codebooks = max(checkpoint.lm_kwargs["dep_q"], checkpoint.user_codebooks)
    try:
        return loaders.get_mimi(
            checkpoint.mimi_weights, checkpoint.mimi_config, device=device, num_codebooks=codebooks
        )
    except RuntimeError as exc:  # load_state_dict names the mismatching keys
        raise CheckpointError(f"{checkpoint.mimi_weights}: {exc}") from exc


def load_tokenizer(checkpoint: Checkpoint) -> sentencepiece.SentencePieceProcessor:
    if checkpoint.tokenizer_path is None:
        raise CheckpointError(
            f"{checkpoint.directory} has no SentencePiece model (config tokenizer_name); "
            "the kame engine needs it to tokenize oracle text"
        )
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(checkpoint.tokenizer_path))
    text_card = checkpoint.lm_kwargs["text_card"]
    if tokenizer.vocab_size() > text_card:
        raise CheckpointError(
            f"{checkpoint.tokenizer_path}: vocabulary of {tokenizer.vocab_size()} pieces does "
            f"not fit the LM's text_card {text_card}"
        )
    return tokenizer
