"""Our Full-Duplex-Bench-format samples spoken by espeak-ng (in the espeak question
set's voices, which the tests may use; one through the phone line): each part's speech
is where the annotations say, and making them again gives the same bytes."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from kame_cli.bench import full_duplex as fdb
from kame_cli.bench import full_duplex_samples as fds
from kame_cli.bench.make_questions import QUESTIONS
from kame_cli.talk import read_wav
from kame_client.caller import speech_intervals
from kame_common.audio import SAMPLE_RATE, resample

pytestmark = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("sox")), reason="needs espeak-ng and sox"
)
POOL = tuple(dataclasses.replace(q, telephone=n % 3 == 0) for n, q in enumerate(QUESTIONS))


def test_espeak_samples_are_timed_as_annotated_and_deterministic(tmp_path):
    entries = fds.make(tmp_path / "a", 1, POOL, progress=lambda line: None)
    assert len(entries) == 3 and any(e["telephone"] for e in entries)
    for entry in entries:
        folder = tmp_path / "a" / entry["folder"] / entry["id"]
        audio, rate = read_wav(folder / "input.wav")
        heard = speech_intervals(
            resample(audio, rate, SAMPLE_RATE), bridge_s=fdb.VAD_BRIDGE_S, min_s=fdb.VAD_MIN_S
        )
        annotated = [(p["start_s"], p["end_s"]) for p in entry["parts"]]
        assert np.allclose(heard, annotated, atol=0.021), (entry["folder"], heard, annotated)
    fds.make(tmp_path / "b", 1, POOL, progress=lambda line: None)
    for wav in sorted((tmp_path / "a").rglob("*.wav")):
        assert wav.read_bytes() == (tmp_path / "b" / wav.relative_to(tmp_path / "a")).read_bytes()
