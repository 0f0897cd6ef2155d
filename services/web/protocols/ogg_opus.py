"""A client's Ogg Opus stream, cut into whole pages and its audio counted before
any of it is decoded (moshi.py).

Opus packets are tiny for the audio they stand for (a TOC byte or two may say
120 ms), so the bytes of a message say little about what decoding it costs: the
count is read from each packet's TOC byte (RFC 6716, 3.1) and a message holding
too much audio is refused before the decoder sees it. Pages (RFC 3533) may span
messages; what a message leaves of a page waits for the next one.
"""

from __future__ import annotations

HEADER_BYTES = 27  # "OggS", version, flags, granule, serial, sequence, CRC, segment count
CONTINUED = 0x01  # the page's first packet began on the page before
# Frame sizes of each TOC configuration (RFC 6716, table 2), in samples at
# 48 kHz, Opus's own clock (whole numbers, so sums are exact): SILK, hybrid, CELT.
OPUS_RATE = 48000
SILK_FRAMES = (480, 960, 1920, 2880)  # 10, 20, 40, 60 ms
HYBRID_FRAMES = (480, 960)
CELT_FRAMES = (120, 240, 480, 960)  # 2.5, 5, 10, 20 ms
HEADER_PACKETS = (b"OpusHead", b"OpusTags")  # the stream's own headers: no audio


class AudioTooLong(ValueError):
    """The pages hold more audio than the caller allows at once."""


def packet_samples(start: bytes) -> int:
    """The audio of the Opus packet that begins with `start` (its first segment),
    in samples at 48 kHz."""
    if not start:
        raise ValueError("an empty Opus packet")
    toc = start[0]
    config = toc >> 3
    if config < 12:
        frame = SILK_FRAMES[config % 4]
    elif config < 16:
        frame = HYBRID_FRAMES[config % 2]
    else:
        frame = CELT_FRAMES[config % 4]
    code = toc & 0x03
    if code == 0:
        frames = 1
    elif code < 3:
        frames = 2
    elif len(start) > 1:
        frames = start[1] & 0x3F
    else:
        raise ValueError("an Opus packet of code 3 without its frame count")
    return frames * frame


class OggOpusPages:
    """Cuts a stream's bytes into whole pages and counts the audio in them."""

    def __init__(self) -> None:
        self.pending = bytearray()  # the start of a page still to come whole

    def take(self, data: bytes, most_s: float) -> tuple[bytes, float]:
        """The whole pages `data` completes and the seconds of audio they hold.
        ValueError if it is no Ogg Opus stream; AudioTooLong, and counting stops,
        past `most_s`."""
        self.pending += data
        pages = bytearray()
        samples, most = 0, int(most_s * OPUS_RATE)
        while (size := self._page_size()) is not None:
            page = bytes(self.pending[:size])
            del self.pending[:size]
            samples += self._page_samples(page, most - samples)
            pages += page
        return bytes(pages), samples / OPUS_RATE

    def _page_size(self) -> int | None:
        """The size of the page the pending bytes start with; None until it came whole."""
        if len(self.pending) < HEADER_BYTES:
            if not b"OggS".startswith(bytes(self.pending[:4])):
                raise ValueError("no Ogg page")
            return None
        if self.pending[:4] != b"OggS" or self.pending[4] != 0:
            raise ValueError("no Ogg page")
        segments = self.pending[26]
        if len(self.pending) < HEADER_BYTES + segments:
            return None
        size = HEADER_BYTES + segments + sum(self.pending[HEADER_BYTES : HEADER_BYTES + segments])
        return size if len(self.pending) >= size else None

    @staticmethod
    def _page_samples(page: bytes, most: int) -> int:
        segments = page[26]
        lacing = page[HEADER_BYTES : HEADER_BYTES + segments]
        offset = HEADER_BYTES + segments
        starts_packet = not page[5] & CONTINUED
        samples = 0
        for length in lacing:
            start = page[offset : offset + length]
            if starts_packet and not start.startswith(HEADER_PACKETS):
                samples += packet_samples(start)
                if samples > most:
                    raise AudioTooLong()
            starts_packet = length < 255  # a full segment: the packet goes on
            offset += length
        return samples
