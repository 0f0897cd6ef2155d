"""`python -m kame_cli.smart_turn_model`: the Smart Turn model taken out of the
real pipecat-ai wheel (downloaded once per session by pip, whose cache makes it
instant after the first time), installed atomically and only with the pinned
sha256, and checked by --check."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kame_cli import smart_turn_model
from kame_common import turn_model
from kame_common.models import ModelNotInstalled

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pipecat_wheel(tmp_path_factory) -> Path:
    """The real pipecat-ai wheel, as the installer's pip download fetches it."""
    try:
        return smart_turn_model.download_wheel(tmp_path_factory.mktemp("wheel"))
    except smart_turn_model.FetchError as exc:
        pytest.skip(f"the pipecat-ai wheel cannot be fetched here (no index?): {exc}")


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    """An empty XDG cache, so the install lands in tmp_path/kame/models/."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(turn_model.PATH_ENV, raising=False)
    return tmp_path


def model_at(cache: Path) -> Path:
    return cache / "kame" / "models" / turn_model.MODEL_FILE


def fake_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_installs_the_pinned_file_from_the_wheel_once_and_checks_it(
    pipecat_wheel, cache_home, capsys
):
    target = model_at(cache_home)
    with pytest.raises(ModelNotInstalled, match=re.escape(turn_model.FETCH_COMMAND)):
        turn_model.smart_turn_path()

    assert smart_turn_model.main(["--wheel", str(pipecat_wheel)]) == 0
    assert turn_model.smart_turn_path() == target
    assert hashlib.sha256(target.read_bytes()).hexdigest() == turn_model.MODEL_SHA256
    # Readable by a service running as another user.
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == [turn_model.MODEL_FILE]

    assert smart_turn_model.main(["--wheel", str(pipecat_wheel)]) == 0
    assert "already installed" in capsys.readouterr().out

    assert smart_turn_model.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "checks out" in out and "p(complete)=" in out


def test_a_file_with_another_sha256_is_refused_and_leaves_nothing(tmp_path, cache_home, capsys):
    wheel = fake_wheel(
        tmp_path / "pipecat_ai-1.14.0-py3-none-any.whl",
        {turn_model.SOURCE_MEMBER: b"not the model"},
    )
    assert smart_turn_model.main(["--wheel", str(wheel)]) == 1
    assert "not the pinned" in capsys.readouterr().err
    models = model_at(cache_home).parent
    assert list(models.iterdir()) == []  # neither the file nor a scratch copy


def test_a_wheel_without_the_model_is_refused(tmp_path, cache_home, capsys):
    wheel = fake_wheel(tmp_path / "other.whl", {"pipecat/__init__.py": b""})
    assert smart_turn_model.main(["--wheel", str(wheel)]) == 1
    assert f"has no {turn_model.SOURCE_MEMBER}" in capsys.readouterr().err
    assert not model_at(cache_home).exists()


def test_check_refuses_a_missing_or_damaged_file(cache_home, capsys):
    assert smart_turn_model.main(["--check"]) == 1
    assert "python -m kame_cli.smart_turn_model" in capsys.readouterr().err

    target = model_at(cache_home)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"truncated")
    assert smart_turn_model.main(["--check"]) == 1
    assert "reinstall" in capsys.readouterr().err
    # smart_turn_path only looks for the file; --check is what verifies it.
    assert turn_model.smart_turn_path() == target


def test_the_path_env_names_another_file(tmp_path, monkeypatch):
    elsewhere = tmp_path / "baked" / "turn.onnx"
    monkeypatch.setenv(turn_model.PATH_ENV, str(elsewhere))
    with pytest.raises(ModelNotInstalled, match=re.escape(str(elsewhere))):
        turn_model.smart_turn_path()
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"x")
    assert turn_model.smart_turn_path() == elsewhere


def test_the_module_runs_as_a_command(pipecat_wheel, tmp_path):
    """As make setup runs it: a process, progress on stdout, exit status 0."""
    result = subprocess.run(
        [sys.executable, "-m", "kame_cli.smart_turn_model", "--wheel", str(pipecat_wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert f"taking {turn_model.MODEL_FILE} out of" in result.stdout
    assert model_at(tmp_path).is_file()
