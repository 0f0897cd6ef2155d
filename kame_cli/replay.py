"""`kame replay --checkpoint DIR --trace FILE --out OUT.json`: run a KAME parity
trace greedily through the kame engine's step path and write `{"steps": [...]}`,
one entry per trace step: null or the step's `[text, audio...]` tokens.

Exit status 0 when every `expect` of the trace is reproduced, 1 otherwise."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kame_cli.errors import USAGE, CliError, one_line
from kame_cli.stack_options import add_dtype_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint directory (config.json + LM safetensors) or HF repo id",
    )
    parser.add_argument("--trace", required=True, type=Path, help="trace JSON")
    parser.add_argument("--out", required=True, type=Path, help="where to write the outputs")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add_dtype_argument(parser)


def run(args: argparse.Namespace) -> int:
    # torch and moshi load only when the command runs.
    from services.frontend.engines.kame.checkpoint import CheckpointError
    from services.frontend.engines.kame.trace import TraceError, mismatches, replay

    try:
        trace = json.loads(args.trace.read_text())
        outputs = replay(trace, args.checkpoint, args.device, args.dtype)
    except (OSError, json.JSONDecodeError, CheckpointError, TraceError) as exc:
        raise CliError(one_line(exc), USAGE) from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"steps": outputs}) + "\n")
    bad = mismatches(trace, outputs)
    compared = sum("expect" in step for step in trace["steps"])
    print(
        f"kame replay: {len(outputs)} steps written to {args.out}; "
        f"{compared - len(bad)}/{compared} match the trace's expect"
    )
    if bad:
        raise CliError(f"steps differing from expect: {bad}")
    return 0
