"""`kame demo`: one spoken conversation end to end, offline.

`kame up` on free ports in the background, `kame say` a question, `kame talk`
it to the gateway, print the question, what the stt heard (and, plainly, when
that is not the question: the agent answers what it heard), what the agent
answered, the response latency (first audio) and the answer latency (the
answer's first word, after any hold phrase), then stop the stack. The question WAV,
the agent's answer, the timeline JSON and its plot stay in --out-dir.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from kame_cli import say, talk
from kame_cli.stack import Stack
from kame_cli.stack_options import Ports, StackOptions
from kame_cli.wer import word_errors
from kame_common.audio import SAMPLE_RATE

QUESTION = "What is the capital of France?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--question", default=QUESTION, help="what the caller asks")
    parser.add_argument("--mode", choices=sorted(talk.MODES), default="tandem")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("out/demo"),
        help="question.wav, answer.wav, timeline.json/png and logs/",
    )
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)


def hearing_verdict(asked: str, heard: str) -> str:
    """Whether the stt heard the question's words (case, punctuation and how numbers
    are written aside), said plainly: a misheard question gets an answer to
    another question."""
    errors = word_errors(asked, heard)
    if not errors.edits:
        return "(heard right: the question's words)"
    if not heard.strip():
        return "MISHEARD: the stt heard nothing; the agent had no question to answer"
    return (
        f"MISHEARD: {errors.edits} of the question's {errors.reference_words} words heard "
        "wrong, missing or added; the agent answered what the stt heard, not the question"
    )


def run(args: argparse.Namespace) -> int:
    out = args.out_dir
    question_wav, answer_wav = out / "question.wav", out / "answer.wav"
    timeline_json, timeline_png = out / "timeline.json", out / "timeline.png"
    print(f"kame demo: synthesizing the question with the piper voice: {args.question!r}")
    question = say.synthesize(args.question)
    say.write_wav(question_wav, question, SAMPLE_RATE)
    options = StackOptions(
        ports=Ports.free(), log_dir=out / "logs", startup_timeout_s=args.startup_timeout_s
    )
    print(
        f"kame demo: starting the stack (redis, llm, stt, oracle, frontend, gateway, web; "
        f"logs in {options.log_dir}) ...",
        flush=True,
    )
    with Stack(options) as stack:  # a StackError says which process failed, in one line
        print(
            f"kame demo: stack is up; streaming the question to {stack.gateway_address} "
            "at real time ...",
            flush=True,
        )
        talk_options = talk.TalkOptions(
            gateway=stack.gateway_address,
            mode=args.mode,
            # A hold phrase ("Hmm,") is not the answer: listen until the answer came.
            wait_for_answer=args.mode != "s2s",
        )
        result = asyncio.run(talk.talk(question, talk_options))
    data = talk.save(result, talk_options, question_wav, answer_wav, timeline_json, timeline_png)
    latency = data["response_latency_s"]
    print()
    print(f"Question asked:   {args.question}")
    print(f"What stt heard:   {data['user_transcript'] or '(nothing recognized)'}")
    print(f"                  {hearing_verdict(args.question, data['user_transcript'])}")
    print(f"Agent's answer:   {data['agent_text'] or '(the agent said nothing)'}")
    print(
        "Response latency: "
        + (
            "n/a (the agent did not answer)"
            if latency is None
            else f"{latency:.2f} s (caller's end of speech -> first agent audio at the client)"
        )
    )
    answer = result.turns[0].answer_latency_s if result.turns else None
    if answer:  # the gateway's measure: 0 when no answer word was spoken
        print(
            f"Answer latency:   {answer:.2f} s (caller's end of speech -> the answer's first "
            "word, after any hold phrase, leaving the gateway)"
        )
    for notice in result.notices:
        print(f"Notice:           {notice.kind}: {notice.message}")
    print(f"Files:            {question_wav}, {answer_wav}, {timeline_json}, {timeline_png}")
    print("Talk yourself:    kame up, then open the page it prints (a microphone and a browser)")
    if result.status != "OK":
        raise talk.session_error(result, talk_options.gateway)
    return 0 if latency is not None else 1
