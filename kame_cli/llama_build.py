"""Build llama.cpp's own server (`llama-server`) from the llama-cpp-python sdist.

`kame llm-server --engine llama-server` serves the embedded model with
llama.cpp's `llama-server`: it decodes several requests at once (parallel
slots, continuous batching) and drops a request the moment its client goes
away, where llama-cpp-python's Python server runs one request at a time. No
PyPI package ships the binary, but the llama-cpp-python sdist vendors the
llama.cpp source it binds, so the server is compiled from the sdist of the
llama-cpp-python version that is installed (pinned in constraints.txt): one
llama.cpp, one source, no other download.

The binary is kept in a per-version cache folder (like pip's wheel cache), so
only the first `make setup` on a machine compiles it (about 10 minutes on two
cores); later runs find it and return at once.

Usage: python -m kame_cli.llama_build [--jobs N] [--portable] [--force] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path, PurePosixPath

SDIST_PACKAGE = "llama-cpp-python"
SIMPLE_INDEX = "https://pypi.org/simple/llama-cpp-python/"
# The binary can be named explicitly (an image, a build of one's own).
BINARY_ENV = "KAME_LLAMA_SERVER"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary to cache and copy
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    # The web UI would be fetched from a hub; the oracle only needs the API.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
]
# -march=native of the build machine, without AMX: llama.cpp's AMX matmul (compiled in when
# the compiler targets an AMX CPU) segfaults on Gemma 3 270M (seen on a Sapphire Rapids VM
# that grants the tile state), in llama-server and llama-cpp-python alike. The Makefile passes
# the same flags to the llama-cpp-python build (a test checks that they agree).
NATIVE_FLAGS = [
    "-DGGML_NATIVE=ON",
    "-DCMAKE_C_FLAGS=-mno-amx-int8",
    "-DCMAKE_CXX_FLAGS=-mno-amx-int8",
]
# Portable (an image that runs elsewhere): the baseline ggml picks without native (AVX2).
PORTABLE_FLAGS = ["-DGGML_NATIVE=OFF"]
# In the cache path, so that a build made with other flags is never picked up.
BUILD_TAG = "no-amx"


class BuildError(RuntimeError):
    pass


def installed_version() -> str:
    """The llama-cpp-python version installed here: the sdist to build from."""
    try:
        return metadata.version(SDIST_PACKAGE)
    except metadata.PackageNotFoundError:
        raise BuildError(f"{SDIST_PACKAGE} is not installed (make setup)") from None


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "kame" / "llama-server"


def cached_binary(version: str) -> Path:
    return cache_dir() / f"{version}-{BUILD_TAG}" / "llama-server"


def binary_path() -> Path:
    """Where `kame llm-server` finds llama-server: $KAME_LLAMA_SERVER, else the
    cached build for the installed llama-cpp-python. BuildError if there is none."""
    named = os.environ.get(BINARY_ENV)
    if named:
        path = Path(named)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BuildError(f"{BINARY_ENV}={named} is not an executable file")
        return path
    path = cached_binary(installed_version())
    if not path.is_file():
        raise BuildError(
            f"llama-server is not built ({path} is missing): run make setup "
            "(or python -m kame_cli.llama_build)"
        )
    return path


def sdist_url(version: str) -> tuple[str, str]:
    """(URL, sha256) of the sdist, from PyPI's JSON simple index (PEP 691)."""
    request = urllib.request.Request(
        SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    name = f"llama_cpp_python-{version}.tar.gz"
    for entry in files:
        if entry["filename"] == name:
            return entry["url"], entry["hashes"]["sha256"]
    raise BuildError(f"PyPI lists no sdist {name}")


def download(url: str, sha256: str, target: Path) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as response, target.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise BuildError(f"{url}: sha256 {digest.hexdigest()} is not the index's {sha256}")


def extract_llama_cpp(sdist: Path, into: Path, version: str) -> Path:
    """Unpack the vendored llama.cpp tree only; returns its root."""
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise BuildError(f"{sdist.name} vendors no llama.cpp")
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, members=members, filter="data")
        else:  # Python < 3.11.4 (Debian bookworm's 3.11.2): the same refusals, by hand
            check_members(members)
            archive.extractall(into, members=members)
    return into / prefix


