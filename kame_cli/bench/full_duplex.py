"""Full-Duplex-Bench v1's four turn-taking tasks, scored on speech intervals.

Full-Duplex-Bench (Lin et al., arXiv 2503.04721; github.com/DanielLin94144/Full-Duplex-Bench,
folder v1_v1.5/evaluation) plays a caller's recording into a model and scores the model's
time-aligned output, sample by sample. What follows restates its definitions in our terms:

- "takes the turn" (the same test in eval_pause_handling.py, eval_smooth_turn_taking.py and
  eval_user_interruption.py): the model's output, from its first word's start to its last
  word's end, lasts at least 1 s, or it has more than 3 words. The take-over rate (TOR) of a
  task is the share of its samples where the model took the turn.
- pause handling (eval_pause_handling.py): the caller's recording holds a mid-sentence pause;
  the whole output is scored; TOR, lower is better.
- smooth turn-taking (eval_smooth_turn_taking.py): TOR, higher is better, and the latency from
  the caller's end of turn to the output's first word, over the samples that took the turn,
  a negative one counted as 0, averaged.
- user interruption (eval_user_interruption.py; the cropping in get_transcript/asr.py): only
  the output after the interruption's end is scored; TOR, higher is better, and the latency
  from the interruption's end to the first word after it, averaged over those that took the
  turn. Its third figure, a GPT-4 rating of the answer's relevance, is left out here.
- backchannel (eval_backchannel.py): the output is cut into voice-activity segments; a segment
  over 3 s, or one of 1 s or more, or with more than 2 words, is the model taking the turn
  (TOR, lower is better); the shorter ones are backchannels, counted per second of the
  recording (frequency, higher is better); the Jensen-Shannon distance between where in the
  recording they fall (0.2 s bins) and where people backchanneled on the same recording
  (icc_gt_distribution.json), 1 when there are none (JSD, lower is better).

FDB times the model's words with an ASR model (parakeet-tdt-0.6b-v2) and the backchannel
segments with Silero VAD. Here both come from the output audio's level (`sample_from_audio`,
kame_client.caller.speech_intervals): an interval stands for the words in it, and its `words`
count, when known, completes the word clauses; without it only the durations decide. Two
departures from the scripts, on purpose: a backchannel sample took the turn if any of its
segments did (the script keeps the verdict of the last short segment), and only the segments
under the turn length count as backchannels (the script counts every segment of 3 s or less).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from kame_cli.bench.report import _table
from kame_cli.bench.stats import percentile, rounded
from kame_client.caller import speech_intervals
from kame_common.audio import SAMPLE_RATE, Samples

TURN_MIN_S = 1.0  # an output this long, first word to last, takes the turn
TURN_MAX_WORDS = 3  # ... and so does a shorter one with more words than this
BACKCHANNEL_MAX_WORDS = 2  # a backchannel segment has at most this many words
JSD_BIN_S = 0.2
JSD_EPSILON = 1e-10
# Silero VAD's defaults, which FDB's backchannel segments come with: gaps of 100 ms or less
# joined, speech under 250 ms dropped.
VAD_BRIDGE_S = 0.1
VAD_MIN_S = 0.25


class Task(StrEnum):
    PAUSE = "pause_handling"
    SMOOTH = "smooth_turn_taking"
    INTERRUPTION = "user_interruption"
    BACKCHANNEL = "backchannel"


@dataclass(frozen=True)
class Speech:
    """A stretch of speech on the sample's timeline (seconds from the recording's start)."""

    start_s: float
    end_s: float
    words: int | None = None  # words said in it, where known (FDB counts ASR words)


@dataclass(frozen=True)
class Sample:
    """One recording of a task: the caller's speech as played, and the agent's output
    speech on the same timeline. The output is scored up to `duration_s` (the caller's
    recording's length: FDB's output.wav is as long as its input.wav)."""

    task: Task
    duration_s: float
    caller: tuple[Speech, ...]
    agent: tuple[Speech, ...]
    # backchannel: where people backchanneled on this recording, a histogram over it
    # (FDB's icc_gt_distribution.json); None: no JSD
    reference: tuple[float, ...] | None = None
    # the annotated end of turn (smooth turn-taking) or of the interruption (user
    # interruption), as FDB's turn_taking.json and interrupt.json give it; None: the end
    # of the caller's last speech
    end_s: float | None = None

    @property
    def caller_end_s(self) -> float:
        """The end of turn (smooth turn-taking) or of the interruption (user interruption)."""
        if self.end_s is not None:
            return self.end_s
        return max((s.end_s for s in self.caller), default=0.0)


@dataclass(frozen=True)
class Score:
    """One sample's figures."""

    task: Task
    took_turn: bool
    latency_s: float | None = None  # smooth turn-taking and user interruption, if taken
    backchannels: int | None = None  # backchannel task
    frequency_hz: float | None = None
    jsd: float | None = None


