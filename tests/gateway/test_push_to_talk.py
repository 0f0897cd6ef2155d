"""Push-to-talk and typed messages through the gateway (services/gateway/turn_control.py).

First against the scripted fakes (what the gateway relays where, and what it
refuses while the call goes on), then on a stack of real services on loopback:
the real gateway, the real tts front-end (piper), the real oracle with a local
OpenAI-compatible LLM written for the test (tests/oracle/conftest.py: no model
needed to show where the words go), and the fake stt (the real one is in
tests/e2e/test_push_to_talk.py). The caller speaks with piper."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import grpc
import numpy as np
import pytest

from kame_client.client import ConverseClient
from kame_client.events import (
    AgentAudio,
    AgentText,
    BargeIn,
    ConverseEvent,
    Event,
    Notice,
    Turn,
    UserFinal,
)
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, float_to_pcm16
from kamepb import common_pb2, gateway_pb2
from services.frontend.config import FrontendSettings
from services.frontend.server import serve as serve_frontend
from services.gateway.turn_control import TURN_CONTROL_BURST, TURN_CONTROLS_PER_S
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.server import serve as serve_oracle
from tests.frontend.calls import frames_of, silence
from tests.gateway.fakes import Activity, activity, sync_converse, transcript
from tests.support import conversation, wait_until, words_of
from tests.support.llm import HttpRequest, Responder, StubHttpServer

Config = gateway_pb2.ConverseConfig
Action = common_pb2.TurnControl.Action
QUESTION = "What is the capital of France?"
ANSWER = "Paris is the capital of France."
MANUAL = Config.TurnDetection.MANUAL

E = TypeVar("E", bound=Event)


def pcm(frame: np.ndarray) -> bytes:
    return float_to_pcm16(frame)


SILENT_FRAME = pcm(np.zeros(FRAME_SAMPLES, dtype=np.float32))


class Call:
    """One Converse call through ConverseClient: the events as they come, and
    caller audio paced at real time (the tts engine speaks in the caller's frames)."""

    def __init__(self, address: str) -> None:
        self.client = ConverseClient.connect(address)
        self.events: list[ConverseEvent] = []
        self._reader: asyncio.Task[None] | None = None
        self.frames = 0  # caller frames sent

    async def start(self, config: Config) -> None:
        await self.client.start(config)
        self._reader = asyncio.create_task(self._read())
        await self.client.wait_started(self._reader)

    async def _read(self) -> None:
        async for event in self.client.events():
            self.events.append(event)

    async def send(self, frames: list[bytes], pace_s: float = FRAME_SECONDS) -> None:
        started = time.monotonic()
        for i, frame in enumerate(frames):
            assert await self.client.send_audio(frame), "the call ended early"
            self.frames += 1
            await asyncio.sleep(max(0.0, started + (i + 1) * pace_s - time.monotonic()))

    async def send_until(self, done: Callable[[], bool], limit_s: float = 15.0) -> None:
        """Silence, paced, until `done()` (AssertionError after `limit_s`)."""
        deadline = time.monotonic() + limit_s
        while not done():
            assert time.monotonic() < deadline, f"not done after {limit_s} s: {self.kinds()}"
            await self.send([SILENT_FRAME])

    async def finish(self) -> grpc.StatusCode:
        await self.client.done_writing()
        assert self._reader is not None
        await asyncio.wait_for(self._reader, 30)
        code = await self.client.code()
        await self.client.close()
        return code

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    def kinds(self) -> list[str]:
        return [e.TYPE for e in self.events if not isinstance(e, AgentAudio)]

    def speaking(self) -> list[int]:
        """Indices (in events) of agent audio that carries speech."""
        return [i for i, e in enumerate(self.events) if isinstance(e, AgentAudio) and e.speaking]

    def agent_words(self) -> list[str]:
        return words_of(" ".join(e.text for e in self.of(AgentText)))


# --- the relays, against the fakes ----------------------------------------------------


async def test_turn_controls_and_typed_text_reach_stt_frontend_and_oracle(fakes):
    runtime = await fakes.gateway(user_text_max_chars=100)
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE))
    session_id = call.client.session.session_id
    await call.send([SILENT_FRAME] * 3, pace_s=0)
    await call.client.end_turn()
    await call.client.respond()
    await call.client.cancel_response()
    await call.client.send_text(f"  {QUESTION}  ")
    await call.client.send_text(" \n ")  # blank: refused, the call goes on
    await call.client.send_text("word " * 30)  # 149 characters: refused
    await call.client.send(gateway_pb2.ConverseRequest(turn_control=common_pb2.TurnControl()))
    for _ in range(5):  # after the first, the sixth typed message in a row is one too many
        await call.client.send_text("And of Spain?")
    # The fake oracle answers the typed question; its answer reaches the front-end.
    await wait_until(lambda: fakes.frontend.log.of("oracle"), "the oracle's answer", 10)
    await call.send([SILENT_FRAME] * 3, pace_s=0)
    assert await call.finish() == grpc.StatusCode.OK

    frontend = fakes.frontend.log
    assert [c.action for c in frontend.of("turn_control")] == [
        Action.END_TURN,
        Action.RESPOND,
        Action.CANCEL,
    ]
    typed_id = f"{session_id}-text-1"
    typed = frontend.of("user_text")[0]
    assert (typed.utterance_id, typed.is_final, typed.text) == (typed_id, True, QUESTION)
    assert typed.span.end_s == pytest.approx(3 * FRAME_SECONDS), "typed after three frames"
    assert not frontend.of("user_transcript"), "a typed turn is not also a transcript"
    # END_TURN and RESPOND finalize stt's utterance at once; CANCEL is the front-end's.
    assert len(fakes.stt.log.of("end_of_turn")) == 2
    oracle_finals = [t for t in fakes.oracle.log.of("user_transcript") if t.is_final]
    assert (oracle_finals[0].utterance_id, oracle_finals[0].text) == (typed_id, QUESTION)
    assert len(oracle_finals) == 5
    answer = frontend.of("oracle")[0]
    assert answer.source.utterance_id == typed_id
    assert call.of(UserFinal)[0].utterance_id == typed_id
    refused = [e.message for e in call.of(Notice) if e.kind == "REFUSED"]
    assert len(refused) == 4, call.of(Notice)
    assert "empty" in refused[0]
    assert "at most 100 characters" in refused[1] and "user_text_max_chars" in refused[1]
    assert "END_TURN, RESPOND or CANCEL" in refused[2]
    assert "user_text_per_s" in refused[3]
    assert len(frontend.of("user_text")) == 5, "the first five went through"
    assert len(call.of(UserFinal)) == 5


