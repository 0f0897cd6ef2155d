"""GPU readiness of the kame stack: one GPU, under 8 minutes (issue #18).

`scripts/gpu_check.sh` runs this after checking that there is a GPU. In order:

1. build: the full 7B Moshi LM config with the oracle table and the real Mimi
   config, random weights, the LM in bfloat16 (Mimi in float32, as the engine
   loads it), built on the GPU.
2. parity: greedy, 4 sessions joining one batch at ticks 0-3, each with its
   own audio and oracle. Each row must produce exactly the tokens it produces
   as the only active row of the same batch, joining at tick 0: rows do not
   mix, a masked row's state does not move, CUDA graphs replay right under
   changing masks. Each is also run as a batch of one and compared; on the CPU that
   must match too, on the GPU in bfloat16 a batch of one multiplies with other
   kernels, which round differently, so a greedy run may part ways at a
   near-tie: the matching steps are reported.
3. step: tick time (Mimi encode, LM step with the oracle stream, Mimi decode;
   with moshi's CUDA graphs, as the engine runs) at batch 1, 8, 32 and 64:
   p50, p99 and peak memory. The goal: 32 sessions or more at p99 under 80 ms.
4. e2e (kame_cli/bench/gpu_check_e2e.py): the random weights written as a
   checkpoint in the Hugging Face layout, a `kame up` stack on free ports with
   the kame engine on the GPU (bfloat16, 4 slots), and one `kame talk`
   conversation through the gateway. Random weights say nothing of the
   answer; timing is what counts: frame lag at the caller, the frontend's
   tick time and sessions per tick.
5. stt: kame_cli/bench/stt_bench.py with Whisper on the GPU (float16) at 1 and 16
   real-time sessions.

Each part writes gpu_<part>.json under --out (bench/results) as soon as it is
done; then gpu_summary.json and the table gpu_check.md, also printed. A part
that fails is recorded with its error and the later parts still run; the exit
status is 1 if any part failed. build, parity and step need only torch and
moshi (with the repo's own packages); e2e and stt import their install when
they start, so where it is missing (a GPU image with torch but not the whole
stack) they fail at once with "missing dependency" and the rest still runs.
`--parts build,parity,step` runs only those; `--dtype float32` builds the LM
in float32 instead of bfloat16. `--cpu-smoke` runs the same code
on the CPU with a tiny config, batch sizes 1 and 2 (for tests; --out defaults
to a new temporary directory then).

    scripts/gpu_check.sh [--out DIR] [--keep-scratch] [--parts LIST] [--dtype D]

What these parts mean for the number of callers a GPU serves (the frontend's
batch slots, the LLM on vLLM or an API, Whisper on the GPU) and the `kame bench
--load` run to make there: docs/capacity.md, "The GPU plan".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import moshi
import numpy as np
import torch
from moshi.models.compression import MimiModel

from kame_cli.bench import kame_step_bench
from kame_cli.bench.paths import RESULTS_DIR
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, Samples
from services.frontend.engines.kame.batch import SlotBatch
from services.frontend.engines.kame.checkpoint import DTYPES, parse_dtype
from services.frontend.engines.kame.moshi_adapter import (
    builtin_lm_kwargs,
    builtin_mimi_config,
    cuda_graphs_enabled,
)
from services.frontend.engines.kame.oracle import KameLMModel

BUDGET_S = 8 * 60
GOAL_SESSIONS = 32
ORACLE_STEP = 2  # parity: each row's oracle starts at its own step 2
PARTS = ("build", "parity", "step", "e2e", "stt")
MODEL_PARTS = ("parity", "step", "e2e")  # they run on the model that build makes

# The smoke test's LM: Moshi's layout and vocabularies, a few thousand times smaller.
TINY_LM = {
    **builtin_lm_kwargs(),
    "dim": 64,
    "num_heads": 4,
    "num_layers": 2,
    "hidden_scale": 2,
    "depformer_dim": 32,
    "depformer_num_heads": 2,
    "depformer_num_layers": 1,
    "depformer_dim_feedforward": 64,
    "context": 100,
}


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    device: str
    dtype: str
    lm_kwargs: dict[str, Any]
    mimi_config: dict[str, Any]
    batch_sizes: tuple[int, ...]
    timed_ticks: int  # per batch size
    warmup_ticks: int  # untimed first (CUDA graph capture)
    parity_rows: int
    parity_steps: int
    e2e_slots: int
    # Random weights never stop speaking: the call lasts the question plus this.
    e2e_wait_s: float
    stt_device: str
    stt_compute_type: str
    stt_sessions: tuple[int, ...]
    stt_sentences: int  # of stt_bench's script, each session speaks the first N


GPU = Profile(
    name="gpu",
    device="cuda",
    dtype="bfloat16",
    lm_kwargs=builtin_lm_kwargs(),
    mimi_config=builtin_mimi_config(),
    batch_sizes=(1, 8, 32, 64),
    timed_ticks=100,
    warmup_ticks=10,
    parity_rows=4,
    parity_steps=24,
    e2e_slots=4,
    e2e_wait_s=20.0,
    stt_device="cuda",
    stt_compute_type="float16",
    stt_sessions=(1, 16),
    stt_sentences=4,
)
CPU_SMOKE = Profile(
    name="cpu-smoke",
    device="cpu",
    dtype="float32",
    lm_kwargs=TINY_LM,
    mimi_config=kame_step_bench.SMALL_MIMI,
    batch_sizes=(1, 2),
    timed_ticks=5,
    warmup_ticks=2,
    parity_rows=2,
    parity_steps=6,
    e2e_slots=2,
    e2e_wait_s=3.0,
    stt_device="cpu",
    stt_compute_type="int8",
    stt_sessions=(1, 2),
    stt_sentences=1,  # the smoke shows the part runs; the GPU profile measures
)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def free_memory(device: str) -> None:
    gc.collect()  # moshi's streaming states hold reference cycles
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def memory_gb(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def environment(profile: Profile) -> dict[str, Any]:
    gpu = torch.cuda.get_device_name() if profile.device.startswith("cuda") else None
    return {
        "profile": profile.name,
        "device": profile.device,
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "moshi": moshi.__version__,
        "cuda_graphs": profile.device.startswith("cuda") and cuda_graphs_enabled(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


# ---- 1. build ----------------------------------------------------------------


def part_build(profile: Profile) -> tuple[dict[str, Any], KameLMModel, MimiModel]:
    torch.manual_seed(0)
    started = time.perf_counter()
    lm, mimi = kame_step_bench.build_models(
        profile.lm_kwargs, profile.mimi_config, profile.device, parse_dtype(profile.dtype)
    )
    synchronize(profile.device)
    result = {
        "ok": True,
        "lm_dtype": str(next(lm.parameters()).dtype).removeprefix("torch."),  # as built
        "lm_parameters_b": round(sum(p.numel() for p in lm.parameters()) / 1e9, 3),
        "mimi_parameters_m": round(sum(p.numel() for p in mimi.parameters()) / 1e6, 1),
        "context_steps": profile.lm_kwargs["context"],
        "build_s": round(time.perf_counter() - started, 2),
        "memory_gb": memory_gb(profile.device),
    }
    return result, lm, mimi


# ---- 2. parity ---------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One session of the parity plan: its frames, its oracle, the tick it joins at."""

    frames: list[Samples]
    oracle: list[int]
    join: int


