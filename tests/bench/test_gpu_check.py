"""scripts/gpu_check.sh and kame_cli/bench/gpu_check.py: without a GPU the script fails with
one clear line; the parity check catches rows that mix; `--cpu-smoke` runs every
part of the GPU check (build, parity, step time, a conversation through a whole
stack, STT) on the CPU with a tiny config and writes the results; --parts runs the
asked parts, and a part whose install is missing fails in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kame_cli.bench import gpu_check, gpu_check_e2e
from services.frontend.engines.kame.batch import SlotBatch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run_script(args: list[str], fake_nvidia_smi: str, tmp_path: Path, timeout: float = 30):
    """The script with `nvidia-smi` replaced by a stub that exits with the given
    status (so the result does not depend on this machine) and this Python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "nvidia-smi"
    stub.write_text(f"#!/bin/sh\nexit {fake_nvidia_smi}\n")
    stub.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_without_a_gpu_the_script_fails_with_one_clear_line(tmp_path):
    done = run_script([], fake_nvidia_smi="9", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("gpu_check: no NVIDIA GPU here")
    assert "--cpu-smoke" in done.stderr
    assert done.stdout == ""  # nothing ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_a_torch_without_cuda_is_named(tmp_path):
    done = run_script([], fake_nvidia_smi="0", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "has no CUDA torch" in done.stderr


def test_parity_catches_rows_that_step_when_masked(monkeypatch):
    profile = gpu_check.CPU_SMOKE
    torch.manual_seed(0)
    _, lm, mimi = gpu_check.part_build(profile)
    result = gpu_check.part_parity(profile, lm, mimi)
    assert result["ok"] and result["rows_differ"]
    assert all(
        row["isolated_identical"] and row["batch_of_one_identical"] for row in result["per_row"]
    )

    # A batch whose exec mask lets every row step, given a frame or not.
    def every_row(self: SlotBatch, _slots) -> torch.Tensor:
        return torch.ones(self.slots, dtype=torch.bool)

    monkeypatch.setattr(SlotBatch, "_mask", every_row)
    broken = gpu_check.part_parity(profile, lm, mimi)
    assert not broken["ok"]
    assert not all(row["isolated_identical"] for row in broken["per_row"])


def test_the_cpu_smoke_runs_every_part_and_writes_the_results(tmp_path):
    out = tmp_path / "results"
    done = run_script(
        ["--cpu-smoke", "--out", str(out), "--scratch", str(tmp_path / "scratch")],
        fake_nvidia_smi="9",  # --cpu-smoke needs no GPU
        tmp_path=tmp_path,
        timeout=480,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parts = {
        name: json.loads((out / f"gpu_{name}.json").read_text())
        for name in ("build", "parity", "step", "e2e", "stt", "summary")
    }
    summary = parts.pop("summary")
    assert summary["ok"] and summary["environment"]["profile"] == "cpu-smoke"
    assert set(summary["parts"]) == set(parts)
    assert all(part["ok"] and part["wall_s"] >= 0 for part in parts.values())

    assert parts["build"]["lm_parameters_b"] > 0
    assert parts["parity"]["rows"] == 2 and len(parts["parity"]["per_row"]) == 2
    step_rows = parts["step"]["rows"]
    assert [row["batch_size"] for row in step_rows] == [1, 2]
    for row in step_rows:
        assert 0 < row["tick_p50_s"] <= row["tick_p99_s"] <= row["tick_max_s"]
        assert row["ticks"] == gpu_check.CPU_SMOKE.timed_ticks
    e2e = parts["e2e"]
    assert e2e["status"] == "OK" and e2e["frames"] > 25  # the question plus the wait
    assert e2e["frontend"]["ticks"] > 0 and e2e["frontend"]["sessions_per_tick"] >= 1
    assert e2e["frame_lag_p50_s"] > 0
    assert [level["sessions"] for level in parts["stt"]["levels"]] == [1, 2]

    table = (out / "gpu_check.md").read_text()
    for name in ("build", "parity", "step", "e2e", "stt"):
        assert f"| {name} | yes |" in table
    assert "batch 1: p50" in table and "batch 2: p50" in table
    assert table in done.stdout
    assert not (tmp_path / "scratch" / "checkpoint").exists()  # the weights are removed


def test_parts_run_alone_and_a_missing_install_is_named(tmp_path):
    """--parts parity,stt runs build (parity's model), parity and stt only; with
    faster-whisper not importable, stt fails at once as a missing dependency and
    the rest is still recorded."""
    out = tmp_path / "results"
    blocked = (
        "import sys; sys.modules['faster_whisper'] = None; "  # as if not installed
        "from kame_cli.bench.gpu_check import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked, "--cpu-smoke", "--out", str(out), "--parts", "parity,stt"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["parts_run"] == ["build", "parity", "stt"]
    assert not summary["ok"]
    assert {name: part["ok"] for name, part in summary["parts"].items()} == {
        "build": True,
        "parity": True,
        "stt": False,
    }
    stt = json.loads((out / "gpu_stt.json").read_text())
    assert stt["error"].startswith("missing dependency") and "faster_whisper" in stt["error"]
    assert not (out / "gpu_step.json").exists() and not (out / "gpu_e2e.json").exists()
    table = (out / "gpu_check.md").read_text()
    assert "| parity | yes |" in table and "| stt | NO | missing dependency" in table
    assert "| step | not run |" in table and "| e2e | not run |" in table
    assert "p99 < 80 ms): step not run." in table  # not "not met": nothing was timed
    assert "Traceback" not in done.stderr  # a missing install is one line, not a crash


def test_dtype_sets_the_lm_dtype(tmp_path):
    out = tmp_path / "results"
    assert (
        gpu_check.main(
            ["--cpu-smoke", "--parts", "build", "--dtype", "bfloat16", "--out", str(out)]
        )
        == 0
    )
    build = json.loads((out / "gpu_build.json").read_text())
    assert build["ok"] and build["lm_dtype"] == "bfloat16"


def test_an_unknown_part_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--parts", "build,warp"])
    assert "expected parts from build,parity,step,e2e,stt" in capsys.readouterr().err


def test_the_stack_check_names_what_is_missing(monkeypatch, tmp_path):
    """e2e checks the stack's install before it writes the checkpoint: the
    redis-server binary, then every module the stack's processes import."""
    assert gpu_check_e2e.stack_missing() is None  # this machine has the full install

    monkeypatch.setattr(
        gpu_check_e2e, "STACK_MODULES", (*gpu_check_e2e.STACK_MODULES, "kame_no_such_module")
    )
    missing = gpu_check_e2e.stack_missing()
    assert missing is not None and "kame_no_such_module" in missing

    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server there
    assert gpu_check_e2e.stack_missing() == "no redis-server binary on PATH"
