"""`kame bench --stt-wer`: how well the embedded stt hears, option by option.

Every sentence of the dictation set (kame_cli/bench/dictation.py: 48 sentences
in 8 voices no test uses, a third through a G.711 phone line) streams through
the stt service's own session logic on a real engine, in audio time
(stt_replay), once per option: an option is a set of the stt's settings
(services/stt/config.py). Per option:

- word error rate of the final transcript, over all the words of the set
  (substitutions + deletions + insertions over the words said), on the 16 kHz
  and the phone-line sentences apart, and how many sentences it got wrong;
- partial stability: the share of the words partials showed that a later
  partial or the final took back, and the stable words (those the stack may
  act on) that the final changed;
- the settled early final: how many sentences got one (the final's words sent
  a pause before the final, what the oracle starts its answer on);
- lag after the end of speech (measured on the WAV) of the final and of the
  settled early final, at one session: the audio each waits for plus its
  decode's own time (stt_replay says how); capacity under load is
  kame_cli/bench/stt_bench.py's;
- the demo's question ("What is the capital of France?") in the piper voice,
  rendered afresh each time as `kame demo` renders it: how often the final
  says France.

The words are the same every run; the lags and decode times depend on how busy
the machine is (its load average is in the report).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame_cli import say, talk
from kame_cli.bench.dictation import INDEX
from kame_cli.bench.paths import DICTATION_SET, REPO_ROOT
from kame_cli.bench.report import _table, run_header
from kame_cli.bench.stt_replay import Heard, replay, timed_engine
from kame_cli.demo import QUESTION
from kame_cli.wer import NO_ERRORS, Errors, normalize, word_errors
from kame_common.audio import SAMPLE_RATE, Samples, resample
from services.stt.config import SttSettings
from services.stt.engine import SttEngine

DEMO_WORD = "france"


@dataclass(frozen=True)
class SttOption:
    """One way to run the stt: its name in the table and its settings."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)  # SttSettings fields
    note: str = ""


def _option(
    name: str,
    model: str,
    pre_roll_s: float,
    beam_size: int,
    *,
    temperature_fallback: bool = False,
    window_pad_s: float = 2.0,
    note: str = "",
) -> SttOption:
    """An option spelling out every setting the options differ in, so that a row
    means the same when the service's defaults change."""
    settings = {
        "model": model,
        "pre_roll_s": pre_roll_s,
        "beam_size": beam_size,
        "temperature_fallback": temperature_fallback,
        "window_pad_s": window_pad_s,
    }
    return SttOption(name, settings, note)


OPTIONS = (
    _option("tiny.en-old", "tiny.en", 0.25, 1, note="the default before this bench"),
    _option(
        "tiny.en-offline",
        "tiny.en",
        0.25,
        5,
        temperature_fallback=True,
        window_pad_s=30.0,
        note="finals as faster-whisper decodes a file: beam 5, temperature fallback, "
        "the full 30 s window (the partials' window too)",
    ),
    _option("tiny.en-pre0.5", "tiny.en", 0.5, 1),
    _option("tiny.en-pre0.5-beam5", "tiny.en", 0.5, 5),
    _option("base-pre0.5", "base", 0.5, 1),
    _option("base-pre0.25-beam5", "base", 0.25, 5),
    _option("base-pre0.5-beam5", "base", 0.5, 5),
    _option("base-pre0.5-beam5-fallback", "base", 0.5, 5, temperature_fallback=True),
    _option("base-pre1-beam5", "base", 1.0, 5),
)


@dataclass(frozen=True)
class Clip:
    wav: str
    text: str
    voice: str
    telephone: bool
    audio: Samples  # float32, 24 kHz

    @property
    def speech_end_s(self) -> float:
        end = talk.speech_region(self.audio)[1]
        if end is None:
            raise ValueError(f"{self.wav}: no speech")
        return end


def load_clips(set_dir: Path = DICTATION_SET) -> list[Clip]:
    """The set's sentences, as the stack hears them (24 kHz)."""
    entries = json.loads((set_dir / INDEX).read_text())
    clips = []
    for entry in entries:
        samples, rate = talk.read_wav(set_dir / entry["wav"])
        clips.append(
            Clip(
                entry["wav"],
                entry["text"],
                entry["voice"],
                bool(entry.get("telephone")),
                resample(samples, rate, SAMPLE_RATE),
            )
        )
    return clips


