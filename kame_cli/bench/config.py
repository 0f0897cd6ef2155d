"""`kame bench`'s options: one frozen `BenchConfig`, parsed once from the command
line. Each field is the one home of its flag's default and help (`add_arguments`
makes the flags from the fields), so the rest of the bench reads typed settings
instead of an argparse namespace."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kame_cli.bench.paths import DICTATION_SET
from kame_cli.stack_options import DTYPE_HELP
from kame_common.audio import FRAME_SECONDS
from kame_common.llm import BACKEND_NAMES
from services.frontend.config import DTYPES


def _levels(text: str) -> tuple[int, ...]:
    levels = tuple(int(part) for part in text.split(",") if part.strip()) if text else ()
    if any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("--load: session counts must be >= 1, e.g. 1,4,8")
    return levels


def _flag(help: str | None = None, **argparse_options: Any) -> dict[str, Any]:
    """A field's metadata: its flag is --NAME (or `flag=`), with these argparse options."""
    return {"help": help, **argparse_options}


@dataclass(frozen=True)
class BenchConfig:
    """What one `kame bench` run measures and how (a field per flag)."""

    checkpoint: str = field(
        default="",
        metadata=_flag("KAME/Moshi checkpoint directory: adds the tandem-kame and s2s runs"),
    )
    device: str = field(default="cpu", metadata=_flag("torch device of the kame/moshi engines"))
    dtype: str = field(default="auto", metadata=_flag(DTYPE_HELP, choices=DTYPES))
    questions: Path | None = field(
        default=None,
        metadata=_flag(
            'JSON list of {"wav": FILE or "text": TEXT, "keywords": [...]}, e.g. '
            "bench/questions/espeak/questions.json (default: six built-in questions "
            "spoken by the piper voice)",
            type=Path,
        ),
    )
    runs: str = field(
        default="",
        metadata=_flag(
            "comma-separated subset of the runs (tandem, cascade, tandem-kame, "
            "s2s); default: every run the options allow"
        ),
    )
    repeats: int = field(default=1, metadata=_flag("times each question is asked", type=int))
    warmup: int = field(
        default=0,
        metadata=_flag(
            "unrecorded calls per stack after its cold first call (which is recorded "
            "apart) and before measuring",
            type=int,
        ),
    )
    load: tuple[int, ...] = field(
        default=(1, 4, 8),
        metadata=_flag(
            "concurrent session counts of the load run, e.g. 1,8,32 "
            "('' = no load run; default 1,4,8)",
            type=_levels,
        ),
    )
    load_run: str = field(
        default="",
        metadata=_flag("run used for load (default: tandem-kame with a checkpoint, else tandem)"),
    )
    late_ms: float = field(
        default=FRAME_SECONDS * 1e3,
        metadata=_flag("an agent frame later than this after its caller frame is late", type=float),
    )
    tail_s: float = field(
        default=1.5, metadata=_flag("the agent is done after this much quiet", type=float)
    )
    max_wait_s: float = field(
        default=20.0,
        metadata=_flag("give up waiting for an answer this long after the question", type=float),
    )
    out_dir: Path = field(
        default=Path("bench/results"),
        metadata=_flag("where the results go (scratch files in OUT_DIR/tmp/NAME)", type=Path),
    )
    name: str = field(default="bench", metadata=_flag("file name stem of the results"))
    redis_url: str = field(
        default="",
        metadata=_flag(
            "use this Redis, whose frontend registry must list no other "
            "replica (default: each stack starts its own Redis)"
        ),
    )
    llm_base_url: str = field(
        default="", metadata=_flag("an OpenAI-compatible server instead of the embedded LLM")
    )
    llm_backend: str = field(
        default="", metadata=_flag("oracle back-end", choices=("", *BACKEND_NAMES))
    )
    llm_model: str = field(default="", metadata=_flag("model name for the oracle"))
    startup_timeout_s: float = field(default=300.0, metadata=_flag(type=float))
    turn_taking: bool = field(
        default=False,
        metadata=_flag(
            "instead of the runs, the turn-taking section (no stack): end-of-turn "
            "latency, paused questions cut off (Smart Turn against the fixed 0.4 s pause), "
            "backchannels and interruptions over the agent; piper and 4 espeak-ng voices",
            action="store_true",
        ),
    )
    turn_taking_full: bool = field(
        default=False,
        metadata=_flag(
            "the turn-taking section on all 14 questions of bench/questions/espeak (13 voices)",
            action="store_true",
        ),
    )
    stt_wer: bool = field(
        default=False,
        metadata=_flag(
            "instead of the runs, the stt's word error rate (no stack): every sentence of "
            "--stt-set streamed through the stt's own session logic in audio time, once per "
            "stt option: WER, partial stability, lag; NAME.json and NAME.md",
            action="store_true",
        ),
    )
    stt_options: str = field(
        default="",
        metadata=_flag("comma-separated names of the --stt-wer options (default: all)"),
    )
    stt_set: Path = field(
        default=DICTATION_SET,
        metadata=_flag(
            "the --stt-wer sentences: a directory with sentences.json (default: the "
            "dictation set, 48 sentences in 8 voices no test uses)",
            type=Path,
        ),
    )
    stt_demo_renderings: int = field(
        default=20,
        metadata=_flag(
            "--stt-wer: times the demo's question is rendered afresh by piper and heard",
            type=int,
        ),
    )
    capacity_admission: bool = field(
        default=True,
        metadata=_flag(
            "the stacks admit every call (by default the gateway refuses, with "
            "RESOURCE_EXHAUSTED, calls stt or the oracle cannot serve in time: the load "
            "levels count them as refused)",
            flag="--no-capacity-admission",
            action="store_false",
        ),
    )

    @property
    def late_s(self) -> float:
        return self.late_ms / 1000

    @property
    def scratch(self) -> Path:
        """Where the answers' WAVs and the stacks' logs go."""
        return self.out_dir / "tmp" / self.name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per `BenchConfig` field, in field order."""
    for option in fields(BenchConfig):
        argparse_options = dict(option.metadata)
        flag = argparse_options.pop("flag", "--" + option.name.replace("_", "-"))
        parser.add_argument(flag, dest=option.name, default=option.default, **argparse_options)


def config_from_namespace(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        **{option.name: getattr(args, option.name) for option in fields(BenchConfig)}
    )


def parse_config(argv: list[str]) -> BenchConfig:
    """`kame bench`'s command line (without `kame bench`) as a config."""
    parser = argparse.ArgumentParser(prog="kame bench")
    add_arguments(parser)
    return config_from_namespace(parser.parse_args(argv))
