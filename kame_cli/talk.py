"""`kame talk --wav IN [--say TEXT] --out OUT.wav --timeline T.json [--plot T.png]`.

Streams a WAV to the gateway the way a microphone would (kame_client/caller.py:
real-time pacing, silence after the WAV until the agent is done, reconnecting
with the resume token); `--say TEXT` then types TEXT as a message of the
caller's (a UserText the agent answers aloud; without --wav the caller is
otherwise silent). Then it saves:

- OUT.wav: the agent's audio stream (24 kHz), one frame per caller frame, so
  its sample i lines up with the caller's sample i (plus the round trip);
- T.json: `user_transcript` (the finals), `agent_text` (what the agent spoke),
  `response_latency_s` (the caller's end of speech -> the first agent audio at
  this client), `gateway_response_latency_s` (the gateway's TurnSummary, which
  ends when the audio leaves the gateway), `turns`, `notices`, and `events`:
  every event of the gateway (kame_client/events.py names them: transcripts,
  oracle updates, agent text, turns, notices, barge-ins, keys) but its audio,
  of which the agent's audio start/stop, and the caller's own (caller audio
  start/stop, reconnects), with `t` in seconds from the start of the stream;
- T.png: caller audio, transcripts, oracle updates and agent audio on one axis
  (kame_cli/timeline.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import wave
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from kame_cli.errors import USAGE, CliError, file_error, from_rpc_error
from kame_cli.say import write_wav
from kame_cli.timeline import plot_timeline
from kame_client.caller import CODECS, MODES, TalkOptions, broke_off, speech_region, talk
from kame_client.result import TalkResult
from kame_common.audio import SAMPLE_RATE, Samples, pcm16_to_float, resample
from kame_common.llm import BACKEND_NAMES
from kame_common.ports import loopback_address

# What the benchmarks, demo and tests use of a talk, importable from here as before.
__all__ = [
    "MODES",
    "TalkOptions",
    "TalkResult",
    "broke_off",
    "plot_timeline",
    "read_wav",
    "run",
    "save",
    "session_error",
    "speech_region",
    "talk",
]


def read_wav(path: Path) -> tuple[Samples, int]:
    """A 16-bit mono PCM WAV as float32 and its rate; CliError saying what the
    file is when it is not one."""
    if not path.is_file():
        raise file_error(path, "WAV file")
    try:
        with wave.open(str(path), "rb") as source:
            width, channels, rate = (
                source.getsampwidth(),
                source.getnchannels(),
                source.getframerate(),
            )
            if (width, channels) != (2, 1):
                raise CliError(
                    f"{path} is {8 * width}-bit {channels}-channel audio at {rate} Hz; a caller's "
                    "WAV must be 16-bit mono PCM (convert it: sox IN.wav -b 16 -c 1 OUT.wav)",
                    USAGE,
                )
            return pcm16_to_float(source.readframes(source.getnframes())), rate
    except (wave.Error, EOFError) as exc:
        raise CliError(f"{path} is not a PCM WAV file ({exc or 'truncated'})", USAGE) from None


def session_error(result: TalkResult, gateway: str) -> CliError:
    """The one line for a session that ended with a gRPC error."""
    return from_rpc_error(grpc.StatusCode[result.status], result.status_details, gateway)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wav", type=Path, help="the caller's audio (16-bit WAV)")
    parser.add_argument(
        "--say", default="", help="a message to type after the WAV; the agent answers it aloud"
    )
    parser.add_argument("--out", type=Path, required=True, help="WAV for the agent's audio")
    parser.add_argument("--timeline", type=Path, required=True, help="timeline JSON to write")
    parser.add_argument("--plot", type=Path, help="PNG of the timeline")
    parser.add_argument(
        "--gateway",
        default=loopback_address("gateway"),
        help="gateway host:port; several comma-separated: a call that breaks off is "
        "resumed on the next",
    )
    parser.add_argument(
        "--ca-file", default="", help="PEM CA of the gateway's certificate (turns TLS on)"
    )
    parser.add_argument(
        "--tls", action="store_true", help="TLS with the system's CAs (a public certificate)"
    )
    parser.add_argument(
        "--tls-server-name",
        default="",
        help="name on the gateway's certificate when --gateway is an IP or another name",
    )
    parser.add_argument(
        "--auth-token",
        default=os.environ.get("KAME_AUTH_TOKEN", ""),
        help="bearer token for the gateway (default: env KAME_AUTH_TOKEN; prefer the "
        "variable, flags show in ps)",
    )
    parser.add_argument("--mode", choices=sorted(MODES), default="tandem")
    parser.add_argument("--input-codec", choices=sorted(CODECS), default="pcm16")
    parser.add_argument("--output-codec", choices=sorted(CODECS), default="pcm16")
    parser.add_argument("--chunk-ms", type=int, default=80, help="audio per message")
    parser.add_argument(
        "--tail-s", type=float, default=2.0, help="the agent is done after this much quiet"
    )
    parser.add_argument(
        "--max-wait-s",
        type=float,
        default=30.0,
        help="give up waiting for the agent after the WAV ends",
    )
    parser.add_argument("--voice", default="", help="frontend voice")
    parser.add_argument(
        "--no-oracle-updates", action="store_true", help="do not ask the gateway for oracle updates"
    )
    parser.add_argument(
        "--llm-backend", default="", choices=("", *BACKEND_NAMES), help="oracle back-end override"
    )
    parser.add_argument("--llm-model", default="", help="oracle model override")
    parser.add_argument("--llm-base-url", default="", help="OpenAI-compatible base URL override")


def options_from_args(args: argparse.Namespace, wav_rate: int) -> TalkOptions:
    return TalkOptions(
        gateway=args.gateway,
        mode=args.mode,
        input_codec=args.input_codec,
        input_rate=wav_rate if args.input_codec == "pcm16" else 0,
        output_codec=args.output_codec,
        chunk_ms=args.chunk_ms,
        tail_s=args.tail_s,
        max_wait_s=args.max_wait_s,
        oracle_updates=not args.no_oracle_updates,
        voice=args.voice,
        auth_token=args.auth_token,
        ca_file=args.ca_file,
        tls=args.tls,
        tls_server_name=args.tls_server_name,
        llm_backend=args.llm_backend,
        llm_model=args.llm_model,
        llm_base_url=args.llm_base_url,
        llm_api_key=os.environ.get("KAME_LLM_API_KEY", ""),
        say=args.say,
    )


def save(
    result: TalkResult,
    options: TalkOptions,
    wav: Path | None,
    out: Path,
    timeline: Path,
    plot: Path | None,
) -> dict[str, Any]:
    """Write OUT.wav, the timeline JSON and (optionally) the PNG; returns the timeline."""
    write_wav(out, result.agent, SAMPLE_RATE)
    data = result.timeline(options, {"wav": str(wav or ""), "out": str(out)})
    timeline.parent.mkdir(parents=True, exist_ok=True)
    timeline.write_text(json.dumps(data, indent=2))
    if plot is not None:
        plot_timeline(result, plot, title=f"kame talk ({options.mode}): {result.user_transcript}")
    return data


# The caller's audio when it only types (--say without --wav): a moment of silence,
# then the silence kame talk sends until the agent is done.
SAY_ONLY_LEAD_S = 0.5


def run(args: argparse.Namespace) -> int:
    if args.wav is not None:
        samples, rate = read_wav(args.wav)
    elif args.say.strip():
        samples, rate = np.zeros(int(SAY_ONLY_LEAD_S * SAMPLE_RATE), np.float32), SAMPLE_RATE
    else:
        raise CliError("give the caller's audio (--wav), a message to type (--say), or both", USAGE)
    options = options_from_args(args, rate)
    result = asyncio.run(talk(resample(samples, rate, SAMPLE_RATE), options))
    if result.status != "OK" and not result.started:  # no session: nothing worth saving
        raise session_error(result, options.gateway)
    data = save(result, options, args.wav, args.out, args.timeline, args.plot)
    print(f"session:          {data['session_id']} ({data['mode']}, engine {data['engine']})")
    print(f"user transcript:  {data['user_transcript']}")
    print(f"agent said:       {data['agent_text']}")
    latency = data["response_latency_s"]
    print(f"response latency: {'n/a' if latency is None else f'{latency:.3f} s'}")
    for notice in result.notices:
        print(f"notice:           {notice.kind}: {notice.message}")
    if result.status != "OK":
        raise session_error(result, options.gateway)
    return 0
