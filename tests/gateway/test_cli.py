"""The CLI pieces that need no running stack: `kame say`, the talk client's
speech detection, and `kame up`'s wiring (every KAME_<SVC>_* variable it sets
is a real setting of that service; a process that dies at start is reported
with its log)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import wave

import numpy as np
import pytest

from kame_cli.child import Child, StackError
from kame_cli.main import main
from kame_cli.stack import SERVICES, Stack
from kame_cli.stack_options import Ports, StackOptions
from kame_cli.talk import read_wav, speech_region
from kame_common.audio import SAMPLE_RATE, resample


def test_say_writes_the_spoken_text(tmp_path):
    out = tmp_path / "q.wav"
    assert (
        main(["say", "What is the capital of France?", "--out", str(out), "--rate", "16000"]) == 0
    )
    with wave.open(str(out), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
    samples, rate = read_wav(out)
    start, end = speech_region(resample(samples, rate, SAMPLE_RATE))
    assert 0.2 < start < 0.5  # the 0.3 s pad before the question
    assert end - start > 1.0  # a whole sentence


def test_speech_region_finds_the_loud_part():
    quiet, loud = np.zeros(SAMPLE_RATE, np.float32), np.full(SAMPLE_RATE // 2, 0.3, np.float32)
    start, end = speech_region(np.concatenate([quiet, loud, quiet]))
    assert start == pytest.approx(1.0, abs=0.02)
    assert end == pytest.approx(1.5, abs=0.02)
    assert speech_region(np.zeros(100, np.float32)) == (None, None)


def _settings_fields(service: str) -> set[str]:
    """Every field of the config dataclasses in services/<service>/config.py."""
    module = importlib.import_module(f"services.{service}.config")
    return {
        field.name
        for value in vars(module).values()
        if dataclasses.is_dataclass(value)
        and isinstance(value, type)
        and value.__module__ == module.__name__
        for field in dataclasses.fields(value)
    }


@pytest.mark.parametrize("service", SERVICES)
def test_kame_up_sets_only_real_settings(service, tmp_path):
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path))
    prefix = f"KAME_{service.upper()}_"
    env = stack.service_env(service)
    assert env and all(name.startswith(prefix) for name in env)
    unknown = {name for name in env if name[len(prefix) :].lower() not in _settings_fields(service)}
    assert not unknown, f"kame up sets variables {service} does not read: {unknown}"
    assert env[prefix + "PORT"] == str(getattr(stack.ports, service))


def test_kame_up_reports_a_process_that_dies(tmp_path):
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path))
    crash = Child(
        "crashy",
        [sys.executable, "-c", "print('model file missing'); exit(3)"],
        {},
        ready=lambda: False,
        endpoint="",
    )
    with pytest.raises(StackError, match=r"crashy exited with status 3[\s\S]*model file missing"):
        stack.start_and_wait([crash])
    stack.stop()


def test_kame_up_uses_an_external_llm_instead_of_the_embedded_one(tmp_path):
    embedded = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path))
    assert embedded.embedded_llm
    assert (
        embedded.service_env("oracle")["KAME_ORACLE_BASE_URL"]
        == f"http://127.0.0.1:{embedded.ports.llm}/v1"
    )
    openai = Stack(
        StackOptions(
            llm_base_url="https://api.openai.com/v1", llm_model="gpt-4o-mini", log_dir=tmp_path
        )
    )
    anthropic = Stack(StackOptions(llm_backend="anthropic", log_dir=tmp_path))
    assert not openai.embedded_llm and not anthropic.embedded_llm
    assert openai.service_env("oracle")["KAME_ORACLE_MODEL"] == "gpt-4o-mini"
    assert anthropic.service_env("oracle")["KAME_ORACLE_BASE_URL"] == "https://api.anthropic.com"
    assert anthropic.service_env("oracle")["KAME_ORACLE_BACKEND"] == "anthropic"


@pytest.mark.parametrize("admission", [True, False])
def test_kame_up_without_admission_turns_off_the_answer_time_bound_too(admission, tmp_path):
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path, capacity_admission=admission))
    env = stack.service_env("gateway")
    assert env["KAME_GATEWAY_CAPACITY_ADMISSION"] == str(int(admission))
    # Unset: the setting's default (1.5); set: 0, no bound.
    assert ("KAME_GATEWAY_ANSWER_TIME_FACTOR" in env) is not admission
    if not admission:
        assert env["KAME_GATEWAY_ANSWER_TIME_FACTOR"] == "0"
