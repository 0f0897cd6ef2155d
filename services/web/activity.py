"""What keeps a web session alive: the caller, not their socket.

The web endpoints pace silence to the gateway themselves (services/web/pacer.py)
and the page streams its microphone, silence included, so the gateway's own
idle timer never fires for a web caller. The bridge therefore times idleness
itself: a caller is active when they send audio with sound in it or text for
the agent. Pings, session updates, silent audio and other protocol chatter do
not count, so a client sending one tiny message every few minutes holds no
call for long (the adapter's `idle_timeout_s` then ends it with the
protocol's error).
"""

from __future__ import annotations

import numpy as np

from kame_client.client import SendText
from kame_common.audio import alaw_decode, mulaw_decode, rms_dbfs
from services.web.protocols.adapter import Actions
from services.web.protocols.realtime_config import CODINGS, AudioCoding

# Quieter than this is no sound: a muted or unplugged microphone, digital
# silence, the faint hiss of a line (speech is around -30 to -15 dBFS).
SOUND_DBFS = -55.0
PCM16 = CODINGS["audio/pcm"]
DECODERS = {"audio/pcmu": mulaw_decode, "audio/pcma": alaw_decode}


def has_sound(audio: bytes, coding: AudioCoding = PCM16) -> bool:
    """Whether caller audio in `coding` (PCM16 whatever its rate, or G.711) holds sound."""
    pcm = DECODERS.get(coding.name, bytes)(audio)
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float32)
    return rms_dbfs(samples / np.float32(32768)) > SOUND_DBFS


def caller_active(actions: Actions, coding: AudioCoding = PCM16) -> bool:
    """Whether what the adapter made of a client's message is the caller's doing:
    audio with sound in it, or text for the agent."""
    said = any(
        isinstance(request, SendText) and request.text.strip() for request in actions.requests
    )
    return said or (bool(actions.audio) and has_sound(actions.audio, coding))
