"""Tools in the oracle: the LLM asks, the oracle runs the tool on the operator's
MCP server, feeds the result back and streams the answer as usual.

OpenAI and Anthropic cannot be reached from here: a local HTTP server written
in the test (tool_support.py, on conftest's stub_http) stands in for both,
speaking their streaming wire formats with tool calls (OpenAI's
`delta.tool_calls`, Anthropic's `tool_use` blocks). The MCP server is written
in the test with the `mcp` SDK (mcp_tool_server.py), run as a stdio
subprocess or served on streamable HTTP; it answers with a value no model
could guess, made up by each test.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from kame_cli.stack_options import free_ports
from kame_common import store
from kame_common.capacity import LoadMeter
from kamepb import common_pb2, oracle_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC
from services.oracle.backends import BackendSettings, create_backend
from services.oracle.candidate import Candidate, Generation
from services.oracle.prompts import TOOLS_PROMPT, USER, Turn
from services.oracle.tools import mcp_toolbox
from services.oracle.tools.settings import parse_allowed, parse_servers
from services.oracle.tools.turn import TurnTools
from tests.oracle import mcp_tool_server
from tests.oracle.mcp_tool_server import recorded_calls
from tests.oracle.test_tool_rules import CountingToolbox
from tests.oracle.tool_support import (
    APOLOGY,
    FAKE_LLM_ROUTES,
    HOLD,
    UNSURE,
    anthropic_models,
    mcp_over_http,
    slow_openai_routes,
)

Event = oracle_pb2.OracleEvent
# Each partial restarts the LLM: the start window must not hold any back.
POLICY = oracle_pb2.OraclePolicy(poll_interval_s=0.05, max_starts=50)


@pytest.fixture
def secret() -> str:
    return f"zq-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def calls_file(tmp_path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
async def mcp_http(secret, calls_file):
    """The test MCP server on streamable HTTP (request it before oracle_service: the
    oracle then stops first, while its MCP server still answers)."""
    async with mcp_over_http(secret, calls_file) as url:
        yield url


def tool_seconds_count(tool: str, outcome: str) -> float:
    labels = {"tool": tool, "outcome": outcome}
    return REGISTRY.get_sample_value("kame_oracle_tool_seconds_count", labels) or 0.0


async def openai_session(
    stub_http,
    oracle_service,
    guide_client,
    session_id,
    mcp_servers,
    tools_allowed,
    routes=FAKE_LLM_ROUTES,
    **settings,
):
    """A Guide stream on an oracle whose LLM is the fake one (OpenAI wire format)."""
    llm, url = await stub_http(routes)
    runtime = await oracle_service(
        base_url=f"{url}/v1",
        model="stub-model",
        mcp_servers=mcp_servers,
        tools_allowed=tools_allowed,
        **settings,
    )
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, policy=POLICY)
    return llm, client


async def test_openai_tool_calls_answer_from_a_stdio_mcp_server(
    secret, calls_file, stub_http, oracle_service, guide_client, session_id, redis_client, spans
):
    command = shlex.join([sys.executable, mcp_tool_server.__file__, secret, str(calls_file)])
    llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        mcp_servers=f"vault={command}",
        tools_allowed="vault.door_code,vault.book_table",  # not order_status
        trust_read_only_hints="*",
    )
    timed_before = tool_seconds_count("door_code", "ok")
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)

    assert client.answer(1) == f"{HOLD} Here you go: The door code of the Paris office is {secret}."
    client.assert_update_protocol()
    asked, answered = (post.json() for post in llm.posts())
    assert {tool["function"]["name"] for tool in asked["tools"]} == {"door_code", "book_table"}
    assert asked["messages"][0]["content"].endswith(TOOLS_PROMPT)
    call, result = answered["messages"][-2:]
    assert call["role"] == "assistant" and call["content"] == HOLD
    assert [c["function"]["name"] for c in call["tool_calls"]] == ["door_code"]
    assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert secret in result["content"]
    assert [(c["tool"], c["arguments"]) for c in recorded_calls(calls_file)] == [
        ("door_code", {"office": "Paris"})
    ]
    assert tool_seconds_count("door_code", "ok") == timed_before + 1
    assert await client.finish() == grpc.StatusCode.OK

    # One span for the call, inside the span of the candidate's LLM stream.
    finished = [
        s for s in spans.get_finished_spans() if s.attributes.get("kame.session_id") == session_id
    ]
    (tool_span,) = [s for s in finished if s.name == "oracle.tool_call"]
    assert tool_span.attributes["tool.name"] == "door_code"
    assert tool_span.attributes["tool.server"] == "vault"
    assert tool_span.attributes["tool.read_only"] is True
    (stream_span,) = [s for s in finished if s.name == "oracle.llm_stream"]
    assert tool_span.parent.span_id == stream_span.context.span_id

    # The call, its arguments, result and time are in the conversation record.
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [turn["role"] for turn in conversation] == ["user", "tool"]
    assert conversation[1]["text"].startswith(
        f'door_code({{"office": "Paris"}}) -> The door code of the Paris office is {secret}. ['
    )


async def test_anthropic_tool_use_with_a_streamable_http_mcp_server(
    mcp_http, secret, calls_file, stub_http, oracle_service, guide_client, session_id
):
    llm, url = await stub_http({**FAKE_LLM_ROUTES, ("GET", "/v1/models"): anthropic_models})
    runtime = await oracle_service(
        allowed_base_urls=url,
        allowed_models="claude-stub",
        allowed_backends="openai,anthropic",
        mcp_servers=f"vault={mcp_http}",
        tools_allowed="vault.*",
    )
    client = guide_client(runtime.port)
    await client.config(
        session_id=session_id,
        backend=LLM_BACKEND_ANTHROPIC,
        base_url=url,
        api_key="sk-ant-test",
        model="claude-stub",
        policy=POLICY,
    )
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)

    assert client.answer(1) == f"{HOLD} Here you go: The door code of the Paris office is {secret}."
    asked, answered = (post.json() for post in llm.posts())
    assert {t["name"] for t in asked["tools"]} == {
        "door_code",
        "book_table",
        "next_train",
        "order_status",
    }
    assert asked["system"].endswith(TOOLS_PROMPT)
    said, results = answered["messages"][-2:]
    assert said["role"] == "assistant"
    assert said["content"][0] == {"type": "text", "text": HOLD}
    use = said["content"][1]
    assert (use["type"], use["name"], use["input"]) == (
        "tool_use",
        "door_code",
        {"office": "Paris"},
    )
    (result,) = results["content"]
    assert result["tool_use_id"] == use["id"] and secret in result["content"]
    assert result["is_error"] is False
    assert len(recorded_calls(calls_file)) == 1
    assert await client.finish() == grpc.StatusCode.OK


async def partials_then_final(client, words: list[str], calls_file: Path) -> float:
    """Five growing partials of one utterance, each answered (its candidate DONE)
    before the next, then the final: the wall-clock time the final was sent."""
    for n in range(1, 6):
        await client.user(" ".join(words[: 1 + 2 * n]))
        await client.wait_event(Event.DONE, n, timeout_s=30)
    sent_at = time.time()
    await client.user(" ".join(words), final=True)
    await client.wait_event(Event.DONE, 6, timeout_s=30)
    return sent_at


async def test_a_side_effect_tool_runs_once_and_only_after_the_final(
    mcp_http, secret, calls_file, stub_http, oracle_service, guide_client, session_id
):
    llm, client = await openai_session(
        stub_http, oracle_service, guide_client, session_id, f"vault={mcp_http}", "vault.*"
    )
    words = "Please book a table for two in Paris tonight at eight thanks".split()
    final_at = await partials_then_final(client, words, calls_file)

    # Every partial's candidate asked for the booking; none ran it.
    assert len(llm.posts()) == 5 + 2
    for n in range(1, 6):
        assert client.answer(n) == HOLD
    booked = f"Booked a table in Paris, reference {secret}."
    assert client.answer(6) == f"{HOLD} Here you go: {booked}"
    (booking,) = recorded_calls(calls_file)
    assert booking["tool"] == "book_table" and booking["at"] >= final_at

    # The caller goes on before the agent speaks: the same turn, so the same booking
    # is not made twice; its result is reused.
    await client.user("Yes, please book it", final=True, utterance_id="u2")
    await client.wait_event(Event.DONE, 7, timeout_s=30)
    assert client.answer(7) == f"{HOLD} Here you go: {booked}"
    assert len(recorded_calls(calls_file)) == 1
    # The booking is in the conversation the model reads next.
    transcript = llm.posts()[-1].json()["messages"][1]["content"]
    assert f'Tool: book_table({{"city": "Paris"}}) -> {booked} [' in transcript

    # Once the agent has answered, a new request is a new turn: it books again.
    await client.agent(f"Here you go: {booked}", start_s=1.0)
    await client.user("Please book one more", final=True, utterance_id="u3")
    await client.wait_event(Event.DONE, 8, timeout_s=30)
    assert [c["tool"] for c in recorded_calls(calls_file)] == ["book_table", "book_table"]
    client.assert_update_protocol()
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_kept_for_a_partial_candidate_still_gets_its_side_effect(
    mcp_http, secret, calls_file, stub_http, oracle_service, guide_client, session_id
):
    """The final has the words of the partial whose candidate is still running, so it
    is kept for that candidate; which then stops short of the booking (a partial's):
    the final gets a candidate of its own, which books."""
    _llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"vault={mcp_http}",
        "vault.*",
        routes=slow_openai_routes(0.5),
    )
    kept_before = REGISTRY.get_sample_value("kame_oracle_finals_kept_total") or 0.0
    question = "Please book a table in Paris"
    await client.user(question)
    await client.wait_event(Event.FIRST_TOKEN, 1, timeout_s=30)  # words out, no call yet
    await client.user(question, final=True)
    await client.wait_event(Event.DONE, 2, timeout_s=10)
    assert REGISTRY.get_sample_value("kame_oracle_finals_kept_total") == kept_before + 1
    assert client.answer(1) == HOLD
    assert client.answer(2) == f"{HOLD} Here you go: Booked a table in Paris, reference {secret}."
    assert [c["tool"] for c in recorded_calls(calls_file)] == ["book_table"]
    assert await client.finish() == grpc.StatusCode.OK


@pytest.mark.parametrize("trusted", [True, False], ids=["hint-trusted", "hint-alone"])
async def test_a_read_only_tool_runs_on_a_partial_only_where_the_operator_trusts_its_hint(
    mcp_http,
    secret,
    calls_file,
    stub_http,
    oracle_service,
    guide_client,
    session_id,
    redis_client,
    trusted,
):
    """door_code is read-only by its server's readOnlyHint. Trusted, it runs on a
    partial and its result is reused. The abuse: a server that hints readOnlyHint for
    a tool with side effects (or one the operator does not control) had it run on
    partial transcripts, for words the caller had not finished; untrusted, the hint
    counts for nothing and the tool runs once, for the final (the old oracle ran it
    on a partial)."""
    _llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"vault={mcp_http}",
        "vault.*",
        trust_read_only_hints="vault" if trusted else "",
    )
    words = "The door code of the Paris office for the visit today please".split()
    final_at = await partials_then_final(client, words, calls_file)

    (lookup,) = recorded_calls(calls_file)
    assert lookup["tool"] == "door_code" and (lookup["at"] < final_at) == trusted
    answered = [n for n in range(1, 7) if secret in client.answer(n)]
    assert answered == ([1, 2, 3, 4, 5, 6] if trusted else [6])
    assert await client.finish() == grpc.StatusCode.OK
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [turn["role"] for turn in conversation] == ["user", "tool"]


async def test_a_hanging_tool_becomes_an_apology_and_the_call_goes_on(
    mcp_http, secret, calls_file, stub_http, oracle_service, guide_client, session_id
):
    llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"vault={mcp_http}",
        "vault.order_status:readonly:1, vault.door_code",
    )
    errors_before = tool_seconds_count("order_status", "error")
    started = time.monotonic()
    await client.user("Where is my order?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)
    took = time.monotonic() - started

    assert client.answer(1) == f"{HOLD} {APOLOGY}"
    assert 1.0 <= took < 6.0  # the 1 s timeout, and not much more on a loaded machine
    result = llm.posts()[1].json()["messages"][-1]
    assert result == {
        "role": "tool",
        "tool_call_id": result["tool_call_id"],
        "content": "error: order_status did not answer within 1 s",
    }
    assert tool_seconds_count("order_status", "error") == errors_before + 1

    await client.agent(f"{HOLD} {APOLOGY}", start_s=1.0)
    await client.user("And the door code of the Paris office?", final=True, utterance_id="u2")
    await client.wait_event(Event.DONE, 2, timeout_s=30)
    assert secret in client.answer(2)
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_stdio_server_that_died_is_started_again_by_the_next_call(
    secret, calls_file, stub_http, oracle_service, guide_client, session_id, monkeypatch
):
    monkeypatch.setattr(mcp_toolbox, "RECONNECT_S", 0.0)  # at once, however soon after start
    command = shlex.join([sys.executable, mcp_tool_server.__file__, secret, str(calls_file)])
    llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"vault={command}",
        "vault.crash_server, vault.door_code",
    )
    await client.user("Please crash the server", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)
    assert client.answer(1) == f"{HOLD} {APOLOGY}"
    lost = llm.posts()[1].json()["messages"][-1]["content"]
    assert lost == "error: crash_server is unavailable (its server is down)"

    await client.agent(f"{HOLD} {APOLOGY}", start_s=1.0)
    await client.user("And the door code of the Paris office?", final=True, utterance_id="u2")
    await client.wait_event(Event.DONE, 2, timeout_s=30)
    assert secret in client.answer(2)
    assert [c["tool"] for c in recorded_calls(calls_file)] == ["crash_server", "door_code"]
    assert await client.finish() == grpc.StatusCode.OK


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def started(starts: Path) -> list[int]:
    """The pids of the server's processes so far, each written at its start."""
    return [int(line) for line in starts.read_text().split()]


async def test_a_lost_server_whose_restart_hangs_holds_one_process_not_one_per_call(
    secret, calls_file, tmp_path, monkeypatch
):
    """The leak: each call of a tool of a lost server started the server again
    within the call's timeout, and a start that hung was left running when the
    call timed out: 5 calls left 5 processes, 4 of them alive after close."""
    monkeypatch.setattr(mcp_toolbox, "RECONNECT_S", 0.0)  # every call may reconnect
    starts = tmp_path / "starts"
    command = [sys.executable, mcp_tool_server.__file__, secret, str(calls_file), str(starts)]
    toolbox = mcp_toolbox.McpToolbox(
        parse_servers(f"vault={shlex.join(command)}"),
        parse_allowed("vault.*"),
        timeout_s=0.3,
        connect_timeout_s=10.0,  # a first start on a busy machine takes seconds
    )
    await toolbox.start()
    try:
        crash, door_code = toolbox.spec("crash_server"), toolbox.spec("door_code")
        assert crash is not None and door_code is not None
        assert (await toolbox.call(crash, {}, "call-0")).is_error  # the server is lost
        starts.with_suffix(".hang").touch()  # its restarts hang from now on
        # At least five calls, and on until the restart's process has written its
        # pid: on a busy machine the interpreter's start takes longer than five
        # 0.3 s timeouts.
        deadline = time.monotonic() + 60.0
        n = 0
        while n < 5 or (len(started(starts)) < 2 and time.monotonic() < deadline):
            n += 1
            result = await toolbox.call(door_code, {"office": "Paris"}, f"call-{n}")
            assert result.is_error, result
            pids = started(starts)
            assert sum(map(running, pids)) <= 1, f"after call {n}: {pids}"
    finally:
        await toolbox.aclose()
    pids = started(starts)
    assert len(pids) >= 2  # it did start the server again
    assert not [pid for pid in pids if running(pid)]


async def test_an_unreachable_mcp_server_leaves_its_tools_out_and_the_oracle_serves(
    stub_http, oracle_service, guide_client, session_id
):
    (port,) = free_ports(1)  # nothing listens there
    llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"gone=http://127.0.0.1:{port}/mcp",
        "gone.*",
        mcp_connect_timeout_s=3.0,
    )
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)
    assert client.answer(1) == UNSURE
    assert "tools" not in llm.posts()[0].json()  # no tools: the field is not sent at all
    assert await client.finish() == grpc.StatusCode.OK


