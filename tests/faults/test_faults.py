"""A side service breaks under a live call; the voice stays on time, the
caller hears about it, and once the service is back the next question in the
same call is answered.

The caller is `kame talk`'s client streaming a WAV of two spoken questions
with silence between them at real time; the test signals a service's
process at set moments of the call. A frame is late as `kame bench` counts
it: its agent frame reached the client more than one frame (80 ms) after the
caller frame was due (kame_cli.bench.conversation.frame_lags).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from kame_cli import talk
from kame_cli.bench.conversation import frame_lags
from kame_cli.child import Child, grpc_serving
from kame_cli.stack_options import free_ports
from kame_client.events import (
    AgentText,
    Notice,
    OracleAppend,
    OracleReset,
    Resumed,
    UserFinal,
    UserPartial,
)
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE
from tests.faults.conftest import child, restart
from tests.support import conversation, word_recall

FIRST = "What is the capital of France?"
SECOND = "What is the capital of Italy?"
LEAD_S = 0.5  # silence before the first question
TAIL_S = 8.0  # silence after the second: time for its answer (its first word came 2.7 s in)


@dataclass
class Script:
    audio: np.ndarray  # 24 kHz
    second_at_s: float  # where the second question starts in the stream


def two_questions(speak, second_at_s: float) -> Script:
    first, second = speak(FIRST), speak(SECOND)
    audio = np.zeros(int((second_at_s + TAIL_S) * SAMPLE_RATE) + len(second), np.float32)
    lead = int(LEAD_S * SAMPLE_RATE)
    audio[lead : lead + len(first)] = first
    start = int(second_at_s * SAMPLE_RATE)
    audio[start : start + len(second)] = second
    assert LEAD_S + len(first) / SAMPLE_RATE < second_at_s
    return Script(audio, second_at_s)


# The call's clock (talk's) starts a moment after the test's: compare with this slack.
CLOCK_SLACK_S = 0.25


async def at(started: float, moment_s: float) -> None:
    """Sleep until `moment_s` into the call (the test's clock starts at `started`)."""
    await asyncio.sleep(max(0.0, started + moment_s - time.monotonic()))


def notices(result: talk.TalkResult, kind: str) -> list[float]:
    return [notice.t for notice in result.of(Notice) if notice.event.kind == kind]


def late_fraction(result: talk.TalkResult) -> tuple[float, float]:
    """Late agent frames (as kame bench counts them) and the frame lag p99."""
    lags = frame_lags(result)
    assert len(lags) > 0
    return float(np.mean(lags > FRAME_SECONDS)), float(np.percentile(lags, 99))


# The word-by-word events an outline leaves out.
WORDS = AgentText | OracleAppend | UserPartial


def outline(result: talk.TalkResult) -> str:
    """The call's events but the word-by-word ones, a line each, for a failure's message."""
    lines = [
        f"{e['t']:7.2f} {e['type']} {e.get('text') or e.get('kind') or e.get('after') or ''}"
        for e in (timed.json() for timed in result.events if not isinstance(timed.event, WORDS))
    ]
    return "\n".join([*lines, f"status {result.status} {result.status_details}"])


def assert_second_question_answered(result: talk.TalkResult, second_at_s: float) -> float:
    """The second question was heard and answered by an oracle candidate made for
    it; returns when its first answer word reached the client."""
    finals = [final.event.text for final in result.of(UserFinal) if final.t > second_at_s]
    assert any(word_recall(SECOND, text) >= 0.5 for text in finals), outline(result)
    resets = {
        reset.event.generation: reset.t for reset in result.of(OracleReset) if reset.t > second_at_s
    }
    answer = [
        said.t
        for said in result.of(AgentText)
        if said.event.generation in resets and said.t > second_at_s
    ]
    assert answer, f"no answer to the second question: {result.events}"
    return answer[0]


def options(stack) -> talk.TalkOptions:
    return talk.TalkOptions(gateway=stack.gateway_address, tail_s=1.0, max_wait_s=20.0)


async def test_a_stopped_stt_costs_no_frame_and_the_call_recovers(process_stack, speak):
    stt = child(process_stack, "stt")
    script = two_questions(speak, second_at_s=13.0)
    stop_at_s, continue_at_s = 1.5, 6.0  # stt stops in the middle of the first question
    started = time.monotonic()
    call = asyncio.ensure_future(talk.talk(script.audio, options(process_stack)))
    try:
        await at(started, stop_at_s)
        stt.signal(signal.SIGSTOP)
        await at(started, continue_at_s)
        stt.signal(signal.SIGCONT)
        result = await call
    finally:
        stt.signal(signal.SIGCONT)
    assert result.status == "OK", result.status_details

    lost, back = notices(result, "ORACLE_UNAVAILABLE"), notices(result, "ORACLE_RESTORED")
    assert lost and lost[0] - stop_at_s < 3.0, result.notices
    assert back and continue_at_s - CLOCK_SLACK_S < back[0] < script.second_at_s, result.notices
    late, lag_p99 = late_fraction(result)
    assert late < 0.01, f"{late:.1%} of agent frames late (frame lag p99 {lag_p99:.3f} s)"
    answered_t = assert_second_question_answered(result, script.second_at_s)
    print(
        f"\nSIGSTOP stt: notice after {lost[0] - stop_at_s:.2f} s, restored "
        f"{back[0] - continue_at_s:.2f} s after SIGCONT, late frames {late:.2%} of "
        f"{len(frame_lags(result))}, frame lag p99 {lag_p99 * 1000:.0f} ms, second answer "
        f"{answered_t - script.second_at_s:.2f} s after it began"
    )


async def test_a_killed_oracle_restarted_answers_the_next_question(process_stack, speak):
    # The oracle was back 3.9 s after its kill alone (restart 1.7 s): 12 s of room.
    script = two_questions(speak, second_at_s=20.0)
    kill_at_s = 8.0  # the first question is final and answered by then
    started = time.monotonic()
    call = asyncio.ensure_future(talk.talk(script.audio, options(process_stack)))
    await at(started, kill_at_s)
    restart_s = await asyncio.to_thread(restart, process_stack, "oracle")
    result = await call
    assert result.status == "OK", result.status_details

    lost, back = notices(result, "ORACLE_UNAVAILABLE"), notices(result, "ORACLE_RESTORED")
    assert lost and lost[0] - kill_at_s < 3.0, result.notices
    assert back and back[0] < script.second_at_s, result.notices
    answered_t = assert_second_question_answered(result, script.second_at_s)
    late, lag_p99 = late_fraction(result)
    # The conversation goes on in the same Redis record: both questions are in it.
    assert result.started is not None
    turns = await conversation(process_stack.redis_url, result.started.session_id)
    users = [t["text"] for t in turns if t["role"] == "user"]
    assert any(word_recall(SECOND, text) >= 0.5 for text in users), turns
    print(
        f"\nSIGKILL oracle: notice after {lost[0] - kill_at_s:.2f} s, restarted in "
        f"{restart_s:.1f} s, restored at {back[0]:.1f} s into the call, late frames "
        f"{late:.2%}, frame lag p99 {lag_p99 * 1000:.0f} ms, second answer "
        f"{answered_t - script.second_at_s:.2f} s after it began, user turns {users}"
    )


def one_question(speak, text: str, tail_s: float = 14.0) -> np.ndarray:
    spoken = speak(text)
    audio = np.zeros(int((LEAD_S + tail_s) * SAMPLE_RATE) + len(spoken), np.float32)
    lead = int(LEAD_S * SAMPLE_RATE)
    audio[lead : lead + len(spoken)] = spoken
    return audio


def answer_words_after(result: talk.TalkResult, after_s: float) -> list[str]:
    """Agent words of oracle candidates that reached the client after `after_s`
    (a restarted oracle numbers its generations from 1 again: times tell them apart)."""
    resets = [reset for reset in result.of(OracleReset) if reset.t > after_s]
    generations = {reset.event.generation for reset in resets}
    first_reset_t = min((reset.t for reset in resets), default=float("inf"))
    return [
        said.event.text
        for said in result.of(AgentText)
        if said.event.generation in generations and said.t >= first_reset_t
    ]


async def test_a_killed_stt_loses_no_word_of_the_question_it_hit(process_stack, speak):
    """SIGKILL stt in the middle of a question; the supervisor restarts it, the
    gateway replays the utterance to the new stream: the transcript is the whole
    question (without the replay it was its tail, "of France"), and it is answered."""
    kill_at_s = LEAD_S + 0.9  # a little past the question's middle
    started = time.monotonic()
    call = asyncio.ensure_future(talk.talk(one_question(speak, FIRST), options(process_stack)))
    await at(started, kill_at_s)
    restart_s = await asyncio.to_thread(restart, process_stack, "stt")
    result = await call
    assert result.status == "OK", result.status_details

    finals = [final.event.text for final in result.of(UserFinal)]
    assert any(word_recall(FIRST, text) >= 0.8 for text in finals), finals
    answer = answer_words_after(result, kill_at_s)
    assert answer, f"the question was not answered: {result.events}"
    print(
        f"\nSIGKILL stt mid-question: back in {restart_s:.1f} s, finals {finals}, "
        f"answer {' '.join(answer)!r}"
    )


async def test_a_killed_oracle_answers_the_question_it_hit_once_back(process_stack, speak):
    """SIGKILL the oracle in the middle of a question; once the supervisor has it
    back, the gateway hands it the question's final and it answers it, and the
    conversation in Redis holds the question once."""
    kill_at_s = LEAD_S + 0.9
    started = time.monotonic()
    call = asyncio.ensure_future(talk.talk(one_question(speak, SECOND), options(process_stack)))
    await at(started, kill_at_s)
    restart_s = await asyncio.to_thread(restart, process_stack, "oracle")
    result = await call
    assert result.status == "OK", result.status_details

    answer = answer_words_after(result, kill_at_s)
    assert answer, f"the question was not answered: {result.events}"
    assert result.started is not None
    turns = await conversation(process_stack.redis_url, result.started.session_id)
    asked = [t for t in turns if t["role"] == "user" and word_recall(SECOND, t["text"]) >= 0.5]
    assert len(asked) == 1, turns
    assert "Hmm," not in [t["text"] for t in turns], turns  # a hold phrase is no agent turn
    print(
        f"\nSIGKILL oracle mid-question: back in {restart_s:.1f} s, "
        f"answer {' '.join(answer)!r}, turns {turns}"
    )


@pytest.mark.parametrize("service", ["frontend", "gateway"])
async def test_a_question_asked_while_the_call_reconnects_is_answered(
    process_stack, speak, service
):
    """SIGKILL the frontend (the gateway then ends the call) or the gateway just
    before the caller's second question; `kame up` restarts it and the call
    resumes. The caller's audio since the break goes to the resumed call, so the
    question asked while no call was open is heard and answered (before, the
    caller skipped that audio, as a phone line would lose it, and with it the
    question)."""
    script = two_questions(speak, second_at_s=9.0)
    kill_at_s = script.second_at_s - 0.2
    started = time.monotonic()
    call = asyncio.ensure_future(talk.talk(script.audio, options(process_stack)))
    await at(started, kill_at_s)
    restart_s = await asyncio.to_thread(restart, process_stack, service)
    result = await call
    assert result.status == "OK", outline(result)

    resumed = [timed.t for timed in result.of(Resumed)]
    assert resumed, outline(result)
    answered_t = assert_second_question_answered(result, script.second_at_s)
    print(
        f"\nSIGKILL {service} before a question: back in {restart_s:.1f} s, call resumed "
        f"{resumed[0] - kill_at_s:.1f} s after the kill, the question answered "
        f"{answered_t - script.second_at_s:.1f} s after it began"
    )


async def test_a_question_whose_llm_server_was_killed_is_answered_once_back(process_stack, speak):
    """SIGKILL the LLM server as the caller's question ends, and again as soon as
    it is back, so that the final's candidate cannot reach it: the oracle asks
    again until the server answers, and the question is answered without the
    caller saying more (before, only the next question was)."""
    question = speak(FIRST)
    kill_at_s = LEAD_S + len(question) / SAMPLE_RATE
    started = time.monotonic()
    call = asyncio.ensure_future(talk.talk(one_question(speak, FIRST), options(process_stack)))
    await at(started, kill_at_s)
    restart_s = await asyncio.to_thread(restart, process_stack, "llm")
    restart_s += await asyncio.to_thread(restart, process_stack, "llm")
    result = await call
    assert result.status == "OK", result.status_details

    answer = answer_words_after(result, kill_at_s)
    assert answer, f"the question was not answered: {outline(result)}"
    print(
        f"\nSIGKILL llm twice at the end of a question: back in {restart_s:.1f} s, "
        f"errors at {notices(result, 'ORACLE_ERROR')}, answer {' '.join(answer)!r}"
    )


def test_side_processes_run_below_the_voice_path(process_stack):
    """kame up's priorities: stt, oracle and the LLM server yield the CPU to
    gateway and frontend."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    niceness = {
        name: os.getpriority(os.PRIO_PROCESS, child(process_stack, name).process.pid) - ours
        for name in ("llm", "stt", "oracle", "frontend", "gateway")
    }
    assert niceness == {"llm": 10, "stt": 10, "oracle": 10, "frontend": 0, "gateway": 0}


def test_niceness_ranks_the_children_against_each_other(process_stack):
    """Every child has a process group of its own (kame up stops it as one) but
    stays in our session: with the kernel's autogroups a new session is a
    scheduling group of its own with an equal share of the CPU, where a niceness
    ranks the child's threads only against each other (on a 2-core machine 32
    tandem sessions then had 20-30 % late agent frames instead of under 1 %)."""
    for process in process_stack.children:
        assert process.process is not None
        pid = process.process.pid
        assert os.getpgid(pid) == pid, process.name
        assert os.getsid(pid) == os.getsid(0), process.name
        assert autogroup(pid) == autogroup("self"), process.name


def autogroup(pid: int | str) -> str:
    """The autogroup a process is scheduled in: "/autogroup-N", or "" where the
    kernel has no autogroups or the process is in the root group (the session of
    PID 1, where CI may run us: the kernel then prints nothing)."""
    path = Path(f"/proc/{pid}/autogroup")
    words = path.read_text().split() if path.exists() else []
    return words[0] if words else ""


async def test_a_call_whose_gateway_is_killed_resumes_on_another(process_stack, speak):
    first, second = await asyncio.to_thread(resumable_gateways, process_stack)
    script = two_questions(speak, second_at_s=16.0)
    kill_at_s = 8.0  # the first question is answered by then
    started = time.monotonic()
    options = talk.TalkOptions(
        gateway=f"{first.endpoint},{second.endpoint}", tail_s=1.0, max_wait_s=20.0
    )
    call = asyncio.ensure_future(talk.talk(script.audio, options))
    await at(started, kill_at_s)
    first.signal(signal.SIGKILL)
    result = await call
    assert result.status == "OK", result.status_details

    assert result.started is not None
    session_id = result.started.session_id
    resumed = result.of(Resumed)
    assert resumed and resumed[0].event.session_id == session_id, outline(result)
    resumed_after_s = resumed[0].t - kill_at_s
    answered_t = assert_second_question_answered(result, script.second_at_s)
    turns = await conversation(process_stack.redis_url, session_id)
    # The history before the kill is intact and the conversation went on after it.
    users = [t["text"] for t in turns if t["role"] == "user"]
    assert word_recall(FIRST, users[0]) >= 0.5 and word_recall(SECOND, users[-1]) >= 0.5, turns
    assert turns[1]["role"] == "agent", turns  # the first answer, before the second question
    print(
        f"\nSIGKILL gateway: resumed on the second {resumed_after_s:.2f} s after the kill, "
        f"second answer {answered_t - script.second_at_s:.2f} s after it began, turns {turns}"
    )


def resumable_gateways(stack) -> tuple[Child, Child]:
    """The stack's gateway restarted with a resume secret, and a second replica
    with the same secret on ports of its own (stopped with the stack)."""
    secret = {"KAME_GATEWAY_RESUME_SECRET": "fault-test-resume-secret"}
    first = child(stack, "gateway")
    first.env.update(secret)
    restart(stack, "gateway")
    port, metrics_port = free_ports(2)
    address = f"127.0.0.1:{port}"
    env = stack.service_env("gateway") | secret
    env |= {"KAME_GATEWAY_PORT": str(port), "KAME_GATEWAY_METRICS_PORT": str(metrics_port)}
    second = Child(
        "gateway-b",
        [sys.executable, "-m", "services.gateway"],
        env,
        partial(grpc_serving, address),
        address,
    )
    second.start(stack.log_dir)
    stack.children.append(second)
    while not second.ready():
        assert second.running(), second.log_tail()
        time.sleep(0.2)
    return first, second
