"""Step time of the kame engine's batched step, per batch size.

One tick = Mimi encode of every session's 80 ms frame, one LM step (main
transformer + depformer) with the oracle stream, Mimi decode. The real-time
budget is 80 ms per tick; "per session" is tick time / batch size. Weights are
random (timing does not depend on them), built directly on the device.

CPU, small config (what this 2-core machine can run):
    .venv/bin/python -m kame_cli.bench.kame_step_bench
GPU, the real 7B Moshi LM and the real Mimi config, random weights:
    python -m kame_cli.bench.kame_step_bench --full --device cuda --dtype bfloat16
(needs ~16 GB for the bf16 weights plus ~1.6 GB of KV cache per session at the
real context of 3000 steps, ~42 GB at batch 16; moshi uses CUDA graphs there,
so the first steps of each batch size are warm-up and capture, not counted.)

Prints a table and writes JSON to bench/results/kame_step_bench_<config>_<device>.json.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel

from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import write_json
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS
from services.frontend.config import DTYPES
from services.frontend.engines.kame.batch import SlotBatch
from services.frontend.engines.kame.checkpoint import resolve_dtype
from services.frontend.engines.kame.moshi_adapter import builtin_lm_kwargs, builtin_mimi_config
from services.frontend.engines.kame.oracle import KameLMModel

BUILTIN_MIMI = builtin_mimi_config()
# A small Moshi: the real 16-codebook layout and vocabularies, narrow and shallow.
SMALL_LM = {
    **builtin_lm_kwargs(),
    "dim": 256,
    "num_heads": 4,
    "num_layers": 4,
    "hidden_scale": 4.125,
    "depformer_dim": 128,
    "depformer_num_heads": 4,
    "depformer_num_layers": 2,
    "depformer_dim_feedforward": 512,
    "context": 500,
}
SMALL_MIMI = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": {**BUILTIN_MIMI["seanet"], "dimension": 64, "n_filters": 8},
    "quantizer": {
        **BUILTIN_MIMI["quantizer"],
        "dimension": 32,
        "n_q": 8,
        "input_dimension": 64,
        "output_dimension": 64,
    },
    "transformer": {
        **BUILTIN_MIMI["transformer"],
        "d_model": 64,
        "num_heads": 4,
        "num_layers": 2,
        "dim_feedforward": 256,
        "input_dimension": 64,
        "output_dimensions": [64],
    },
}


def build_models(
    lm_kwargs: dict[str, Any], mimi_config: dict[str, Any], device: str, dtype: torch.dtype
) -> tuple[KameLMModel, MimiModel]:
    """The LM (in `dtype`) and Mimi (float32, as the engine loads it) with random
    weights, built directly on the device."""
    lm = KameLMModel(device=device, dtype=dtype, **lm_kwargs)
    lm.eval()
    mimi = loaders.get_mimi(None, mimi_config, device=device, num_codebooks=8)
    for name, buffer in mimi.named_buffers():
        if name.endswith("embedding_sum"):  # random codebooks instead of all-zero ones
            buffer.normal_()
    return lm, mimi


def build(full: bool, batch_size: int, device: str, dtype: torch.dtype) -> SlotBatch:
    lm, mimi = build_models(
        builtin_lm_kwargs() if full else SMALL_LM,
        BUILTIN_MIMI if full else SMALL_MIMI,
        device,
        dtype,
    )
    return SlotBatch(lm, batch_size, mimi=mimi, use_sampling=True)


def time_ticks(batch: SlotBatch, steps: int, warmup: int) -> list[float]:
    rng = np.random.default_rng(0)
    frames = {
        slot: (0.1 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32)
        for slot in range(batch.slots)
    }
    for slot in range(batch.slots):  # every session steered by an oracle, as in KAME
        batch.oracle_append(slot, list(range(100, 100 + steps + warmup)))
    timings = []
    for step in range(warmup + steps):
        started = time.perf_counter()
        batch.step_audio(frames)
        if step >= warmup:
            timings.append(time.perf_counter() - started)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="the real 7B LM and Mimi configs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="torch dtype (default auto: bfloat16 on CUDA, float32 otherwise)",
    )
    parser.add_argument("--batch-sizes", default="1,2,4,8,16")
    parser.add_argument("--steps", type=int, default=20, help="timed ticks per batch size")
    parser.add_argument("--warmup", type=int, default=4, help="untimed ticks first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = resolve_dtype(args.dtype, args.device)
    dtype_name = str(dtype).removeprefix("torch.")
    config = "full" if args.full else "small"

    rows = []
    print(
        f"kame step bench: {config} config, {args.device}, {dtype_name}, "
        f"{args.steps} ticks per batch size (medians)"
    )
    print(
        f"{'batch':>5} {'tick ms':>9} {'per session ms':>15} {'p90 tick ms':>12} "
        f"{'real-time x':>12}"
    )
    for batch_size in (int(size) for size in args.batch_sizes.split(",")):
        batch = build(args.full, batch_size, args.device, dtype)
        timings = time_ticks(batch, args.steps, args.warmup)
        tick = statistics.median(timings)
        row = {
            "batch_size": batch_size,
            "tick_median_s": tick,
            "tick_p90_s": float(np.percentile(timings, 90)),
            "per_session_median_s": tick / batch_size,
            "realtime_factor": FRAME_SECONDS / tick,
        }
        rows.append(row)
        print(
            f"{batch_size:>5} {tick * 1e3:>9.1f} {tick / batch_size * 1e3:>15.2f} "
            f"{row['tick_p90_s'] * 1e3:>12.1f} {row['realtime_factor']:>12.2f}"
        )
        del batch
        gc.collect()  # the model's hooks and streaming callbacks form reference cycles
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()

    out = args.out or RESULTS_DIR / (f"kame_step_bench_{config}_{args.device.split(':')[0]}.json")
    write_json(
        out,
        {
            "config": config,
            "device": args.device,
            "dtype": dtype_name,
            "threads": args.threads,
            "steps": args.steps,
            "warmup": args.warmup,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "rows": rows,
            "note": "real-time x = 80 ms / median tick; >1 means the batch keeps up",
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
