"""`kame llm-server --engine llama-server` (llama.cpp's own server, built by
kame_cli.llama_build): requests are decoded side by side, and a stream whose
client leaves stops costing the server work at once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import tarfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from kame_cli import llama_build, llm_server
from services.oracle.prompts import gemma_prefix
from tests.support import served_llm, wait_until


@pytest.fixture(scope="module")
def llm_url():
    """This module's own server: llama-server with two slots (the suite's is the default engine)."""
    with served_llm(threads=1, engine=llm_server.LLAMA_SERVER, parallel=2) as url:
        yield url


def prompt(question: str) -> str:
    # A tag nobody has sent before: every request pays its own prompt, none is cached.
    return f"{gemma_prefix()}User: ({uuid.uuid4().hex}) {question}\nAssistant:"


async def stream_times(client: AsyncOpenAI, text: str, max_tokens: int) -> list[float]:
    """Arrival times of every streamed chunk."""
    stream = await client.completions.create(
        model=llm_server.EMBEDDED_ALIAS,
        prompt=text,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
    )
    times = []
    async with stream:
        async for _chunk in stream:
            times.append(time.monotonic())
    return times


def busy_slots(url: str) -> list[dict]:
    root = url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/slots", timeout=5) as response:
        return [slot for slot in json.load(response) if slot["is_processing"]]


async def test_two_requests_are_decoded_side_by_side(llm_url):
    async with AsyncOpenAI(base_url=llm_url, api_key="unused", max_retries=0) as client:
        first, second = await asyncio.gather(
            stream_times(client, prompt("Tell me a long story about a dragon."), 48),
            stream_times(client, prompt("Tell me a long story about a knight."), 48),
        )
    assert len(first) > 8 and len(second) > 8
    # One at a time, one stream would end before the other's first token.
    assert second[0] < first[-1] and first[0] < second[-1]


async def test_a_stream_whose_client_leaves_stops_at_once(llm_url):
    async with AsyncOpenAI(base_url=llm_url, api_key="unused", max_retries=0) as client:
        stream = await client.completions.create(
            model=llm_server.EMBEDDED_ALIAS,
            prompt=prompt("Count from one to five hundred, one number per line."),
            max_tokens=400,
            temperature=0.0,
            stream=True,
        )
        async with stream:
            async for _chunk in stream:
                break  # leaving the block closes the connection
        left_at = time.monotonic()
        await wait_until(lambda: not busy_slots(llm_url), "every slot idle", 5, 0.05)
        stopped_after = time.monotonic() - left_at
    # 400 tokens take about 10 s here on one thread; a server that noticed stops within a
    # token or two (2 s leaves room for a loaded machine).
    assert stopped_after < 2.0


def test_a_missing_build_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.delenv(llama_build.BINARY_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(llama_build.BuildError, match=r"llama-server is not built .* make setup"):
        llama_build.binary_path()
    with pytest.raises(llm_server.LlmServerError, match="make setup"):
        llm_server.launch(quiet=True, engine=llm_server.LLAMA_SERVER)


def test_a_named_binary_must_be_executable(monkeypatch, tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setenv(llama_build.BINARY_ENV, str(binary))
    with pytest.raises(llama_build.BuildError, match="is not an executable file"):
        llama_build.binary_path()
    os.chmod(binary, binary.stat().st_mode | stat.S_IXUSR)
    assert llama_build.binary_path() == binary


def test_the_cached_build_belongs_to_the_installed_llama_cpp_python():
    # make setup built it: the same llama.cpp as the Python binding (one source, one version).
    path = llama_build.binary_path()
    assert path == llama_build.cached_binary(llama_build.installed_version())
    assert os.access(path, os.X_OK)


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, link
    return member


def test_an_sdist_member_that_would_unpack_outside_is_refused_without_the_data_filter():
    """The check used where tarfile has no "data" filter (Python < 3.11.4, as in Debian
    bookworm's images) refuses what that filter refuses and keeps a normal tree."""
    tree = "llama_cpp_python-1/vendor/llama.cpp"
    llama_build.check_members(
        [
            tar_member(f"{tree}/CMakeLists.txt"),
            tar_member(f"{tree}/tools", tarfile.DIRTYPE),
            tar_member(f"{tree}/tools/link", tarfile.SYMTYPE, "../CMakeLists.txt"),
        ]
    )
    for bad in (
        tar_member(f"{tree}/../../../etc/passwd"),
        tar_member("/etc/passwd"),
        tar_member(f"{tree}/up", tarfile.SYMTYPE, "../../../../../etc"),
        tar_member(f"{tree}/abs", tarfile.SYMTYPE, "/etc/passwd"),
        tar_member(f"{tree}/device", tarfile.CHRTYPE),
    ):
        with pytest.raises(llama_build.BuildError, match="would unpack outside"):
            llama_build.check_members([bad])


def test_make_setup_compiles_llama_cpp_python_with_the_flags_of_llama_server():
    """One llama.cpp, compiled twice (the binding by pip, the server here): both for this CPU
    without AMX, whose kernels crash on the embedded model."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    (flags,) = re.findall(r"^LLAMA_CMAKE_ARGS := (.+)$", makefile, re.M)
    assert flags.split() == llama_build.NATIVE_FLAGS
    assert 'CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install' in makefile
