"""tests/clients/venvs.py's caching, without the network: locks that install
nothing (or a wheel that is not there), in a cache under tmp_path."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.clients.venvs import STAMP, ClientVenvFailed, client_venv, venv_home


def write_lock(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / f"{name}.lock"
    lock.write_text(text)
    return lock


def test_two_processes_build_a_venv_once_and_later_calls_reuse_it(tmp_path):
    requirements, cache = tmp_path / "requirements", tmp_path / "cache"
    write_lock(requirements, "tiny", "# installs nothing\n")
    said: list[str] = []

    def make() -> Path:
        return client_venv("tiny", requirements=requirements, cache=cache, say=said.append)

    with ThreadPoolExecutor(2) as pool:  # flock excludes two open files even in one process
        first, second = pool.map(lambda _: make(), range(2))

    assert first == second
    assert sum("building" in line for line in said) == 1, said
    assert (first.parent.parent / STAMP).exists()
    ran = subprocess.run([first, "-c", "import sys; print(sys.prefix)"], capture_output=True)
    assert ran.stdout.decode().strip() == str(first.parent.parent)
    said.clear()
    assert make() == first
    assert said == []  # reused: nothing built, nothing said


def test_a_changed_lock_gets_a_new_venv_and_an_unfinished_one_is_rebuilt(tmp_path):
    requirements, cache = tmp_path / "requirements", tmp_path / "cache"
    before = venv_home("tiny", write_lock(requirements, "tiny", "# one\n"), cache)
    lock = write_lock(requirements, "tiny", "# two\n")
    home = venv_home("tiny", lock, cache)
    assert home != before and home.name.startswith("tiny-")
    (home / "bin").mkdir(parents=True)  # what a build killed half-way leaves: no stamp
    (home / "half-built").write_text("")

    python = client_venv("tiny", requirements=requirements, cache=cache, say=lambda _: None)

    assert python == home / "bin" / "python"
    assert (home / STAMP).exists() and not (home / "half-built").exists()
    assert "removing the unfinished" in home.with_name(home.name + ".log").read_text()


def test_a_failed_install_names_the_pip_command_and_its_log_and_leaves_no_stamp(tmp_path):
    requirements, cache = tmp_path / "requirements", tmp_path / "cache"
    lock = write_lock(requirements, "broken", "./not-here-1.0-py3-none-any.whl\n")

    with pytest.raises(ClientVenvFailed) as failed:
        client_venv("broken", requirements=requirements, cache=cache, say=lambda _: None)

    home = venv_home("broken", lock, cache)
    message = str(failed.value)
    assert f"pip install --no-input -r {lock}" in message
    assert str(home.with_name(home.name + ".log")) in message
    assert "not-here" in message  # pip's own words about what it could not install
    assert not (home / STAMP).exists()


def test_a_client_without_a_lock_is_named(tmp_path):
    with pytest.raises(ClientVenvFailed, match="no lock for client 'nobody'"):
        client_venv("nobody", requirements=tmp_path, cache=tmp_path)
