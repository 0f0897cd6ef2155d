"""The held-out question set (bench/questions/heldout/) stays held out: no other
file under tests/ names one of its voices, one of its questions or its directory,
so a bench on it measures voices and questions that nothing here was tuned on
(issue #32). And its entries are well formed and are what kame_cli/bench/make_questions.py
makes.

This file reads the voices and questions from the set and never spells them out,
so the guard does not trip on itself."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import pytest

from kame_cli.bench import make_questions
from kame_cli.bench.questions import BUILTIN_QUESTIONS, load_questions
from tests.bench.unused_sets import flat, guard_catches, uses_of_the_set

ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = ROOT / "tests"
SET_NAME = "heldout"
SET_DIR = ROOT / "bench" / "questions" / SET_NAME
ESPEAK_SET = ROOT / "bench" / "questions" / "espeak" / "questions.json"
WAV_RATE = 16_000


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return json.loads((SET_DIR / "questions.json").read_text())


def test_no_other_test_uses_the_held_out_set(entries):
    assert uses_of_the_set(entries, SET_NAME, TESTS_DIR, Path(__file__).resolve()) == []


def test_the_guard_catches_a_test_that_uses_the_set(entries, tmp_path):
    """A test using a held-out voice, question or the directory is found: the
    guard above can fail."""
    guard_catches(entries, SET_NAME, tmp_path)


def test_the_entries_are_well_formed(entries):
    assert len(entries) >= 12
    for entry in entries:
        assert entry["text"].strip() and entry["voice"].strip(), entry
        assert entry["keywords"] and all(k.strip() for k in entry["keywords"]), entry
        with wave.open(str(SET_DIR / entry["wav"]), "rb") as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, WAV_RATE)
            assert 1.0 < wav.getnframes() / WAV_RATE < 6.0, entry["wav"]
    questions = load_questions(SET_DIR / "questions.json")  # as `kame bench --questions` reads it
    assert [q.text for q in questions] == [e["text"] for e in entries]
    assert all(q.speech_end_s is not None for q in questions)


def test_the_voices_and_questions_are_new(entries):
    """Voice+variant combinations and questions that neither the espeak set (which
    the tests use) nor `kame bench`'s built-in questions have; about a third by phone."""
    espeak_set = json.loads(ESPEAK_SET.read_text())
    voices = [entry["voice"] for entry in entries]
    assert all("+" in voice for voice in voices) and len(set(voices)) == len(voices)
    assert not set(voices) & {entry["voice"] for entry in espeak_set}
    seen = {flat(text) for text, _ in BUILTIN_QUESTIONS} | {flat(e["text"]) for e in espeak_set}
    assert not seen & {flat(entry["text"]) for entry in entries}
    by_phone = sum(entry.get("telephone", False) for entry in entries)
    assert len(entries) / 4 <= by_phone <= len(entries) / 2


def test_the_script_describes_the_committed_set(entries):
    made = [
        q.entry(e["wav"]) for q, e in zip(make_questions.HELDOUT_QUESTIONS, entries, strict=True)
    ]
    assert made == entries
    checked = json.loads((SET_DIR / "check.json").read_text())
    assert [row["text"] for row in checked] == [entry["text"] for entry in entries]
    # Kept: questions the oracle's model answers right from their exact text.
    assert all(row["llm_right_from_text"] for row in checked)


def test_each_variant_is_spoken_and_a_phone_question_regenerates(tmp_path, entries):
    """espeak-ng 1.51 speaks "en-gb+m4" as plain en-gb, a voice the tests use:
    every held-out variant must change the voice. And a telephone question comes
    out of the script byte for byte."""
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        pytest.skip("espeak-ng and sox are not installed")
    for tool, version in make_questions.MADE_WITH.items():
        if make_questions.tool_version(tool) != version:
            pytest.skip(f"{tool} is not version {version}, which made the committed WAVs")
    assert not [e["voice"] for e in entries if make_questions.variant_is_ignored(e["voice"])]
    index, question = next(
        (i, q) for i, q in enumerate(make_questions.HELDOUT_QUESTIONS) if q.telephone
    )
    make_questions.synthesize(question, tmp_path / "q.wav")
    assert (tmp_path / "q.wav").read_bytes() == (SET_DIR / entries[index]["wav"]).read_bytes()
