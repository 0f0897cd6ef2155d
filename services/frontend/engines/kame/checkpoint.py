"""KAME / Moshi checkpoints in the Hugging Face layout (kyutai/moshiko-*, SakanaAI/kame).

A checkpoint is a directory with `config.json` (LMModel keyword arguments plus
`moshi_name`, `mimi_name`, `tokenizer_name`, `model_type`, `lm_gen_config`,
optionally `mimi_config_name`), the LM safetensors, the Mimi safetensors and
the SentencePiece model. Only the LM is required: `kame replay` runs on an
LM-only checkpoint, the engine also needs Mimi and the tokenizer.

Layouts read, as the reference loader (moshi.models.loaders) reads them:
- SakanaAI/kame and newer kyutai repositories: `config.json` as above.
- plain kyutai/moshiko-* repositories have no `config.json`: the moshi
  package's built-in Moshi 7B settings apply (its LMModel arguments and Mimi
  config, through moshi_adapter.py, and its default file names), and a log
  line says so.
- a file name in `config.json` may be `hf://owner/repo/path`, a file of another
  Hugging Face repository (moshiko's Mimi, for instance): it is looked up in
  the local Hugging Face cache only (HF_HUB_CACHE / HF_HOME), never
  downloaded here; `file:///abs/path` names a local file; any other name is
  relative to the checkpoint directory.

Key rule: a checkpoint without `oracle_emb.*` (plain Moshi) gets `oracle_emb`
cloned from `text_emb`; any other missing or unexpected key is an error that
names it. A Hugging Face repo id is fetched with `huggingface_hub` where the
network allows (with the `hf://` files its config names); offline that is a
clear error.

dtype: `auto` is bfloat16 on a CUDA device (the dtype Moshi's weights are
published in: half the memory and the tensor-core kernels) and float32
elsewhere (bfloat16 is slower than float32 on most CPUs).
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMGen
from safetensors.torch import load_file

from services.frontend.engines.kame import moshi_adapter
from services.frontend.engines.kame.oracle import KameLMModel

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTO_DTYPE = "auto"
# config.json keys that describe the checkpoint rather than the LMModel.
_FILE_KEYS = ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name")
_IGNORED_KEYS = ("model_type", "lm_gen_config", "model_id", "tts_config", "stt_config")
# Features of the moshi package that these engines do not serve.
_UNSUPPORTED_KEYS = ("lora", "lora_name", "conditioners", "fuser", "quantize")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HF_PREFIX = "hf://"
FILE_PREFIX = "file://"
# LMGen arguments the engine sets itself: a checkpoint's lm_gen_config cannot.
_ENGINE_LM_GEN_ARGS = frozenset(
    {
        "self",
        "lm_model",
        "use_sampling",
        "support_out_of_sync",
        "condition_tensors",
        "on_text_hook",
        "on_text_logits_hook",
        "on_audio_hook",
    }
)


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found or loaded; the message says which file or key."""


@dataclass
class Checkpoint:
    directory: Path
    lm_kwargs: dict[str, Any]
    lm_weights: Path
    mimi_weights: Path | None
    mimi_config: dict[str, Any] | None  # None: the moshi package's Mimi config
    tokenizer_path: Path | None
    model_type: str = "moshi"
    lm_gen_config: dict[str, Any] = field(default_factory=dict)
    # config.json file keys whose `hf://` file is not in the local cache, and what
    # to do about it: raised when the file is needed (an LM-only replay needs no Mimi).
    unresolved: dict[str, str] = field(default_factory=dict)

    @property
    def user_codebooks(self) -> int:
        codebooks: int = self.lm_kwargs["n_q"]
        agent_codebooks: int = self.lm_kwargs["dep_q"]
        return codebooks - agent_codebooks

    def lm_gen_params(self) -> dict[str, Any]:
        """LMGen keyword arguments from `lm_gen_config` (moshi's defaults for the rest).

        Every key LMGen takes is passed on; a key it does not take, or one the
        engine sets itself, is logged by name and left out."""
        accepted = set(inspect.signature(LMGen.__init__).parameters) - _ENGINE_LM_GEN_ARGS
        params = {}
        for key, value in self.lm_gen_config.items():
            if key in accepted:
                params[key] = value
            elif key in _ENGINE_LM_GEN_ARGS:
                log.warning(
                    "%s: lm_gen_config key %r is ignored: the engine sets it",
                    self.directory,
                    key,
                )
            else:
                log.warning(
                    "%s: lm_gen_config key %r is ignored: moshi's LMGen takes no such "
                    "argument (it takes %s)",
                    self.directory,
                    key,
                    ", ".join(sorted(accepted)),
                )
        return params


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise CheckpointError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def resolve_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """`name` as a torch dtype; `auto`: bfloat16 on CUDA, float32 elsewhere."""
    if name != AUTO_DTYPE:
        return parse_dtype(name)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    log.info("dtype auto on device %s: %s", device, str(dtype).removeprefix("torch."))
    return dtype


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
    """Download the repo's config.json and every file it names (the reference's
    defaults where it names none, or has no config.json); returns the snapshot."""
    try:
        config_file = _hub_config_file(repo_id)
        config = json.loads(config_file.read_text()) if config_file is not None else {}
        fetched = [_hub_file(repo_id, name) for name in _file_names(config).values()]
    except Exception as exc:  # offline, unknown repo, gated repo: all end the same way
        raise CheckpointError(
            f"could not fetch checkpoint {repo_id!r} from the Hugging Face Hub "
            f"({type(exc).__name__}: {exc}). Without network access, download it elsewhere "
            "and pass the local checkpoint directory instead"
        ) from exc
    # Without config.json the first file is the LM weights, from this repo.
    return config_file.parent if config_file is not None else fetched[0].parent