async def test_the_turn_budget_stops_tool_calls(
    mcp_http, calls_file, stub_http, oracle_service, guide_client, session_id
):
    llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"vault={mcp_http}",
        "vault.*",
        tool_budget=0,
    )
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)
    assert client.answer(1) == f"{HOLD} {APOLOGY}"
    assert (
        llm.posts()[1]
        .json()["messages"][-1]["content"]
        .startswith("error: no more tool calls this turn (at most 0)")
    )
    assert recorded_calls(calls_file) == []
    assert await client.finish() == grpc.StatusCode.OK


async def test_the_warm_up_sends_the_tools_the_sessions_are_offered(
    mcp_http, stub_http, oracle_service, guide_client, session_id
):
    """A chat template renders the tools before the prompt: warming without them would
    leave the first caller's prompt cold from the system prompt on."""

    async def warm_or_answer(request, respond):
        if request.json()["max_tokens"] == 1:
            await respond.json(200, {"choices": []})
        else:
            await FAKE_LLM_ROUTES[("POST", "/v1/chat/completions")](request, respond)

    llm, client = await openai_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        f"vault={mcp_http}",
        "vault.door_code",
        routes={("POST", "/v1/chat/completions"): warm_or_answer},
        warmup_timeout_s=10.0,
    )
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)
    warm_up, first_call = (post.json() for post in llm.posts()[:2])
    assert warm_up["max_tokens"] == 1
    assert warm_up["tools"] == first_call["tools"]
    assert [t["function"]["name"] for t in warm_up["tools"]] == ["door_code"]
    assert warm_up["messages"][0] == first_call["messages"][0]  # the system prompt, tools told
    assert await client.finish() == grpc.StatusCode.OK


