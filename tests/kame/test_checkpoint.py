"""Checkpoint loading: the legacy (plain Moshi) rule, key errors, files, repo ids."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.frontend.engines.kame import checkpoint
from services.frontend.engines.kame.checkpoint import CheckpointError


def copy_with_weights(parity_dir, target, edit) -> checkpoint.Checkpoint:
    """The parity checkpoint in `target`, its LM weights passed through `edit`."""
    target.mkdir()
    shutil.copy(parity_dir / "config.json", target / "config.json")
    state = edit(load_file(str(parity_dir / "model.safetensors")))
    save_file(state, str(target / "model.safetensors"))
    return checkpoint.read(target)


def test_legacy_checkpoint_gets_oracle_emb_cloned_from_text_emb(parity_dir, tmp_path):
    def drop_oracle(state):
        del state["oracle_emb.weight"]
        return state

    lm = checkpoint.load_lm(copy_with_weights(parity_dir, tmp_path / "legacy", drop_oracle))
    assert torch.equal(lm.oracle_emb.weight, lm.text_emb.weight)
    assert lm.oracle_emb.weight.data_ptr() != lm.text_emb.weight.data_ptr()


def test_kame_checkpoint_keeps_its_own_oracle_emb(parity_dir):
    lm = checkpoint.load_lm(checkpoint.read(parity_dir))
    stored = load_file(str(parity_dir / "model.safetensors"))["oracle_emb.weight"]
    assert torch.equal(lm.oracle_emb.weight, stored)
    assert not torch.equal(lm.oracle_emb.weight, lm.text_emb.weight)


def test_unexpected_key_is_an_error_naming_it(parity_dir, tmp_path):
    def add_key(state):
        state["bogus_head.weight"] = torch.zeros(2, 2)
        return state

    ckpt = copy_with_weights(parity_dir, tmp_path / "extra", add_key)
    with pytest.raises(CheckpointError, match=r"unexpected keys: bogus_head\.weight"):
        checkpoint.load_lm(ckpt)


def test_missing_key_other_than_oracle_is_an_error_naming_it(parity_dir, tmp_path):
    def drop_key(state):
        del state["text_linear.weight"]
        return state

    ckpt = copy_with_weights(parity_dir, tmp_path / "missing", drop_key)
    with pytest.raises(CheckpointError, match=r"missing keys: text_linear\.weight"):
        checkpoint.load_lm(ckpt)


def test_dtype_and_lm_only_checkpoint(parity_dir):
    ckpt = checkpoint.read(parity_dir)
    assert ckpt.mimi_weights is None and ckpt.tokenizer_path is None
    lm = checkpoint.load_lm(ckpt, dtype=checkpoint.resolve_dtype("bfloat16", "cpu"))
    assert lm.dtype == torch.bfloat16 and lm.oracle_emb.weight.dtype == torch.bfloat16
    with pytest.raises(CheckpointError, match="needs them"):
        checkpoint.load_mimi(ckpt)
    with pytest.raises(CheckpointError, match="dtype must be one of"):
        checkpoint.resolve_dtype("float64", "cpu")


def test_full_layout_loads_mimi_and_tokenizer(tiny_checkpoint):
    ckpt = checkpoint.read(tiny_checkpoint)
    mimi = checkpoint.load_mimi(ckpt)
    tokenizer = checkpoint.load_tokenizer(ckpt)
    assert mimi.num_codebooks == 8
    assert tokenizer.vocab_size() == ckpt.lm_kwargs["text_card"]
    assert ckpt.lm_gen_params() == {"temp": 0.8, "temp_text": 0.7, "top_k": 25, "top_k_text": 25}


def test_missing_config_and_weights_are_clear_errors(parity_dir, tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json is missing"):
        checkpoint.read(tmp_path)
    config = json.loads((parity_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"LM weights .*model\.safetensors are missing"):
        checkpoint.read(tmp_path)


def test_repo_id_offline_is_a_clear_error(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(
        CheckpointError,
        match=r"could not fetch checkpoint 'SakanaAI/kame'.*"
        r"pass the local checkpoint directory",
    ):
        checkpoint.resolve("SakanaAI/kame")


def test_not_a_directory_nor_repo_id(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory nor a Hugging Face repo id"):
        checkpoint.resolve(str(tmp_path / "no" / "such" / "dir"))
