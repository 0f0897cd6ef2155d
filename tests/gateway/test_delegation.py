"""Client delegation and the caller's context through the gateway
(services/gateway/delegation.py).

First against the scripted fakes (what is refused at the start, where each
delegation and each context goes, what is refused while the call goes on),
then on real services on loopback: the real gateway, the real tts front-end
(piper) and the real oracle, whose session in client delegation has no LLM at
all (its configured one is a closed port), beside the fake stt. The test is
the caller's back-end: it answers each delegation with a fact only it knows
and finds it in the words the agent spoke (the stack's own AgentText)."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from kame_client.events import Delegated, Notice
from kame_common.audio import FRAME_SECONDS
from kamepb import common_pb2, gateway_pb2
from services.oracle.delegation import APOLOGY
from tests.gateway.fakes import sync_converse
from tests.gateway.test_push_to_talk import SILENT_FRAME, Call, real_upstreams
from tests.oracle.test_bad_input import closed_port_url
from tests.support import words_of

Config = gateway_pb2.ConverseConfig
Delegation = gateway_pb2.DelegationConfig
Context = common_pb2.AgentContext
Request = gateway_pb2.ConverseRequest
CLIENT = Delegation(target=Delegation.CLIENT)
QUESTION = "What is the door code of the Paris office?"
HOLD_LATER = gateway_pb2.HoldConfig(phrases=["Hmm,"], delay_s=2.0, max_s=6.0)


def context(kind: int, text: str, delegation_id: str = "") -> Request:
    return Request(context=Context(kind=kind, text=text, delegation_id=delegation_id))


def refusals(call: Call) -> list[str]:
    return [e.message for e in call.of(Notice) if e.kind == "REFUSED"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            Config(mode=Config.S2S, delegation=CLIENT),
            "CLIENT (the client's back-end answers) cannot go with mode S2S",
        ),
        (
            Config(delegation=CLIENT, llm=gateway_pb2.LlmOverride(model="gpt-4o")),
            "cannot go with an llm override",
        ),
        (
            Config(delegation=CLIENT, functions=[common_pb2.ClientFunction(name="hang_up")]),
            "cannot go with functions",
        ),
        (
            Config(delegation=Delegation(target=Delegation.CLIENT, timeout_s=61)),
            "delegation.timeout_s: 0 (the default, 10 s) to 60 s, got 61",
        ),
        (Config(delegation=Delegation(timeout_s=5)), "only with delegation.target CLIENT"),
        (Config(delegation=Delegation(target=9)), "delegation.target: unknown value 9"),
        (
            Config(hold=gateway_pb2.HoldConfig(delay_s=-1)),
            "hold.delay_s: must be 0 (at once) to 10 seconds",
        ),
    ],
)
async def test_delegations_that_cannot_work_are_refused_before_any_upstream(fakes, config, message):
    runtime = await fakes.gateway()
    code, details, _ = await asyncio.to_thread(
        sync_converse, f"127.0.0.1:{runtime.port}", [Request(config=config)]
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details
    assert fakes.frontend.log.opened == 0 and fakes.oracle.log.opened == 0


async def test_a_delegation_goes_to_the_caller_and_its_answer_to_the_oracle(fakes):
    runtime = await fakes.gateway()
    call = Call(f"127.0.0.1:{runtime.port}")
    delegation = Delegation(target=Delegation.CLIENT, timeout_s=4)
    await call.start(Config(mode=Config.CASCADE, delegation=delegation, hold=HOLD_LATER))
    await call.send([SILENT_FRAME] * 5)
    await call.client.send_text(QUESTION)
    await call.send_until(lambda: bool(call.of(Delegated)))
    (event,) = call.of(Delegated)
    assert event.delegation_id == "delegation-1"
    assert (event.source_text, event.source_final) == (QUESTION, True)
    # Stamped where it was created on the call's timeline: the caller had sent 5 frames.
    assert 5 * FRAME_SECONDS <= event.offset_s <= call.frames * FRAME_SECONDS

    await call.client.send(context(Context.THINKING, "Looking it up.", "delegation-1"))
    await call.client.send(context(Context.COMMENTARY, "It is 4417.", "delegation-1"))
    await call.client.send(context(Context.COMMENTARY, "Made up.", "delegation-9"))
    await call.client.send(context(Context.INSTRUCTIONS, "Be brief.", "delegation-1"))
    await call.send_until(lambda: len(refusals(call)) == 2)
    await call.send([SILENT_FRAME] * 3)
    assert await call.finish() == grpc.StatusCode.OK

    (config,) = fakes.oracle.log.of("config")
    assert config.client_delegation and config.delegation_timeout_s == 4
    assert config.model == "" and not config.client_functions
    (frontend_config,) = fakes.frontend.log.of("config")
    assert (frontend_config.hold_delay_s, frontend_config.hold_max_s) == (2.0, 6.0)
    relayed = [(c.kind, c.text, c.delegation_id) for c in fakes.oracle.log.of("context")]
    assert relayed == [
        (Context.THINKING, "Looking it up.", "delegation-1"),
        (Context.COMMENTARY, "It is 4417.", "delegation-1"),
    ]
    assert refusals(call) == [
        "context.delegation_id: no delegation 'delegation-9' was sent in this call",
        "context.delegation_id: instructions are for the session, name no delegation",
    ]
    record = await fakes.session_record(call.client.session.session_id)
    assert record["delegation"] == "client"


async def test_context_the_gateway_cannot_act_on_is_refused_and_the_call_goes_on(fakes):
    runtime = await fakes.gateway(context_max_chars=40, context_per_s=0.01)
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE))
    await call.send([SILENT_FRAME] * 2)
    sent = [
        context(Context.COMMENTARY, "It is 4417.", "delegation-1"),  # no client delegation
        context(Context.THINKING, "   "),
        context(Context.THINKING, "x" * 41),
        context(7, "What kind is this?"),
        context(Context.INSTRUCTIONS, "Answer in French."),  # allow_instructions is off
        # With those, a burst of 10 passes the rate; one notice for the rest.
        *[context(Context.THINKING, f"Note {n}.") for n in range(8)],
    ]
    for request in sent:
        assert await call.client.send(request)
    await call.send_until(lambda: len(refusals(call)) == 6)
    await call.send([SILENT_FRAME] * 3)
    assert await call.finish() == grpc.StatusCode.OK
    assert refusals(call) == [
        "context.delegation_id: this call delegates to no client (delegation CLIENT)",
        "context.text: empty",
        "context.text: at most 40 characters (context_max_chars), got 41",
        "context.kind: COMMENTARY, THINKING or INSTRUCTIONS, got 7",
        "context: this gateway takes no instructions from callers (allow_instructions)",
        "context: more than 0.01 a second (context_per_s); the rest dropped",
    ]
    relayed = [c.text for c in fakes.oracle.log.of("context")]
    assert relayed == [f"Note {n}." for n in range(5)]


async def test_instructions_added_during_the_call_reach_every_oracle_stream(fakes):
    fakes.oracle.fail_after_first = True  # the first stream breaks at the typed question
    runtime = await fakes.gateway(
        allow_instructions=True,
        instructions_max_chars=40,
        side_backoff_s=0.05,
        side_backoff_max_s=0.1,
    )
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE, instructions="Be brief."))
    await call.send([SILENT_FRAME] * 2)
    await call.client.send(context(Context.INSTRUCTIONS, "Answer in French."))
    await call.client.send(context(Context.INSTRUCTIONS, "And never mention the weather."))
    await call.send_until(lambda: bool(refusals(call)))
    await call.client.send_text(QUESTION)
    await call.send_until(lambda: len(fakes.oracle.log.of("config")) == 2)
    await call.send([SILENT_FRAME] * 3)
    assert await call.finish() == grpc.StatusCode.OK
    assert refusals(call) == [
        "context.text: instructions of at most 40 characters in all (instructions_max_chars), "
        "this call has 26"
    ]
    first, reopened = fakes.oracle.log.of("config")
    assert first.instructions == "Be brief."
    assert reopened.instructions == "Be brief.\nAnswer in French."


async def test_an_s2s_call_takes_no_context(fakes):
    runtime = await fakes.gateway()
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.S2S))
    await call.client.send(context(Context.THINKING, "The caller is in Paris."))
    await call.send_until(lambda: bool(refusals(call)))
    assert await call.finish() == grpc.StatusCode.OK
    assert refusals(call) == ["context: this call has no oracle to take it (s2s)"]


# --- real front-end and oracle ------------------------------------------------------------


@pytest.fixture
async def delegating_stack(fakes):
    """The real tts front-end and oracle beside the fake stt; the oracle's own LLM
    cannot be reached (client delegation needs none). `gateway()` starts a real
    gateway in front."""
    runtimes, gateway = await real_upstreams(fakes, base_url=closed_port_url())
    yield gateway
    for runtime in runtimes:
        await runtime.stop()


async def test_the_callers_back_end_answers_in_the_agents_voice(delegating_stack):
    secret = str(uuid.uuid4().int % 900_000 + 100_000)  # six digits: one word
    runtime = await delegating_stack()
    call = Call(f"127.0.0.1:{runtime.port}")
    # A hold phrase that waits longer than the back-end takes is never said.
    hold = gateway_pb2.HoldConfig(phrases=["Hmm, let me see,"], delay_s=8.0, max_s=10.0)
    await call.start(Config(mode=Config.CASCADE, delegation=CLIENT, hold=hold))
    await call.send([SILENT_FRAME] * 3)
    await call.client.send_text(QUESTION)
    await call.send_until(lambda: bool(call.of(Delegated)))
    (event,) = call.of(Delegated)
    assert event.source_text == QUESTION
    answer = f"The code is {secret}."
    await call.client.send_context(Context.COMMENTARY, answer, event.delegation_id)
    await call.send_until(lambda: words_of(answer)[-1] in call.agent_words())
    await call.send([SILENT_FRAME] * 3)
    assert await call.finish() == grpc.StatusCode.OK
    assert call.agent_words() == words_of(answer)  # no hold phrase before it


async def test_a_back_end_that_never_answers_gets_an_apology_and_the_call_goes_on(
    delegating_stack,
):
    runtime = await delegating_stack()
    call = Call(f"127.0.0.1:{runtime.port}")
    delegation = Delegation(target=Delegation.CLIENT, timeout_s=1.0)
    await call.start(Config(mode=Config.CASCADE, delegation=delegation))
    await call.send([SILENT_FRAME] * 3)
    await call.client.send_text(QUESTION)
    await call.send_until(lambda: words_of(APOLOGY)[-1] in call.agent_words(), limit_s=30)
    await call.client.send_text("And the London office?")
    await call.send_until(lambda: len(call.of(Delegated)) == 2, limit_s=30)
    second = call.of(Delegated)[1]
    await call.client.send(context(Context.COMMENTARY, "Nine nine.", second.delegation_id))
    await call.send_until(lambda: call.agent_words()[-2:] == ["nine", "nine"], limit_s=30)
    await call.send([SILENT_FRAME] * 3)
    assert await call.finish() == grpc.StatusCode.OK
    assert call.agent_words() == [*words_of(APOLOGY), "nine", "nine"]
