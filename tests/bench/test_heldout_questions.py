"""The held-out question set (bench/questions/heldout/) stays held out: no other
file under tests/ names one of its voices, one of its questions or its directory,
so a bench on it measures voices and questions that nothing here was tuned on
(issue #32). And its entries are well formed and are what kame_cli/bench/make_questions.py
makes.

This file reads the voices and questions from the set and never spells them out,
so the guard does not trip on itself."""

from __future__ import annotations

import json
import re
import shutil
import wave
from pathlib import Path

import pytest

from kame_cli.bench import make_questions
from kame_cli.bench.questions import BUILTIN_QUESTIONS, load_questions, words

ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = ROOT / "tests"
SET_NAME = "heldout"
SET_DIR = ROOT / "bench" / "questions" / SET_NAME
ESPEAK_SET = ROOT / "bench" / "questions" / "espeak" / "questions.json"
WAV_RATE = 16_000


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return json.loads((SET_DIR / "questions.json").read_text())


def flat(text: str) -> str:
    """Words only, space-separated and padded: a question split over lines or
    string literals, or in other case or punctuation, still matches."""
    return f" {' '.join(words(text))} "


def text_files(tests_dir: Path, skip: Path) -> dict[Path, str]:
    """Every readable text file under `tests_dir` but `skip`."""
    texts = {}
    for path in sorted(tests_dir.rglob("*")):
        if not path.is_file() or path.resolve() == skip or "__pycache__" in path.parts:
            continue
        try:
            texts[path] = path.read_text()
        except UnicodeDecodeError:
            continue  # a binary fixture cannot name a voice in a way a test could pass on
    return texts


def uses_of_the_set(entries: list[dict], tests_dir: Path, skip: Path) -> list[str]:
    """A line ("file: what") for each file under `tests_dir` (but `skip`) that
    names a held-out voice (voice+variant), question text, or the set's directory."""
    voices = {entry["voice"].lower() for entry in entries}
    questions = {flat(entry["text"]) for entry in entries}
    found = []
    for path, text in text_files(tests_dir, skip).items():
        lower, words_only = text.lower(), flat(text)
        found += [
            f"{path}: voice {voice}"
            for voice in sorted(voices)
            if re.search(rf"(?<![\w+-]){re.escape(voice)}(?![\w+-])", lower)
        ]
        found += [f"{path}: question{q.rstrip()}" for q in sorted(questions) if q in words_only]
        if re.search(rf"\b{SET_NAME}\b", lower):
            found.append(f"{path}: names the {SET_NAME} directory")
    return found


def test_no_other_test_uses_the_held_out_set(entries):
    assert uses_of_the_set(entries, TESTS_DIR, Path(__file__).resolve()) == []


def test_the_guard_catches_a_test_that_uses_the_set(entries, tmp_path):
    """A test using a held-out voice, question or the directory is found: the
    guard above can fail."""
    voice, question = entries[0]["voice"], entries[1]["text"]
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_voice.py").write_text(f'speech = espeak(QUESTION, "{voice}")\n')
    cut = question.index(" ", len(question) // 2)  # split between words, over two lines
    (tmp_path / "test_text.py").write_text(
        f'QUESTION = ("{question[:cut].upper()}"\n    "{question[cut:]}")\n'
    )
    (tmp_path / "test_dir.py").write_text(f'SET = ROOT / "bench/questions/{SET_NAME}"\n')
    (tmp_path / "test_clean.py").write_text('speech = espeak("What is the capital of France?")\n')
    found = uses_of_the_set(entries, tmp_path, tmp_path / "none")
    assert [line.split(":")[0] for line in found] == [
        str(tmp_path / "test_dir.py"),
        str(tmp_path / "test_text.py"),
        str(tmp_path / "unit" / "test_voice.py"),
    ], found


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
