"""Smart Turn v3.2 (kame_common.turn_model) on real speech: piper's voice and
espeak-ng's, at 16 kHz and at phone quality (8 kHz G.711 mu-law and back).

A finished question must score "complete". Whether the same audio cut before its
last words scores "incomplete" is the model's quality, and it moves with the CPU:
kame_cli/bench/turn_bench.py measures it on the whole question set. Where the model
is wrong by a wide margin ("What is the capital of" scores 0.9 and more, in piper
and espeak-ng alike), the tests say so with a strict xfail, so a better model shows.
The model is asked as the turn detector will ask it: the speech, then 0.24 s of
silence (three 80 ms frames after the speech ended).

The model file is fetched as make setup does (python -m kame_cli.smart_turn_model)
if it is not installed yet; the tests skip only if it cannot be fetched.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from kame_cli.talk import read_wav
from kame_common import turn_model
from kame_common.audio import resample, through_phone
from kame_common.models import ModelNotInstalled
from kame_common.turn_model import MODEL_RATE, SmartTurn

THRESHOLD = 0.5
SILENCE_S = 0.24
LEAD_S = 0.3
HOP = MODEL_RATE // 100  # 10 ms

QUESTION = "What is the capital of France?"
KEEP = 5  # "What is the capital of"


def levels_db(audio: np.ndarray) -> np.ndarray:
    frames = audio[: len(audio) // HOP * HOP].reshape(-1, HOP)
    return 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)


def as_heard(speech: np.ndarray, silence_s: float = SILENCE_S) -> np.ndarray:
    """The speech (its frames within 40 dB of the loudest) between LEAD_S of
    silence and `silence_s` of silence."""
    voiced = np.flatnonzero(levels_db(speech) > levels_db(speech).max() - 40)
    trimmed = speech[voiced[0] * HOP : (voiced[-1] + 1) * HOP]
    return np.concatenate(
        [np.zeros(int(LEAD_S * MODEL_RATE)), trimmed, np.zeros(int(silence_s * MODEL_RATE))]
    ).astype(np.float32)


def cut_after(audio: np.ndarray, word_times, keep: int) -> np.ndarray:
    """The audio up to the quietest 10 ms between word `keep` and the next."""
    words = word_times(audio)
    assert len(words) > keep, f"Whisper heard {len(words)} words"
    boundary_s = (words[keep - 1][1] + words[keep][0]) / 2
    levels = levels_db(audio)
    first = max(0, int((boundary_s - 0.06) * 100))
    quietest = first + int(np.argmin(levels[first : int((boundary_s + 0.06) * 100) + 1]))
    return audio[: quietest * HOP]


def espeak(text: str, voice: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as scratch:
        wav = Path(scratch) / "q.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True)
        samples, rate = read_wav(wav)
    return resample(samples, rate, MODEL_RATE)


def piper_16k(speak, text: str) -> np.ndarray:
    return resample(speak(text), 24_000, MODEL_RATE)


QUALITIES = {"16k": lambda audio: audio, "phone": lambda audio: through_phone(audio, MODEL_RATE)}


@pytest.mark.parametrize("quality", QUALITIES)
def test_piper_question_whole_is_complete(smart_turn, speak, quality):
    """Whether a question cut mid-phrase scores incomplete is the model's quality, not the
    stack's logic: its score for "Who was the first president of" moved from below 0.5 to
    0.85 with the CPU and the cut's position (Whisper's word times), so kame_cli/bench/
    turn_bench.py measures it over the whole question set instead of one cut here."""
    whole = piper_16k(speak, QUESTION)
    assert smart_turn.predict(QUALITIES[quality](as_heard(whole))) >= THRESHOLD
    assert 0 < smart_turn.last_latency_s < 5


@pytest.mark.parametrize("speaker", ["en-us", "en-gb-scotland+m1"])
@pytest.mark.parametrize("quality", QUALITIES)
def test_espeak_question_whole_is_complete(smart_turn, speaker, quality):
    whole = espeak(QUESTION, speaker)
    assert smart_turn.predict(QUALITIES[quality](as_heard(whole))) >= THRESHOLD


MISSES_THE_CUT = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Smart Turn v3.2 hears 'What is the capital of' (cut out of the whole question) as "
    "finished, p 0.9 and more in piper and espeak-ng alike (kame_cli/bench/turn_bench.py: "
    "most questions cut at 60-80 % of their words score complete); the turn detector needs the "
    "transcript and the fallback silence too",
)


@pytest.mark.parametrize(
    "speaker",
    [
        pytest.param("piper", marks=MISSES_THE_CUT),
        pytest.param("en-us", marks=MISSES_THE_CUT),
        pytest.param("en-gb-scotland+m1", marks=MISSES_THE_CUT),
    ],
)
def test_question_cut_before_its_last_word_is_incomplete(smart_turn, speak, word_times, speaker):
    whole = piper_16k(speak, QUESTION) if speaker == "piper" else espeak(QUESTION, speaker)
    cut = cut_after(whole, word_times, KEEP)  # "What is the capital of"
    assert smart_turn.predict(as_heard(cut)) < THRESHOLD


def test_the_features_are_whispers():
    """Whisper's log-mel input, computed without Whisper: equal to faster-whisper's
    FeatureExtractor on the same 8 s window (zero-padded at the front, normalized)."""
    from faster_whisper.feature_extractor import FeatureExtractor

    rng = np.random.default_rng(7)
    audio = (0.1 * rng.standard_normal(3 * MODEL_RATE)).astype(np.float32)
    window = turn_model.last_window(audio)
    assert window.shape == (turn_model.WINDOW_SAMPLES,) and not window[: 5 * MODEL_RATE].any()
    normalized = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
    expected = FeatureExtractor(chunk_length=turn_model.WINDOW_S)(normalized, padding=0)
    features = turn_model.log_mel_features(audio)
    assert features.shape == (80, 800) and features.dtype == np.float32
    np.testing.assert_allclose(features, expected, atol=1e-4)
    # Longer audio: only its last 8 s count.
    longer = np.concatenate([rng.standard_normal(2 * MODEL_RATE).astype(np.float32), window])
    np.testing.assert_array_equal(turn_model.log_mel_features(longer), features)


def test_a_missing_model_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(turn_model.PATH_ENV, raising=False)
    with pytest.raises(ModelNotInstalled) as raised:
        SmartTurn()
    assert turn_model.FETCH_COMMAND in str(raised.value)
    assert str(tmp_path / "kame" / "models" / turn_model.MODEL_FILE) in str(raised.value)
