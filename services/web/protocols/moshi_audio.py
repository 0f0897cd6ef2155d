"""The audio and words of a Moshi-protocol chat (moshi.py): the caller's Ogg
Opus stream decoded for the gateway, the agent's coded in moshi's frames, and
the agent's words let out with the audio they start in."""

from __future__ import annotations

from collections import deque

import sphn

from kame_common.audio import float_to_pcm16, pcm16_to_float
from services.web.protocols.ogg_opus import AudioTooLong, OggOpusPages
from services.web.protocols.realtime_config import CODINGS

PCM = CODINGS["audio/pcm"]  # PCM16 at 24 kHz: Moshi's rate, which the gateway takes as is
FRAME_BYTES = 1920 * PCM.bytes_per_sample  # 80 ms, the Opus frame moshi's server codes
# A word whose start is further ahead of the agent's audio than this is sent at
# once: its position is on another clock than the audio's, and waiting for it
# would hold the words back for good.
MAX_WORD_LEAD_S = 3.0
MAX_AUDIO_MESSAGE_S = 2.0  # the most one message may carry (sphn's decoder takes 5 s a call)


class CallerAudio:
    """The caller's Ogg Opus stream -> PCM16 at 24 kHz, a message's audio counted
    before it is decoded."""

    def __init__(self) -> None:
        self.pages = OggOpusPages()
        self.reader = sphn.OpusStreamReader(PCM.rate)

    def whole_pages(self, data: bytes) -> tuple[bytes, float]:
        """The whole pages `data` completes and their seconds of audio; ValueError
        if it is no Ogg Opus stream, AudioTooLong past MAX_AUDIO_MESSAGE_S."""
        try:
            return self.pages.take(data, MAX_AUDIO_MESSAGE_S)
        except AudioTooLong:
            raise
        except ValueError as exc:
            raise ValueError(f"audio is not an Ogg Opus stream ({exc})") from None

    def pcm16(self, pages: bytes) -> bytes:
        """The PCM16 these whole pages hold; ValueError if the codec refuses them."""
        try:
            samples = self.reader.append_bytes(pages)
        except Exception as exc:  # the codec's own errors, of its own types
            raise ValueError(f"audio is not an Ogg Opus stream ({exc})") from None
        return float_to_pcm16(samples)


class AgentOpus:
    """The agent's PCM16 at 24 kHz -> Ogg Opus pages, in 80 ms frames."""

    def __init__(self) -> None:
        self.writer = sphn.OpusStreamWriter(PCM.rate)
        self.pending = bytearray()

    def pages(self, pcm: bytes) -> bytes:
        """The pages `pcm` completes (b"" while less than a frame waits)."""
        self.pending += pcm
        pages = []
        while len(self.pending) >= FRAME_BYTES:
            frame = bytes(self.pending[:FRAME_BYTES])
            del self.pending[:FRAME_BYTES]
            pages.append(self.writer.append_pcm(pcm16_to_float(frame)))
        return b"".join(pages)


class AgentWords:
    """The agent's words, each let out once the agent's audio reaches its start
    (the gateway may send words ahead of their audio), spaced as moshi's are."""

    def __init__(self) -> None:
        self.position_s = 0.0  # how much agent audio came
        self.waiting: deque[tuple[float, str]] = deque()

    def heard(self, text: str, start_s: float) -> list[str]:
        """`text` starts `start_s` into the agent's audio: the words due now."""
        if text.strip():
            self.waiting.append((start_s, text if text[0].isspace() else " " + text))
        return self._due()

    def advanced(self, seconds: float) -> list[str]:
        """`seconds` more of the agent's audio came: the words due now."""
        self.position_s += seconds
        return self._due()

    def cut(self) -> None:
        """A barge-in: the words not yet reached will not be spoken."""
        self.waiting.clear()

    def _due(self) -> list[str]:
        due = []
        while self.waiting:
            start_s, text = self.waiting[0]
            if self.position_s < start_s <= self.position_s + MAX_WORD_LEAD_S:
                break
            due.append(text)
            self.waiting.popleft()
        return due
