"""The checkpoint layouts users have: SakanaAI/kame (config.json), plain
kyutai/moshiko (no config.json: the moshi package's built-in Moshi 7B
settings), `hf://` files taken from the local Hugging Face cache; every
lm_gen_config key LMGen takes reaching it; dtype `auto`."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from moshi.models import loaders
from safetensors.torch import load_file

from kame_cli.bench import kame_step_bench
from kame_cli.stack import Stack
from kame_cli.stack_options import StackOptions
from services.frontend.config import DTYPES, FrontendSettings
from services.frontend.engines.base import SessionParams
from services.frontend.engines.kame import checkpoint, moshi_adapter
from services.frontend.engines.kame.checkpoint import CheckpointError
from services.frontend.engines.kame.engine import KameEngine
from tests.kame.conftest import TINY_MIMI_CONFIG, write_moshiko_checkpoint

MOSHIKO = "kyutai/moshiko-pytorch-bf16"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def copy_checkpoint(source: Path, target: Path, **config_changes: object) -> Path:
    """A copy of the checkpoint in `target`, its config.json updated with the changes."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(config_changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


def engine_settings(directory: Path, dtype: str = "auto") -> FrontendSettings:
    return FrontendSettings(
        engine="kame", checkpoint=str(directory), device="cpu", dtype=dtype, batch_slots=1
    )


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache of this test's own, offline: the only one it sees."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variables once, when it is imported.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def put_in_cache(cache: Path, repo_id: str, filename: str, source: Path) -> Path:
    """`source` as `filename` of `repo_id`, in the cache's layout
    (models--owner--name/snapshots/<revision>/filename, refs/main naming the revision)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    target = repo / "snapshots" / REVISION / filename
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return target


async def speak_three_frames(engine: KameEngine, to_frames) -> list:
    session = await engine.open_session(SessionParams(session_id="layout"))
    try:
        noise = np.random.default_rng(0).normal(0, 0.1, 3 * 1920).astype(np.float32)
        return [await session.step(frame) for frame in to_frames(noise, 3)]
    finally:
        await session.close()


# --- SakanaAI/kame: config.json -------------------------------------------------------


def test_kame_layout_reads_its_config_and_keeps_its_oracle_table(tiny_checkpoint):
    ckpt = checkpoint.read(tiny_checkpoint)
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert ckpt.model_type == "kame"
    assert ckpt.lm_kwargs["dim"] == config["dim"] and "moshi_name" not in ckpt.lm_kwargs
    assert (ckpt.lm_weights, ckpt.mimi_weights, ckpt.tokenizer_path) == (
        tiny_checkpoint / "lm.safetensors",
        tiny_checkpoint / "mimi.safetensors",
        tiny_checkpoint / "tokenizer.model",
    )
    assert ckpt.mimi_config == TINY_MIMI_CONFIG
    lm = checkpoint.load_lm(ckpt)
    stored = load_file(str(tiny_checkpoint / "lm.safetensors"))["oracle_emb.weight"]
    assert torch.equal(lm.oracle_emb.weight, stored)


# --- kyutai/moshiko: no config.json ---------------------------------------------------


def test_without_config_json_the_builtin_moshi_7b_settings_apply(tmp_path, caplog):
    (tmp_path / loaders.MOSHI_NAME).write_bytes(b"")  # read() only locates the files
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        ckpt = checkpoint.read(tmp_path)
    assert ckpt.lm_kwargs == moshi_adapter.builtin_lm_kwargs()
    assert ckpt.lm_kwargs["dim"] == 4096 and ckpt.lm_kwargs["num_layers"] == 32
    assert ckpt.lm_weights == tmp_path / loaders.MOSHI_NAME
    assert ckpt.mimi_config is None  # moshi's built-in Mimi config
    assert (ckpt.model_type, ckpt.lm_gen_config) == ("moshi", {})
    said = caplog.text
    assert "no config.json" in said and "built-in Moshi 7B settings" in said
    assert loaders.MIMI_NAME in said and loaders.TEXT_TOKENIZER_NAME in said


def test_a_directory_with_neither_config_nor_moshi_weights_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json is missing.*model\.safetensors"):
        checkpoint.read(tmp_path)
    (tmp_path / loaders.MOSHI_Q8_NAME).write_bytes(b"")
    with pytest.raises(CheckpointError, match="int8-quantized Moshi weights are not supported"):
        checkpoint.read(tmp_path)


async def test_a_moshiko_checkpoint_runs_with_the_builtin_settings(
    tmp_path, monkeypatch, to_frames
):
    directory = tmp_path / "moshiko"
    tiny_kwargs = write_moshiko_checkpoint(directory)
    # The built-in settings are the 7B's; shrink them to what these weights were made with.
    monkeypatch.setattr(moshi_adapter, "builtin_lm_kwargs", lambda: dict(tiny_kwargs))
    monkeypatch.setattr(moshi_adapter, "builtin_mimi_config", lambda: dict(TINY_MIMI_CONFIG))
    assert not (directory / "config.json").exists()
    engine = KameEngine.from_config(engine_settings(directory), with_oracle=True)
    try:
        outputs = await speak_three_frames(engine, to_frames)
    finally:
        await engine.close()
    assert len(outputs) == 3 and any(output.pcm.any() for output in outputs[1:])
    lm = checkpoint.load_lm(checkpoint.read(directory))
    assert torch.equal(lm.oracle_emb.weight, lm.text_emb.weight)  # plain Moshi: cloned


def test_a_moshiko_repo_id_in_the_cache_resolves_without_config_json(tmp_path, hf_cache):
    """Offline, a repo id is read from the cache; that the repo has no config.json
    is known from the cache's record of it (moshi's loader leaves one)."""
    files = tmp_path / "files"
    write_moshiko_checkpoint(files)
    for name in (loaders.MOSHI_NAME, loaders.MIMI_NAME, loaders.TEXT_TOKENIZER_NAME):
        put_in_cache(hf_cache, MOSHIKO, name, files / name)
    with pytest.raises(CheckpointError, match="could not fetch checkpoint"):
        checkpoint.resolve(MOSHIKO)  # no record: config.json may just not be cached
    no_config = hf_cache / f"models--{MOSHIKO.replace('/', '--')}" / ".no_exist" / REVISION
    no_config.mkdir(parents=True)
    (no_config / "config.json").touch()
    directory = checkpoint.resolve(MOSHIKO)
    assert directory == hf_cache / f"models--{MOSHIKO.replace('/', '--')}" / "snapshots" / REVISION
    assert checkpoint.read(directory).lm_kwargs == moshi_adapter.builtin_lm_kwargs()


# --- hf:// references ----------------------------------------------------------------


def test_hf_references_are_taken_from_the_local_cache(tiny_checkpoint, tmp_path, hf_cache):
    cached_mimi = put_in_cache(
        hf_cache, MOSHIKO, loaders.MIMI_NAME, tiny_checkpoint / "mimi.safetensors"
    )
    cached_tokenizer = put_in_cache(
        hf_cache, MOSHIKO, loaders.TEXT_TOKENIZER_NAME, tiny_checkpoint / "tokenizer.model"
    )
    cached_config = put_in_cache(
        hf_cache, "SakanaAI/kame", "configs/mimi.json", tiny_checkpoint / "mimi_config.json"
    )
    directory = copy_checkpoint(
        tiny_checkpoint,
        tmp_path / "kame",
        mimi_name=f"hf://{MOSHIKO}/{loaders.MIMI_NAME}",
        tokenizer_name=f"hf://{MOSHIKO}/{loaders.TEXT_TOKENIZER_NAME}",
        mimi_config_name="hf://SakanaAI/kame/configs/mimi.json",
    )
    for local in ("mimi.safetensors", "tokenizer.model", "mimi_config.json"):
        (directory / local).unlink()
    ckpt = checkpoint.read(directory)
    assert (ckpt.mimi_weights, ckpt.tokenizer_path) == (cached_mimi, cached_tokenizer)
    assert ckpt.mimi_config == json.loads(cached_config.read_text())
    assert checkpoint.load_mimi(ckpt).num_codebooks == 8
    assert checkpoint.load_tokenizer(ckpt).vocab_size() == ckpt.lm_kwargs["text_card"]


def test_an_hf_reference_missing_from_the_cache_says_what_and_how_to_get_it(
    tiny_checkpoint, tmp_path, hf_cache
):
    reference = f"hf://{MOSHIKO}/{loaders.MIMI_NAME}"
    directory = copy_checkpoint(tiny_checkpoint, tmp_path / "kame", mimi_name=reference)
    ckpt = checkpoint.read(directory)  # the LM alone still loads (kame replay needs no Mimi)
    checkpoint.load_lm(ckpt)
    with pytest.raises(CheckpointError) as missing:
        checkpoint.load_mimi(ckpt)
    message = str(missing.value)
    assert f"mimi_name {reference} is not in the local Hugging Face cache" in message
    assert str(hf_cache) in message
    assert f"hf download {MOSHIKO} {loaders.MIMI_NAME}" in message

    lm_elsewhere = copy_checkpoint(
        tiny_checkpoint,
        tmp_path / "lm-elsewhere",
        moshi_name="hf://SakanaAI/kame/model.safetensors",
    )
    with pytest.raises(CheckpointError, match=r"moshi_name hf://SakanaAI/kame/model\.safetensors"):
        checkpoint.read(lm_elsewhere)
    malformed = copy_checkpoint(tiny_checkpoint, tmp_path / "malformed", mimi_name="hf://kyutai/x")
    with pytest.raises(CheckpointError, match="not a Hugging Face file reference"):
        checkpoint.read(malformed)


# --- lm_gen_config -------------------------------------------------------------------


def test_every_lm_gen_config_key_lmgen_takes_reaches_it(tiny_checkpoint, tmp_path, caplog):
    lm_gen_config = {
        "temp": 0.5,
        "temp_text": 0.4,
        "top_k": 7,
        "top_k_text": 3,
        "cfg_coef": 1.0,
        "cfg_is_no_text": True,
        "top_p": 0.9,  # not an LMGen argument
        "use_sampling": False,  # the engine's to set
    }
    directory = copy_checkpoint(tiny_checkpoint, tmp_path / "kame", lm_gen_config=lm_gen_config)
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        engine = KameEngine.from_config(engine_settings(directory), with_oracle=True)
    generator = engine._batch._gen
    assert (generator.temp, generator.temp_text, generator.top_k, generator.top_k_text) == (
        0.5,
        0.4,
        7,
        3,
    )
    assert (generator.cfg_coef, generator.cfg_is_no_text, generator.use_sampling) == (
        1.0,
        True,
        True,
    )
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    assert "'top_p' is ignored: moshi's LMGen takes no such argument" in warnings[0]
    assert "'use_sampling' is ignored: the engine sets it" in warnings[1]


def test_lm_gen_config_the_model_cannot_serve_is_a_checkpoint_error(tiny_checkpoint, tmp_path):
    directory = copy_checkpoint(tiny_checkpoint, tmp_path / "kame", lm_gen_config={"cfg_coef": 3.0})
    with pytest.raises(CheckpointError, match=r"lm_gen_config \{'cfg_coef': 3.0\} does not suit"):
        KameEngine.from_config(engine_settings(directory), with_oracle=True)


# --- dtype ---------------------------------------------------------------------------


def test_dtype_auto_is_bfloat16_on_cuda_and_float32_elsewhere():
    assert checkpoint.resolve_dtype("auto", "cpu") == torch.float32
    assert checkpoint.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert checkpoint.resolve_dtype("auto", "cuda:1") == torch.bfloat16
    assert checkpoint.resolve_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert checkpoint.resolve_dtype("float16", "cuda") == torch.float16
    assert checkpoint.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert DTYPES == (checkpoint.AUTO_DTYPE, *checkpoint.DTYPES)
    assert FrontendSettings().dtype == "auto"


@pytest.mark.parametrize(
    ("module", "required"),
    [
        ("kame_cli.up", []),
        ("kame_cli.bench", []),
        ("kame_cli.replay", ["--checkpoint", "c", "--trace", "t", "--out", "o"]),
    ],
)
def test_every_command_with_a_device_takes_a_dtype(module, required):
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    assert parser.parse_args(required).dtype == "auto"
    assert parser.parse_args([*required, "--dtype", "float16"]).dtype == "float16"
    with pytest.raises(SystemExit):
        parser.parse_args([*required, "--dtype", "float64"])


def test_kame_up_hands_the_dtype_to_the_frontend(tmp_path):
    env = Stack(StackOptions(dtype="bfloat16", log_dir=tmp_path)).service_env("frontend")
    assert env["KAME_FRONTEND_DTYPE"] == "bfloat16"
    default = Stack(StackOptions(log_dir=tmp_path)).service_env("frontend")
    assert default["KAME_FRONTEND_DTYPE"] == "auto"


def test_step_bench_resolves_auto_for_its_device(tmp_path):
    out = tmp_path / "bench.json"
    args = ["--batch-sizes", "1", "--steps", "1", "--warmup", "0", "--out", str(out)]
    assert kame_step_bench.main(args) == 0
    assert json.loads(out.read_text())["dtype"] == "float32"
