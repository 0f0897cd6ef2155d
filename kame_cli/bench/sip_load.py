"""SIP load: N phone calls at once, each from its own baresip softphone, to the
telephony service's SIP side in front of a `kame up` stack.

Each caller (a baresip process on loopback, its microphone one of the bench's
espeak-ng questions resampled by sox to 8 kHz, then --listen-s of silence)
dials at about the same time, asks its question and hangs up when its file
ends. Per load level (--calls 1,4,8) it reports:

- calls established and answered (agent speech heard after the question);
- agent audio packets the service sent late (more than 10 ms after their 20 ms
  deadline) and playout underruns (a deadline with no agent audio queued:
  silence went out), from each call's Playout;
- response latency at the phone, from the recordings baresip made: the end
  of the question in what it sent to the first agent speech in what it heard
  (negative when the agent started first), median and p90; beside it the
  gateway's own figures from its TurnSummary (to the first agent audio leaving
  the gateway, and to the answer's first word after any hold phrase): the
  difference is what the phone line adds (playout prebuffer, jitter buffers).

Without --sip it starts `kame up`'s stack (its own Redis, free ports) and the
telephony service in this process; with --sip HOST:PORT it calls a running
service (then the packet figures are not known here).

    .venv/bin/python -m kame_cli.bench.sip_load [--calls 1,4,8] [--listen-s 12]

Prints a table and writes bench/results/telephony/sip_load.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame_cli.bench.baresip import Baresip, caller_wav
from kame_cli.bench.paths import ESPEAK_QUESTIONS, REPO_ROOT, RESULTS_DIR
from kame_cli.bench.questions import Question, load_questions
from kame_cli.bench.report import write_json
from kame_cli.bench.stacks import BenchStack
from kame_cli.stack_options import Ports, add_arguments, free_ports, options_from_args
from kame_common.audio import SAMPLE_RATE, Samples
from services.telephony.call import HANG_UP_GRACE_S, PhoneCall
from services.telephony.config import TelephonySettings
from services.telephony.server import TelephonyServer

OUT = RESULTS_DIR / "telephony" / "sip_load.json"
LEAD_S = 0.5  # silence before each question in the caller's file
WINDOW_S = 0.02
SPEECH_DBFS = -35.0  # a 20 ms window this loud is speech


@dataclass
class CallOutcome:
    established: bool
    closed: bool
    question_end_s: float  # in the caller's file, so in the call's timeline
    heard: Samples | None
    heard_rate: int
    playout: dict[str, int] | None

    def response_latency_s(self) -> float | None:
        """From the question's end to the first agent speech baresip heard (from
        1 s before the end on: an agent that starts early counts negative)."""
        if self.heard is None:
            return None
        size = int(WINDOW_S * self.heard_rate)
        count = len(self.heard) // size
        if count == 0:
            return None
        windows = self.heard[: count * size].reshape(count, size)
        dbfs = 20 * np.log10(np.sqrt(np.mean(windows**2, axis=1)) + 1e-9)
        first = max(0, int((self.question_end_s - 1.0) / WINDOW_S))
        loud = np.nonzero(dbfs[first:] > SPEECH_DBFS)[0]
        if len(loud) == 0:
            return None
        return round((first + int(loud[0])) * WINDOW_S - self.question_end_s, 3)


def question_end_s(question: Question) -> float:
    end = question.speech_end_s
    return LEAD_S + (end if end is not None else len(question.audio) / SAMPLE_RATE)


async def one_call(
    target: str, question: Question, wav: Path, delay_s: float, timeout_s: float
) -> CallOutcome:
    await asyncio.sleep(delay_s)
    phone = await Baresip(wav).start()
    try:
        await phone.dial(f"sip:agent@{target}")
        established = closed = False
        with contextlib.suppress(AssertionError):
            await phone.wait_for("CALL_ESTABLISHED", timeout_s=15)
            established = True
            await phone.wait_for("CALL_CLOSED", timeout_s=timeout_s)
            closed = True
        heard: Samples | None = None
        rate = 8000
        if established:
            with contextlib.suppress(AssertionError):
                heard, rate = phone.heard()
        return CallOutcome(established, closed, question_end_s(question), heard, rate, None)
    finally:
        await phone.close()


@dataclass
class Service:
    """The telephony service the phones call, and what the bench sees of its side:
    with `server` (in this process) each call once it has ended."""

    address: str  # host:port of its SIP side
    server: TelephonyServer | None = None
    ended: list[PhoneCall] = field(default_factory=list)

    @classmethod
    async def start(cls, gateway_address: str) -> Service:
        server = TelephonyServer(TelephonySettings.loopback_sip(gateway_address))
        await server.start()
        assert server.sip is not None
        service = cls(f"127.0.0.1:{server.sip.port}", server)
        server.telephony.on_call_ended = service.ended.append
        return service

    async def settle(self) -> None:
        """Wait for the service's side of the last hang-ups: a call ends up to
        HANG_UP_GRACE_S after its phone hung up (the gateway's last TurnSummary
        may come then). Without the server here, a moment."""
        if self.server is None:
            await asyncio.sleep(0.5)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.telephony.idle.wait(), HANG_UP_GRACE_S + 2)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()


async def load_level(
    args: argparse.Namespace,
    service: Service,
    questions: list[Question],
    wavs: list[Path],
    calls: int,
) -> dict[str, Any]:
    ended = service.ended
    ended.clear()
    longest = max(len(q.audio) for q in questions) / SAMPLE_RATE
    timeout_s = LEAD_S + longest + args.listen_s + 30
    started = time.monotonic()
    outcomes = await asyncio.gather(
        *(
            one_call(
                service.address,
                questions[i % len(questions)],
                wavs[i % len(wavs)],
                i * args.stagger_s,
                timeout_s,
            )
            for i in range(calls)
        )
    )
    await service.settle()
    playouts = [vars(call.playout.stats) for call in ended]
    latencies = [lat for o in outcomes if (lat := o.response_latency_s()) is not None]
    packets = sum(p["packets"] for p in playouts)
    late = sum(p["late"] for p in playouts)
    turns = [turn for call in ended for turn in call.turns]
    underruns = sum(p["underruns"] for p in playouts)
    return {
        "calls": calls,
        "wall_s": round(time.monotonic() - started, 1),
        "established": sum(o.established for o in outcomes),
        "completed": sum(o.closed for o in outcomes),
        "answered": len(latencies),
        "packets": packets if playouts else None,
        "late_packets": late if playouts else None,
        "late_percent": round(100 * late / packets, 2) if packets else None,
        "underruns": underruns if playouts else None,
        "underrun_percent": round(100 * underruns / packets, 2) if packets else None,
        "response_latency_s": {
            "median": round(float(np.median(latencies)), 3) if latencies else None,
            "p90": round(float(np.percentile(latencies, 90)), 3) if latencies else None,
            "all": latencies,
        },
        "gateway_turns": len(turns),
        "gateway_response_latency_s": percentiles([t.response_latency_s for t in turns]),
        "gateway_answer_latency_s": percentiles(
            [t.answer_latency_s for t in turns if t.answer_latency_s]
        ),
        "per_call_playout": playouts,
    }


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p90": None}
    return {
        "median": round(float(np.median(values)), 3),
        "p90": round(float(np.percentile(values, 90)), 3),
    }


async def run_levels(
    args: argparse.Namespace, gateway_address: str | None, questions: list[Question]
) -> list[dict[str, Any]]:
    """A warm-up call, then each load level of args.calls: to the service at
    args.sip, or to one started here in front of the gateway at `gateway_address`."""
    if args.sip:
        service = Service(args.sip)
    else:
        assert gateway_address is not None
        service = await Service.start(gateway_address)
    try:
        with tempfile.TemporaryDirectory(prefix="sip-load-") as scratch:
            wavs = [
                caller_wav(
                    Path(scratch),
                    f"q{i}",
                    q.audio,
                    SAMPLE_RATE,
                    lead_s=LEAD_S,
                    tail_s=args.listen_s,
                )
                for i, q in enumerate(questions)
            ]
            print(f"sip load: warm-up call to {service.address} ...", flush=True)
            await load_level(args, service, questions[:1], wavs[:1], 1)
            results = []
            for calls in args.calls:
                print(f"sip load: {calls} calls at once ...", flush=True)
                results.append(await load_level(args, service, questions, wavs, calls))
            return results
    finally:
        await service.stop()


def print_report(levels: list[dict[str, Any]]) -> None:
    print(
        "\n| calls | established | answered | late packets | underruns "
        "| response latency at the phone, median / p90 s "
        "| at the gateway: response / answer, median s |"
    )
    print("|---|---|---|---|---|---|---|")
    for level in levels:
        latency = level["response_latency_s"]
        late = "-" if level["late_percent"] is None else f"{level['late_percent']:.2f} %"
        under = (
            "-"
            if level["underruns"] is None
            else f"{level['underruns']} ({level['underrun_percent']:.2f} %)"
        )
        print(
            f"| {level['calls']} | {level['established']} | {level['answered']} | {late} | "
            f"{under} | {_s(latency['median'])} / {_s(latency['p90'])} | "
            f"{_s(level['gateway_response_latency_s']['median'])} / "
            f"{_s(level['gateway_answer_latency_s']['median'])} |"
        )


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 4, 8],
        help="load levels: calls at once, comma-separated",
    )
    parser.add_argument("--listen-s", type=float, default=12.0, help="silence after the question")
    parser.add_argument("--stagger-s", type=float, default=0.25, help="between two callers dialing")
    parser.add_argument("--sip", default="", help="HOST:PORT of a running telephony service")
    parser.add_argument("--questions", type=Path, default=ESPEAK_QUESTIONS)
    parser.add_argument("--out", type=Path, default=OUT)
    add_arguments(parser)  # kame up's stack options (engine, checkpoint, LLM, ...)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    questions = load_questions(args.questions)
    if args.sip:
        levels = asyncio.run(run_levels(args, None, questions))
    else:
        ports = Ports.free(redis=free_ports(1)[0])  # its own Redis, beside any other stack
        options = options_from_args(args, ports, args.frontend_engine, args.log_dir)
        stack = BenchStack(options, frontend_slots=max(args.calls))
        print(f"sip load: starting the stack (logs in {stack.log_dir}) ...", flush=True)
        with stack:
            levels = asyncio.run(run_levels(args, stack.gateway_address, questions))
            stack.check()
    report = {
        "levels": levels,
        "listen_s": args.listen_s,
        "questions": str(args.questions.relative_to(REPO_ROOT))
        if args.questions.is_relative_to(REPO_ROOT)
        else str(args.questions),
        "machine": f"{platform.processor() or platform.machine()}, {platform.platform()}",
        "command": "python -m kame_cli.bench.sip_load --calls "
        + ",".join(str(n) for n in args.calls),
    }
    print_report(levels)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
