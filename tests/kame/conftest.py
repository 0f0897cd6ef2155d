"""Fixtures for the kame engine tests: the parity fixture (tests/kame/fixtures/parity),
and a tiny random checkpoint written here in the real Hugging Face layout
(config.json, LM and Mimi safetensors, a SentencePiece model trained on a few
sentences)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import torch
from moshi.models import loaders
from safetensors.torch import save_file

from kame_cli.bench.gpu_check_e2e import train_tokenizer
from kame_common.audio import FRAME_SAMPLES
from services.frontend.engines.kame import checkpoint
from services.frontend.engines.kame.batch import SlotBatch
from services.frontend.engines.kame.engine import DEFAULT_JITTER_FRAMES, KameEngine
from services.frontend.engines.kame.moshi_adapter import builtin_mimi_config
from services.frontend.engines.kame.oracle import KameLMModel

# A random-weight KAME checkpoint and the reference implementation's tokens for it.
PARITY_DIR = Path(__file__).resolve().parent / "fixtures" / "parity"

SENTENCES = [
    "the weather in paris is sunny today",
    "what is the capital of france",
    "tell me about the moon landing",
    "i think the answer is forty two",
    "paris is the capital of france",
    "the moon is far away from the earth",
    "how many legs does a spider have",
    "a spider has eight legs",
    "good morning how are you",
    "thank you very much for calling",
]
MIMI_BINS = 64
BUILTIN_MIMI = builtin_mimi_config()
TINY_MIMI_CONFIG = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": {**BUILTIN_MIMI["seanet"], "dimension": 32, "n_filters": 4},
    "quantizer": {
        **BUILTIN_MIMI["quantizer"],
        "dimension": 16,
        "n_q": 8,
        "bins": MIMI_BINS,
        "input_dimension": 32,
        "output_dimension": 32,
    },
    "transformer": {
        **BUILTIN_MIMI["transformer"],
        "d_model": 32,
        "num_heads": 2,
        "num_layers": 1,
        "context": 50,
        "dim_feedforward": 64,
        "input_dimension": 32,
        "output_dimensions": [32],
    },
}


def tiny_lm_kwargs(text_card: int) -> dict:
    """Moshi's 16-codebook layout (8 agent + 8 user, acoustic delay 1) with tiny dims."""
    return {
        "n_q": 16,
        "dep_q": 8,
        "card": MIMI_BINS,
        "text_card": text_card,
        "dim": 64,
        "num_heads": 4,
        "num_layers": 2,
        "hidden_scale": 2,
        "causal": True,
        "context": 100,
        "max_period": 10000,
        "gating": "silu",
        "norm": "rms_norm_f32",
        "positional_embedding": "rope",
        "depformer_dim": 32,
        "depformer_num_heads": 2,
        "depformer_num_layers": 1,
        "depformer_dim_feedforward": 64,
        "depformer_multi_linear": True,
        "depformer_pos_emb": "none",
        "depformer_weights_per_step": True,
        "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
        "existing_text_padding_id": 3,
    }


def random_mimi_state() -> dict[str, torch.Tensor]:
    mimi = loaders.get_mimi(None, TINY_MIMI_CONFIG, num_codebooks=8)
    state = mimi.state_dict()
    for key in state:
        # Random codebooks, marked initialised, so that audio maps to varied codes.
        if key.endswith("embedding_sum"):
            state[key] = torch.randn_like(state[key])
        elif key.endswith("_initialized"):
            state[key] = torch.ones_like(state[key])
    return {key: value.contiguous() for key, value in state.items()}


def write_tokenizer(path: Path) -> int:
    """The tiny SentencePiece model at `path`; returns its vocabulary size (text_card)."""
    tokenizer_model = train_tokenizer(SENTENCES, vocab_size=80)
    path.write_bytes(tokenizer_model)
    return sentencepiece.SentencePieceProcessor(model_proto=tokenizer_model).vocab_size()


