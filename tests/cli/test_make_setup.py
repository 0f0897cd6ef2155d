"""The first `make setup` says up front what it builds and about how long it
takes; once done (its stamp files are newer than what they depend on), it is
instant and says nothing of the kind."""

from __future__ import annotations

import os
import subprocess
import time

from tests.cli.conftest import ROOT


def make_setup(venv) -> subprocess.CompletedProcess:
    # PYTHON=false: the recipe stops at creating the virtual environment, after its notice.
    return subprocess.run(
        ["make", "--no-print-directory", "setup", f"VENV={venv}", "PYTHON=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_first_setup_announces_the_long_build_and_a_done_one_is_instant(tmp_path):
    venv = tmp_path / "venv"
    first = make_setup(venv)
    assert first.returncode != 0  # stopped at `python -m venv`, on purpose
    assert "llama-cpp-python from source" in first.stdout
    assert "8-10 minutes" in first.stdout
    assert first.stdout.index("make setup: installing") < first.stdout.index("test -x")

    venv.mkdir()
    later = time.time() + 60  # newer than every requirements file
    # The install's stamp, and the Smart Turn model's (a stamp of its own: a change
    # of the model's pin fetches the model again, not the whole setup).
    for stamp in (venv / ".installed", venv / ".smart-turn"):
        stamp.touch()
        os.utime(stamp, (later, later))
    done = make_setup(venv)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing" not in done.stdout and "minutes" not in done.stdout
