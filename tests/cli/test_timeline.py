"""`kame talk`'s timeline picture shows the oracle's tool calls beside its updates."""

from __future__ import annotations

import numpy as np

from kame_cli.timeline import _lane_text, plot_timeline
from kame_client.events import ToolCall, UserFinal, event_of
from kame_client.result import TalkResult, Timed
from kamepb import common_pb2, gateway_pb2

Phase = common_pb2.ToolActivity.Phase


def tool_event(phase: int, **fields: object) -> ToolCall:
    """A tool event as the Converse client maps the gateway's response."""
    activity = common_pb2.ToolActivity(phase=phase, call_id="c1", name="door_code", **fields)
    event = event_of(gateway_pb2.ConverseResponse(tool=activity))
    assert isinstance(event, ToolCall)
    return event


def test_tool_calls_are_drawn_with_their_outcome_and_time(tmp_path):
    started = tool_event(Phase.STARTED, source="vault", read_only=True)
    finished = tool_event(Phase.FINISHED, source="vault", elapsed_s=0.4)
    failed = tool_event(Phase.FINISHED, source="client", elapsed_s=5.0, is_error=True)
    assert _lane_text(started) == "door_code(...)"
    assert _lane_text(finished) == "door_code ok 0.40 s"
    assert _lane_text(failed) == "door_code error 5.00 s"

    result = TalkResult(caller=np.zeros(24000, np.float32), speech_start_s=0.2, speech_end_s=0.8)
    question = UserFinal("u1", "What is the door code?", "", 1.0, 0.1)
    result.events = [Timed(0.9, question), Timed(1.0, started), Timed(1.4, finished)]
    plot = tmp_path / "timeline.png"
    plot_timeline(result, plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [timed.json()["type"] for timed in result.events] == [
        "user_final",
        "tool_started",
        "tool_finished",
    ]
