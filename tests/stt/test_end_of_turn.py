"""EndOfTurn: when the front-end's turn detector ends the caller's turn, the open
utterance gets its SPEECH_END and final at once instead of after the endpoint
pause. Real piper speech over real gRPC; where the final arrives is measured in
stream position (how much audio the client had sent), not in wall time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import FRAME_SECONDS
from kamepb import common_pb2, stt_pb2

QUESTION = "What is the capital of France?"
SECOND = "Please remind me to call my mother on Sunday."
ENDPOINT_S = 2.0  # the VAD's own endpoint pause: long, so EndOfTurn is what ends the turn
TURN_DETECTOR_S = 0.4  # the front-end ends the turn after this much pause
VAD_TOLERANCE_S = 0.35
SPEECH_START = common_pb2.SpeechActivity.SPEECH_START
SPEECH_END = common_pb2.SpeechActivity.SPEECH_END
FINAL_DECODE = common_pb2.SpeechActivity.FINAL_DECODE


def end_of_turn_total(outcome: str) -> float:
    return REGISTRY.get_sample_value("kame_stt_end_of_turn_total", {"outcome": outcome}) or 0.0


def final_decodes() -> float:
    return REGISTRY.get_sample_value("kame_stt_decode_rtf_count", {"kind": "final"}) or 0.0


class Caller:
    """One Transcribe stream driven step by step: frames, EndOfTurn, half-close. Each
    response is recorded with the stream position the client had sent when it came."""

    def __init__(self, stub, session_id: str, frame_request) -> None:
        self.call = stub.Transcribe()
        self.session_id = session_id
        self.frame_request = frame_request
        self.sent_s = 0.0
        self.received: list[tuple[float, stt_pb2.TranscribeResponse]] = []
        self._changed = asyncio.Condition()
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        await self.call.write(
            stt_pb2.TranscribeRequest(
                config=stt_pb2.SttConfig(session_id=self.session_id, endpoint_silence_s=ENDPOINT_S)
            )
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            async with self._changed:
                self.received.append((self.sent_s, response))
                self._changed.notify_all()

    async def send_until(self, frames: list[bytes], stream_s: float | None = None) -> None:
        """Send the next frames, up to stream second `stream_s` (None: all of them)."""
        first = frame_index(self.sent_s)
        last = len(frames) if stream_s is None else frame_index(stream_s)
        for seq in range(first, last):
            await self.call.write(self.frame_request(frames[seq], seq))
            self.sent_s = (seq + 1) * FRAME_SECONDS

    async def end_turn(self, speech_end_s: float) -> None:
        await self.call.write(
            stt_pb2.TranscribeRequest(end_of_turn=stt_pb2.EndOfTurn(speech_end_s=speech_end_s))
        )

    async def wait_final(self, count: int, timeout_s: float = 60.0) -> None:
        await self.wait_until(lambda: len(self.finals()) >= count, timeout_s)

    async def wait_until(self, received: Callable[[], object], timeout_s: float = 60.0) -> None:
        async def condition() -> None:
            async with self._changed:
                await self._changed.wait_for(received)

        await asyncio.wait_for(condition(), timeout_s)

    async def finish(self) -> None:
        await self.call.done_writing()
        await asyncio.wait_for(self._reader, 60)
        assert await self.call.code() == grpc.StatusCode.OK

    def finals(self) -> list[tuple[float, common_pb2.TranscriptEvent]]:
        return [
            (at, r.transcript)
            for at, r in self.received
            if r.HasField("transcript") and r.transcript.is_final
        ]

    def final_decodes(self) -> list[tuple[int, float, common_pb2.SpeechActivity]]:
        """(index among the responses, position, message) of each FINAL_DECODE."""
        return [
            (index, at, r.activity)
            for index, (at, r) in enumerate(self.received)
            if r.HasField("activity") and r.activity.kind == FINAL_DECODE
        ]

    def of_utterance(self, utterance_id: str) -> list[tuple[float, str, object]]:
        """(position, kind, message) of one utterance's SPEECH_START/END and finals, in
        order (FINAL_DECODE: `final_decodes`)."""
        out = []
        for at, response in self.received:
            message = getattr(response, response.WhichOneof("msg"))
            if message.utterance_id != utterance_id:
                continue
            if response.HasField("activity") and message.kind == FINAL_DECODE:
                continue
            if response.HasField("activity"):
                out.append((at, "start" if message.kind == SPEECH_START else "end", message))
            elif message.is_final:
                out.append((at, "final", message))
        return out


@pytest.fixture
def two_turns(speak, stream_helpers):
    """The question, a long pause, a second sentence, a pause; and its 80 ms frames."""
    script = stream_helpers.build_script(speak, [QUESTION, SECOND], gap_s=3.0)
    return script, stream_helpers.audio_frames(script.audio)


def frame_index(stream_s: float) -> int:
    return round(stream_s / FRAME_SECONDS)


async def test_end_of_turn_finalizes_before_the_endpoint_pause(
    stt_stub, stream_helpers, text_metrics, two_turns
):
    script, frames = two_turns
    question_end = script.spans[0][1]
    finalized_before = end_of_turn_total("finalized")
    decodes_before = final_decodes()

    # With EndOfTurn: the client sends TURN_DETECTOR_S of pause, ends the turn and
    # sends nothing more until the final is in.
    caller = Caller(stt_stub, "eot", stream_helpers.frame_request)
    await caller.start()
    await caller.send_until(frames, question_end + TURN_DETECTOR_S)
    await caller.end_turn(question_end)
    await caller.wait_final(1)
    ((final_at, final),) = caller.finals()
    assert final_at < question_end + ENDPOINT_S  # far less than the endpoint pause was sent
    assert text_metrics.wer(QUESTION, final.text) <= 0.3, final.text
    kinds = [kind for _at, kind, _m in caller.of_utterance(final.utterance_id)]
    assert kinds == ["start", "end", "final"]
    speech_end = caller.of_utterance(final.utterance_id)[1][2]
    assert speech_end.at_s == pytest.approx(question_end, abs=VAD_TOLERANCE_S)
    assert end_of_turn_total("finalized") == finalized_before + 1
    # The early final, cut at the same pause, was the final: no second decode.
    assert final_decodes() == decodes_before + 1

    # The rest of the pause brings no second end for it; the next sentence is a new utterance.
    await caller.send_until(frames)
    await caller.finish()
    assert [kind for _at, kind, _m in caller.of_utterance(final.utterance_id)] == kinds
    finals = [f for _at, f in caller.finals()]
    assert len(finals) == 2 and finals[1].utterance_id != final.utterance_id
    assert text_metrics.wer(SECOND, finals[1].text) <= 0.3, finals[1].text
    second = caller.of_utterance(finals[1].utterance_id)
    assert [kind for _at, kind, _m in second] == ["start", "end", "final"]

    # Without EndOfTurn the same audio is finalized only once the endpoint pause is in.
    alone = Caller(stt_stub, "endpoint-alone", stream_helpers.frame_request)
    await alone.start()
    await alone.send_until(frames)
    await alone.finish()
    endpoint_final_at, endpoint_final = alone.finals()[0]
    assert text_metrics.wer(QUESTION, endpoint_final.text) <= 0.3, endpoint_final.text
    assert endpoint_final_at >= question_end + ENDPOINT_S - VAD_TOLERANCE_S
    assert final_at < endpoint_final_at


async def test_end_of_turn_without_an_open_utterance_does_nothing(
    stt_stub, stream_helpers, text_metrics, two_turns
):
    script, frames = two_turns
    (question_start, question_end), (second_start, _second_end) = script.spans
    ignored_before = end_of_turn_total("no_utterance")
    caller = Caller(stt_stub, "eot-noop", stream_helpers.frame_request)
    await caller.start()

    # Before anyone spoke.
    await caller.send_until(frames, question_start - 0.2)
    await caller.end_turn(0.1)
    # After the question was finalized by its endpoint pause.
    await caller.send_until(frames, question_end + ENDPOINT_S + 0.5)
    await caller.wait_final(1)
    await caller.end_turn(question_end)
    # A late EndOfTurn for the question while the second sentence is under way.
    await caller.send_until(frames, second_start + 1.0)
    await caller.end_turn(question_end)
    await caller.send_until(frames)
    await caller.finish()

    assert end_of_turn_total("no_utterance") == ignored_before + 3
    finals = [f for _at, f in caller.finals()]
    assert len(finals) == 2
    assert text_metrics.wer(QUESTION, finals[0].text) <= 0.3, finals[0].text
    assert text_metrics.wer(SECOND, finals[1].text) <= 0.3, finals[1].text  # not cut short
    for final in finals:
        events = caller.of_utterance(final.utterance_id)
        assert [kind for _at, kind, _m in events] == ["start", "end", "final"]
    second_final_at = caller.finals()[1][0]
    assert second_final_at >= script.spans[1][1] + ENDPOINT_S - VAD_TOLERANCE_S


async def test_the_early_final_goes_out_as_a_settled_partial_before_the_endpoint(
    stt_stub, stream_helpers, text_metrics, two_turns
):
    """Decoded 0.2 s into the pause, the early final's words go out at once as a
    partial whose every word is stable (the oracle starts its LLM on them); the
    final at the endpoint reuses that decode, so it says the same words."""
    script, frames = two_turns
    question_end = script.spans[0][1]
    decodes_before = final_decodes()
    caller = Caller(stt_stub, "early-final", stream_helpers.frame_request)
    await caller.start()
    await caller.send_until(frames, question_end + 0.8)  # past 0.2 s, short of the endpoint

    def settled_partials() -> list[common_pb2.TranscriptEvent]:
        return [
            r.transcript
            for _at, r in caller.received
            if r.HasField("transcript") and r.transcript.stability == 1.0
        ]

    await caller.wait_until(settled_partials)
    (early,) = settled_partials()
    assert not early.is_final and caller.finals() == []
    assert early.stable_text == early.text
    # FINAL_DECODE said when the decode started (the oracle's speculation yields to
    # it), before its words, for the audio they cover.
    ((decode_index, _at, decode),) = caller.final_decodes()
    early_index = next(i for i, (_at, r) in enumerate(caller.received) if r.transcript == early)
    assert decode_index < early_index
    assert (decode.utterance_id, decode.at_s) == (early.utterance_id, early.span.end_s)
    assert text_metrics.wer(QUESTION, early.text) <= 0.3, early.text
    assert early.span.end_s == pytest.approx(question_end + 0.2, abs=VAD_TOLERANCE_S)

    await caller.send_until(frames, question_end + ENDPOINT_S + 0.5)
    await caller.wait_final(1)
    ((_at, final),) = caller.finals()
    assert (final.utterance_id, final.text) == (early.utterance_id, early.text)
    assert final_decodes() == decodes_before + 1  # one decode for both
    assert len(caller.final_decodes()) == 1  # and one FINAL_DECODE
    await caller.send_until(frames)
    await caller.finish()