async def test_a_flood_of_turn_controls_is_bounded(fakes):
    """200 END_TURNs at once: stt gets the burst's EndOfTurns, not 200 (each is
    queued for stt, whose buffer drops the oldest audio), one notice says so,
    and the call goes on."""
    runtime = await fakes.gateway()
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE))
    await call.send([SILENT_FRAME] * 3, pace_s=0)
    started = time.monotonic()
    for _ in range(200):
        await call.client.end_turn()
    await call.send([SILENT_FRAME] * 3, pace_s=0)
    assert await call.finish() == grpc.StatusCode.OK
    # The rate refills while the flood is sent (seconds on a busy host): each token
    # let through later may end a run of refusals, and the next run gets a notice.
    refilled = int(TURN_CONTROLS_PER_S * (time.monotonic() - started)) + 1
    relayed = len(fakes.stt.log.of("end_of_turn"))
    assert TURN_CONTROL_BURST <= relayed <= TURN_CONTROL_BURST + refilled, (relayed, refilled)
    assert len(fakes.frontend.log.of("turn_control")) == relayed
    refused = [e.message for e in call.of(Notice) if e.kind == "REFUSED"]
    assert 1 <= len(refused) <= refilled, refused
    assert all("turn_control: more than" in message for message in refused), refused


async def test_manual_turns_reach_the_frontend_config(fakes):
    runtime = await fakes.gateway()
    code, details, _ = await asyncio.to_thread(
        sync_converse,
        f"127.0.0.1:{runtime.port}",
        [
            gateway_pb2.ConverseRequest(config=Config(turn_detection=MANUAL)),
            gateway_pb2.ConverseRequest(audio=SILENT_FRAME),
        ],
    )
    assert code == grpc.StatusCode.OK, details
    [config] = fakes.frontend.log.of("config")
    assert config.manual_turns


