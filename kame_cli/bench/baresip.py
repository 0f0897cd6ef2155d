"""A baresip softphone driven from Python: the SIP load bench's callers
(kame_cli/bench/sip_load.py) and the SIP tests' phone (tests/telephony/).

`Baresip` runs one baresip process (the Debian package) with its own config in
a temp dir: the microphone is a WAV file (aufile; the call ends when the file
does, so pad it with silence for as long as the call should last), what it
hears is dumped to WAV (sndfile), and it is steered and watched over ctrl_tcp
(JSON in netstrings: commands dial/hangup/sndcode, events CALL_ESTABLISHED,
CALL_CLOSED, ...). `caller_wav` and `espeak_wav` make its microphone files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kame_cli.stack_options import free_port_run, free_ports
from kame_common.audio import Samples

BARESIP = shutil.which("baresip") or "baresip"
RATE = 8000

BARESIP_CONFIG = """\
poll_method		epoll
sip_listen		127.0.0.1:{sip_port}
net_interface		127.0.0.1
audio_player		aubridge,nil
audio_source		aufile,{source}
audio_alert		aubridge,nil
module_path		/usr/lib/baresip/modules
module			g711.so
module			aufile.so
module			aubridge.so
module			sndfile.so
module_app		account.so
module_app		menu.so
module_app		ctrl_tcp.so
ctrl_tcp_listen		127.0.0.1:{ctrl_port}
snd_path		{recordings}
rtp_ports		{rtp_first}-{rtp_last}
"""


def write_wav(path: Path, samples: npt.ArrayLike, rate: int = RATE) -> Path:
    """float32 mono samples in [-1, 1] to a 16-bit mono WAV."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


def read_wav(path: Path) -> tuple[Samples, int]:
    """A 16-bit WAV as float32 samples, and its rate."""
    with wave.open(str(path), "rb") as wav:
        rate = wav.getframerate()
        data = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
        if wav.getnchannels() > 1:
            data = data.reshape(-1, wav.getnchannels())[:, 0]
    return data.astype(np.float32) / 32768.0, rate


def caller_wav(
    directory: Path,
    name: str,
    speech: Samples,
    speech_rate: int,
    lead_s: float = 1.0,
    tail_s: float = 20.0,
) -> Path:
    """What a baresip caller says, as aufile wants it (8 kHz mono 16-bit): some
    silence, the speech, then `tail_s` of silence to listen to the answer (baresip
    hangs up when the file ends). Resampled with sox."""
    raw = write_wav(directory / f"{name}-raw.wav", speech, speech_rate)
    return phone_wav(raw, directory, name, lead_s, tail_s)


def espeak_wav(
    directory: Path,
    name: str,
    text: str,
    voice: str = "en-us",
    lead_s: float = 1.0,
    tail_s: float = 20.0,
) -> Path:
    """`text` spoken by espeak-ng, resampled by sox to 8 kHz mono 16-bit, padded."""
    raw = directory / f"{name}-espeak.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(raw), text], check=True)
    return phone_wav(raw, directory, name, lead_s, tail_s)


