"""A virtual environment of its own for each third-party client the tests run
(Pipecat, the OpenAI Agents SDK, LiveKit Agents, ...), installed the way its
users install it, so that a client's pins (Pipecat's protobuf 6) never meet the
stack's (protobuf 7).

`client_venv(name)` returns the python of the venv that
`tests/clients/requirements/<name>.lock` describes: the full `pip freeze` of a
venv where `<name>.txt` (the client's top-level pins) was installed, so that
every build installs the same versions without the resolver choosing anew.
Venvs are cached in ~/.cache/kame/client-venvs/<name>-<sha256 of the lock>/
(KAME_CLIENT_VENVS moves the folder): a changed lock makes a new one, and a
stamp file written last marks one as complete, so a build that died half-way is
redone. An fcntl lock per venv keeps two pytest processes from building the
same one at once. Progress goes to stdout (pytest -s shows it) and, with pip's
output, to <venv>.log beside the venv.

To change a client's version: edit <name>.txt, install it into a fresh
python3.11 venv, and write its `pip freeze` to <name>.lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REQUIREMENTS = Path(__file__).parent / "requirements"
DEFAULT_CACHE = Path.home() / ".cache" / "kame" / "client-venvs"
STAMP = ".kame-installed"
INSTALL_TIMEOUT_S = 1200.0  # pip downloads on a slow network; a hung pip must not hang the tests


class ClientVenvFailed(RuntimeError):
    """A client's venv could not be made; the message names the command and the log."""


def client_venv(
    name: str,
    *,
    requirements: Path = REQUIREMENTS,
    cache: Path | None = None,
    base_python: str | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """The python of `name`'s venv, built from `<requirements>/<name>.lock` if no
    complete one is cached."""
    lock_file = requirements / f"{name}.lock"
    if not lock_file.is_file():
        raise ClientVenvFailed(f"no lock for client {name!r}: {lock_file} is missing")
    home = venv_home(name, lock_file, cache or cache_root())
    python = home / "bin" / "python"
    if (home / STAMP).exists():
        return python
    home.parent.mkdir(parents=True, exist_ok=True)
    log_path = home.with_name(home.name + ".log")
    with exclusive(home.with_name(home.name + ".building")):
        if (home / STAMP).exists():  # another process built it while we waited
            return python
        build(home, lock_file, base_python or default_python(), Progress(log_path, say))
    return python


def cache_root() -> Path:
    return Path(os.environ.get("KAME_CLIENT_VENVS", DEFAULT_CACHE))


def venv_home(name: str, lock_file: Path, cache: Path) -> Path:
    digest = hashlib.sha256(lock_file.read_bytes()).hexdigest()[:12]
    return cache / f"{name}-{digest}"


def default_python() -> str:
    """python3.11 as the clients' users would have it; else this interpreter (3.11 too)."""
    return shutil.which("python3.11") or sys.executable


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Progress:
    """Lines to stdout and the build's log file; pip's own output to the log only."""

    def __init__(self, log_path: Path, say: Callable[[str], None] | None) -> None:
        self.log_path = log_path
        self.say = say or (lambda line: print(line, flush=True))
        self.log_path.write_text("")

    def line(self, text: str) -> None:
        self.say(f"client venv: {text}")
        with open(self.log_path, "a") as log:
            log.write(f"# {text}\n")

    def run(self, command: list[str]) -> None:
        self.line("$ " + " ".join(command))
        with open(self.log_path, "a") as log:
            try:
                done = subprocess.run(
                    command, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                raise ClientVenvFailed(self.failure(command, "timed out")) from None
        if done.returncode != 0:
            raise ClientVenvFailed(self.failure(command, f"exited {done.returncode}"))

    def failure(self, command: list[str], how: str) -> str:
        tail = self.log_path.read_text().splitlines()[-15:]
        return "\n".join([f"`{' '.join(command)}` {how}; its output is in {self.log_path}:", *tail])


def build(home: Path, lock_file: Path, base_python: str, progress: Progress) -> None:
    """A fresh venv at `home` with the lock installed, then the stamp."""
    started = time.monotonic()
    if home.exists():  # left half-built by a process that died
        progress.line(f"removing the unfinished {home}")
        shutil.rmtree(home)
    progress.line(f"building {home} from {lock_file} (first run: pip downloads the client)")
    progress.run([base_python, "-m", "venv", str(home)])
    python = str(home / "bin" / "python")
    progress.run([python, "-m", "pip", "install", "--no-input", "-r", str(lock_file)])
    elapsed = time.monotonic() - started
    (home / STAMP).write_text(f"{lock_file.name} installed in {elapsed:.0f} s\n")
    progress.line(f"{home.name} ready in {elapsed:.0f} s")
