"""Running an example of examples/ (a third-party client's program) in its own
venv (tests/clients/venvs.py), from an asyncio test whose loop also serves the
stack: the venv is built in a thread and the example runs as a subprocess, so
the stack's servers keep answering meanwhile.

The examples print what each side said as JSON lines, {"you": ...},
{"agent": ...} and {"error": ...}, each function the agent had them run as
{"tool": NAME, ...its arguments}, and each answer of a back-end of their own
(GPT-Live's client delegation) as {"backend": ...}; `ClientRun` holds them."""

from __future__ import annotations

import asyncio
import json
import os
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kame_common.audio import SAMPLE_RATE, float_to_pcm16, pcm16_to_float
from tests.clients.venvs import client_venv

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUIET_S = 6.0  # an example stops once the agent has been quiet this long
MAX_S = 75.0  # ... or after this long anyway
# A cached venv builds in seconds; a first build downloads the client.
BUILD_S = 240.0


@dataclass
class ClientRun:
    """What an example printed and saved."""

    returncode: int
    stderr: str
    answer: np.ndarray  # the agent's voice, float32 at 24 kHz
    seconds: float
    you: list[str] = field(default_factory=list)
    agent: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)  # a back-end of the client's answered

    @property
    def heard_question(self) -> str:
        return " ".join(self.you)

    @property
    def said(self) -> str:
        return " ".join(self.agent)

    def __str__(self) -> str:  # what an assertion shows when it fails
        return (
            f"exit {self.returncode} after {self.seconds:.0f} s; you={self.you} "
            f"agent={self.agent} errors={self.errors} tools={self.tool_calls} "
            f"backend={self.backend}; "
            f"stderr's end:\n{self.stderr[-3000:]}"
        )


def write_wav(path: Path, samples: np.ndarray) -> Path:
    """`samples` (float32 at 24 kHz) as the 16-bit mono WAV the examples read."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(float_to_pcm16(samples))
    return path


def read_wav(path: Path) -> np.ndarray:
    """The 16-bit mono WAV at 24 kHz an example saved; nothing if it saved none."""
    if not path.exists():
        return np.zeros(0, np.float32)
    with wave.open(str(path)) as wav:
        assert (wav.getframerate(), wav.getsampwidth(), wav.getnchannels()) == (SAMPLE_RATE, 2, 1)
        return pcm16_to_float(wav.readframes(wav.getnframes()))


async def run_example(
    client: str, example: str, args: list[str], out: Path, timeout_s: float
) -> ClientRun:
    """`examples/<example>` run by client `client`'s venv python with `args`
    (which name `out` as its --out); killed after timeout_s."""
    python = await asyncio.to_thread(client_venv, client)
    # Nothing of the stack's own environment leaks into the client's venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(python),
        str(EXAMPLES / example),
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        stdout, stderr = await process.communicate()
    run = ClientRun(
        returncode=process.returncode if process.returncode is not None else -1,
        stderr=stderr.decode(errors="replace"),
        answer=read_wav(out),
        seconds=time.monotonic() - started,
    )
    for line in stdout.decode(errors="replace").splitlines():
        said = json.loads(line) if line.startswith("{") else {}
        run.you += [said["you"]] if "you" in said else []
        run.agent += [said["agent"]] if "agent" in said else []
        run.errors += [said["error"]] if "error" in said else []
        run.tool_calls += [said] if "tool" in said else []
        run.backend += [said["backend"]] if "backend" in said else []
    return run


async def ask_from_wav(
    client: str,
    example: str,
    url: str,
    question: Path,
    out_dir: Path,
    *flags: str,
    quiet_s: float = QUIET_S,
    max_s: float = MAX_S,
) -> ClientRun:
    """`examples/<example>` (in client `client`'s venv) asks the question of the WAV
    `question` at `url`, with `flags`; it saves the agent's voice in out_dir."""
    out = out_dir / "answer.wav"
    args = ["--url", url, "--wav", str(question), "--out", str(out), *flags]
    args += ["--quiet-s", str(quiet_s), "--max-s", str(max_s)]
    run = await run_example(client, example, args, out, max_s + BUILD_S)
    print(f"{example}: {run.seconds:.0f} s, you={run.you} agent={run.agent} tools={run.tool_calls}")
    return run