def _hub_config_file(repo_id: str) -> Path | None:
    """The repo's config.json; None for a plain kyutai/moshiko repo, which has none."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, CONFIG_NAME))
    except LocalEntryNotFoundError:  # offline: the cache may know the repo has none
        cached = try_to_load_from_cache(repo_id, CONFIG_NAME)
        # A path (cached) or None (not known): only its third answer, a marker
        # object, says the Hub had no such file when last asked.
        if cached is None or isinstance(cached, str):
            raise
    except EntryNotFoundError:  # the Hub answered: no such file
        pass
    return None  # read() says which built-in settings apply


def _hub_file(repo_id: str, name: str) -> Path:
    """Download the file a config.json file name stands for (its own repo's, or an
    `hf://` reference's); a `file://` name is left as it is."""
    from huggingface_hub import hf_hub_download

    if name.startswith(FILE_PREFIX):
        return Path(name.removeprefix(FILE_PREFIX))
    if name.startswith(HF_PREFIX):
        return Path(hf_hub_download(*_split_hf_reference(name)))
    return Path(hf_hub_download(repo_id, name))


def _file_names(config: dict[str, Any]) -> dict[str, str]:
    """The file each file key names, the moshi package's default file names where
    the config names none (mimi_config_name has no default: moshi's built-in)."""
    names = {
        "moshi_name": config.get("moshi_name", loaders.MOSHI_NAME),
        "mimi_name": config.get("mimi_name", loaders.MIMI_NAME),
        "tokenizer_name": config.get("tokenizer_name", loaders.TEXT_TOKENIZER_NAME),
    }
    if "mimi_config_name" in config:
        names["mimi_config_name"] = config["mimi_config_name"]
    return names


def _split_hf_reference(reference: str) -> tuple[str, str]:
    """`hf://owner/repo/path/in/repo` -> ("owner/repo", "path/in/repo")."""
    parts = reference.removeprefix(HF_PREFIX).split("/")
    if len(parts) < 3 or not all(parts):
        raise CheckpointError(
            f"{reference!r} is not a Hugging Face file reference (hf://owner/repo/file)"
        )
    return f"{parts[0]}/{parts[1]}", "/".join(parts[2:])


def _locate(directory: Path, name: str) -> Path | str:
    """The file `name` (a config.json file name) stands for; for an `hf://` file
    missing from the local cache, the message that says how to get it."""
    if name.startswith(FILE_PREFIX):
        return Path(name.removeprefix(FILE_PREFIX))
    if not name.startswith(HF_PREFIX):
        return directory / name
    from huggingface_hub import constants, try_to_load_from_cache

    repo_id, filename = _split_hf_reference(name)
    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return Path(cached)
    return (
        f"{name} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}); "
        f"fetch it where the network allows with `hf download {repo_id} {filename}` "
        "and bring that cache here (HF_HUB_CACHE or HF_HOME points at it), or put "
        "the file in the checkpoint directory and name it there"
    )


def read(directory: str | Path) -> Checkpoint:
    """Parse a checkpoint directory (its `config.json`, or the built-in Moshi 7B
    settings where it has none) and locate its files."""
    moshi_adapter.check_private_names()
    directory = Path(directory)
    config_path = directory / CONFIG_NAME
    if config_path.is_file():
        raw = _read_config(config_path)
        lm_kwargs = _lm_kwargs_of(raw, config_path)
    elif (directory / loaders.MOSHI_NAME).is_file():
        raw, lm_kwargs = {}, moshi_adapter.builtin_lm_kwargs()
        log.warning(
            "%s has no %s: a plain kyutai/moshiko checkpoint, read with the moshi "
            "package's built-in Moshi 7B settings (its LMModel arguments and "
            "Mimi config, files %s, %s, %s), as the reference loader does",
            directory,
            CONFIG_NAME,
            loaders.MOSHI_NAME,
            loaders.MIMI_NAME,
            loaders.TEXT_TOKENIZER_NAME,
        )
    elif (directory / loaders.MOSHI_Q8_NAME).is_file():
        raise CheckpointError(
            f"{directory} holds {loaders.MOSHI_Q8_NAME}: int8-quantized Moshi weights are not "
            "supported; use the bf16 release (kyutai/moshiko-pytorch-bf16)"
        )
    else:
        raise CheckpointError(
            f"{config_path} is missing: a checkpoint directory needs it, or the "
            f"{loaders.MOSHI_NAME} of a plain kyutai/moshiko checkpoint"
        )
    files = {key: _locate(directory, name) for key, name in _file_names(raw).items()}
    unresolved = {key: found for key, found in files.items() if isinstance(found, str)}
    if "moshi_name" in unresolved:
        raise CheckpointError(f"{config_path}: moshi_name {unresolved['moshi_name']}")
    lm_weights = files["moshi_name"]
    assert isinstance(lm_weights, Path)
    if not lm_weights.is_file():
        raise CheckpointError(f"LM weights {lm_weights} are missing (config moshi_name)")
    return Checkpoint(
        directory=directory,
        lm_kwargs=lm_kwargs,
        lm_weights=lm_weights,
        mimi_weights=_existing(files["mimi_name"]),
        mimi_config=_read_mimi_config(files.get("mimi_config_name")),
        tokenizer_path=_existing(files["tokenizer_name"]),
        model_type=raw.get("model_type", "moshi"),
        lm_gen_config=dict(raw.get("lm_gen_config") or {}),
        unresolved=unresolved,
    )


def _read_config(config_path: Path) -> dict[str, Any]:
    try:
        raw: dict[str, Any] = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc}") from exc
    unsupported = [key for key in _UNSUPPORTED_KEYS if raw.get(key)]
    if unsupported:
        raise CheckpointError(f"{config_path}: {', '.join(unsupported)} not supported")
    return raw