Tokens = list[list[int] | None]


def parity_rows(rows: int, steps: int) -> list[Row]:
    rng = np.random.default_rng(0)
    return [
        Row(
            [(0.1 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32) for _ in range(steps)],
            list(range(100 + 11 * row, 140 + 11 * row)),
            join=row,
        )
        for row in range(rows)
    ]


def run_rows(batch: SlotBatch, plan: dict[int, Row]) -> dict[int, Tokens]:
    """The rows of `plan` (slot -> row) in one batch from a reset; tokens per slot."""
    batch.reset(range(batch.slots))
    tokens: dict[int, Tokens] = {slot: [] for slot in plan}
    last_tick = max(row.join + len(row.frames) for row in plan.values())
    for tick in range(last_tick):
        frames = {}
        for slot, row in plan.items():
            step = tick - row.join
            if 0 <= step < len(row.frames):
                if step == ORACLE_STEP:
                    batch.oracle_reset(slot)
                    batch.oracle_append(slot, row.oracle)
                frames[slot] = row.frames[step]
        for slot, output in batch.step_audio(frames).items():
            tokens[slot].append(output.tokens)
    return tokens


def matching_steps(a: Tokens, b: Tokens) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def part_parity(profile: Profile, lm: KameLMModel, mimi: MimiModel) -> dict[str, Any]:
    rows = parity_rows(profile.parity_rows, profile.parity_steps)
    wide = SlotBatch(lm, len(rows), mimi=mimi, use_sampling=False)
    try:
        together = run_rows(wide, dict(enumerate(rows)))
        # Each row alone in its slot, from tick 0: same kernels, no neighbours, no
        # masked ticks before it joins.
        isolated = {
            slot: run_rows(wide, {slot: dataclasses.replace(row, join=0)})[slot]
            for slot, row in enumerate(rows)
        }
    finally:
        wide.close()
    single = SlotBatch(lm, 1, mimi=mimi, use_sampling=False)
    try:
        alone = [run_rows(single, {0: dataclasses.replace(row, join=0)})[0] for row in rows]
    finally:
        single.close()
    free_memory(profile.device)

    per_row = [
        {
            "row": slot,
            "joins_at_tick": row.join,
            "isolated_identical": together[slot] == isolated[slot],
            "batch_of_one_identical": together[slot] == alone[slot],
            "batch_of_one_matching_steps": matching_steps(together[slot], alone[slot]),
        }
        for slot, row in enumerate(rows)
    ]
    rows_differ = len({json.dumps(tokens) for tokens in together.values()}) == len(rows)
    exact_batch_of_one = profile.device == "cpu"  # same kernels whatever the batch size
    ok = (
        rows_differ
        and all(r["isolated_identical"] for r in per_row)
        and (not exact_batch_of_one or all(r["batch_of_one_identical"] for r in per_row))
    )
    return {
        "ok": ok,
        "rows": len(rows),
        "steps": profile.parity_steps,
        "sampling": "greedy",
        "rows_differ": rows_differ,
        "batch_of_one_must_match": exact_batch_of_one,
        "per_row": per_row,
    }