@dataclass(frozen=True)
class TaskFigures:
    """A task's figures over its samples; FDB reports the means."""

    task: Task
    samples: int
    tor: float
    latency_mean_s: float | None = None
    latency_median_s: float | None = None
    latency_p90_s: float | None = None
    frequency_hz: float | None = None
    jsd: float | None = None


def clipped(speech: Iterable[Speech], start_s: float, end_s: float) -> list[Speech]:
    """The speech within [start_s, end_s], intervals that cross an edge cut at it (a cut
    interval keeps its word count)."""
    return [
        Speech(max(s.start_s, start_s), min(s.end_s, end_s), s.words)
        for s in speech
        if s.end_s > start_s and s.start_s < end_s
    ]


def _words(speech: Sequence[Speech]) -> int | None:
    counts = [s.words for s in speech]
    return None if None in counts else sum(c for c in counts if c is not None)


def takes_turn(speech: Sequence[Speech]) -> bool:
    """FDB's test: the output spans at least TURN_MIN_S, first start to last end, or says
    more than TURN_MAX_WORDS words."""
    if not speech:
        return False
    span = max(s.end_s for s in speech) - min(s.start_s for s in speech)
    words = _words(speech)
    return span >= TURN_MIN_S or (words is not None and words > TURN_MAX_WORDS)


def _turn_and_latency(task: Task, speech: Sequence[Speech], from_s: float) -> Score:
    if not takes_turn(speech):
        return Score(task, False)
    first = min(s.start_s for s in speech)
    return Score(task, True, latency_s=max(0.0, first - from_s))


def pause_handling(sample: Sample) -> Score:
    """Did the agent take the turn anywhere in the recording (it holds a pause)?"""
    return Score(sample.task, takes_turn(clipped(sample.agent, 0.0, sample.duration_s)))


def smooth_turn_taking(sample: Sample) -> Score:
    """Did the agent take the turn, and how long after the caller's end did it start?
    The whole output counts: speech before the caller's end gives latency 0."""
    speech = clipped(sample.agent, 0.0, sample.duration_s)
    return _turn_and_latency(sample.task, speech, sample.caller_end_s)


def user_interruption(sample: Sample) -> Score:
    """The output after the interruption's end: a turn, and how soon it started (0 for an
    agent that was still speaking then)."""
    speech = clipped(sample.agent, sample.caller_end_s, sample.duration_s)
    return _turn_and_latency(sample.task, speech, sample.caller_end_s)


def is_backchannel(segment: Speech) -> bool:
    """A segment too short to be a turn: under TURN_MIN_S, at most BACKCHANNEL_MAX_WORDS
    (FDB's segments over 3 s, always turns, are so a fortiori)."""
    short = segment.end_s - segment.start_s < TURN_MIN_S
    return short and (segment.words is None or segment.words <= BACKCHANNEL_MAX_WORDS)


def backchannel_bins(segments: Sequence[Speech], duration_s: float) -> npt.NDArray[np.float64]:
    """Where backchannels fall: a count per JSD_BIN_S bin of the recording, each segment
    adding 1 to every bin from its start's to its end's."""
    bins = np.zeros(int(duration_s / JSD_BIN_S) + 1)
    for segment in segments:
        first, last = int(segment.start_s / JSD_BIN_S), int(segment.end_s / JSD_BIN_S)
        bins[first : min(last, len(bins) - 1) + 1] += 1
    return bins