# --- one sentence ---


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


WORD_COUNTS = ("shown", "taken_back", "stable", "stable_revised")


def stability(heard: Heard) -> dict[str, int]:
    """Words partials showed, how many of them a later partial or the final took
    back, and the stable words of the last partial the final changed."""
    shown = taken_back = stable = stable_revised = 0
    for partials, final in zip(heard.partials, heard.finals, strict=True):
        ordinary = [p for p in partials if not p.settled]
        texts = [normalize(p.text) for p in ordinary] + [normalize(final.text)]
        shown += sum(len(text) for text in texts[:-1])
        taken_back += sum(
            len(text) - _common_prefix(text, after) for text, after in itertools.pairwise(texts)
        )
        if ordinary:
            kept = normalize(ordinary[-1].stable_text)
            stable += len(kept)
            stable_revised += len(kept) - _common_prefix(kept, texts[-1])
    return dict(zip(WORD_COUNTS, (shown, taken_back, stable, stable_revised), strict=True))


def sentence_record(clip: Clip, heard: Heard) -> dict[str, Any]:
    errors = word_errors(clip.text, heard.text)
    end_s = clip.speech_end_s
    settled = [p for partials in heard.partials for p in partials if p.settled]
    last = heard.finals[-1] if heard.finals else None
    return {
        "wav": clip.wav,
        "voice": clip.voice,
        "telephone": clip.telephone,
        "text": clip.text,
        "heard": heard.text,
        "errors": vars(errors),
        "settled_text": settled[-1].text if settled else None,
        "settled_lag_s": round(settled[-1].out_at_s - end_s, 3) if settled else None,
        "final_lag_s": round(last.out_at_s - end_s, 3) if last else None,
        "final_decode_s": round(last.decode_s, 3) if last else None,
        "stability": stability(heard),
    }


# --- one option ---


async def hear_all(engine: SttEngine, clips: Iterable[Samples]) -> list[Heard]:
    scheduler = timed_engine(engine)
    return [await replay(engine, scheduler, audio) for audio in clips]


def _errors(records: list[dict[str, Any]]) -> Errors:
    return sum((Errors(**r["errors"]) for r in records), NO_ERRORS)


def _mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return round(statistics.mean(known), 3) if known else None


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p90": None}
    return {
        "median": round(statistics.median(values), 3),
        "p90": round(float(np.percentile(values, 90)), 3),
    }


def summarize(records: list[dict[str, Any]], demo_heard: list[str]) -> dict[str, Any]:
    phone = [r for r in records if r["telephone"]]
    wideband = [r for r in records if not r["telephone"]]
    words = {key: sum(r["stability"][key] for r in records) for key in WORD_COUNTS}
    return {
        "wer": round(_errors(records).rate, 4),
        "wer_16k": round(_errors(wideband).rate, 4),
        "wer_phone": round(_errors(phone).rate, 4),
        "errors": vars(_errors(records)),
        "sentences": len(records),
        "sentences_wrong": sum(Errors(**r["errors"]).edits > 0 for r in records),
        "settled": sum(r["settled_text"] is not None for r in records),
        "partial_words": words,
        "taken_back": round(words["taken_back"] / max(words["shown"], 1), 4),
        "stable_revised": round(words["stable_revised"] / max(words["stable"], 1), 4),
        "final_lag_s": _quantiles(
            [r["final_lag_s"] for r in records if r["final_lag_s"] is not None]
        ),
        "settled_lag_s": _quantiles(
            [r["settled_lag_s"] for r in records if r["settled_lag_s"] is not None]
        ),
        "final_decode_s_mean": _mean([r["final_decode_s"] for r in records]),
        "demo_heard": sum(DEMO_WORD in normalize(text) for text in demo_heard),
        "demo_renderings": len(demo_heard),
    }


