"""The guard of the speech sets no test may use (in bench/questions: the
held-out questions, the sentences of the stt's word error rate): which files
under tests/ name one of a set's voices, one of its texts or its directory. A
set's own guard test reads the voices and texts from the set, never spelling
them out, so it does not trip on itself."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from kame_cli.bench.questions import words


def flat(text: str) -> str:
    """Words only, space-separated and padded: a text split over lines or
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


def uses_of_the_set(
    entries: list[dict],
    set_name: str,
    tests_dir: Path,
    skip: Path,
    shared_voices: Collection[str] = (),
) -> list[str]:
    """A line ("file: what") for each file under `tests_dir` (but `skip`) that
    names one of the set's voices (voice+variant; but `shared_voices`), one of its
    texts, or the set's directory `set_name`."""
    voices = {entry["voice"].lower() for entry in entries} - set(shared_voices)
    texts = {flat(entry["text"]) for entry in entries}
    found = []
    for path, text in text_files(tests_dir, skip).items():
        lower, words_only = text.lower(), flat(text)
        found += [
            f"{path}: voice {voice}"
            for voice in sorted(voices)
            if re.search(rf"(?<![\w+-]){re.escape(voice)}(?![\w+-])", lower)
        ]
        found += [f"{path}: text{t.rstrip()}" for t in sorted(texts) if t in words_only]
        if re.search(rf"\b{set_name}\b", lower):
            found.append(f"{path}: names the {set_name} directory")
    return found


def guard_catches(entries: list[dict], set_name: str, tmp_path: Path) -> None:
    """The guard finds a test naming the set's first voice, the second entry's text
    (in capitals, split over two lines) or its directory, and not a clean test."""
    voice, text = entries[0]["voice"], entries[1]["text"]
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_voice.py").write_text(f'speech = espeak(QUESTION, "{voice}")\n')
    cut = text.index(" ", len(text) // 2)  # split between words, over two lines
    (tmp_path / "test_text.py").write_text(
        f'QUESTION = ("{text[:cut].upper()}"\n    "{text[cut:]}")\n'
    )
    (tmp_path / "test_dir.py").write_text(f'SET = ROOT / "bench/questions/{set_name}"\n')
    (tmp_path / "test_clean.py").write_text('speech = espeak("What is the capital of France?")\n')
    found = uses_of_the_set(entries, set_name, tmp_path, tmp_path / "none")
    assert [line.split(":")[0] for line in found] == [
        str(tmp_path / "test_dir.py"),
        str(tmp_path / "test_text.py"),
        str(tmp_path / "unit" / "test_voice.py"),
    ], found
