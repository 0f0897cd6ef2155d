"""Full-Duplex-Bench v1 through a live `/api/chat`: each recording of FDB's v1.0 data
played into the web service's Moshi-protocol endpoint as moshi's client sends (an Ogg
Opus page per 80 ms, 0x01 before each, at real time, from the start), the agent's
audio and words kept until they are as long as the recording, then scored by
kame_cli/bench/full_duplex.py (docs/turn-taking.md, "Full-Duplex-Bench figures").

    .venv/bin/python -m kame_cli.bench.full_duplex_live --data /path/to/v1_0 \\
        --url 'ws://127.0.0.1:8088/api/chat?model=kame-tandem' [--limit 5] \\
        [--reference /path/to/icc_gt_distribution.json] [--out bench/results/full_duplex]

`--data` is FDB's v1.0 folder (candor_pause_handling/, candor_turn_taking/,
icc_backchannel/, synthetic_pause_handling/, synthetic_user_interruption/, each with
{ID}/input.wav), a download from FDB's dataset README, or samples in its format made by
kame_cli/bench/full_duplex_samples.py (whose turn-taking ones are synthetic_turn_taking/).
Each agent output is written as {out}/{folder}/{ID}/output.wav (24 kHz), the layout FDB's
own scripts read, so its ASR scoring can be run on the same outputs; the figures go to
{out}/full_duplex.json and .md.
The stack answers one agent frame per caller frame, so the agent's sample k answers the
recording's sample k (docs/turn-taking.md, "`/api/chat` keeps the caller's time").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sphn
import websockets

from kame_cli.bench import full_duplex as fdb
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import write_json
from kame_cli.say import write_wav
from kame_cli.talk import read_wav
from kame_common.aio import cancel_and_wait
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE, Samples, resample

FOLDERS = {
    "candor_pause_handling": fdb.Task.PAUSE,
    "synthetic_pause_handling": fdb.Task.PAUSE,
    "candor_turn_taking": fdb.Task.SMOOTH,
    "synthetic_turn_taking": fdb.Task.SMOOTH,  # ours: kame_cli/bench/full_duplex_samples.py
    "synthetic_user_interruption": fdb.Task.INTERRUPTION,
    "icc_backchannel": fdb.Task.BACKCHANNEL,
}
AUDIO, TEXT = 1, 2  # the Moshi protocol's message kinds (services/web/protocols/moshi.py)
SLACK_S = 60.0  # beyond the recording's length, the most a chat may take


@dataclass
class Heard:
    audio: Samples  # the agent's, as long as the caller's
    words_at: list[float]  # when each of the agent's words starts (within a frame)


async def _send(socket: Any, caller: Samples) -> None:
    """The caller's audio, a page per frame at real time, then silence (a phone's line
    stays open) until cancelled."""
    writer = sphn.OpusStreamWriter(SAMPLE_RATE)
    started, index = time.monotonic(), 0
    while True:
        frame = caller[index * FRAME_SAMPLES : (index + 1) * FRAME_SAMPLES]
        frame = np.pad(frame, (0, FRAME_SAMPLES - len(frame))).astype(np.float32)
        page = writer.append_pcm(frame)
        if page:
            await socket.send(bytes([AUDIO]) + page)
        index += 1
        await asyncio.sleep(max(0.0, started + index * FRAME_SECONDS - time.monotonic()))


async def _receive(socket: Any, length: int) -> Heard:
    reader = sphn.OpusStreamReader(SAMPLE_RATE)
    chunks: list[Samples] = []
    words_at: list[float] = []
    got = last = 0
    async for message in socket:
        if isinstance(message, str) or not message:
            continue
        if message[0] == AUDIO:
            pcm = reader.append_bytes(message[1:])
            chunks.append(pcm)
            last, got = got, got + len(pcm)
            if got >= length:
                break
        elif message[0] == TEXT:  # sent after the audio the word starts in
            words_at.append(last / SAMPLE_RATE)
    if got < length:
        why = getattr(socket, "close_reason", None) or "no reason given"
        raise RuntimeError(
            f"the chat closed after {got / SAMPLE_RATE:.1f} s of the recording's "
            f"{length / SAMPLE_RATE:.1f} s: {why}"
        )
    return Heard(np.concatenate(chunks)[:length], words_at)


async def chat(url: str, caller: Samples, token: str = "") -> Heard:
    """`caller` (24 kHz) played into the chat; what came back over as many samples."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as socket:
        sending = asyncio.create_task(_send(socket, caller))
        try:
            async with asyncio.timeout(len(caller) / SAMPLE_RATE + SLACK_S):
                return await _receive(socket, len(caller))
        finally:
            await cancel_and_wait(sending)


def _annotation(folder: Path) -> dict[str, Any]:
    """The sample's annotated end (of turn, of the interruption), where FDB gives one."""
    if (folder / "turn_taking.json").is_file():
        return {"end_s": json.loads((folder / "turn_taking.json").read_text())[0]["timestamp"][0]}
    if (folder / "interrupt.json").is_file():
        return {"end_s": json.loads((folder / "interrupt.json").read_text())[0]["timestamp"][1]}
    return {}


async def run_folder(
    args: argparse.Namespace, name: str, references: dict[str, list[float]]
) -> list[dict[str, Any]]:
    """Every sample of one of FDB's folders through the chat: its score, and its output
    written where FDB's scripts look for it."""
    task, rows = FOLDERS[name], []
    samples = sorted(p for p in (args.data / name).iterdir() if (p / "input.wav").is_file())
    for folder in samples[: args.limit or None]:
        samples_in, rate = read_wav(folder / "input.wav")
        caller = resample(samples_in, rate, SAMPLE_RATE)
        heard = await chat(args.url, caller, args.token)
        write_wav(args.out / name / folder.name / "output.wav", heard.audio, SAMPLE_RATE)
        known = _annotation(folder)
        if task is fdb.Task.BACKCHANNEL and folder.name in references:
            known["reference"] = tuple(references[folder.name])
        sample = fdb.sample_from_audio(task, caller, heard.audio, heard.words_at, **known)
        score = fdb.score(sample)
        rows.append({"folder": name, "id": folder.name} | asdict(score))
        print(f"{name}/{folder.name}: {score}", flush=True)
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    references = json.loads(args.reference.read_text()) if args.reference else {}
    rows: list[dict[str, Any]] = []
    for name in FOLDERS:
        if (args.data / name).is_dir():
            rows += await run_folder(args, name, references)
    scores = [fdb.Score(**{k: v for k, v in r.items() if k not in ("folder", "id")}) for r in rows]
    figures = fdb.aggregate(scores)
    return {
        "url": args.url,
        "figures": {task.value: asdict(f) for task, f in figures.items()},
        "targets": fdb.meets_targets(figures),
        "table": fdb.render_table(args.label, figures),
        "samples": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="FDB's v1.0 folder")
    parser.add_argument("--url", default="ws://127.0.0.1:8088/api/chat?model=kame-tandem")
    parser.add_argument("--token", default="", help="sent as Authorization: Bearer")
    parser.add_argument("--limit", type=int, default=0, help="samples per folder (0: all)")
    parser.add_argument("--reference", type=Path, help="FDB's icc_gt_distribution.json")
    parser.add_argument("--label", default="KAME (tandem)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "full_duplex")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    write_json(args.out / "full_duplex.json", report)
    (args.out / "full_duplex.md").write_text("\n".join(report["table"]) + "\n")
    print("\n".join(report["table"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
