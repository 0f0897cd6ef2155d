"""Our Full-Duplex-Bench-format samples (kame_cli/bench/full_duplex_samples.py): the
plan of each task, where the pause and the interruption land, the annotation files and
the folder layout full_duplex_live reads. Speech here is a tone with silence either
side (no espeak-ng), spoken by made-up voices: the bench's own voices are for the
bench alone (tests/bench/test_heldout_questions.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kame_cli.bench import full_duplex as fdb
from kame_cli.bench import full_duplex_live as live
from kame_cli.bench import full_duplex_samples as fds
from kame_cli.bench.full_duplex import Task
from kame_cli.bench.make_questions import SpokenQuestion
from kame_cli.talk import read_wav
from kame_client.caller import speech_intervals
from kame_common.audio import SAMPLE_RATE, Samples, resample

RATE = fds.RATE
POOL = tuple(
    SpokenQuestion(text, ("x",), f"made-up+v{n}", 140, 50, telephone=n % 3 == 0)
    for n, text in enumerate(
        [
            "Alpha beta gamma delta?",
            "One two three?",
            "Red green blue yellow orange?",
            "North south?",
            "Monday Tuesday Wednesday Thursday?",
            "Cat dog bird fish horse cow?",
            "Up down left?",
            "Spring summer autumn winter?",
            "Oak pine birch?",
            "Iron copper silver gold tin?",
        ]
    )
)
PAD_S = 0.3
WORD_S = 0.25


def tone(voice: SpokenQuestion, text: str) -> Samples:
    """A stand-in for espeak-ng: PAD_S of silence, WORD_S of tone per word, PAD_S."""
    pad = np.zeros(round(PAD_S * RATE), np.float32)
    n = round(WORD_S * RATE) * len(text.split())
    speech = 0.5 * np.sin(2 * np.pi * 220 * np.arange(n) / RATE).astype(np.float32)
    return np.concatenate([pad, speech, pad])


# -- plans -----------------------------------------------------------------------------


def test_the_pause_splits_at_the_middle_word_boundary_with_a_comma():
    assert fds.split_for_pause("What is the name of it?") == ("What is the,", "name of it?")
    assert fds.split_for_pause("One two three four five?") == ("One two three,", "four five?")


def test_each_task_gets_count_samples_in_its_folder():
    plans = fds.plans(4, POOL)
    assert len(plans) == 12
    for task, folder in fds.FOLDERS.items():
        mine = [p for p in plans if p.task is task]
        assert [p.sample_id for p in mine] == ["00", "01", "02", "03"]
        assert {p.folder for p in mine} == {folder}


def test_the_plans_are_deterministic_and_the_tasks_hear_different_voices():
    assert fds.plans(3, POOL) == fds.plans(3, POOL)
    voices = {task: {p.voice.voice for p in fds.plans(3, POOL) if p.task is task} for task in Task}
    assert not voices[Task.SMOOTH] & voices[Task.PAUSE]
    assert not voices[Task.PAUSE] & voices[Task.INTERRUPTION]


def test_a_sample_does_not_say_its_voices_own_question():
    for plan in fds.plans(4, POOL):
        assert plan.voice.text not in plan.text


def test_the_parts_and_silences_of_each_task():
    plans = fds.plans(6, POOL)
    for plan in plans:
        if plan.task is Task.SMOOTH:
            assert [p.silence_after_s for p in plan.parts] == [fds.ANSWER_S]
        elif plan.task is Task.PAUSE:
            first, second = plan.parts
            assert 1.0 <= first.silence_after_s <= 1.5 and second.silence_after_s == fds.END_S
            assert first.text.endswith(",")
        else:
            context, interrupt = plan.parts
            assert context.silence_after_s == fds.INTERRUPT_AFTER_S
            assert interrupt.silence_after_s == fds.ANSWER_S
            assert context.text != interrupt.text
    pauses = [p.parts[0].silence_after_s for p in plans if p.task is Task.PAUSE]
    assert pauses == [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


def test_more_samples_than_voices_go_round_the_pool():
    plans = [p for p in fds.plans(len(POOL) + 1, POOL) if p.task is Task.SMOOTH]
    assert plans[0].voice == plans[-1].voice


def test_the_default_voices_come_a_quarter_to_a_half_by_phone():
    plans = fds.plans(4)
    assert len(plans) / 4 <= sum(p.voice.telephone for p in plans) <= len(plans) / 2
    assert len({p.voice.voice for p in plans}) == len(plans)


# -- where the speech lands -------------------------------------------------------------


def test_the_layout_lays_each_speech_the_silence_after_the_one_before():
    # two parts of 1 s audio with speech from 0.25 s to 0.75 s, 1.2 s between them
    part = (RATE, RATE // 4, 3 * RATE // 4)
    offsets, spans, length = fds.layout([part, part], [1.2, 0.3], lead_s=0.5)
    assert offsets == [RATE // 4, round(1.95 * RATE)]
    assert spans == [(0.5, 1.0), (2.2, 2.7)]
    assert length == 3 * RATE  # 0.3 s after the last speech (its audio ends at 2.95 s)


def test_a_parts_audio_longer_than_the_silence_after_it_is_kept_whole():
    offsets, spans, length = fds.layout([(RATE, 0, RATE // 2)], [0.1], lead_s=0.0)
    assert (offsets, spans, length) == ([0], [(0.0, 0.5)], RATE)


def test_the_layout_ends_the_last_silence_after_the_last_speech():
    part = (RATE, 0, RATE)  # speech all through
    offsets, spans, length = fds.layout([part], [6.0], lead_s=0.5)
    assert (offsets, spans, length) == ([RATE // 2], [(0.5, 1.5)], round(7.5 * RATE))


def test_a_lead_shorter_than_a_parts_padding_starts_it_at_once():
    offsets, spans, _ = fds.layout([(RATE, RATE // 2, RATE)], [0.0], lead_s=0.25)
    assert offsets == [0] and spans == [(0.5, 1.0)]


def test_the_mix_adds_parts_where_their_padding_overlaps():
    mixed = fds.mix([np.ones(4, np.float32), np.ones(4, np.float32)], [0, 2], 8)
    assert mixed.tolist() == [1, 1, 2, 2, 1, 1, 0, 0]


# -- annotation files --------------------------------------------------------------------


def plan_of(task: Task) -> fds.Plan:
    return next(p for p in fds.plans(1, POOL) if p.task is task)


def test_turn_taking_json_gives_the_end_of_turn_first():
    files = fds.annotation_files(plan_of(Task.SMOOTH), [(0.5, 2.1234)], 8.1234)
    assert files["turn_taking.json"][0]["timestamp"] == [2.123, 8.123]
    assert set(files) == {"turn_taking.json", "transcription.json"}


def test_pause_json_gives_the_pause():
    plan = plan_of(Task.PAUSE)
    files = fds.annotation_files(plan, [(0.5, 1.4), (2.6, 3.5)], 3.8)
    assert files["pause.json"][0]["timestamp"] == [1.4, 2.6]
    chunks = files["transcription.json"]["chunks"]
    assert [c["text"] for c in chunks] == [p.text for p in plan.parts]
    assert [c["timestamp"] for c in chunks] == [[0.5, 1.4], [2.6, 3.5]]


def test_interrupt_json_gives_the_interruption_and_both_texts():
    plan = plan_of(Task.INTERRUPTION)
    entry = fds.annotation_files(plan, [(0.5, 2.0), (4.0, 5.5)], 11.5)["interrupt.json"][0]
    assert entry == {
        "context": plan.parts[0].text,
        "interrupt": plan.parts[1].text,
        "timestamp": [4.0, 5.5],
    }


# -- the folder, as full_duplex_live reads it ----------------------------------------------


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("samples")
    lines: list[str] = []
    entries = fds.make(out, 2, POOL, say=tone, progress=lines.append)
    return out, entries, lines


def test_the_layout_on_disk_is_fdbs(made):
    out, entries, lines = made
    assert len(entries) == len(lines) == 6
    expected = {
        "synthetic_turn_taking": {"input.wav", "turn_taking.json", "transcription.json"},
        "synthetic_pause_handling": {"input.wav", "pause.json", "transcription.json"},
        "synthetic_user_interruption": {
            "input.wav",
            "interrupt.json",
            "transcription.json",
            "context.wav",
            "interrupt.wav",
        },
    }
    for folder, files in expected.items():
        for sample in ("00", "01"):
            assert {p.name for p in (out / folder / sample).iterdir()} == files
    assert json.loads((out / "samples.json").read_text()) == entries


def test_full_duplex_live_knows_each_folder_as_its_task():
    for task, folder in fds.FOLDERS.items():
        assert live.FOLDERS[folder] is task


def test_the_speech_in_input_wav_is_where_the_annotations_say(made):
    out, entries, _ = made
    for entry in entries:
        audio, rate = read_wav(out / entry["folder"] / entry["id"] / "input.wav")
        assert rate == RATE
        assert len(audio) / RATE == pytest.approx(entry["duration_s"], abs=1e-3)
        heard = speech_intervals(resample(audio, RATE, SAMPLE_RATE), bridge_s=fdb.VAD_BRIDGE_S)
        annotated = [(p["start_s"], p["end_s"]) for p in entry["parts"]]
        assert np.allclose(heard, annotated, atol=0.021), (entry["folder"], heard, annotated)


def test_the_annotated_ends_are_what_the_scoring_starts_from(made):
    out, entries, _ = made
    for entry in entries:
        known = live._annotation(out / entry["folder"] / entry["id"])
        last_start, last_end = entry["parts"][-1]["start_s"], entry["parts"][-1]["end_s"]
        if entry["folder"] == "synthetic_pause_handling":
            assert known == {}  # the whole recording is scored
            first_end = entry["parts"][0]["end_s"]
            assert 1.0 <= round(last_start - first_end, 3) <= 1.5
            assert entry["duration_s"] == pytest.approx(last_end + fds.END_S, abs=0.01)
        else:
            assert known == {"end_s": last_end}
            assert entry["duration_s"] == pytest.approx(last_end + fds.ANSWER_S, abs=0.01)
        if entry["folder"] == "synthetic_user_interruption":
            first_end = entry["parts"][0]["end_s"]
            assert round(last_start - first_end, 3) == fds.INTERRUPT_AFTER_S


def test_the_progress_lines_name_each_sample_and_its_voice(made):
    _, entries, lines = made
    for entry, line in zip(entries, lines, strict=True):
        assert line.startswith(f"{entry['folder']}/{entry['id']}: {entry['voice']}")
