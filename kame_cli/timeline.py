"""The picture of a `kame talk` call (T.png): caller audio, transcripts, oracle
updates and tool calls, and agent audio on one time axis, from a TalkResult's events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kame_client.events import (
    AgentText,
    Event,
    OracleAppend,
    OracleReset,
    ToolFinished,
    ToolStarted,
    UserFinal,
    UserPartial,
    UserTranscript,
)
from kame_client.result import TalkResult, Timed
from kame_common.audio import SAMPLE_RATE

# The events each text lane shows, by kind, with their colours.
TRANSCRIPT_COLORS: dict[type[Event], str] = {UserPartial: "tab:gray", UserFinal: "black"}
ORACLE_COLORS: dict[type[Event], str] = {
    OracleReset: "tab:red",
    OracleAppend: "tab:orange",
    ToolStarted: "tab:cyan",
    ToolFinished: "tab:blue",
}


def plot_timeline(result: TalkResult, path: Path, title: str = "") -> None:
    """Caller audio, transcripts, oracle updates and agent audio on one time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, lanes = plt.subplots(
        4, 1, sharex=True, figsize=(13, 8), gridspec_kw={"height_ratios": [2, 1.3, 1.3, 2]}
    )
    caller_t = np.arange(len(result.caller)) / SAMPLE_RATE
    lanes[0].plot(caller_t, result.caller, lw=0.4, color="tab:blue")
    lanes[0].set_ylabel("caller audio")
    for edge in (result.speech_start_s, result.speech_end_s):
        if edge is not None:
            lanes[0].axvline(edge, color="tab:blue", ls="--", lw=0.8)
    _text_lane(lanes[1], result.events, TRANSCRIPT_COLORS, "transcripts")
    _text_lane(lanes[2], result.events, ORACLE_COLORS, "oracle updates\nand tools")
    if result.agent_t:  # each chunk drawn from the moment it reached the client
        agent_t = np.concatenate(result.agent_t)
        lanes[3].plot(agent_t, result.agent[: len(agent_t)], lw=0.4, color="tab:green")
    lanes[3].set_ylabel("agent audio")
    for said in result.of(AgentText):
        lanes[3].annotate(
            said.event.text,
            (said.t, 0.8),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=30,
        )
    if result.response_latency_s is not None and result.speech_end_s is not None:
        end = result.speech_end_s
        lanes[3].axvspan(
            end,
            end + result.response_latency_s,
            color="tab:purple",
            alpha=0.2,
            label=f"response latency {result.response_latency_s:.2f} s",
        )
        lanes[3].legend(loc="upper right", fontsize=8)
    lanes[3].set_xlabel("time since the stream started (s)")
    fig.suptitle(title or "kame talk timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _text_lane(
    axis: Any, events: list[Timed[Any]], colors: dict[type[Event], str], label: str
) -> None:
    rows = 4
    shown = [timed for timed in events if type(timed.event) in colors]
    for index, timed in enumerate(shown):
        y = 0.15 + 0.2 * (index % rows)
        color = colors[type(timed.event)]
        axis.plot([timed.t], [y], marker="|", color=color)
        axis.annotate(
            _lane_text(timed.event)[:40],
            (timed.t, y),
            fontsize=6,
            color=color,
            xytext=(2, 0),
            textcoords="offset points",
            va="center",
        )
    axis.set_ylim(0, 1)
    axis.set_yticks([])
    axis.set_ylabel(label)


def _lane_text(event: Event) -> str:
    """What an event says on its lane: its words, a tool call's name (and, once
    finished, how long it took), or its kind."""
    match event:
        case ToolStarted(name=name):
            return f"{name}(...)"
        case ToolFinished(name=name, is_error=is_error, reused=reused, elapsed_s=elapsed_s):
            outcome = "error" if is_error else "reused" if reused else "ok"
            return f"{name} {outcome} {elapsed_s:.2f} s"
        case OracleReset(text=text) | OracleAppend(text=text) | UserTranscript(text=text) if text:
            return text
    return event.TYPE.split("_")[-1].upper()