# ---- 3. step time ------------------------------------------------------------


def step_row(profile: Profile, lm: KameLMModel, mimi: MimiModel, size: int) -> dict[str, Any]:
    if profile.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    batch = SlotBatch(lm, size, mimi=mimi, use_sampling=True)
    try:
        timings = kame_step_bench.time_ticks(batch, profile.timed_ticks, profile.warmup_ticks)
    finally:
        batch.close()
    p50, p90, p99 = (float(np.percentile(timings, q)) for q in (50, 90, 99))
    return {
        "batch_size": size,
        "ticks": len(timings),
        "tick_p50_s": round(p50, 5),
        "tick_p90_s": round(p90, 5),
        "tick_p99_s": round(p99, 5),
        "tick_max_s": round(max(timings), 5),
        "tick_mean_s": round(statistics.fmean(timings), 5),
        "per_session_p50_s": round(p50 / size, 6),
        "p99_under_80ms": p99 < FRAME_SECONDS,
        "peak_memory_gb": memory_gb(profile.device),
    }


def part_step(profile: Profile, lm: KameLMModel, mimi: MimiModel) -> dict[str, Any]:
    rows = []
    for size in profile.batch_sizes:
        try:
            rows.append(step_row(profile, lm, mimi, size))
        except torch.cuda.OutOfMemoryError:
            rows.append({"batch_size": size, "error": "out of GPU memory"})
        # Each batch size as it is done: a run stopped at its time limit keeps them.
        print(f"gpu_check: step {json.dumps(rows[-1])}", flush=True)
        free_memory(profile.device)
    fitting = [row["batch_size"] for row in rows if row.get("p99_under_80ms")]
    max_sessions = max(fitting, default=0)
    return {
        "ok": all("error" not in row for row in rows),
        "timed_ticks": profile.timed_ticks,
        "warmup_ticks": profile.warmup_ticks,
        "rows": rows,
        "max_sessions_p99_under_80ms": max_sessions,
        "goal_sessions": GOAL_SESSIONS,
        "goal_met": max_sessions >= GOAL_SESSIONS,
        "note": "tick = Mimi encode + LM step with the oracle stream + Mimi decode, every "
        "slot busy; the goal is measured on the GPU profile only",
    }


# ---- 5. stt -----------------------------------------------------------------


def part_stt(profile: Profile) -> dict[str, Any]:
    from kame_cli.bench import (
        stt_bench,
    )  # Whisper's install (faster-whisper, CTranslate2): this part's

    args = stt_bench.parse_args(
        [
            "--device",
            profile.stt_device,
            "--compute-type",
            profile.stt_compute_type,
            "--sessions",
            ",".join(map(str, profile.stt_sessions)),
            "--rounds",
            "1",
            "--sentences",
            str(profile.stt_sentences),
        ]
    )
    report: dict[str, Any] = asyncio.run(stt_bench.main_async(args))
    levels = report["levels"]
    ran = [level["sessions"] for level in levels]
    complete = all(level["finals"] >= level["utterances"] for level in levels)
    return {"ok": ran == list(profile.stt_sessions) and complete, **report}