def measure_option(option: SttOption, clips: list[Clip], demo: list[Samples]) -> dict[str, Any]:
    engine = SttEngine(SttSettings(**option.settings))
    try:
        heard = asyncio.run(hear_all(engine, [clip.audio for clip in clips]))
        demo_heard = asyncio.run(hear_all(engine, demo))
    finally:
        engine.close()
    records = [sentence_record(clip, h) for clip, h in zip(clips, heard, strict=True)]
    return {
        "option": option.name,
        "settings": option.settings,
        "note": option.note,
        "model_dir": str(engine.model_dir),
        "summary": summarize(records, [h.text for h in demo_heard]),
        "sentences": records,
        "demo_heard": [h.text for h in demo_heard],
    }


def demo_renderings(count: int) -> list[Samples]:
    """The demo's question as `kame demo` says it: piper with its random noise,
    so each rendering differs a little."""
    return [say.synthesize(QUESTION) for _ in range(count)]


def measure(
    options: Sequence[SttOption], clips: list[Clip], demo: list[Samples]
) -> list[dict[str, Any]]:
    results = []
    for option in options:
        print(f"kame bench: {option.name} on {len(clips)} sentences ...", flush=True)
        results.append(measure_option(option, clips, demo))
        print("  " + table_row(results[-1]["option"], results[-1]["summary"]), flush=True)
    return results


# --- the table ---

HEADER = (
    "option | WER | WER 16 kHz / phone | sentences wrong | demo question heard | "
    "settled early finals | partial words taken back | stable words revised | "
    "final lag median / p90 | settled lag median | final decode mean"
)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _seconds(stats: dict[str, float | None]) -> str:
    median, p90 = stats["median"], stats["p90"]
    return "n/a" if median is None or p90 is None else f"{median:.2f} / {p90:.2f} s"


def table_row(name: str, s: dict[str, Any]) -> str:
    settled = s["settled_lag_s"]["median"]
    return " | ".join(
        [
            name,
            _pct(s["wer"]),
            f"{_pct(s['wer_16k'])} / {_pct(s['wer_phone'])}",
            f"{s['sentences_wrong']}/{s['sentences']}",
            f"{s['demo_heard']}/{s['demo_renderings']}",
            f"{s['settled']}/{s['sentences']}",
            _pct(s["taken_back"]),
            _pct(s["stable_revised"]),
            _seconds(s["final_lag_s"]),
            "n/a" if settled is None else f"{settled:.2f} s",
            "n/a" if s["final_decode_s_mean"] is None else f"{s['final_decode_s_mean']:.2f} s",
        ]
    )


def render_section(results: list[dict[str, Any]]) -> list[str]:
    return _table(
        "STT word error rate", HEADER, [table_row(r["option"], r["summary"]) for r in results]
    )


def select_options(names: str) -> list[SttOption]:
    """The options named (comma-separated), or all; ValueError naming the known ones."""
    if not names.strip():
        return list(OPTIONS)
    known = {option.name: option for option in OPTIONS}
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise ValueError(
            f"--stt-options: no option {', '.join(map(repr, unknown))}; "
            f"the options are {', '.join(map(repr, known))}"
        )
    return [known[name] for name in chosen]


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        *run_header(report, "the words do not depend on it, the lags and decode times do"),
        f"- sentences: {report['set']['sentences']} of {report['set']['dir']} in "
        f"{len(report['set']['voices'])} voices ({', '.join(report['set']['voices'])}), "
        f"{report['set']['telephone']} of them through 8 kHz G.711 mu-law; each streamed "
        "through the stt's session logic in audio time",
        f"- demo question: {QUESTION!r} rendered {report['demo_renderings']} times by piper "
        "with its random noise, as `kame demo` renders it",
        *render_section(report["options"]),
        "",
        "Options:",
        "",
        *[
            f"- {r['option']}: {json.dumps(r['settings'])}"
            + (f"; {r['note']}" if r["note"] else "")
            for r in report["options"]
        ],
    ]
    return "\n".join(lines) + "\n"


def set_description(set_dir: Path, clips: list[Clip]) -> dict[str, Any]:
    where = set_dir.resolve()
    return {
        "dir": str(where.relative_to(REPO_ROOT) if where.is_relative_to(REPO_ROOT) else where),
        "sentences": len(clips),
        "voices": sorted({clip.voice for clip in clips}),
        "telephone": sum(clip.telephone for clip in clips),
    }
