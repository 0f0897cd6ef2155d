"""The committed espeak-ng question set (bench/questions/espeak/): what the bench
and the issue ask of it, and that kame_cli/bench/make_questions.py makes exactly it."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import pytest

from kame_cli.bench import make_questions
from kame_cli.bench.questions import BUILTIN_QUESTIONS, load_questions, words

ROOT = Path(__file__).resolve().parents[2]
SET_DIR = ROOT / "bench" / "questions" / "espeak"


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return json.loads((SET_DIR / "questions.json").read_text())


def test_the_set_is_new_questions_in_several_voices(entries):
    assert len(entries) >= 12
    builtin = {" ".join(words(text)) for text, _ in BUILTIN_QUESTIONS}
    assert not builtin & {" ".join(words(e["text"])) for e in entries}
    assert len({e["voice"].split("+")[0] for e in entries}) >= 4
    assert len({e["voice"] for e in entries}) >= 8
    assert len({e["speed_wpm"] for e in entries}) >= 3 and len({e["pitch"] for e in entries}) >= 3
    assert all(e["keywords"] and all(k.strip() for k in e["keywords"]) for e in entries)


def test_the_wavs_are_small_mono_16_bit_speech(entries):
    for entry in entries:
        with wave.open(str(SET_DIR / entry["wav"]), "rb") as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16_000)
            assert 1.0 < wav.getnframes() / 16_000 < 6.0, entry["wav"]
    questions = load_questions(SET_DIR / "questions.json")
    assert [q.text for q in questions] == [e["text"] for e in entries]
    assert all(q.speech_end_s is not None for q in questions)


def test_the_script_describes_the_committed_set(entries):
    assert [q.entry(e["wav"]) for q, e in zip(make_questions.QUESTIONS, entries, strict=True)] == (
        entries
    )
    checked = json.loads((SET_DIR / "check.json").read_text())
    assert [row["text"] for row in checked] == [e["text"] for e in entries]
    # Kept: questions the oracle's model answers right from their exact text.
    assert sum(row["llm_right_from_text"] for row in checked) >= 10


def test_regenerating_gives_the_same_bytes(tmp_path, entries):
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        pytest.skip("espeak-ng and sox are not installed")
    for tool, version in make_questions.MADE_WITH.items():
        if make_questions.tool_version(tool) != version:
            pytest.skip(f"{tool} is not version {version}, which made the committed WAVs")
    make_questions.synthesize(make_questions.QUESTIONS[0], tmp_path / "q.wav")
    assert (tmp_path / "q.wav").read_bytes() == (SET_DIR / entries[0]["wav"]).read_bytes()
