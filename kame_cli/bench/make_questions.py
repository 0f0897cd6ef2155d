"""Make the bench's espeak-ng question sets, bench/questions/<set>/.

Factual questions (none of `kame bench`'s six built-in ones) spoken by
espeak-ng in several English voices, speeds and pitches, so that the bench
hears voices other than the piper voice the agent speaks with. Each question
becomes a 16 kHz mono 16-bit WAV (espeak-ng's 22.05 kHz output converted by
sox, loudness normalized to -3 dBFS peak, 0.3 s of silence either side) and an
entry of questions.json in `kame bench --questions` format, which also names
the voice, speed (words per minute) and pitch (0-99).

Two sets:
- espeak: 14 questions in 13 voices; the tests use it too (tests/conftest.py).
- heldout: 14 other questions in voice+variant combinations that neither the
  espeak set nor any test uses, about a third of them at telephone quality
  (8 kHz mu-law and back to 16 kHz; "telephone": true in questions.json). No
  test may use it (tests/bench/test_heldout_questions.py guards that), so the
  bench can measure on voices the tests never tuned anything to.

    python -m kame_cli.bench.make_questions                  # espeak: WAVs, questions.json
    python -m kame_cli.bench.make_questions --set heldout    # the held-out set
    python -m kame_cli.bench.make_questions --check          # and check.json (below)

--check asks two questions of every entry and writes the answers to
check.json:
- does the oracle's LLM answer it right from the exact text? The embedded
  Gemma 3 270M (started with `kame llm-server`'s launcher) is asked through
  the oracle's own back-end and prompt (services.oracle.backends, the few-shot
  prompt of services.oracle.prompts.gemma_prompt, the oracle's default max
  tokens and temperature); right = every keyword in its answer;
- does Whisper hear it? The stt engine transcribes the WAV; word recall is
  the share of the question's words in that transcript (and the LLM is asked
  that transcript too).
The questions kept are ones the model answers right from the text.

Needs espeak-ng and sox (Debian: apt-get install espeak-ng sox). Regenerating
with the versions in MADE_WITH gives the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kame_cli import llm_server, talk
from kame_cli.bench.paths import QUESTIONS_DIR
from kame_cli.bench.questions import heard, words
from kame_cli.stack_options import free_ports
from kame_common.audio import PHONE_RATE, SAMPLE_RATE, resample

MADE_WITH = {"espeak-ng": "1.51", "sox": "14.4.2"}  # the versions the committed WAVs came from
WAV_RATE = 16_000
PAD_S = 0.3
PEAK_DBFS = -3


@dataclass(frozen=True)
class SpokenQuestion:
    text: str
    keywords: tuple[str, ...]
    voice: str  # an espeak-ng voice, optionally with a variant: en-us+f3
    speed_wpm: int
    pitch: int  # 0-99, espeak-ng's default 50
    telephone: bool = False  # heard as over a phone line: 8 kHz mu-law, then back up

    def entry(self, wav: str) -> dict[str, Any]:
        entry = {
            "wav": wav,
            "text": self.text,
            "keywords": list(self.keywords),
            "voice": self.voice,
            "speed_wpm": self.speed_wpm,
            "pitch": self.pitch,
        }
        if self.telephone:  # only then, so the espeak set's entries stay as committed
            entry["telephone"] = True
        return entry


# The espeak set; the tests use it too (tests/conftest.py's espeak_questions).
QUESTIONS = (
    SpokenQuestion(
        "What is the fastest land animal?", ("cheetah|cheetahs",), "en-us-nyc+f2", 130, 45
    ),
    SpokenQuestion("What is the capital of Germany?", ("berlin",), "en-gb-x-gbclan+f4", 155, 40),
    SpokenQuestion("What is the capital of Italy?", ("rome",), "en-gb-scotland+m1", 155, 65),
    SpokenQuestion("What is the longest river in Africa?", ("nile",), "en-gb+f1", 155, 60),
    SpokenQuestion("What language do people speak in Mexico?", ("spanish",), "en-029+m2", 130, 60),
    SpokenQuestion("What language is spoken in Brazil?", ("portuguese",), "en-us+m1", 140, 40),
    SpokenQuestion("What do cows give us to drink?", ("milk",), "en-gb-x-rp+m3", 160, 60),
    SpokenQuestion(
        "Who was the first president of the United States?", ("washington",), "en-us+f3", 140, 35
    ),
    SpokenQuestion("What is the currency of Japan?", ("yen",), "en-gb-x-gbcwmd+m1", 145, 50),
    SpokenQuestion("Who was the first man on the moon?", ("armstrong",), "en-us", 145, 65),
    SpokenQuestion(
        "What is the tallest animal in the world?", ("giraffe|giraffes",), "en-gb-scotland", 140, 40
    ),
    SpokenQuestion(
        "Which planet is known as the red planet?", ("mars",), "en-gb-x-gbclan+f2", 155, 50
    ),
    SpokenQuestion("Who invented the light bulb?", ("edison",), "en-gb-x-rp+f2", 145, 50),
    SpokenQuestion("What gas do humans need to breathe?", ("oxygen",), "en-us-nyc+f2", 145, 35),
)

# The held-out set: no test may use it (tests/bench/test_heldout_questions.py).
# Voice+variant combinations that neither the tests nor the espeak set use
# (British English as en+VARIANT: espeak-ng ignores a variant after en-gb);
# about a third over a phone line.
HELDOUT_QUESTIONS = (
    SpokenQuestion("What is the capital of Egypt?", ("cairo",), "en-us-nyc+m6", 140, 55),
    SpokenQuestion(
        "Who painted the Sistine Chapel ceiling?", ("michelangelo",), "en-us+m3", 145, 45
    ),
    SpokenQuestion("What is the hottest planet?", ("venus",), "en+steph", 130, 50, True),
    SpokenQuestion("What do bees make?", ("honey",), "en-gb-x-rp+m5", 145, 40),
    SpokenQuestion(
        "Which animal is called the king of the jungle?", ("lion|lions",), "en-gb-x-rp+m1", 130, 50
    ),
    SpokenQuestion("What language do people speak in France?", ("french",), "en+f2", 155, 55, True),
    SpokenQuestion(
        "What color is the sky on a clear day?", ("blue",), "en-gb-x-gbclan+m4", 150, 35
    ),
    SpokenQuestion("What is the capital of Russia?", ("moscow",), "en+f3", 135, 50, True),
    SpokenQuestion("What planet do we live on?", ("earth",), "en-gb-scotland+f2", 140, 50),
    SpokenQuestion("Who developed the theory of relativity?", ("einstein",), "en+m6", 135, 50),
    SpokenQuestion("What is the capital of Norway?", ("oslo",), "en-029+f2", 140, 50, True),
    SpokenQuestion("What color is grass?", ("green",), "en-us+f5", 140, 60),
    SpokenQuestion(
        "Which bird is a symbol of peace?", ("dove|doves",), "en-gb-x-gbcwmd+f3", 130, 50
    ),
    SpokenQuestion("What is the capital of Greece?", ("athens",), "en-us+david", 140, 40, True),
)
SETS = {"espeak": QUESTIONS, "heldout": HELDOUT_QUESTIONS}


def tool_version(tool: str) -> str:
    """The installed espeak-ng's or sox's version, e.g. "1.51"; "" if unknown."""
    output = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"(\d+\.\d+(?:\.\d+)?)", output)
    return found.group(1) if found else ""


def speak(question: SpokenQuestion, wav: Path) -> None:
    """espeak-ng's own output (22.05 kHz) for the question's voice, speed and pitch."""
    subprocess.run(
        [
            "espeak-ng",
            "-v",
            question.voice,
            "-s",
            str(question.speed_wpm),
            "-p",
            str(question.pitch),
            "-w",
            str(wav),
            question.text,
        ],
        check=True,
    )


def through_phone_line(source: Path, phone: Path) -> None:
    """What a G.711 call carries: 8 kHz mono mu-law, at a normal level."""
    subprocess.run(
        [
            "sox",
            "-D",
            str(source),
            "-r",
            str(PHONE_RATE),
            "-c",
            "1",
            "-e",
            "mu-law",
            str(phone),
            "gain",
            "-n",
            str(PEAK_DBFS),
        ],
        check=True,
    )


def to_set_format(source: Path, wav: Path) -> None:
    """16 kHz mono 16-bit, normalized, padded; no dither, so the bytes are the
    same every time."""
    subprocess.run(
        [
            "sox",
            "-D",
            str(source),
            "-r",
            str(WAV_RATE),
            "-c",
            "1",
            "-b",
            "16",
            "-e",
            "signed-integer",
            str(wav),
            "gain",
            "-n",
            str(PEAK_DBFS),
            "pad",
            str(PAD_S),
            str(PAD_S),
        ],
        check=True,
    )


def synthesize(question: SpokenQuestion, wav: Path) -> None:
    """espeak-ng -> (the phone line, for a telephone question) -> the set's WAV."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "raw.wav"
        speak(question, source)
        if question.telephone:
            phone = Path(scratch) / "phone.wav"
            through_phone_line(source, phone)
            source = phone
        to_set_format(source, wav)


