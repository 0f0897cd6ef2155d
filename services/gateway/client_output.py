"""What a session sends its caller.

The pumps put what is due into one bounded queue (a caller that reads slowly
pushes back on them); the session's `responses` takes the items out in order
and sends what `ClientOutput.responses_for` makes of each. An agent frame
leaves as its encoded chunks. The first audio of an agent answer and the
answer's first word are the moments that end the turn's response and answer
latencies (turns.py), so they are taken here, as they leave, and the
TurnSummaries that became ready leave with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from kame_common.aio import cancel_and_wait
from kame_common.audio import FRAME_SECONDS
from kamepb import common_pb2, gateway_pb2
from services.gateway.plan import Mode
from services.gateway.reporting import TurnReporter
from services.gateway.turns import TurnTracker


@dataclass
class AgentFrameOut:
    """One agent frame, encoded, on its way to the client."""

    seq: int
    speaking: bool
    chunks: list[bytes]
    held: bool = False  # the agent is paused while the caller speaks over it


class EndOfSession:
    """Queued last for the client: every upstream has finished."""


ClientItem = gateway_pb2.ConverseResponse | AgentFrameOut | EndOfSession


class ClientOutput:
    def __init__(self, size: int, mode: Mode, tracker: TurnTracker, reporter: TurnReporter) -> None:
        self.queue: asyncio.Queue[ClientItem] = asyncio.Queue(size)
        self._mode = mode
        self._tracker = tracker
        self._reporter = reporter
        self._speaking = False
        self._last_agent_seq = 0

    async def put(self, item: ClientItem) -> None:
        await self.queue.put(item)

    def offer(self, item: ClientItem) -> None:
        """Queue `item` without waiting; dropped when the queue is full."""
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(item)

    async def next_item(self, supervisor: asyncio.Task[None]) -> ClientItem:
        """The next item for the caller; raises the supervisor's failure at once."""
        if supervisor.done():
            supervisor.result()
            return await self.queue.get()
        getter = asyncio.ensure_future(self.queue.get())
        await asyncio.wait({getter, supervisor}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        await cancel_and_wait(getter)
        return await self.next_item(supervisor)

    def responses_for(self, item: ClientItem) -> list[gateway_pb2.ConverseResponse]:
        """What leaves the gateway for one queued item. The first audio of an agent
        answer and the answer's first word are the moments that end the turn's
        response and answer latencies."""
        if isinstance(item, AgentFrameOut):
            return self._agent_frame_out(item)
        assert isinstance(item, gateway_pb2.ConverseResponse)
        if item.HasField("agent_text") and self._is_answer_word(item.agent_text):
            offset_s = item.agent_text.start_s - self._last_agent_seq * FRAME_SECONDS
            self._tracker.on_answer_word(time.time() + max(0.0, offset_s))
            return [item, *self._ready_summaries()]
        return [item]

    async def report_ready_turns(self) -> None:
        for summary in self._ready_summaries():
            await self.queue.put(summary)

    def _agent_frame_out(self, item: AgentFrameOut) -> list[gateway_pb2.ConverseResponse]:
        responses = [
            gateway_pb2.ConverseResponse(
                audio=gateway_pb2.AgentAudioChunk(
                    data=chunk, seq=item.seq, speaking=item.speaking, held=item.held
                )
            )
            for chunk in item.chunks
        ]
        started = item.speaking and not self._speaking
        self._speaking = item.speaking
        self._last_agent_seq = item.seq
        if started:
            self._tracker.on_agent_audio_start(time.time())
            responses += self._ready_summaries()
        return responses

    def _is_answer_word(self, text: common_pb2.AgentText) -> bool:
        """Words of an oracle candidate are the answer, a hold phrase or repair is
        not; in s2s mode every word the speech LM says is."""
        if text.filler:
            return False
        return text.generation != 0 or self._mode is Mode.S2S

    def _ready_summaries(self) -> list[gateway_pb2.ConverseResponse]:
        return [self._reporter.summarize(turn) for turn in self._tracker.pop_ready()]