def _lm_kwargs_of(raw: dict[str, Any], config_path: Path) -> dict[str, Any]:
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
    return lm_kwargs


def _existing(found: Path | str) -> Path | None:
    return found if isinstance(found, Path) and found.is_file() else None


def _read_mimi_config(found: Path | str | None) -> dict[str, Any] | None:
    if found is None or isinstance(found, str):  # an unresolved one fails in load_mimi
        return None
    if not found.is_file():
        raise CheckpointError(f"Mimi config {found} is missing")
    config: dict[str, Any] = json.loads(found.read_text())
    return config


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
    _check_resolved(checkpoint, "mimi_name", "mimi_config_name")
    if checkpoint.mimi_weights is None:
        raise CheckpointError(
            f"{checkpoint.directory} has no Mimi weights (config mimi_name); the engine needs "
            "them to encode the caller's audio and decode the agent's"
        )
    codebooks = max(checkpoint.lm_kwargs["dep_q"], checkpoint.user_codebooks)
    config = checkpoint.mimi_config
    if config is None:  # as moshi's loader does
        config = moshi_adapter.builtin_mimi_config()
    try:
        return loaders.get_mimi(
            checkpoint.mimi_weights, config, device=device, num_codebooks=codebooks
        )
    except RuntimeError as exc:  # load_state_dict names the mismatching keys
        raise CheckpointError(f"{checkpoint.mimi_weights}: {exc}") from exc


def _check_resolved(checkpoint: Checkpoint, *keys: str) -> None:
    for key in keys:
        if key in checkpoint.unresolved:
            raise CheckpointError(
                f"{checkpoint.directory / CONFIG_NAME}: {key} {checkpoint.unresolved[key]}"
            )


def load_tokenizer(checkpoint: Checkpoint) -> sentencepiece.SentencePieceProcessor:
    _check_resolved(checkpoint, "tokenizer_name")
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
