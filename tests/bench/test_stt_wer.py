"""`kame bench --stt-wer`: sentences streamed through the stt's own session logic
in audio time (kame_cli/bench/stt_replay.py), scored per option
(kame_cli/bench/stt_wer.py). Run here on a set of two sentences made in the
test, in voices the tests use."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from kame_cli.bench import stt_wer
from kame_cli.bench.cli import run_bench
from kame_cli.bench.config import parse_config
from kame_cli.bench.stt_replay import Final, Heard, Partial, replay, timed_engine
from kame_cli.errors import CliError
from kame_cli.say import write_wav
from kame_cli.wer import Errors
from kame_common.audio import SAMPLE_RATE, resample
from services.stt.config import SttSettings
from services.stt.engine import SttEngine

SENTENCES = ("What is twelve times four?", "I would like to book a table for two.")


@pytest.fixture(scope="module")
def replay_engine():
    engine = SttEngine(SttSettings())
    scheduler = timed_engine(engine)
    yield engine, scheduler
    engine.close()


@pytest.fixture
def small_set(tmp_path, speak):
    """Two piper sentences, the second through the phone line's rate, listed as
    the bench's sentence sets list theirs."""
    entries = []
    for number, text in enumerate(SENTENCES, start=1):
        audio = np.concatenate([np.zeros(SAMPLE_RATE // 4, np.float32), speak(text)])
        if number == 2:
            audio = resample(resample(audio, SAMPLE_RATE, 8000), 8000, SAMPLE_RATE)
        write_wav(tmp_path / f"s{number}.wav", resample(audio, SAMPLE_RATE, 16000), 16000)
        entries.append(
            {"wav": f"s{number}.wav", "text": text, "voice": "piper", "telephone": number == 2}
        )
    (tmp_path / "sentences.json").write_text(json.dumps(entries))
    return tmp_path


def test_a_replay_in_audio_time_hears_the_same_words_every_time(replay_engine, speak):
    """Partials, a settled early final and the final, the same on a second run;
    each event comes out once its audio is in."""
    engine, scheduler = replay_engine
    audio = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), speak(SENTENCES[1])])
    first = asyncio.run(replay(engine, scheduler, audio))
    second = asyncio.run(replay(engine, scheduler, audio))
    assert [f.text for f in first.finals] == [f.text for f in second.finals]
    assert [[p.text for p in u] for u in first.partials] == [
        [p.text for p in u] for u in second.partials
    ]
    (partials,) = first.partials
    assert len(partials) >= 2 and any(p.settled for p in partials)
    end_s = len(audio) / SAMPLE_RATE
    out = [p.out_at_s for p in partials] + [first.finals[0].out_at_s]
    assert out == sorted(out) and 0.0 < out[0] and out[-1] <= end_s + 2.0


def test_stability_counts_words_taken_back_and_stable_words_revised():
    heard = Heard(
        partials=[
            [
                Partial("what is", "", False, 1.0),
                Partial("what is the cap", "what is", False, 1.5),
                Partial("what is the capital of", "what is the", False, 2.0),
                Partial("what is a capital of friends", "what is a capital of friends", True, 2.5),
            ]
        ],
        finals=[Final("What is a capital of France?", 3.0, 0.1)],
    )
    # Taken back: "cap" (then "capital"), "the" (then "a"); stable "the" revised.
    assert stt_wer.stability(heard) == {
        "shown": 2 + 4 + 5,
        "taken_back": 0 + 1 + 3,
        "stable": 3,
        "stable_revised": 1,
    }


def test_stt_wer_writes_its_table_and_json(small_set, tmp_path):
    out = tmp_path / "out"
    config = parse_config(
        [
            "--stt-wer",
            "--stt-set",
            str(small_set),
            "--stt-options",
            "tiny.en-old,tiny.en-pre0.5",
            "--stt-demo-renderings",
            "1",
            "--out-dir",
            str(out),
            "--name",
            "wer",
        ]
    )
    assert run_bench(config) == 0
    report = json.loads((out / "wer.json").read_text())
    assert [r["option"] for r in report["options"]] == ["tiny.en-old", "tiny.en-pre0.5"]
    for result in report["options"]:
        summary, sentences = result["summary"], result["sentences"]
        assert [s["text"] for s in sentences] == list(SENTENCES)
        total = sum((Errors(**s["errors"]) for s in sentences), Errors(0, 0, 0, 0))
        assert summary["errors"] == vars(total)
        assert summary["wer"] == pytest.approx(total.rate, abs=1e-4)
        assert summary["sentences_wrong"] == sum(Errors(**s["errors"]).edits > 0 for s in sentences)
        assert summary["demo_renderings"] == 1 and summary["demo_heard"] in (0, 1)
        for sentence in sentences:
            assert sentence["final_lag_s"] > 0  # the endpoint pause at least
            assert sentence["final_decode_s"] > 0
    markdown = (out / "wer.md").read_text()
    assert "| tiny.en-old |" in markdown and "| tiny.en-pre0.5 |" in markdown
    assert report["set"] == {
        "dir": str(small_set.resolve()),
        "sentences": 2,
        "voices": ["piper"],
        "telephone": 1,
    }


def test_an_unknown_option_is_a_usage_error(small_set, tmp_path):
    config = parse_config(["--stt-wer", "--stt-set", str(small_set), "--stt-options", "large-v3"])
    with pytest.raises(CliError, match=r"no option 'large-v3'; the options are 'tiny\.en-old'"):
        run_bench(config)


def test_the_options_spell_out_what_they_differ_in():
    """So that a row means the same after the service's defaults change."""
    keys = {frozenset(option.settings) for option in stt_wer.OPTIONS}
    assert len(keys) == 1
    names = [option.name for option in stt_wer.OPTIONS]
    assert len(set(names)) == len(names)
    for option in stt_wer.OPTIONS:
        SttSettings(**option.settings).validate()