# What a tool costs the caller (issue #33's figure): with a tool that takes 300 ms,
# the first word of the answer that uses its result comes at most 400 ms later than
# the first word of an answer without a tool. The fake LLM takes no model time, so
# this is the oracle's own cost: the tool round, the MCP call, the second request.
ROUNDS = 5


async def first_word_after(client, question: str, utterance_id: str, after: str) -> float:
    """Seconds from the final to the update carrying the candidate's first word
    after the words `after` (its hold, when it has one)."""
    generation = len(client.events(Event.REQUEST_START)) + 1
    sent = time.monotonic()
    await client.user(question, final=True, utterance_id=utterance_id)
    await client.wait_event(Event.DONE, generation, timeout_s=30)
    words = 0
    for response, arrived in zip(client.responses, client.arrival, strict=True):
        if response.HasField("update") and response.update.generation == generation:
            words += len(response.update.text.split())
            if words > len(after.split()):
                return arrived - sent
    raise AssertionError(f"generation {generation} said only {after!r}")


async def test_a_300_ms_tool_delays_the_answer_by_at_most_400_ms(
    mcp_http, stub_http, oracle_service, guide_client, session_id
):
    _llm, url = await stub_http(FAKE_LLM_ROUTES)
    runtime = await oracle_service(
        base_url=f"{url}/v1",
        model="stub-model",
        mcp_servers=f"vault={mcp_http}",
        tools_allowed="vault.next_train",
    )
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, policy=POLICY)
    plain, with_tool = [], []
    for n in range(ROUNDS):
        plain.append(await first_word_after(client, f"Hello number {n}", f"p{n}", ""))
        await client.agent("I am not sure.", start_s=float(n))
        with_tool.append(
            await first_word_after(client, "When is the next train to Paris?", f"t{n}", HOLD)
        )
        await client.agent("Here you go.", start_s=n + 0.5)
    print(
        f"first answer word (median of {ROUNDS}): {statistics.median(plain) * 1000:.0f} ms "
        f"without a tool, {statistics.median(with_tool) * 1000:.0f} ms with one of 300 ms"
    )
    # The best of each: a loaded machine's stalls are not the oracle's cost.
    assert 0.3 <= min(with_tool) - min(plain) <= 0.4