def js_distance(observed: npt.NDArray[np.float64], reference: Sequence[float]) -> float:
    """The Jensen-Shannon distance (square root of the divergence, natural log) between the
    observed bins and the reference histogram, stretched linearly to as many bins."""
    p = observed + JSD_EPSILON
    q = np.interp(
        np.linspace(0, 1, len(p)), np.linspace(0, 1, len(reference)), np.asarray(reference)
    )
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a: npt.NDArray[np.float64]) -> float:
        kept = a > 0
        return float(np.sum(a[kept] * np.log(a[kept] / m[kept])))

    return float(np.sqrt(max(0.0, (kl(p) + kl(q)) / 2)))


def backchannel(sample: Sample) -> Score:
    """Turn taken (any segment a turn), backchannels per second, and JSD to the reference."""
    segments = clipped(sample.agent, 0.0, sample.duration_s)
    channels = [s for s in segments if is_backchannel(s)]
    jsd = None
    if sample.reference is not None:
        bins = backchannel_bins(channels, sample.duration_s)
        jsd = js_distance(bins, sample.reference) if channels else 1.0
    return Score(
        sample.task,
        len(channels) < len(segments),
        backchannels=len(channels),
        frequency_hz=len(channels) / sample.duration_s if sample.duration_s > 0 else 0.0,
        jsd=jsd,
    )


SCORERS = {
    Task.PAUSE: pause_handling,
    Task.SMOOTH: smooth_turn_taking,
    Task.INTERRUPTION: user_interruption,
    Task.BACKCHANNEL: backchannel,
}


def score(sample: Sample) -> Score:
    return SCORERS[sample.task](sample)


def _mean(values: Sequence[float | None]) -> float | None:
    measured = [v for v in values if v is not None]
    return rounded(statistics.fmean(measured)) if measured else None


def aggregate(scores: Sequence[Score]) -> dict[Task, TaskFigures]:
    """Each task's figures over its samples' scores."""
    figures = {}
    for task in Task:
        mine = [s for s in scores if s.task is task]
        if not mine:
            continue
        latencies = [s.latency_s for s in mine]
        figures[task] = TaskFigures(
            task,
            samples=len(mine),
            tor=round(sum(s.took_turn for s in mine) / len(mine), 4),
            latency_mean_s=_mean(latencies),
            latency_median_s=rounded(percentile(latencies, 50)),
            latency_p90_s=rounded(percentile(latencies, 90)),
            frequency_hz=_mean([s.frequency_hz for s in mine]),
            jsd=_mean([s.jsd for s in mine]),
        )
    return figures


def _counted(spans: list[tuple[float, float]], words_at: Sequence[float] | None) -> list[Speech]:
    """The spans as Speech, each with the words that start in it (or within VAD_BRIDGE_S
    before it) when their times are known."""
    if words_at is None:
        return [Speech(start, end) for start, end in spans]
    counts = [0] * len(spans)
    for at in words_at:
        for index, (start, end) in enumerate(spans):
            if start - VAD_BRIDGE_S <= at <= end:
                counts[index] += 1
                break
    return [Speech(start, end, n) for (start, end), n in zip(spans, counts, strict=True)]


def sample_from_audio(
    task: Task,
    caller: Samples,
    agent: Samples,
    words_at: Sequence[float] | None = None,
    **known: Any,
) -> Sample:
    """A sample from the caller's recording and the agent's output, both 24 kHz and
    starting together; speech by level, joined and filtered as Silero VAD's defaults do;
    `words_at`: when each of the agent's words starts, if known; `known`: the Sample's
    `reference` and `end_s`."""

    def spans(audio: Samples) -> list[tuple[float, float]]:
        return speech_intervals(audio, bridge_s=VAD_BRIDGE_S, min_s=VAD_MIN_S)

    return Sample(
        task,
        len(caller) / SAMPLE_RATE,
        tuple(_counted(spans(caller), None)),
        tuple(_counted(spans(agent), words_at)),
        **known,
    )


# issue #44's aims for the agent, on the FDB figures (latencies: FDB's mean)
TARGETS = {
    "smooth_latency_s": 0.35,  # takes the turn within 0.35 s of the caller's end
    "interruption_latency_s": 0.6,  # answers within 0.6 s of an interruption's end
    "pause_tor": 0.1,  # takes the turn in at most 1 of 10 mid-sentence pauses
}


