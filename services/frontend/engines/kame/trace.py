"""Parity traces: oracle operations and user codes per step, and the expected tokens.

The format is that of the parity fixture (tests/kame/fixtures/parity/README.md): `steps`,
each with `oracle` (ops applied before the step: `{"op": "reset"}` or
`{"op": "append", "tokens": [...]}`), `user_codes` and `expect`
(`[text, audio...]` or null while the acoustic delay fills).
"""

from __future__ import annotations

from typing import Any

from services.frontend.engines.kame import checkpoint
from services.frontend.engines.kame.batch import SlotBatch


class TraceError(ValueError):
    """The trace does not fit the format or the model."""


def check_trace(trace: dict[str, Any], batch: SlotBatch) -> None:
    lm = batch.lm
    if not isinstance(trace.get("steps"), list):
        raise TraceError("trace needs a list 'steps'")
    for key, model_value in (
        ("text_initial_token_id", lm.text_initial_token_id),
        ("text_padding_token_id", lm.text_padding_token_id),
        ("user_codebooks", batch.user_codebooks),
    ):
        if key in trace and trace[key] != model_value:
            raise TraceError(f"trace {key} is {trace[key]}, the checkpoint's is {model_value}")
    for index, step in enumerate(trace["steps"]):
        codes = step.get("user_codes")
        if not isinstance(codes, list) or len(codes) != batch.user_codebooks:
            raise TraceError(
                f"step {index}: user_codes must be {batch.user_codebooks} codes, got {codes!r}"
            )
        for op in step.get("oracle", []):
            if op.get("op") not in ("reset", "append"):
                raise TraceError(f"step {index}: unknown oracle op {op!r}")


def run_trace(batch: SlotBatch, trace: dict[str, Any], slot: int = 0) -> list[list[int] | None]:
    """Run every step of the trace on one slot; one output per step."""
    check_trace(trace, batch)
    batch.reset([slot])
    outputs: list[list[int] | None] = []
    for step in trace["steps"]:
        for op in step.get("oracle", []):
            if op["op"] == "reset":
                batch.oracle_reset(slot)
            else:
                batch.oracle_append(slot, op["tokens"])
        outputs.append(batch.step_codes({slot: step["user_codes"]})[slot])
    return outputs


def replay(
    trace: dict[str, Any], checkpoint_spec: str, device: str = "cpu", dtype: str = "auto"
) -> list[list[int] | None]:
    """`trace` run greedily (no sampling) on one slot of the LM of `checkpoint_spec`
    (a directory or a Hugging Face repo id; no Mimi needed): `kame replay`'s outputs.
    Raises checkpoint.CheckpointError or TraceError when either does not fit."""
    found = checkpoint.read(checkpoint.resolve(checkpoint_spec))
    lm = checkpoint.load_lm(found, device=device, dtype=checkpoint.resolve_dtype(dtype, device))
    return run_trace(SlotBatch(lm, slots=1, use_sampling=False), trace)


def mismatches(trace: dict[str, Any], outputs: list[list[int] | None]) -> list[int]:
    """Indexes of the steps whose output differs from the trace's `expect`."""
    return [
        index
        for index, (step, output) in enumerate(zip(trace["steps"], outputs, strict=True))
        if "expect" in step and step["expect"] != output
    ]
