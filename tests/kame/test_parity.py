"""Parity with the reference KAME implementation on the shared fixture: the
streaming step path (`kame replay`) and the teacher-forced training path."""

from __future__ import annotations

import json

import torch

from kame_cli.main import main as kame
from services.frontend.engines.kame import checkpoint


def test_replay_reproduces_every_expected_step(parity_dir, parity_trace, tmp_path):
    out = tmp_path / "out.json"
    status = kame(
        [
            "replay",
            "--checkpoint",
            str(parity_dir),
            "--trace",
            str(parity_dir / "trace.json"),
            "--out",
            str(out),
        ]
    )
    steps = json.loads(out.read_text())["steps"]
    assert status == 0
    assert len(steps) == len(parity_trace["steps"])
    for index, (step, got) in enumerate(zip(parity_trace["steps"], steps, strict=True)):
        assert got == step["expect"], f"step {index}"


def test_replay_fails_on_a_trace_it_does_not_reproduce(parity_dir, parity_trace, tmp_path):
    tampered = json.loads(json.dumps(parity_trace))
    tampered["steps"][5]["expect"][0] = (tampered["steps"][5]["expect"][0] + 1) % 96
    trace = tmp_path / "tampered.json"
    trace.write_text(json.dumps(tampered))
    status = kame(
        [
            "replay",
            "--checkpoint",
            str(parity_dir),
            "--trace",
            str(trace),
            "--out",
            str(tmp_path / "out.json"),
        ]
    )
    assert status == 1


def test_forward_text_logits_match_the_trace(parity_dir, parity_trace):
    lm = checkpoint.load_lm(checkpoint.read(parity_dir))
    forward = parity_trace["forward"]
    codes = torch.tensor(forward["codes"])[None]
    oracle = torch.tensor(forward["oracle_tokens"])[None]
    expected = torch.tensor(forward["text_logits"])
    with torch.no_grad():
        with_oracle = lm(codes, oracle_tokens=oracle).text_logits[0, 0]
        without_oracle = lm(codes).text_logits[0, 0]
    assert with_oracle.shape == expected.shape
    assert (with_oracle - expected).abs().max().item() < 1e-4
    # The oracle stream matters: the plain Moshi path is far from the trace.
    assert (without_oracle - expected).abs().max().item() > 1e-2


def test_replay_explains_a_bad_checkpoint(parity_dir, tmp_path, capsys):
    status = kame(
        [
            "replay",
            "--checkpoint",
            str(tmp_path),
            "--trace",
            str(parity_dir / "trace.json"),
            "--out",
            str(tmp_path / "out.json"),
        ]
    )
    assert status == 2
    assert "config.json is missing" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