def variant_is_ignored(voice: str) -> bool:
    """Whether espeak-ng speaks `voice` ("en-gb+m4") exactly as its base voice:
    1.51 ignores any variant after en-gb (use en+m4 for British English), so such a
    voice is not the new voice its name says."""
    if "+" not in voice:
        return False
    base = voice.split("+")[0]
    with tempfile.TemporaryDirectory() as scratch:
        spoken = []
        for name in (voice, base):
            wav = Path(scratch) / "probe.wav"
            subprocess.run(["espeak-ng", "-v", name, "-w", str(wav), "Hello there."], check=True)
            spoken.append(wav.read_bytes())
    return spoken[0] == spoken[1]


def make(questions: tuple[SpokenQuestion, ...], out_dir: Path) -> list[dict[str, Any]]:
    return write_set(questions, synthesize, out_dir)


class SpokenEntry(Protocol):
    def entry(self, wav: str) -> dict[str, Any]: ...


EntryT = TypeVar("EntryT", bound=SpokenEntry)


def write_set(
    items: Sequence[EntryT],
    speak_as_wav: Callable[[EntryT, Path], None],
    out_dir: Path,
    prefix: str = "q",
    index: str = "questions.json",
) -> list[dict[str, Any]]:
    """A spoken set in `out_dir`: PREFIX01.wav ... (each item spoken by
    `speak_as_wav`) and the index listing each item's entry."""
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for number, item in enumerate(items, start=1):
        name = f"{prefix}{number:02d}.wav"
        speak_as_wav(item, out_dir / name)
        entries.append(item.entry(name))
    (out_dir / index).write_text(json.dumps(entries, indent=1) + "\n")
    return entries