def phone_wav(raw: Path, directory: Path, name: str, lead_s: float, tail_s: float) -> Path:
    """`raw` made 8 kHz mono 16-bit by sox, with `lead_s` of silence before and
    `tail_s` after: NAME.wav in `directory`."""
    speech_8k = directory / f"{name}-8k.wav"
    subprocess.run(
        ["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(speech_8k)], check=True
    )
    samples, _ = read_wav(speech_8k)
    padded = np.concatenate(
        [
            np.zeros(int(lead_s * RATE), np.float32),
            samples,
            np.zeros(int(tail_s * RATE), np.float32),
        ]
    )
    return write_wav(directory / f"{name}.wav", padded)


def baresip_ports() -> tuple[int, int, int]:
    """Ports free for a baresip now: SIP (UDP and TCP on it, and TLS on the port after
    it, which baresip 1.0 always opens), its control port, and an even RTP port with
    RTCP's after it; none is another. Picked where kame up picks free ports (below
    the ephemeral range: a port the kernel hands out for port 0 could be taken
    again before baresip binds it, as a call's RTP port once was)."""
    while True:
        sip, rtp = free_port_run(2), free_port_run(2, even=True)
        (ctrl,) = free_ports(1)
        taken = {sip, sip + 1, rtp, rtp + 1, ctrl}
        if len(taken) == 5:
            return sip, ctrl, rtp


@dataclass
class Baresip:
    """One baresip softphone on loopback, its microphone `source` (a WAV)."""

    source: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="baresip-")))
    events: list[dict[str, Any]] = field(default_factory=list)
    process: asyncio.subprocess.Process | None = None
    _reader: asyncio.StreamReader | None = None
    _writer: asyncio.StreamWriter | None = None
    _pump: asyncio.Task[None] | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0

    @property
    def recordings(self) -> Path:
        return self.workdir / "recordings"

    async def start(self, timeout_s: float = 10.0) -> Baresip:
        sip_port, ctrl_port, rtp_first = baresip_ports()
        self.recordings.mkdir(parents=True, exist_ok=True)
        config = BARESIP_CONFIG.format(
            sip_port=sip_port,
            source=self.source,
            ctrl_port=ctrl_port,
            recordings=self.recordings,
            rtp_first=rtp_first,
            rtp_last=rtp_first + 1,
        )
        (self.workdir / "config").write_text(config)
        (self.workdir / "accounts").write_text(
            "<sip:caller@127.0.0.1>;regint=0;audio_codecs=PCMU,PCMA\n"
        )
        # The child keeps its own descriptor of the log; ours closes at once.
        with open(self.workdir / "baresip.log", "wb") as log_file:  # noqa: ASYNC230
            self.process = await asyncio.create_subprocess_exec(
                BARESIP,
                "-f",
                str(self.workdir),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._reader, self._writer = await asyncio.open_connection("127.0.0.1", ctrl_port)
                break
            except OSError:
                if time.monotonic() > deadline or self.process.returncode is not None:
                    raise AssertionError(f"baresip did not start: {self.log()}") from None
                await asyncio.sleep(0.05)
        self._pump = asyncio.create_task(self._read_events())
        return self

    def log(self) -> str:
        path = self.workdir / "baresip.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def command(self, command: str, params: str = "") -> None:
        assert self._writer is not None
        data = json.dumps({"command": command, "params": params, "token": command}).encode()
        self._writer.write(str(len(data)).encode() + b":" + data + b",")
        await self._writer.drain()

    async def dial(self, uri: str) -> None:
        self.started_at = time.monotonic()
        await self.command("dial", uri)

    async def hang_up(self) -> None:
        await self.command("hangup")

    async def send_digits(self, digits: str) -> None:
        await self.command("sndcode", digits)

    async def _read_events(self) -> None:
        assert self._reader is not None
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                length = int((await self._reader.readuntil(b":"))[:-1])
                message = json.loads(await self._reader.readexactly(length))
                await self._reader.readexactly(1)  # the netstring's ','
                if message.get("event"):
                    message["at"] = time.monotonic()
                    self.events.append(message)
                    self._arrived.set()

    def seen(self, event_type: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("type") == event_type), None)

    async def wait_for(self, event_type: str, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (event := self.seen(event_type)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                types = [e.get("type") for e in self.events]
                raise AssertionError(
                    f"baresip: no {event_type} in {timeout_s:g} s (events {types})\n{self.log()}"
                )
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        return event

    def heard(self) -> tuple[Samples, int]:
        """What baresip heard (its decoded receive side), once the call has closed."""
        dumps = sorted(self.recordings.glob("dump-*-dec.wav"))
        assert dumps, f"baresip recorded nothing\n{self.log()}"
        return read_wav(dumps[-1])

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self.command("quit")
            self._writer.close()
        if self.process is not None and self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 3.0)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
