"""`kame up`: the whole stack as processes on loopback, until Ctrl-C.

Starts Redis (unless one answers on the Redis port, or --redis-url names
one), the embedded LLM server (`kame llm-server`, unless --llm-base-url points
at another OpenAI-compatible server or --llm-backend anthropic uses the
Anthropic API; API keys come from OPENAI_API_KEY / ANTHROPIC_API_KEY in the
environment, which the oracle inherits), then stt, oracle, frontend and gateway
(`python -m services.<name>`), configured through their KAME_<SVC>_* variables
to find each other on 127.0.0.1, and the web service (the browser page, a
client of the gateway). It waits until every one is ready (gRPC
health SERVING, which the oracle reports only after warming up its LLM's
prompt; the LLM server's ready line, which it prints after its own warm-up;
the web service's /healthz; Redis PING; and the gateway reports SERVING only
once stt, the oracle and a frontend do: services/gateway/readiness.py), refuses
to go on when an --mcp-server did not start (its reason on the console, as
for any other part), prints
the endpoints (the OpenAI Realtime and the Moshi-protocol ones on a line each)
and the page's URL, restarts any process that dies (with
backoff, printed: kame_cli.supervise), and on Ctrl-C
or SIGTERM stops them all (SIGTERM to each process group, SIGKILL after a
timeout). Each child's output goes to a log file in --log-dir. A server named
with --mcp-server that no --tools-allowed narrows gets a warning before the
start: every one of its tools is offered.

The processes, their ports and the stack file are kame_cli.stack's (`Stack`);
the flags and the options they set, kame_cli.stack_options's.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from kame_cli.errors import USAGE, CliError
from kame_cli.stack import Stack
from kame_cli.stack_options import add_arguments, options_from_args, ports_from_args
from kame_cli.supervise import Supervisor

__all__ = ["add_arguments", "run"]  # what kame_cli.main calls


def realtime_url(web_url: str) -> str:
    """The web service's OpenAI Realtime endpoint (services/web/protocols/realtime.py)."""
    return "ws" + web_url.removeprefix("http") + "v1/realtime"


def live_url(web_url: str) -> str:
    """The web service's OpenAI GPT-Live endpoint (services/web/protocols/live.py)."""
    return "ws" + web_url.removeprefix("http") + "v1/live/sessions"


def moshi_url(web_url: str) -> str:
    """The web service's Moshi-protocol endpoint (services/web/protocols/moshi.py)."""
    return "ws" + web_url.removeprefix("http") + "api/chat"


def api_lines(web_url: str) -> list[str]:
    """The lines that name the web service's endpoints for programs, one each."""
    return [
        f"  {'realtime':<9} {realtime_url(web_url)} (OpenAI Realtime API)",
        f"  {'live':<9} {live_url(web_url)} (OpenAI GPT-Live)",
        f"  {'moshi':<9} {moshi_url(web_url)} (Moshi protocol: moshi's clients, PersonaPlex)",
    ]


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.frontend_engine != "tts" and not args.checkpoint:
        raise CliError(f"--frontend-engine {args.frontend_engine} needs --checkpoint DIR", USAGE)
    # Explicit handlers: a shell that starts us in the background ignores SIGINT.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    options = options_from_args(args, ports_from_args(args), args.frontend_engine, args.log_dir)
    options.side_niceness = args.side_nice
    stack = Stack(options)
    for name in options.servers_allowed_whole():
        print(
            f"kame up: WARNING: every tool of MCP server {name} is offered to the LLM, those "
            f"that change or delete things included; name the ones it may call with "
            f"--tools-allowed {name}.TOOL",
            file=sys.stderr,
            flush=True,
        )
    stack.check_ports_free()  # before saying anything starts
    print(
        f"kame up: starting the stack (gateway {stack.gateway_address}, logs in "
        f"{stack.log_dir}) ...",
        flush=True,
    )
    try:
        stack.start()
        print("KAME stack is up:")
        for name, endpoint in stack.endpoints():
            print(f"  {name:<9} {endpoint}")
        print("\n".join(api_lines(stack.web_url)))
        print(
            f"Talk to it in a browser: open {stack.web_url}\n"
            f"Call it from a phone: {stack.phone_endpoints} (docs/telephony.md)\n"
            f"or stream a WAV: kame talk --wav q.wav --out a.wav --timeline t.json "
            f"--gateway {stack.gateway_address}\n"
            f"How it is doing: kame status --gateway {stack.gateway_address}\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        supervisor = Supervisor(stack, say=lambda line: print(line, flush=True))
        while True:
            time.sleep(0.5)
            supervisor.poll()
    except KeyboardInterrupt:
        print("\nkame up: stopping ...", flush=True)
        return 0
    finally:
        stack.stop()
