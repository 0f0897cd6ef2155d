"""`kame talk`'s timeline picture shows the oracle's tool calls beside its updates."""

from __future__ import annotations

import numpy as np

from kame_cli.caller import TalkResult
from kame_cli.timeline import _lane_text, plot_timeline
from kame_common.converse import converse_event
from kamepb import common_pb2, gateway_pb2

Phase = common_pb2.ToolActivity.Phase


def tool_event(phase: int, t: float, **fields: object) -> dict:
    """A tool event as the Converse client maps the gateway's response, timed like kame talk's."""
    activity = common_pb2.ToolActivity(phase=phase, call_id="c1", name="door_code", **fields)
    event = dict(converse_event(gateway_pb2.ConverseResponse(tool=activity)))
    event["t"] = t
    return event


def test_tool_calls_are_drawn_with_their_outcome_and_time(tmp_path):
    started = tool_event(Phase.STARTED, 1.0, source="vault", read_only=True)
    finished = tool_event(Phase.FINISHED, 1.4, source="vault", elapsed_s=0.4)
    failed = tool_event(Phase.FINISHED, 2.0, source="client", elapsed_s=5.0, is_error=True)
    assert _lane_text(started) == "door_code(...)"
    assert _lane_text(finished) == "door_code ok 0.40 s"
    assert _lane_text(failed) == "door_code error 5.00 s"

    result = TalkResult(caller=np.zeros(24000, np.float32), speech_start_s=0.2, speech_end_s=0.8)
    result.events = [{"type": "user_final", "t": 0.9, "text": "What is the door code?"}]
    result.events += [started, finished]
    plot = tmp_path / "timeline.png"
    plot_timeline(result, plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
