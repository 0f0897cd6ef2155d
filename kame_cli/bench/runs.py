"""What is compared: a run is a mode (the gateway's oracle policy) on a frontend engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    label: str
    mode: str  # tandem, cascade or s2s
    engine: str  # the frontend engine: tts, kame or moshi

    @property
    def has_oracle(self) -> bool:
        return self.mode != "s2s"


def plan_runs(checkpoint: str) -> list[Run]:
    """tandem and cascade on the tts engine; with a checkpoint also tandem on kame and s2s."""
    runs = [Run("tandem", "tandem", "tts"), Run("cascade", "cascade", "tts")]
    if checkpoint:
        runs += [Run("tandem-kame", "tandem", "kame"), Run("s2s", "s2s", "moshi")]
    return runs


def select_runs(planned: list[Run], wanted: str) -> list[Run]:
    """The runs named in `wanted` (comma-separated labels), or every planned run."""
    if not wanted:
        return planned
    by_label = {run.label: run for run in planned}
    labels = [label.strip() for label in wanted.split(",") if label.strip()]
    unknown = [label for label in labels if label not in by_label]
    if unknown:
        raise ValueError(
            f"--runs: unknown run(s) {', '.join(unknown)}; with these options the "
            f"runs are {', '.join(by_label)} (kame and s2s need --checkpoint)"
        )
    return [by_label[label] for label in labels]


def pick_load_run(
    planned: list[Run], levels: Sequence[int], label: str, checkpoint: str
) -> Run | None:
    """The run the load levels use: `label`, else tandem-kame with a checkpoint, else tandem."""
    if not levels:
        return None
    return select_runs(planned, label or ("tandem-kame" if checkpoint else "tandem"))[0]