async def ask(backend: Any, text: str) -> str:
    """The oracle back-end's answer to `text` as the caller's only words."""
    from services.oracle.backends import StreamStats
    from services.oracle.prompts import USER, Turn

    chunks = [chunk async for chunk in backend.stream([Turn(USER, text)], StreamStats())]
    return "".join(chunks).strip()


async def ask_all(texts: list[str]) -> list[str]:
    """Start the embedded LLM on a free port and ask it every text, one by one."""
    from services.oracle.backends import BackendSettings, OpenAIBackend
    from services.oracle.config import OracleSettings
    from services.oracle.prompts import is_gemma_270m_base

    port = free_ports(1)[0]
    url = llm_server.base_url("127.0.0.1", port)
    server = llm_server.launch(port=port, quiet=True)
    defaults = OracleSettings()
    settings = BackendSettings(
        backend="openai",
        model=llm_server.EMBEDDED_ALIAS,
        base_url=url,
        api_key="",
        request_timeout_s=60.0,  # the first request also loads the model
        max_tokens=defaults.max_tokens,
        temperature=defaults.temperature,
        system_prompt="",
    )
    backend = OpenAIBackend(settings, few_shot=is_gemma_270m_base(settings.model))
    try:
        await asyncio.to_thread(llm_server.wait_ready, url, server)
        return [await ask(backend, text) for text in texts]
    finally:
        await backend.aclose()
        llm_server.stop(server)


