"""Fixtures shared by every test: the real Redis, the piper voice that makes
caller speech, and unique ids so tests never share Redis keys."""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kame_cli.stack_options import FREE_PORT_RANGE_ENV, free_port_range
from kame_common import store
from kame_common.voice import Voice, load_voice
from tests.gateway.fakes import start_fakes
from tests.support import served_llm
from tests.support.redis import tests_redis, with_db
from tests.support.tiers import TIER_NAMES, no_network, tier_of

FAKES_DB = 10
ESPEAK_QUESTIONS = Path(__file__).resolve().parents[1] / "bench/questions/espeak/questions.json"


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker picks free ports (kame_cli.stack_options.free_ports) in its
    own share of the range, and the stacks it starts inherit it: two workers that
    each pick a port and bind it a few seconds later never pick the same one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    index, count = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    low, high = free_port_range()
    share = (high - low) // count
    os.environ[FREE_PORT_RANGE_ENV] = f"{low + index * share}-{low + (index + 1) * share}"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Out of the garbage collector's reach: what importing the stack and its models
    made (about half a million objects). Many tests run real services in this one
    process, and a full collection that scans all of it stalls their event loop
    for half a second or more on a loaded 2-core machine: late frames that the
    service, in a process of its own, would not have."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker from tests/support/tiers.py (before `-m`
    selects on it); a module that TIERS does not cover stops the run, named."""
    unregistered: set[str] = set()
    for item in items:
        if any(item.get_closest_marker(name) for name in TIER_NAMES):
            continue
        module = item.path.relative_to(config.rootpath).as_posix()
        tier = tier_of(module)
        if tier is None:
            unregistered.add(module)
        else:
            item.add_marker(getattr(pytest.mark, tier))
    if unregistered:
        raise pytest.UsageError(
            "test modules with no tier: "
            + ", ".join(sorted(unregistered))
            + " (add each to TIERS in tests/support/tiers.py; docs/testing.md says which tier)"
        )


@pytest.fixture(autouse=True)
def _unit_tests_stay_off_the_network(request: pytest.FixtureRequest) -> Iterator[None]:
    """A unit test that reaches for the network fails (tests/support/tiers.py)."""
    if request.node.get_closest_marker("unit") is None:
        yield
    else:
        yield from no_network()


# After the last test, how long the interpreter may take to exit.
EXIT_GRACE_S = 60.0


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread some test left stuck (a to_thread call that never returns) keeps
    the interpreter from exiting after the summary: once CI sat an hour on one.
    If the exit takes longer than EXIT_GRACE_S, every thread's stack goes to
    stderr (to find it) and the process ends with pytest's own status."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker waits for the controller to close it: the controller watches
    status = int(getattr(config, "_kame_exit_status", 1))

    def watch() -> None:
        time.sleep(EXIT_GRACE_S)
        print(
            f"tests: the interpreter did not exit {EXIT_GRACE_S:g} s after the last test; "
            "threads still running:",
            file=sys.__stderr__,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        os._exit(status)

    threading.Thread(target=watch, name="exit-watchdog", daemon=True).start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._kame_exit_status = exitstatus  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """This process's Redis (tests/support/redis.py): CI's, or an xdist worker's own."""
    with tests_redis() as url:
        yield url


@pytest.fixture
async def redis_client(redis_url):
    client = store.connect(redis_url)
    await client.ping()
    yield client
    await client.aclose()


@pytest.fixture
def session_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def fakes(redis_url):
    """Scripted frontend, stt and oracle on loopback (tests/gateway/fakes.py), and
    real gateways in front of them (`await fakes.gateway(**settings)`), whose
    session records go to a Redis database no frontend publishes to (so the
    gateway uses its frontend_address, the fake)."""
    made = await start_fakes(with_db(redis_url, FAKES_DB))
    yield made
    await made.stop()


@pytest.fixture(scope="session")
def voice() -> Voice:
    """The piper voice with its random noise off, so a text always sounds the same:
    a test must not pass or fail on piper's draw of a pause (at random a comma,
    or once in a full run a plain question, came out long enough to end the
    caller's turn). Callers that vary come from the espeak-ng question set."""
    return load_voice(varied=False)


@pytest.fixture(scope="session")
def llm_url() -> Iterator[str]:
    """Base URL of a real llama.cpp server serving the embedded Gemma 3 270M."""
    # One thread: the two cores are shared with whisper, piper and the test
    # itself, and one llama.cpp thread degrades far less under contention.
    with served_llm(threads=1) as url:
        yield url


@pytest.fixture(scope="session")
def transcribe():
    """transcribe(samples at 24 kHz) -> lower-case text, heard by the STT engine
    (embedded Whisper tiny.en), to check what an agent said."""
    from services.stt.config import SttSettings
    from services.stt.engine import SttEngine

    engine = SttEngine(SttSettings())
    yield lambda samples: engine.transcribe_clip(samples).lower()
    engine.close()


@pytest.fixture(scope="session")
def speak(voice):
    """speak(text) -> float32 speech at 24 kHz, synthesized once per text."""
    cache: dict[str, np.ndarray] = {}

    def _speak(text: str) -> np.ndarray:
        if text not in cache:
            cache[text] = voice.synthesize(text)
        return cache[text]

    return _speak


@pytest.fixture(scope="session")
def espeak_questions():
    """Callers that do not sound like piper: the bench's factual questions spoken by
    espeak-ng in 13 English voices, speeds and pitches (bench/questions/espeak,
    made by kame_cli/bench/make_questions.py), as kame bench loads them (24 kHz)."""
    from kame_cli.bench.questions import load_questions

    return load_questions(ESPEAK_QUESTIONS)