async def test_the_llm_is_not_counted_busy_while_a_tool_runs(stub_http):
    """The oracle's capacity is its LLM's: a candidate waiting for a tool does not
    keep the LLM busy (its load meter counts the LLM rounds only)."""
    _llm, url = await stub_http(FAKE_LLM_ROUTES)
    backend = create_backend(
        BackendSettings("openai", "stub-model", f"{url}/v1", "", 10.0, 64, 0.0, "")
    )
    toolbox = CountingToolbox(delay_s=1.0, names=("next_train",))
    load = LoadMeter(parallelism=1, window_s=1.0)  # about the candidate's time
    source = common_pb2.CandidateSource(utterance_id="u1", is_final=True, text="next train?")
    words: list[str] = []
    candidate = Candidate(
        Generation(1, source),
        backend,
        TurnTools(toolbox, 4, "s1", lambda call, result: None),
        toolbox.specs,
        lambda kind, generation: None,
        lambda generation, text: words.append(text),
        load,
    )
    try:
        await candidate.run([Turn(USER, "When is the next train to Paris?")])
    finally:
        await backend.aclose()
    assert toolbox.calls == [("next_train", {"city": "Paris"})]
    assert " ".join(w for w in words if w).startswith(HOLD)
    assert load.utilization() < 0.3  # two quick LLM rounds in a second and more