def transcribe_all(wavs: list[Path]) -> list[str]:
    from services.stt.config import SttSettings
    from services.stt.engine import SttEngine

    engine = SttEngine(SttSettings())
    try:
        transcripts = []
        for wav in wavs:
            samples, rate = talk.read_wav(wav)
            transcripts.append(engine.transcribe_clip(resample(samples, rate, SAMPLE_RATE)))
        return transcripts
    finally:
        engine.close()


def recall(question: str, transcript: str) -> float:
    """The share of the question's words that the transcript holds."""
    expected, got = words(question), set(words(transcript))
    return sum(word in got for word in expected) / len(expected)


def check(out_dir: Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    transcripts = transcribe_all([out_dir / e["wav"] for e in entries])
    texts = [e["text"] for e in entries]
    answers = asyncio.run(ask_all(texts + transcripts))
    rows = []
    for index, entry in enumerate(entries):
        keywords = tuple(entry["keywords"])
        from_text, from_transcript = answers[index], answers[len(entries) + index]
        rows.append(
            {
                "wav": entry["wav"],
                "text": entry["text"],
                "voice": entry["voice"],
                "llm_answer_from_text": from_text,
                "llm_right_from_text": heard(from_text, keywords),
                "whisper_transcript": transcripts[index],
                "whisper_word_recall": round(recall(entry["text"], transcripts[index]), 3),
                "llm_answer_from_transcript": from_transcript,
                "llm_right_from_transcript": heard(from_transcript, keywords),
            }
        )
    (out_dir / "check.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="espeak", dest="set_name")
    parser.add_argument(
        "--out-dir", type=Path, help="default: bench/questions/<set>/, where the set is committed"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also ask the embedded LLM and Whisper about every question (check.json)",
    )
    return parser.parse_args()


def tools_ready(questions: tuple[SpokenQuestion, ...]) -> bool:
    """espeak-ng and sox are installed (notes where their versions or a voice's
    variant would not give the committed WAVs)."""
    missing = [tool for tool in ("espeak-ng", "sox") if shutil.which(tool) is None]
    if missing:
        print(f"make_questions: install {' and '.join(missing)} (Debian packages)", file=sys.stderr)
        return False
    for tool, made_with in MADE_WITH.items():
        if (installed := tool_version(tool)) != made_with:
            print(f"note: {tool} {installed} here, the committed WAVs came from {made_with}")
    for voice in sorted({q.voice for q in questions}):
        if variant_is_ignored(voice):
            base = voice.split("+")[0]
            print(f"note: espeak-ng ignores the variant of {voice}: it speaks as {base}")
    return True


def print_check(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(
            f"{row['wav']}  llm {'right' if row['llm_right_from_text'] else 'WRONG'}: "
            f"{row['llm_answer_from_text']!r:60}  whisper recall "
            f"{row['whisper_word_recall']:.2f}: {row['whisper_transcript']!r}"
        )
    right = sum(r["llm_right_from_text"] for r in rows)
    heard_right = sum(r["llm_right_from_transcript"] for r in rows)
    print(
        f"the LLM answers {right} of {len(rows)} right from the exact text, "
        f"{heard_right} of {len(rows)} from Whisper's transcript"
    )


def main() -> int:
    args = parse_args()
    questions = SETS[args.set_name]
    out_dir = args.out_dir or QUESTIONS_DIR / args.set_name
    if not tools_ready(questions):
        return 1
    entries = make(questions, out_dir)
    print(f"wrote {len(entries)} WAVs and questions.json to {out_dir}")
    if args.check:
        print_check(check(out_dir, entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
