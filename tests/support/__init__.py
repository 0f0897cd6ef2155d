"""Helpers every test module may use."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import inspect
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc

from kame_common import store
from kame_common.server import ServiceRuntime


@contextlib.contextmanager
def served_llm(**launch_options: Any) -> Iterator[str]:
    """Base URL of a real embedded LLM server (kame_cli.llm_server.launch on a free
    port, Gemma 3 270M), stopped when the block ends."""
    from kame_cli import llm_server
    from kame_cli.stack_options import free_ports

    port = free_ports(1)[0]
    process = llm_server.launch(port=port, quiet=True, **launch_options)
    url = llm_server.base_url("127.0.0.1", port)
    try:
        llm_server.wait_ready(url, process, timeout_s=120)
        yield url
    finally:
        llm_server.stop(process)


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
) -> None:
    """Poll `condition` (plain or async) until it is true; AssertionError naming
    `what` if it is still false after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)


def words_of(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return re.findall(r"[a-z0-9']+", text.lower())


# How alike two spellings must be (difflib's ratio) for a heard word to count as
# the expected one: "capitol" for "capital" (0.86) counts, "harris" for "paris"
# (0.73) does not. Short words must match exactly ("off" for "of" is 0.8).
SAME_WORD_RATIO = 0.8
SAME_WORD_MIN_LETTERS = 5


def word_recall(expected: str, heard: str) -> float:
    """The share of `expected`'s distinct words that are in `heard`, a word
    spelled nearly the same counting as heard (Whisper picks between spellings of
    one sound: "capitol" for "capital"). Speech recognition of synthesized audio
    on a loaded CPU mishears a word now and then (Whisper tiny.en hears piper's
    "Paris" as "Harris"), so tests that check what was recognized compare a
    share against a threshold, never one exact word."""
    wanted = set(words_of(expected))
    got = set(words_of(heard))
    if not wanted:
        return 1.0
    return sum(1 for word in wanted if _heard(word, got)) / len(wanted)


def _heard(word: str, heard: set[str]) -> bool:
    if word in heard:
        return True
    return len(word) >= SAME_WORD_MIN_LETTERS and any(
        difflib.SequenceMatcher(None, word, other).ratio() >= SAME_WORD_RATIO for other in heard
    )


# How alike, letter for letter, the agent's words and what our STT heard in its
# voice may be for the voice to count as saying those words where word recall
# says no. Whisper on a loaded CPU splits and joins words ("capital is" heard as
# "capitalist") and respells names the agent made up ("Quorvan" as "corbin"):
# 0.69 in one full run, where word recall gave 3 of 7. Unrelated speech scores
# 0.1-0.4 (a hold phrase for an answer) and an answer cut in half about 0.55.
VOICE_SAYS_RATIO = 0.6
VOICE_SAYS_RECALL = 0.5  # or half of the words, as word_recall counts them


def letter_similarity(expected: str, heard: str) -> float:
    """difflib's ratio of the two texts' letters and digits, case, spaces and
    punctuation dropped: how much of the sound was heard, whatever the word
    boundaries Whisper chose."""
    return difflib.SequenceMatcher(
        None, "".join(words_of(expected)), "".join(words_of(heard)), autojunk=False
    ).ratio()


def voice_says(words: str, heard: str) -> bool:
    """Whether `heard`, the transcript of a voice, is that voice saying `words`:
    half of the words are in it (the voice may go on past the words a client
    collected: word recall does not count what `heard` has beyond them), or the
    letters are alike (Whisper moved the word boundaries)."""
    return (
        word_recall(words, heard) >= VOICE_SAYS_RECALL
        or letter_similarity(words, heard) >= VOICE_SAYS_RATIO
    )


ECHO_SERVICE = "kametest.Echo"


def echo_handler(runtime: ServiceRuntime) -> grpc.GenericRpcHandler:
    """`kametest.Echo/Chat`: a bidirectional echo (raw bytes) that holds one of
    `runtime`'s sessions while its stream is open, for tests of the runtime itself."""

    async def chat(
        request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async with runtime.session(context):
            async for message in request_iterator:
                yield message

    return grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {"Chat": grpc.stream_stream_rpc_method_handler(chat, lambda b: b, lambda b: b)},
    )


class Blackhole:
    """A TCP proxy to `target` that can turn into a black hole. Until `freeze()` it
    forwards bytes both ways; from then on it moves no byte either way and holds
    every connection open (no FIN, no RST), old and new alike: a Redis that hangs,
    a peer gone behind a NAT, a node dropped off the network. Without a target it
    is frozen from the start: a server that accepts connections and never answers.
    Runs on threads of its own, so processes, blocking code and the test's event
    loop can all use it."""

    def __init__(self, target: str | None = None) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.accepted = 0
        self._sockets: list[socket.socket] = [self._listener]
        self._frozen = threading.Event()
        if target is None:
            self._frozen.set()
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._accept_forever, daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self._frozen.set()

    def _accept_forever(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            self._sockets.append(client)
            if self._frozen.is_set() or self._target is None:
                continue  # held open, never read, never answered
            host, port = self._target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            self._sockets.append(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.05)
        while not self._stopped.is_set() and not self._frozen.is_set():
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if self._frozen.is_set():
                return  # what was in flight is lost, like the rest
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            with contextlib.suppress(OSError):
                sink.sendall(data)

    def close(self) -> None:
        self._stopped.set()
        self._threads[0].join()  # no thread starts after the accept loop ended
        for thread in self._threads[1:]:
            thread.join()
        for sock in self._sockets:
            sock.close()


async def session_record(redis_url: str, session_id: str) -> dict[str, str]:
    """A gateway's Redis record of a session."""
    client = store.connect(redis_url)
    try:
        return await store.SessionStore(client).get_session(session_id)
    finally:
        await client.aclose()


async def conversation(redis_url: str, session_id: str) -> list[dict[str, Any]]:
    """A session's conversation as Redis holds it: [{role, text, ts}]."""
    client = store.connect(redis_url)
    try:
        return await store.SessionStore(client).conversation(session_id)
    finally:
        await client.aclose()