@pytest.mark.parametrize(
    ("settings", "config", "code", "message"),
    [
        (
            {},
            Config(instructions="Answer in French."),
            grpc.StatusCode.PERMISSION_DENIED,
            "allow_instructions is off",
        ),
        (
            {"allow_instructions": True, "instructions_max_chars": 10},
            Config(instructions="Answer in French."),
            grpc.StatusCode.INVALID_ARGUMENT,
            "at most 10 characters",
        ),
        ({}, Config(turn_detection=7), grpc.StatusCode.INVALID_ARGUMENT, "turn_detection"),
    ],
)
async def test_refused_configs(fakes, settings, config, code, message):
    runtime = await fakes.gateway(**settings)
    got, details, _ = await asyncio.to_thread(
        sync_converse, f"127.0.0.1:{runtime.port}", [gateway_pb2.ConverseRequest(config=config)]
    )
    assert got == code and message in details, details
    assert fakes.frontend.log.opened == 0, "refused before any upstream"


# --- real front-end and oracle ------------------------------------------------------------


class Stack:
    def __init__(self, fakes, llm: StubHttpServer) -> None:
        self.fakes = fakes
        self.llm = llm
        self.runtimes: list = []

    def prompts(self) -> list[str]:
        """The system prompt of every chat request the oracle made."""
        return [json.loads(r.body)["messages"][0]["content"] for r in self.llm.posts()]

    def asked(self) -> list[str]:
        """The user message (the transcript) of every chat request."""
        return [json.loads(r.body)["messages"][-1]["content"] for r in self.llm.posts()]


async def _chat(_request: HttpRequest, respond: Responder) -> None:
    await respond.openai_chat(["Paris is the ", "capital of France."])


async def real_upstreams(fakes, **oracle_settings) -> tuple[list, Callable]:
    """The real tts front-end and oracle (`oracle_settings` over loopback defaults)
    beside the fakes' stt: their runtimes, and `gateway(**settings)`, which starts a
    real gateway in front of them."""
    frontend = await serve_frontend(
        FrontendSettings(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=fakes.redis_url,
            replica_id=f"ptt-frontend-{uuid.uuid4().hex[:8]}",
        )
    )
    oracle = await serve_oracle(
        OracleSettings(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=fakes.redis_url,
            warmup_timeout_s=0,
            **oracle_settings,
        ),
        api_keys=ApiKeys(),
    )

    async def gateway(**settings):
        return await fakes.gateway(
            frontend_address=f"127.0.0.1:{frontend.port}",
            oracle_address=f"127.0.0.1:{oracle.port}",
            **settings,
        )

    return [frontend, oracle], gateway


@pytest.fixture
async def stack(fakes):
    """The real tts front-end and oracle (its LLM: a stub that always says ANSWER)
    beside the fake stt; `gateway(**settings)` starts a real gateway in front."""
    llm = StubHttpServer({("POST", "/v1/chat/completions"): _chat})
    url = await llm.start()
    made = Stack(fakes, llm)
    made.runtimes, made.gateway = await real_upstreams(  # type: ignore[attr-defined]
        fakes, base_url=f"{url}/v1", model="stub-model"
    )
    yield made
    for runtime in made.runtimes:
        await runtime.stop()
    await llm.close()


def speech_frames(speech: np.ndarray) -> tuple[list[bytes], float]:
    """The question as caller frames after 0.16 s of silence, and where it ends."""
    frames = frames_of(np.concatenate([silence(0.16), speech]))
    return [pcm(f) for f in frames], len(frames) * FRAME_SECONDS