def check_members(members: list[tarfile.TarInfo]) -> None:
    """BuildError unless every member is a file, folder or link that stays inside the
    tree it unpacks into (what tarfile's "data" filter refuses, it refuses too)."""
    for member in members:
        path = PurePosixPath(member.name)
        inside = not path.is_absolute() and ".." not in path.parts
        if member.issym() or member.islnk():
            target = PurePosixPath(member.linkname)
            base = path.parent if member.issym() else PurePosixPath()
            inside = inside and not target.is_absolute() and _stays_inside(base / target)
        elif not (member.isfile() or member.isdir()):
            inside = False
        if not inside:
            raise BuildError(f"the sdist holds {member.name!r}, which would unpack outside it")


def _stays_inside(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return False
    return True


def run_step(title: str, command: list[str], log: Path) -> None:
    print(f"llama-server build: {title} (log: {log})", flush=True)
    with log.open("a") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    if status != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise BuildError(f"{title} failed with status {status}:\n{tail}")


def build(version: str, jobs: int, portable: bool) -> Path:
    target = cached_binary(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    log = target.parent / "build.log"
    log.write_text("")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kame-llama-build-") as work:
        url, sha256 = sdist_url(version)
        sdist = Path(work) / Path(url.split("#")[0]).name
        print(f"llama-server build: downloading {sdist.name}", flush=True)
        download(url, sha256, sdist)
        source = extract_llama_cpp(sdist, Path(work), version)
        sdist.unlink()
        build_dir = Path(work) / "build"
        target_flags = PORTABLE_FLAGS if portable else NATIVE_FLAGS
        run_step(
            "configuring",
            ["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS, *target_flags],
            log,
        )
        run_step(
            f"compiling with {jobs} jobs (about 10 minutes on two cores)",
            ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
            log,
        )
        built = build_dir / "bin" / "llama-server"
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.replace(target)  # atomic: a half-copied binary is never found
    print(f"llama-server build: {target} ready in {time.monotonic() - started:.0f} s", flush=True)
    return target


BINDING_CHECK = """
from llama_cpp import Llama
from kame_common.models import gemma_270m_gguf_path
llm = Llama(str(gemma_270m_gguf_path()), n_ctx=256, n_threads=1, verbose=False)
print(llm("The capital of France is", max_tokens=2)["choices"][0]["text"])
"""


def check_binding() -> None:
    """BuildError unless llama-cpp-python generates with the embedded model here. A wheel
    compiled with other flags (pip's cache keeps the first build of a version, whatever
    CMAKE_ARGS said) may crash on this CPU; this says so at setup, not in a test."""
    result = subprocess.run(
        [sys.executable, "-c", BINDING_CHECK], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise BuildError(
            f"llama-cpp-python failed to generate here (status {result.returncode}); if pip "
            "reused a wheel built with other flags: pip cache remove llama_cpp_python, "
            "rm -r .venv, make setup"
        )
    print("llama-cpp-python: generates with the embedded model", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compile jobs")
    parser.add_argument(
        "--portable", action="store_true", help="no -march=native (for an image run elsewhere)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if one is cached")
    parser.add_argument(
        "--check", action="store_true", help="then generate a token with llama-cpp-python"
    )
    args = parser.parse_args(argv)
    try:
        version = installed_version()
        target = cached_binary(version)
        if target.is_file() and not args.force:
            print(f"llama-server build: {target} is already built", flush=True)
        else:
            if shutil.which("cmake") is None:
                raise BuildError("cmake is not installed (apt-get install cmake)")
            build(version, args.jobs, args.portable)
        if args.check:
            check_binding()
    except BuildError as exc:
        print(f"llama-server build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