# ---- the run -----------------------------------------------------------------


class MissingDependency(RuntimeError):
    """A part cannot run here: a package or program it needs is not installed."""


def run_part(
    name: str, out: Path, parts: dict[str, dict[str, Any]], work: Callable[[], dict[str, Any]]
) -> None:
    """Run one part, record its result (or its error) and write gpu_<name>.json."""
    print(f"gpu_check: {name} ...", flush=True)
    started = time.monotonic()
    try:
        result = work()
    except (ModuleNotFoundError, MissingDependency) as exc:  # nothing of the part ran
        print(f"gpu_check: {name}: missing dependency: {exc}", flush=True)
        result = {"ok": False, "error": f"missing dependency: {exc}"}
    except Exception as exc:  # a failed part is a result; the later parts still run
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["wall_s"] = round(time.monotonic() - started, 1)
    parts[name] = result
    (out / f"gpu_{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


def parts_to_run(asked: tuple[str, ...]) -> tuple[str, ...]:
    """The asked parts in run order, with build when a part needs its model."""
    needed = set(asked) | ({"build"} if set(asked) & set(MODEL_PARTS) else set())
    return tuple(part for part in PARTS if part in needed)


def run(
    profile: Profile, out: Path, scratch: Path, asked: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    to_run = parts_to_run(asked)
    parts: dict[str, dict[str, Any]] = {}
    built: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        result, built["lm"], built["mimi"] = part_build(profile)
        return result

    def end_to_end() -> dict[str, Any]:
        from kame_cli.bench import gpu_check_e2e  # the whole stack's install: this part's alone

        missing = gpu_check_e2e.stack_missing()  # before 16 GB of weights are written
        if missing is not None:
            raise MissingDependency(missing)
        return gpu_check_e2e.check_conversation(
            profile, built, scratch, lambda: free_memory(profile.device)
        )

    model_parts: dict[str, Callable[[], dict[str, Any]]] = {
        "parity": lambda: part_parity(profile, built["lm"], built["mimi"]),
        "step": lambda: part_step(profile, built["lm"], built["mimi"]),
        "e2e": end_to_end,
    }
    if "build" in to_run:
        run_part("build", out, parts, build)
    for name in (part for part in MODEL_PARTS if part in to_run):
        if built:
            run_part(name, out, parts, model_parts[name])
    built.clear()
    free_memory(profile.device)
    if "stt" in to_run:
        run_part("stt", out, parts, lambda: part_stt(profile))

    wall_s = round(time.monotonic() - started, 1)
    summary = {
        "ok": all(part["ok"] for part in parts.values()) and len(parts) == len(to_run),
        "environment": environment(profile),
        "wall_s": wall_s,
        "under_8_min": wall_s < BUDGET_S,
        "parts_run": list(to_run),
        "parts": {
            name: {"ok": part["ok"], "wall_s": part["wall_s"]} for name, part in parts.items()
        },
        "goal_met": parts.get("step", {}).get("goal_met", False),
    }
    (out / "gpu_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(profile, parts, summary)
    (out / "gpu_check.md").write_text(text)
    print(text, flush=True)
    return summary


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _gb(size: float | None) -> str:
    return "" if size is None else f", {size} GB"


def table(profile: Profile, parts: dict[str, dict[str, Any]], summary: dict[str, Any]) -> str:
    env = summary["environment"]
    lines = [
        f"# kame GPU check: {env['gpu'] or env['device']} ({profile.name}), torch {env['torch']}, "
        f"moshi {env['moshi']}, CUDA graphs {'on' if env['cuda_graphs'] else 'off'}",
        "",
        "| part | ok | figures |",
        "| --- | --- | --- |",
    ]

    def row(name: str, figures: str) -> None:
        if name not in summary["parts_run"]:
            lines.append(f"| {name} | not run | not asked (--parts) |")
            return
        part = parts.get(name, {})
        ok = "yes" if part.get("ok") else "NO"
        lines.append(f"| {name} | {ok} | {part.get('error') or figures} |")

    build = parts.get("build", {})
    row(
        "build",
        f"LM {build.get('lm_parameters_b')} B parameters in {build.get('lm_dtype')}, "
        f"context {build.get('context_steps')} steps, built in {build.get('build_s')} s"
        f"{_gb(build.get('memory_gb'))}",
    )
    parity = parts.get("parity", {})
    per_row = parity.get("per_row", [])
    row(
        "parity",
        f"{parity.get('rows')} rows x {parity.get('steps')} steps, greedy: alone in the batch "
        f"identical {sum(r['isolated_identical'] for r in per_row)}/{len(per_row)}; batch of "
        f"one identical {sum(r['batch_of_one_identical'] for r in per_row)}/{len(per_row)} "
        f"(matching steps {[r['batch_of_one_matching_steps'] for r in per_row]})",
    )
    step = parts.get("step", {})
    figures = [
        f"batch {r['batch_size']}: "
        + (
            r["error"]
            if "error" in r
            else f"p50 {_ms(r['tick_p50_s'])} / p99 {_ms(r['tick_p99_s'])} ms"
            f"{'' if r['p99_under_80ms'] else ' (over 80)'}{_gb(r['peak_memory_gb'])}"
        )
        for r in step.get("rows", [])
    ]
    row(
        "step",
        "; ".join(figures) + f"; p99 under 80 ms up to {step.get('max_sessions_p99_under_80ms')} "
        f"sessions (goal {GOAL_SESSIONS})",
    )
    e2e = parts.get("e2e", {})
    frontend = e2e.get("frontend", {})
    row(
        "e2e",
        f"{e2e.get('status')}: {e2e.get('frames')} agent frames, lag p50 "
        f"{_ms(e2e.get('frame_lag_p50_s'))} / p99 {_ms(e2e.get('frame_lag_p99_s'))} ms, "
        f"{e2e.get('late_frames')} late; frontend tick p50 {_ms(frontend.get('tick_p50_s'))} / "
        f"p99 {_ms(frontend.get('tick_p99_s'))} ms, {frontend.get('sessions_per_tick')} sessions "
        f"per tick; stack up in {e2e.get('stack_startup_s')} s",
    )
    stt = parts.get("stt", {})
    row(
        "stt",
        "; ".join(
            f"{level['sessions']} sessions: final lag median "
            f"{_ms(level['final_lag_median_s'])} / p90 {_ms(level['final_lag_p90_s'])} ms, "
            f"partial lag median {_ms(level['partial_lag_median_s'])} ms"
            for level in stt.get("levels", [])
        )
        + f" ({profile.stt_device}, {profile.stt_compute_type})",
    )
    goal = "step not run" if "step" not in parts else "met" if summary["goal_met"] else "not met"
    lines += [
        "",
        f"Total {summary['wall_s']} s ({'under' if summary['under_8_min'] else 'OVER'} 8 min); "
        f"all parts ok: {'yes' if summary['ok'] else 'NO'}; goal ({GOAL_SESSIONS} sessions at "
        f"p99 < 80 ms): {goal}.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="the same code on the CPU, a tiny config"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results (default bench/results; smoke: a temp dir)"
    )
    parser.add_argument(
        "--scratch", type=Path, default=None, help="checkpoint and logs (default: a temp dir)"
    )
    parser.add_argument(
        "--keep-scratch", action="store_true", help="keep the stack's logs after a clean run"
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=None,
        help="the LM's dtype (default: bfloat16 on the GPU, float32 in the smoke run); "
        "float32 on the GPU tells rounding from a real difference in parity",
    )
    parser.add_argument(
        "--parts",
        type=part_list,
        default=PARTS,
        help=f"comma-separated parts to run (default all: {','.join(PARTS)}); "
        f"{', '.join(MODEL_PARTS)} bring build with them",
    )
    return parser.parse_args(argv)


def part_list(text: str) -> tuple[str, ...]:
    """--parts: names from PARTS, comma-separated."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names or any(name not in PARTS for name in names):
        raise argparse.ArgumentTypeError(f"expected parts from {','.join(PARTS)}, got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = CPU_SMOKE if args.cpu_smoke else GPU
    if args.dtype is not None:
        profile = dataclasses.replace(profile, dtype=args.dtype)
    if profile.device == "cpu":
        torch.set_num_threads(2)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="kame-gpu-check-smoke-")) if args.cpu_smoke else RESULTS_DIR
    )
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="kame-gpu-check-"))
    summary = run(profile, out, scratch, args.parts)
    if summary["ok"] and not args.keep_scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"gpu_check: stack logs kept in {scratch / 'logs'}")
    print(f"gpu_check: results in {out}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
