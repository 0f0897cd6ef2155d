"""A caller of the gateway for `kame talk`, the benchmarks and the tests: one
WAV streamed through a Converse session as a microphone would
(kame_client/microphone.py), and all that came back (kame_client/result.py).

Chunk k leaves when its last sample has been "spoken" (start + (k+1) * chunk).
After the WAV, it keeps streaming silence (the line stays open, as on a phone)
until the agent has answered and been quiet for `tail_s`, or `max_wait_s`
passed. Then it half-closes.

The caller's end of speech is measured on the WAV itself (the end of the last
20 ms window within 35 dB of the loudest one), so it does not depend on the
stt service being right.

Reconnecting: when the gateway sent a resume token, a call that breaks off
(the gateway went away: UNAVAILABLE, or the INTERNAL that grpc.aio reports for
a write under way) or that the gateway asks to move (Notice RECONNECT: it is
shutting down) is continued in a new call with the token, on the next address
of `gateway = "a,b,..."` (round the list), up to RECONNECT_ATTEMPTS failed
attempts in a row (a call that started begins the count anew); the
timeline shows a `reconnect` event. No caller word is lost on the way: the
continued call starts at the first chunk the broken one had no agent frame
for (the gateway answers every caller frame with one), moved back to the
start of the speech it falls in (the new session's stt must hear the
utterance whole), at most RESEND_MAX_S back. The caller is then behind real
time: it sends at most BURST_S ahead of the new call's own clock
(microphone.py), and catches up
by skipping quiet audio while more than CATCH_UP_S behind, past the first
SILENCE_KEPT_S of each quiet stretch (the agent answers in that silence).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import numpy as np
import numpy.typing as npt

from kame_client.client import ConverseClient
from kame_client.codecs import Decoder, Encoder, resolve_format
from kame_client.events import (
    AgentAudio,
    AgentText,
    Notice,
    Started,
    Turn,
    UserFinal,
)
from kame_client.microphone import Microphone
from kame_client.result import (
    AgentAudioStart,
    AgentAudioStop,
    CallerAudioStart,
    CallerAudioStop,
    CallerText,
    Reconnect,
    TalkResult,
    Timed,
    TimelineEvent,
)
from kame_client.status import CORE_INTERNAL_DETAILS, retry_after_s
from kame_common.aio import cancel_and_wait
from kame_common.audio import FRAME_SAMPLES, SAMPLE_RATE, Samples
from kame_common.llm import backend_value
from kame_common.ports import loopback_address
from kame_common.tls import ClientTls
from kamepb import gateway_pb2

CODECS = {
    "pcm16": gateway_pb2.AudioFormat.PCM16,
    "mulaw": gateway_pb2.AudioFormat.MULAW,
    "alaw": gateway_pb2.AudioFormat.ALAW,
    "opus": gateway_pb2.AudioFormat.OPUS,
}
MODES = {
    "tandem": gateway_pb2.ConverseConfig.TANDEM,
    "cascade": gateway_pb2.ConverseConfig.CASCADE,
    "s2s": gateway_pb2.ConverseConfig.S2S,
}
LEVEL_WINDOW_S = 0.02
LEVEL_RANGE_DB = 35.0
RECONNECT_ATTEMPTS = 5
RECONNECT_BACKOFF_S = 0.5  # doubles on each failed attempt in a row
CATCH_UP_S = 1.0  # behind real time by more than this, quiet audio is skipped
RESEND_MAX_S = 30.0  # the most caller audio a continued call sends again
SILENCE_KEPT_S = 5.0  # of a quiet stretch, what a caller behind real time still sends


@dataclass
class TalkOptions:
    gateway: str = loopback_address("gateway")  # host:port, or several comma-separated
    mode: str = "tandem"
    input_codec: str = "pcm16"
    input_rate: int = 0  # 0: the WAV's rate for pcm16, the codec's own rate otherwise
    output_codec: str = "pcm16"
    output_rate: int = 0  # 0: 24 kHz for pcm16, the codec's own rate otherwise
    chunk_ms: int = 80
    tail_s: float = 2.0
    max_wait_s: float = 30.0
    # A call whose session has not started by then ends DEADLINE_EXCEEDED: a gateway
    # that took the call and never set it up does not hold the caller forever (the
    # gateway's own set-up bound is connect_timeout_s per frontend tried).
    start_timeout_s: float = 60.0
    oracle_updates: bool = True
    # Done only once a word of an oracle generation was spoken, not a hold phrase
    # (generation 0) that fills the wait for it; for modes with an oracle.
    wait_for_answer: bool = False
    voice: str = ""
    auth_token: str = ""  # sent as 'authorization: Bearer <token>' metadata
    ca_file: str = ""  # non-empty: TLS, verifying the gateway's certificate with this CA
    tls: bool = False  # TLS with the system's roots (a public certificate)
    tls_server_name: str = ""  # the name the gateway's certificate carries, if not the host
    llm_backend: str = ""
    llm_model: str = ""
    llm_base_url: str = ""
    llm_api_key: str = ""
    # A message typed after the WAV (kame talk --say): sent as UserText, answered like
    # a spoken turn; the WAV may then be just silence.
    say: str = ""

    def client_tls(self) -> ClientTls:
        return ClientTls(ca_file=self.ca_file, tls=self.tls, server_name=self.tls_server_name)

    @property
    def gateways(self) -> list[str]:
        return [address.strip() for address in self.gateway.split(",") if address.strip()]

    def converse_config(self, resume_token: str = "") -> gateway_pb2.ConverseConfig:
        config = gateway_pb2.ConverseConfig(
            resume_token=resume_token,
            mode=MODES[self.mode],
            input_format=gateway_pb2.AudioFormat(
                codec=CODECS[self.input_codec], sample_rate_hz=self.input_rate
            ),
            output_format=gateway_pb2.AudioFormat(
                codec=CODECS[self.output_codec], sample_rate_hz=self.output_rate
            ),
            voice=self.voice,
            include_oracle_updates=self.oracle_updates,
        )
        if self.llm_backend or self.llm_model or self.llm_base_url or self.llm_api_key:
            config.llm.CopyFrom(
                gateway_pb2.LlmOverride(
                    backend=backend_value(self.llm_backend),
                    model=self.llm_model,
                    base_url=self.llm_base_url,
                    api_key=self.llm_api_key,
                )
            )
        return config


def loud_windows(samples: Samples) -> npt.NDArray[np.intp]:
    """Indices of the clip's 20 ms windows that are speech: within 35 dB of the
    loudest window and above -60 dBFS (the one level rule of the functions below)."""
    window = int(LEVEL_WINDOW_S * SAMPLE_RATE)
    count = len(samples) // window
    if count == 0:
        return np.zeros(0, np.intp)
    frames = samples[: count * window].reshape(count, window).astype(np.float64)
    level = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)
    return np.flatnonzero(level > max(level.max() - LEVEL_RANGE_DB, -60.0))


def speech_region(samples: Samples) -> tuple[float | None, float | None]:
    """(start_s, end_s) of the speech in a clip: its first to its last loud window."""
    loud = loud_windows(samples)
    if not len(loud):
        return None, None
    return loud[0] * LEVEL_WINDOW_S, (loud[-1] + 1) * LEVEL_WINDOW_S


def speech_intervals(
    samples: Samples, bridge_s: float = 0.1, min_s: float = 0.0
) -> list[tuple[float, float]]:
    """Each stretch of speech in a clip, (start_s, end_s): runs of loud windows,
    joined across quiet gaps up to `bridge_s`, those shorter than `min_s` left out."""
    stretches: list[list[float]] = []
    for index in loud_windows(samples):
        start = float(index) * LEVEL_WINDOW_S
        if stretches and start - stretches[-1][1] <= bridge_s + 1e-9:
            stretches[-1][1] = start + LEVEL_WINDOW_S
        else:
            stretches.append([start, start + LEVEL_WINDOW_S])
    return [(start, end) for start, end in stretches if end - start >= min_s - 1e-9]


def broke_off(status: str, details: str) -> bool:
    """Whether a call ended because its connection did (the gateway went away), so that it
    is worth continuing with the resume token. A write under way when the connection breaks
    makes grpc.aio report INTERNAL "Internal error from Core" instead of UNAVAILABLE
    (grpc/grpc#36066; seen when the gateway was killed mid-call). If the gateway had ended the
    call itself, the resumed call says so with its own status."""
    if status == grpc.StatusCode.UNAVAILABLE.name:
        return True
    return status == grpc.StatusCode.INTERNAL.name and details == CORE_INTERNAL_DETAILS


class SpeechMap:
    """Which chunks of the caller's audio are speech (`loud_windows`), and how many
    quiet chunks in a row end at each one."""

    def __init__(self, samples: Samples, chunk: int) -> None:
        window = int(LEVEL_WINDOW_S * SAMPLE_RATE)
        self.loud = np.zeros(-(-len(samples) // chunk), bool)
        self.loud[loud_windows(samples) * window // chunk] = True
        self.quiet_run = np.zeros(len(self.loud), int)
        for index, loud in enumerate(self.loud):
            self.quiet_run[index] = 0 if loud else (self.quiet_run[index - 1] if index else 0) + 1

    def is_loud(self, index: int) -> bool:
        return bool(index < len(self.loud) and self.loud[index])

    def start_of_speech(self, index: int, oldest: int) -> int:
        """Where the speech that chunk `index` follows or falls in began (not before
        `oldest`); `index` itself when the chunk before it is quiet."""
        while index > oldest and self.is_loud(index - 1):
            index -= 1
        return index

    def quiet_for(self, index: int) -> int:
        """Quiet chunks in a row up to chunk `index` (0 for speech; past the end, all)."""
        return int(self.quiet_run[index]) if index < len(self.loud) else index + 1


class _Conversation:
    """One Converse call: a paced sender and a reader filling a TalkResult."""

    def __init__(self, audio_24k: Samples, options: TalkOptions) -> None:
        self.options = options
        config = options.converse_config()
        self.input_format = resolve_format(config.input_format, "input_format")
        self.output_format = resolve_format(config.output_format, "output_format")
        self.decoder = Decoder(self.output_format)
        start, end = speech_region(audio_24k)
        self.result = TalkResult(caller=audio_24k, speech_start_s=start, speech_end_s=end)
        self.chunk = max(1, int(options.chunk_ms * SAMPLE_RATE / 1000))
        self.speech = SpeechMap(audio_24k, self.chunk)
        self.t0 = 0.0
        self.speaking = False
        self.answered = False  # the agent spoke after the caller began
        self.answer_spoken = False  # ... and said a word of an oracle generation
        self.last_speaking_t = 0.0
        self.agent_parts: list[Samples] = []
        self.next_chunk = 0  # the next chunk of caller audio to send, in any call
        self.call_chunks: list[int] = []  # the chunks sent in the current call, in order
        self.answered_frames = 0  # caller frames of the current call the agent answered
        self.input_end_t: float | None = None  # when the WAV had been sent
        self.said_t: float | None = None  # when the typed message (options.say) was sent
        self.resume_token = ""
        self.move_asked = False  # the gateway sent Notice RECONNECT
        self.client: ConverseClient | None = None  # the current call

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, event: TimelineEvent) -> None:
        """An event on the timeline, at the time it came."""
        self.result.events.append(Timed(round(self.now(), 4), event))

    async def run(self) -> TalkResult:
        self.t0 = time.monotonic()
        gateways = self.options.gateways
        failures, attempt = 0, 0  # failed attempts in a row; attempts in all
        while failures <= RECONNECT_ATTEMPTS:
            gateway = gateways[attempt % len(gateways)]
            attempt += 1
            if await self._call(gateway):
                break
            # A call that started (or was asked to move) ends an outage: a long call may
            # ride out several (a restarted gateway, then a restarted frontend).
            started = self.client is not None and self.client.started.is_set()
            failures = 0 if self.move_asked or started else failures + 1
            self.next_chunk = self._resume_point()
            resend_from_s = round(self.next_chunk * self.chunk / SAMPLE_RATE, 2)
            self.record(Reconnect(gateway, self.result.status, resend_from_s))
            await asyncio.sleep(RECONNECT_BACKOFF_S * (2 ** (failures - 1)) if failures else 0)
        self.agent_parts.append(self.decoder.flush())
        self.result.agent = np.concatenate(self.agent_parts).astype(np.float32)
        return self.result

    async def _call(self, gateway: str) -> bool:
        """One Converse call; False when it should be continued in another (it broke
        off or the gateway asked, and there is a resume token). Each call codes its
        own streams, both ways."""
        self.move_asked = False
        self.call_chunks, self.answered_frames = [], 0
        options = self.options
        self.client = ConverseClient.connect(gateway, options.auth_token, options.client_tls())
        async with self.client as client:
            await client.start(options.converse_config(self.resume_token))
            sender = asyncio.ensure_future(
                self._send(Microphone(client, Encoder(self.input_format)))
            )
            try:
                await self._receive_once_started(client)
            except grpc.aio.AioRpcError as exc:
                self.result.status = exc.code().name
                self.result.status_details = exc.details() or ""
                self.result.retry_after_s = retry_after_s(exc)
            except TimeoutError:
                self.result.status = grpc.StatusCode.DEADLINE_EXCEEDED.name
                self.result.status_details = (
                    f"the gateway did not start the session in {options.start_timeout_s:g} s"
                )
            finally:
                await cancel_and_wait(sender)
        continued = self.move_asked or (
            broke_off(self.result.status, self.result.status_details) and bool(self.resume_token)
        )
        if continued:
            self.agent_parts.append(self.decoder.flush())
            self.decoder = Decoder(self.output_format)
        return not continued

    def _resume_point(self) -> int:
        """The chunk a continued call starts at (module doc): the first one the broken
        call sent that no agent frame answered (or the next one), moved back to the
        start of its speech, at most RESEND_MAX_S before now."""
        answered = self.answered_frames * FRAME_SAMPLES // self.chunk
        first = self.call_chunks[answered] if answered < len(self.call_chunks) else self.next_chunk
        oldest = max(0, int((self.now() - RESEND_MAX_S) * SAMPLE_RATE) // self.chunk)
        return min(self.speech.start_of_speech(max(first, oldest), oldest), self.next_chunk)

    def _behind(self, index: int) -> bool:
        """Chunk `index` was due more than CATCH_UP_S ago."""
        return self.now() - (index + 1) * self.chunk / SAMPLE_RATE > CATCH_UP_S

    def _done(self, input_end_t: float) -> bool:
        now = self.now()
        if now - input_end_t >= self.options.max_wait_s:
            return True
        quiet = not self.speaking and now - self.last_speaking_t >= self.options.tail_s
        answered = self.answer_spoken if self.options.wait_for_answer else self.answered
        return answered and quiet and now - input_end_t >= self.options.tail_s

    async def _send(self, mic: Microphone) -> None:
        """The WAV from `next_chunk` on, then silence until the agent is done.

        Audio goes only once the session started (kame_client/client.py says why).
        Chunks due in the meantime (a resumed call may wait seconds for its start:
        the gateway waits for the dead call's lease) are sent, not skipped; a
        caller behind real time catches up in quiet audio (module doc)."""
        client = mic.client
        await client.wait_started()
        audio = self.result.caller
        count = -(-len(audio) // self.chunk)
        if self.next_chunk == 0:
            self.record(CallerAudioStart())
        silence_kept = int(SILENCE_KEPT_S * SAMPLE_RATE) // self.chunk
        while self.next_chunk < count:
            index = self.next_chunk
            if self.speech.quiet_for(index) > silence_kept and self._behind(index):
                self.next_chunk += 1
                continue
            if not await self._send_chunk(
                mic, index, audio[index * self.chunk : (index + 1) * self.chunk]
            ):
                return  # the call is over: the reader has its status
            self.next_chunk += 1
        if self.options.say and self.said_t is None:
            if not await client.send_text(self.options.say):
                return
            self.said_t = self.now()
            self.record(CallerText(self.options.say))
        if self.input_end_t is None:
            self.record(CallerAudioStop())
            self.input_end_t = self.now()
        # The silence after the WAV starts now, however far behind the caller was.
        due = int(self.now() * SAMPLE_RATE) // self.chunk
        self.next_chunk = max(self.next_chunk, due - int(CATCH_UP_S * SAMPLE_RATE) // self.chunk)
        while not self._done(self.input_end_t):
            if not await self._send_chunk(mic, self.next_chunk, np.zeros(0, np.float32)):
                return
            self.next_chunk += 1
        await mic.flush()
        await client.done_writing()

    async def _send_chunk(self, mic: Microphone, index: int, samples: Samples) -> bool:
        """Chunk `index` (padded to a whole chunk) once its last sample has been
        spoken, on the caller's clock; False if the call is over."""
        if len(samples) < self.chunk:
            samples = np.concatenate([samples, np.zeros(self.chunk - len(samples), np.float32)])
        due_t = self.t0 + (index + 1) * self.chunk / SAMPLE_RATE
        if not await mic.send(samples, due_t):
            return False
        self.call_chunks.append(index)
        self.result.sent_t[index] = round(self.now(), 3)
        self.result.streamed_samples += len(samples)
        return True

    async def _receive_once_started(self, client: ConverseClient) -> None:
        """`_receive`, or TimeoutError if the session has not started (nor the call
        ended) within `start_timeout_s`."""
        receiving = asyncio.ensure_future(self._receive(client))
        try:
            await asyncio.wait_for(client.wait_started(receiving), self.options.start_timeout_s)
        except TimeoutError:
            await cancel_and_wait(receiving)
            raise
        await receiving

    async def _receive(self, client: ConverseClient) -> None:
        """The gateway's events into the result until the call ends, or the gateway
        asks to move it (Notice RECONNECT) and there is a token to move it with."""
        async for event in client.events():
            if isinstance(event, AgentAudio):
                self._on_audio(event)
                continue
            self.record(event)
            match event:
                case Started():
                    self.resume_token = client.session.resume_token
                    self.result.status, self.result.status_details = "OK", ""
                    self.result.started = event
                case UserFinal(text=text):
                    self.result.finals.append(text.strip())
                case AgentText(text=text, generation=generation):
                    self.result.agent_words.append(text)
                    if generation != 0 and self._caller_began():
                        self.answer_spoken = True
                case Turn():
                    self.result.turns.append(event)
                case Notice(kind=kind):
                    self.result.notices.append(event)
                    if kind == "RECONNECT" and self.resume_token:
                        self.move_asked = True
                        return

    def _on_audio(self, chunk: AgentAudio) -> None:
        """Agent audio into the result; the timeline gets where the agent starts and
        stops speaking."""
        if self.result.agent_first_chunk_t is None:
            self.result.agent_first_chunk_t = round(self.now(), 4)
        self.answered_frames = max(self.answered_frames, chunk.seq + 1)
        samples = self.decoder.decode(chunk.data)
        self.agent_parts.append(samples)
        self.result.agent_t.append(self.now() + np.arange(len(samples)) / SAMPLE_RATE)
        if chunk.speaking != self.speaking:
            self.speaking = chunk.speaking
            self.record(AgentAudioStart(chunk.seq) if self.speaking else AgentAudioStop(chunk.seq))
        if self.speaking:
            self.last_speaking_t = self.now()
            self.answered = self.answered or self._caller_began()

    def _caller_began(self) -> bool:
        """The caller has spoken (the WAV's speech began) or typed its message."""
        start = self.result.speech_start_s
        return (start is not None and self.now() > start) or self.said_t is not None


async def talk(audio_24k: Samples, options: TalkOptions) -> TalkResult:
    """Stream `audio_24k` (float32 mono at 24 kHz) through one Converse session."""
    return await _Conversation(audio_24k, options).run()
