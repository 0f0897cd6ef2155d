"""Where the benchmarks' data lives in a checkout: the question sets in
bench/questions/ and what runs wrote in bench/results/. The code that makes and
reads them is here in kame_cli/bench/ (`kame bench` and the `python -m
kame_cli.bench.NAME` scripts), so these paths are the repository's: the scripts
are run from a checkout."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
QUESTIONS_DIR = REPO_ROOT / "bench" / "questions"
ESPEAK_QUESTIONS = QUESTIONS_DIR / "espeak" / "questions.json"
DICTATION_SET = QUESTIONS_DIR / "dictation"
RESULTS_DIR = REPO_ROOT / "bench" / "results"