def random_lm_state(lm_kwargs: dict, with_oracle_emb: bool = True) -> dict[str, torch.Tensor]:
    lm = KameLMModel(device="cpu", dtype=torch.float32, **lm_kwargs)
    state = {key: value.contiguous() for key, value in lm.state_dict().items()}
    if not with_oracle_emb:  # a plain Moshi LM has no oracle table
        state = {key: value for key, value in state.items() if not key.startswith("oracle_emb.")}
    return state


def write_tiny_checkpoint(directory: Path, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    text_card = write_tokenizer(directory / "tokenizer.model")
    lm_kwargs = tiny_lm_kwargs(text_card)
    save_file(random_lm_state(lm_kwargs), str(directory / "lm.safetensors"))
    save_file(random_mimi_state(), str(directory / "mimi.safetensors"))
    (directory / "mimi_config.json").write_text(json.dumps(TINY_MIMI_CONFIG))
    config = {
        **lm_kwargs,
        "moshi_name": "lm.safetensors",
        "mimi_name": "mimi.safetensors",
        "tokenizer_name": "tokenizer.model",
        "mimi_config_name": "mimi_config.json",
        "model_type": "kame",
        "lm_gen_config": {"temp": 0.8, "temp_text": 0.7, "top_k": 25, "top_k_text": 25},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def write_moshiko_checkpoint(directory: Path, seed: int = 0) -> dict:
    """A plain kyutai/moshiko-style directory: no config.json, the moshi package's
    default file names, no oracle table. Returns the tiny LMModel kwargs its
    weights were made with (the test makes them the built-in settings)."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    lm_kwargs = tiny_lm_kwargs(write_tokenizer(directory / loaders.TEXT_TOKENIZER_NAME))
    lm_state = random_lm_state(lm_kwargs, with_oracle_emb=False)
    save_file(lm_state, str(directory / loaders.MOSHI_NAME))
    save_file(random_mimi_state(), str(directory / loaders.MIMI_NAME))
    return lm_kwargs


@pytest.fixture(scope="session")
def parity_dir() -> Path:
    """The parity fixture (tests/kame/fixtures/parity/README.md says what it holds)."""
    return PARITY_DIR


@pytest.fixture(scope="session")
def parity_trace(parity_dir) -> dict:
    return json.loads((parity_dir / "trace.json").read_text())


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-kame"))


@pytest.fixture(scope="session", autouse=True)
def _two_torch_threads():
    torch.set_num_threads(2)


def greedy_batch(
    ckpt_dir: Path, slots: int, with_oracle: bool = True, with_mimi: bool = True
) -> SlotBatch:
    ckpt = checkpoint.read(ckpt_dir)
    lm = checkpoint.load_lm(ckpt)
    mimi = checkpoint.load_mimi(ckpt) if with_mimi else None
    return SlotBatch(lm, slots, mimi=mimi, use_sampling=False, with_oracle=with_oracle)


def speech_frames(signal: np.ndarray, count: int) -> list[np.ndarray]:
    """`count` 80 ms frames of the signal, zero-padded (or cut) to length."""
    padded = np.zeros(count * FRAME_SAMPLES, dtype=np.float32)
    usable = min(len(signal), len(padded))
    padded[:usable] = signal[:usable]
    return list(padded.reshape(count, FRAME_SAMPLES))


@pytest.fixture(scope="session")
def make_greedy_batch():
    return greedy_batch


@pytest.fixture(scope="session")
def to_frames():
    return speech_frames


@pytest.fixture
async def make_engine(tiny_checkpoint):
    """make_engine(slots, with_oracle, jitter_frames) -> a greedy, warmed-up
    KameEngine on the tiny checkpoint (closed at the end of the test)."""
    tokenizer = checkpoint.load_tokenizer(checkpoint.read(tiny_checkpoint))
    engines: list[KameEngine] = []

    def _make(
        slots: int = 4, with_oracle: bool = True, jitter_frames: int = DEFAULT_JITTER_FRAMES
    ) -> KameEngine:
        batch = greedy_batch(tiny_checkpoint, slots, with_oracle=with_oracle)
        batch.warm_up()  # as from_config does: the first steps are slow (torch compiles)
        engines.append(KameEngine(batch, tokenizer, jitter_frames=jitter_frames))
        return engines[-1]

    yield _make
    for engine in engines:
        await engine.close()
