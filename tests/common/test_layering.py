"""The layering as import-linter contracts (pyproject.toml's [tool.importlinter],
run by `make lint`): every package that ships is under them, and they catch
what they are meant to (the contracts run on a small tree that breaks each)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LINTER = PYPROJECT["tool"]["importlinter"]


def shipped_packages() -> set[str]:
    """The top-level packages setuptools ships (its find.include patterns)."""
    patterns = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {pattern.removesuffix("*") for pattern in patterns}
    return {top for top in tops if (ROOT / top / "__init__.py").is_file()}


def layers() -> list[str]:
    (contract,) = [c for c in LINTER["contracts"] if c["type"] == "layers"]
    return [layer.strip("()") for layer in contract["layers"]]


def test_every_shipped_package_is_a_root_and_a_layer():
    assert shipped_packages() == set(LINTER["root_packages"])
    assert shipped_packages() <= set(layers())


def test_every_service_is_in_the_independence_contract():
    (contract,) = [c for c in LINTER["contracts"] if c["type"] == "independence"]
    services = {
        f"services.{path.name}"
        for path in (ROOT / "services").iterdir()
        if (path / "__init__.py").is_file()
    }
    assert set(contract["modules"]) == services


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """The project's contracts on the packages under `tree`."""
    (tree / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    script = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", script, "--no-cache"],
        cwd=tree,
        # The tree first: its packages stand in for ours.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def package(tree: Path, name: str, code: str = "") -> None:
    """A package (dotted `name`, its parents made too) whose __init__ holds `code`."""
    path = tree.joinpath(*name.split("."))
    path.mkdir(parents=True, exist_ok=True)
    for parent in [path, *path.relative_to(tree).parents][:-1]:
        (tree / parent / "__init__.py").touch()
    (path / "__init__.py").write_text(code)


def test_the_contracts_pass_a_tree_that_keeps_them_and_fail_one_that_breaks_them(tmp_path):
    kept = tmp_path / "kept"
    package(kept, "kamepb")
    package(kept, "kame_common", "import kamepb\n")
    package(kept, "kame_client", "import kame_common\n")
    for service in ("gateway", "frontend", "stt", "oracle", "web", "telephony"):
        package(kept, f"services.{service}", "import kame_client\n")
    package(kept, "kame_cli", "import services.gateway\n")
    done = lint_imports(kept)
    assert done.returncode == 0, done.stdout + done.stderr

    broken = tmp_path / "broken"
    package(broken, "kamepb")
    package(broken, "kame_common", "import kame_cli\n")  # a layer importing a higher one
    package(broken, "kame_client", "import services.web\n")  # the client needing a service
    for service in ("frontend", "stt", "oracle", "web", "telephony"):
        package(broken, f"services.{service}")
    package(broken, "services.gateway", "import services.oracle\n")  # one service another
    package(broken, "kame_cli")
    done = lint_imports(broken)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 2 broken." in done.stdout
    assert "kame_common -> kame_cli" in done.stdout
    assert "kame_client -> services.web" in done.stdout
    assert "services.gateway -> services.oracle" in done.stdout
