"""The dictation set (bench/questions/dictation/), on which `kame bench --stt-wer`
measures the stt's word error rate, stays unheard by the tests: no other file
under tests/ names one of its voices, one of its sentences or its directory.
And its entries are well formed, new, and what kame_cli/bench/dictation.py makes.

This file reads the voices and sentences from the set and never spells them
out, so the guard does not trip on itself."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import pytest

from kame_cli.bench import dictation, make_questions
from kame_cli.bench.paths import DICTATION_SET, ESPEAK_QUESTIONS, QUESTIONS_DIR
from kame_cli.bench.questions import BUILTIN_QUESTIONS
from tests.bench.unused_sets import flat, guard_catches, uses_of_the_set

ROOT = Path(__file__).resolve().parents[2]
SET_DIR = DICTATION_SET
SET_NAME = SET_DIR.name
WAV_RATE = 16_000


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return json.loads((SET_DIR / dictation.INDEX).read_text())


def test_no_other_test_uses_the_set(entries):
    """Its espeak-ng voices and its sentences; the piper voice is the stack's own."""
    here = Path(__file__).resolve()
    found = uses_of_the_set(entries, SET_NAME, ROOT / "tests", here, {dictation.PIPER})
    assert found == []


def test_the_guard_catches_a_test_that_uses_the_set(entries, tmp_path):
    guard_catches(entries, SET_NAME, tmp_path)


def test_the_set_is_what_the_issue_asks(entries):
    """At least 40 sentences in at least 6 voices, the piper voice among them, a
    quarter to a half of them through the phone line; 16 kHz mono WAVs."""
    voices = {entry["voice"] for entry in entries}
    assert len(entries) >= 40 and len(voices) >= 6 and dictation.PIPER in voices
    by_phone = sum(entry["telephone"] for entry in entries)
    assert len(entries) / 4 <= by_phone <= len(entries) / 2
    for voice in voices:  # each voice by phone and not
        assert {e["telephone"] for e in entries if e["voice"] == voice} == {True, False}
    for entry in entries:
        with wave.open(str(SET_DIR / entry["wav"]), "rb") as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, WAV_RATE)
            assert 1.0 < wav.getnframes() / WAV_RATE < 8.0, entry["wav"]


def test_the_voices_and_sentences_are_new(entries):
    """espeak-ng voice+variant combinations and sentences that no other set of the
    bench has (the espeak set, which the tests use; the held-out questions;
    `kame bench`'s built-in questions), each sentence once."""
    other_sets = [json.loads(ESPEAK_QUESTIONS.read_text())] + [
        json.loads(path.read_text())
        for path in QUESTIONS_DIR.glob("*/questions.json")
        if path != ESPEAK_QUESTIONS
    ]
    assert len(other_sets) >= 2
    espeak_voices = [entry["voice"] for entry in entries if entry["voice"] != dictation.PIPER]
    assert all("+" in voice for voice in espeak_voices)
    assert not set(espeak_voices) & {entry["voice"] for s in other_sets for entry in s}
    texts = [flat(entry["text"]) for entry in entries]
    assert len(set(texts)) == len(texts)
    seen = {flat(text) for text, _ in BUILTIN_QUESTIONS}
    seen |= {flat(entry["text"]) for s in other_sets for entry in s}
    assert not seen & set(texts)


def test_the_script_describes_the_committed_set(entries):
    made = [s.entry(e["wav"]) for s, e in zip(dictation.SENTENCES, entries, strict=True)]
    assert made == entries


def test_each_variant_is_spoken_and_a_phone_sentence_regenerates(tmp_path, entries):
    """Every variant changes its voice (espeak-ng 1.51 speaks "en-gb+m4" as plain
    en-gb), and an espeak-ng sentence through the phone line comes out of the
    script byte for byte."""
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        pytest.skip("espeak-ng and sox are not installed")
    for tool, version in make_questions.MADE_WITH.items():
        if make_questions.tool_version(tool) != version:
            pytest.skip(f"{tool} is not version {version}, which made the committed WAVs")
    voices = sorted({s.voice for s in dictation.SENTENCES if s.voice != dictation.PIPER})
    assert not [voice for voice in voices if make_questions.variant_is_ignored(voice)]
    index, sentence = next(
        (i, s)
        for i, s in enumerate(dictation.SENTENCES)
        if s.telephone and s.voice != dictation.PIPER
    )
    dictation.synthesize(sentence, tmp_path / "s.wav")
    assert (tmp_path / "s.wav").read_bytes() == (SET_DIR / entries[index]["wav"]).read_bytes()