async def test_manual_mode_answers_only_when_asked(stack, speak):
    """MANUAL: the caller asks, then 3 s of silence: the answer is ready (stt's
    final went to the oracle, which answered), but nobody asked for it, so the
    agent is silent. END_TURN + RESPOND: the agent says it."""
    frames, end_s = speech_frames(speak(QUESTION))
    heard = len(frames) + 2  # stt's final, a little after the speech ends
    stack.fakes.stt.script = {
        heard: [
            activity(Activity.SPEECH_START, "u1", 0.16),
            activity(Activity.SPEECH_END, "u1", end_s),
            transcript("u1", QUESTION, True, end_s),
        ]
    }
    runtime = await stack.gateway()
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE, turn_detection=MANUAL))
    await call.send(frames)
    await call.send([SILENT_FRAME] * round(3.0 / FRAME_SECONDS))
    assert call.of(UserFinal), "stt's final came"
    assert stack.asked() and QUESTION in stack.asked()[-1], "the oracle has its answer"
    assert call.speaking() == [], "no answer without RESPOND"
    asked_at = len(call.events)
    await call.client.end_turn()
    await call.client.respond()
    await call.send_until(lambda: "france" in call.agent_words())
    assert await call.finish() == grpc.StatusCode.OK
    assert call.speaking()[0] >= asked_at, "not a frame of speech before RESPOND"
    assert call.agent_words()[:2] == ["paris", "is"]
    # The turn's latencies count from RESPOND, not from the end of speech 3 s before.
    [turn] = call.of(Turn)
    assert 0 <= turn.response_latency_s < 2.0, turn
    assert stack.fakes.stt.log.of("end_of_turn"), "END_TURN finalizes stt's utterance"


async def test_a_typed_message_is_spoken_to_recorded_and_cancel_stops_the_agent(stack):
    runtime = await stack.gateway()
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE))
    session_id = call.client.session.session_id
    await call.send([SILENT_FRAME] * 3)
    await call.client.send_text(QUESTION)
    await call.send_until(lambda: len(call.speaking()) >= 5)
    await call.client.cancel_response()
    cancelled_at = len(call.events)
    await call.send_until(lambda: bool(call.of(BargeIn)))
    await call.send([SILENT_FRAME] * round(1.5 / FRAME_SECONDS))
    assert await call.finish() == grpc.StatusCode.OK

    [echo] = call.of(UserFinal)
    assert (echo.utterance_id, echo.text) == (f"{session_id}-text-1", QUESTION)
    [barge_in] = call.of(BargeIn)
    assert barge_in.cancelled
    late = [i for i in call.speaking() if i > cancelled_at]
    assert len(late) <= 4, f"{len(late)} speaking frames after the cancel"
    assert "paris" in call.agent_words(), "it had begun the answer"
    assert "france" not in call.agent_words(), "and was cut before its end"

    async def recorded() -> bool:
        turns = await conversation(stack.fakes.redis_url, session_id)
        return [t["role"] for t in turns] == ["user", "agent"]

    await wait_until(recorded, "the typed turn and its answer in Redis", 10)
    user, agent = await conversation(stack.fakes.redis_url, session_id)
    assert user["text"] == QUESTION
    assert words_of(agent["text"])[:1] == ["paris"]


async def _instructions_reach_the_prompt(stack, instructions: str) -> list[str]:
    runtime = await stack.gateway(allow_instructions=True)
    call = Call(f"127.0.0.1:{runtime.port}")
    await call.start(Config(mode=Config.CASCADE, instructions=instructions))
    await call.send([SILENT_FRAME] * 2)
    await call.client.send_text(QUESTION)
    await call.send_until(lambda: bool(stack.llm.posts()))
    assert await call.finish() == grpc.StatusCode.OK
    return stack.prompts()


async def test_instructions_reach_the_oracles_prompt_when_allowed(stack):
    prompts = await _instructions_reach_the_prompt(stack, "Always answer like a pirate.")
    assert prompts and all(p.endswith("\nAlways answer like a pirate.") for p in prompts)
    # After the oracle's own prompt, not instead of it.
    assert all("voice agent in a live spoken conversation" in p for p in prompts)
    plain = await _instructions_reach_the_prompt(stack, "")
    assert all("pirate" not in p for p in plain[len(prompts) :])
