"""A call placed the moment a starting stack's gateway accepts connections.

A phone, a browser or an app does not wait for `kame up` to print that the
stack is up: it calls as soon as the gateway's port answers. Such a call must
either be refused with a retry hint (the gateway is not ready yet: UNAVAILABLE,
"try again in N s") or be served right: the caller's whole question in the
transcript and an answer. Anything else lost the caller's words
(kame_cli/bench/startup_race.py runs this again and again; tests/e2e/test_cli_stack.py once).
"""

from __future__ import annotations

import asyncio
import re
import socket
import time

from kame_cli import talk
from kame_client.events import AgentText
from kame_common.audio import Samples
from kame_common.words import normalize_words

REFUSED, ANSWERED, LOST = "refused with a retry hint", "answered whole", "lost words"
# Share of the question's words the final transcript must hold to count as whole
# (Whisper tiny.en mishears a word of an espeak-ng voice now and then; losing the
# question's first 1.7 s, the failure this guards against, left 1 word of 7).
WHOLE_RECALL = 0.6
_RETRY_HINT = re.compile(r"try again in \d+ s")


def gateway_named(first_line: str) -> str:
    """The gateway address on `kame up`'s first line ("... (gateway HOST:PORT, ...")."""
    found = re.search(r"gateway ([\w.\-]+:\d+)", first_line)
    if found is None:
        raise ValueError(f"no gateway address in {first_line!r}")
    return found.group(1)


def accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def call_at_first_accept(
    address: str, audio: Samples, timeout_s: float = 120.0
) -> tuple[talk.TalkResult, float]:
    """Wait until `address` accepts a TCP connection, then stream `audio` as one
    call; the call's result and how long the wait for the port took."""
    began = time.monotonic()
    while not accepts(address):
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"the gateway at {address} never accepted a connection")
        time.sleep(0.02)
    waited_s = time.monotonic() - began
    options = talk.TalkOptions(gateway=address, tail_s=1.0, max_wait_s=20.0)
    return asyncio.run(talk.talk(audio, options)), waited_s


def recall(expected: str, heard: str) -> float:
    """The share of `expected`'s distinct words that `heard` holds."""
    wanted, got = set(normalize_words(expected)), set(normalize_words(heard))
    return sum(1 for word in wanted if word in got) / len(wanted) if wanted else 1.0


def outcome(result: talk.TalkResult, question: str) -> str:
    """REFUSED, ANSWERED or LOST (see the module docstring)."""
    if result.status == "UNAVAILABLE" and _RETRY_HINT.search(result.status_details):
        return REFUSED
    answered = any(said.event.generation for said in result.of(AgentText))
    heard_whole = any(recall(question, final) >= WHOLE_RECALL for final in result.finals)
    return ANSWERED if result.status == "OK" and answered and heard_whole else LOST