def meets_targets(figures: dict[Task, TaskFigures]) -> dict[str, bool | None]:
    """Each TARGETS aim met (None: the task was not run or nothing was measured)."""

    def at_most(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    def figure(task: Task, name: str) -> float | None:
        found = figures.get(task)
        value = getattr(found, name) if found else None
        return None if value is None else float(value)

    return {
        "smooth_latency_s": at_most(
            figure(Task.SMOOTH, "latency_mean_s"), TARGETS["smooth_latency_s"]
        ),
        "interruption_latency_s": at_most(
            figure(Task.INTERRUPTION, "latency_mean_s"), TARGETS["interruption_latency_s"]
        ),
        "pause_tor": at_most(figure(Task.PAUSE, "tor"), TARGETS["pause_tor"]),
    }


# FDB v1.0's published table: v1_v1.5/README.md of DanielLin94144/Full-Duplex-Bench
# (commit 6d6506628ff8a388a19dcb44b0c400165b67150f, "Evaluation Results", v1.0), scored with
# parakeet-tdt-0.6b-v2 word timings. Columns: pause TOR on the synthetic and Candor sets,
# backchannel TOR / frequency / JSD, smooth turn-taking TOR / latency (Candor), user
# interruption TOR / GPT-4o rating / latency.
PUBLISHED_SOURCE = "Full-Duplex-Bench v1_v1.5/README.md (v1.0 table, commit 6d65066)"
PUBLISHED: dict[str, tuple[float, ...]] = {
    "Moshi": (0.985, 0.980, 1.000, 0.001, 0.957, 0.941, 0.265, 1.000, 0.765, 0.257),
    "PersonaPlex": (0.584, 0.662, 0.327, 0.025, 0.649, 0.992, 0.070, 1.000, 4.210, 0.400),
    "Freeze-Omni": (0.642, 0.481, 0.636, 0.001, 0.997, 0.336, 0.953, 0.867, 3.615, 1.409),
    "GPT-Realtime": (0.010, 0.120, 0.000, 0.007, 0.980, 1.000, 1.470, 0.970, 3.850, 1.500),
}

HEADER = (
    "model | pause TOR ↓ (synthetic / Candor) | backchannel TOR ↓ | backchannel freq ↑ | "
    "JSD ↓ | turn-taking TOR ↑ | turn-taking latency ↓ | interruption TOR ↑ | "
    "interruption GPT-4o ↑ | interruption latency ↓"
)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def published_row(model: str) -> str:
    values = PUBLISHED[model]
    pause = f"{values[0]:.3f} / {values[1]:.3f}"
    return " | ".join([model, pause, *(_cell(v) for v in values[2:])])


def our_row(label: str, figures: dict[Task, TaskFigures]) -> str:
    """Our figures in the published columns ("-" where a task was not run or a figure
    needs what we leave out, the GPT-4o rating)."""

    def get(task: Task, name: str) -> float | None:
        found = figures.get(task)
        return getattr(found, name) if found else None

    cells = [
        get(Task.PAUSE, "tor"),
        get(Task.BACKCHANNEL, "tor"),
        get(Task.BACKCHANNEL, "frequency_hz"),
        get(Task.BACKCHANNEL, "jsd"),
        get(Task.SMOOTH, "tor"),
        get(Task.SMOOTH, "latency_mean_s"),
        get(Task.INTERRUPTION, "tor"),
        None,
        get(Task.INTERRUPTION, "latency_mean_s"),
    ]
    return " | ".join([f"**{label}**", *(_cell(v) for v in cells)])


def render_table(label: str, figures: dict[Task, TaskFigures]) -> list[str]:
    """The markdown table: our row, then FDB's published rows, and where they come from."""
    samples = ", ".join(f"{task.value} {f.samples}" for task, f in figures.items())
    return [
        *_table(
            "Full-Duplex-Bench v1",
            HEADER,
            [our_row(label, figures), *(published_row(model) for model in PUBLISHED)],
        ),
        "",
        f"Our samples: {samples or 'none'}; our speech timed by audio level, not ASR. "
        f"Published rows: {PUBLISHED_SOURCE}.",
    ]
