"""Every command and snippet in README.md, taken from README itself, is one that
works: `make` targets exist in the Makefile; `kame` subcommands exist and take
the flags README gives them (asked of `kame SUBCOMMAND --help`), with every flag
they require; `docker compose`, `helm` and the other tools name files that exist;
every Python block compiles and imports what it imports. The Python blocks also
run against a real stack in tests/e2e/test_readme_snippets.py. A block of a
language this file does not know fails, so a new kind of snippet gets checked."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

from tests.docs.markdown import README, ROOT, Block, blocks

KNOWN_LANGUAGES = {"sh", "python", "text"}
# Tools README names that this machine need not have: their subcommands, and the
# options whose values are files of this repository.
TOOLS = {
    ("docker", "compose"): {"up", "down", "logs", "ps"},
    ("helm",): {"lint", "install", "upgrade", "template", "test"},
    ("kubectl",): {"create", "apply", "get"},
    ("apt-get",): {"install"},
}
FILE_OPTIONS = {"-f", "--file", "--values", "--env-file"}


def readme_blocks() -> list[Block]:
    return blocks(README.read_text())


def shell_commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, as argv lists (comments and `\\` joins done,
    leading VAR=value assignments dropped)."""
    text = block.text.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        argv = shlex.split(line, comments=True)
        while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
            argv.pop(0)
        if argv:
            commands.append(argv)
    return commands


@cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.MULTILINE))


@cache
def kame_help(subcommand: str) -> str:
    """`kame SUBCOMMAND --help`, as the installed command prints it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "kame_cli", subcommand, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"kame {subcommand} --help failed: {result.stderr[-500:]}"
    return result.stdout


def required_flags(help_text: str) -> set[str]:
    """The flags outside [brackets] in the usage lines of an argparse help."""
    usage = help_text.split("\n\n")[0]
    while re.search(r"\[[^\[\]]*\]", usage):
        usage = re.sub(r"\[[^\[\]]*\]", "", usage)
    return set(re.findall(r"(--[\w-]+)", usage))


def kame_problems(argv: list[str]) -> list[str]:
    if len(argv) < 2 or argv[1].startswith("-"):
        return [f"{shlex.join(argv)}: no subcommand"]
    help_text = kame_help(argv[1])
    given = {arg.split("=")[0] for arg in argv[2:] if arg.startswith("--")}
    problems = [
        f"kame {argv[1]}: no flag {flag}" for flag in sorted(given) if flag not in help_text
    ]
    missing = required_flags(help_text) - given - {"--help"}
    problems += [f"kame {argv[1]}: required {flag} not given" for flag in sorted(missing)]
    return problems


def tool_problems(argv: list[str]) -> list[str]:
    for prefix, subcommands in TOOLS.items():
        if tuple(argv[: len(prefix)]) != prefix:
            continue
        rest = argv[len(prefix) :]
        subcommand = next((a for a in rest if not a.startswith("-")), "")
        problems = [] if subcommand in subcommands else [f"{shlex.join(argv)}: not a known use"]
        for option, value in itertools.pairwise(rest):
            if option in FILE_OPTIONS and not (ROOT / value).exists():
                problems.append(f"{shlex.join(argv)}: {value} does not exist")
        for arg in rest:
            if arg.startswith("deploy/") and not (ROOT / arg).exists():
                problems.append(f"{shlex.join(argv)}: {arg} does not exist")
        return problems
    return [f"{shlex.join(argv)}: a command this test does not know"]


def command_problems(argv: list[str]) -> list[str]:
    program = argv[0]
    if program == "make":
        targets = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
        return [f"make {t}: no such target" for t in targets if t not in make_targets()]
    if program in ("kame", ".venv/bin/kame"):
        return kame_problems(argv)
    return tool_problems(argv)


def python_problems(block: Block) -> list[str]:
    """What keeps a Python block from running here: syntax, or an import that
    does not resolve (a module, or a name the module lacks)."""
    tree = ast.parse(block.text, filename=f"README.md:{block.line}")
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if importlib.util.find_spec(alias.name) is None:
                    problems.append(f"import {alias.name}: not installed")
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"from {node.module} import {alias.name}: no such name")
    return problems


def test_readme_has_the_blocks_a_newcomer_needs():
    languages = [b.language for b in readme_blocks()]
    assert set(languages) <= KNOWN_LANGUAGES, f"unchecked block languages: {set(languages)}"
    assert languages.count("python") >= 2 and languages.count("sh") >= 4
    first = shell_commands(next(b for b in readme_blocks() if b.language == "sh"))
    assert first[0] == ["make", "test"], "README's first command is the test command CI runs"


@pytest.mark.parametrize(
    "block",
    [b for b in readme_blocks() if b.language == "sh"],
    ids=lambda b: f"line{b.line}",
)
def test_readme_shell_commands_exist(block):
    problems = [p for argv in shell_commands(block) for p in command_problems(argv)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "block",
    [b for b in readme_blocks() if b.language == "python"],
    ids=lambda b: f"line{b.line}",
)
def test_readme_python_compiles_and_imports(block):
    compile(block.text, f"README.md:{block.line}", "exec")
    assert not python_problems(block)


def test_a_wrong_command_is_caught():
    assert command_problems(["make", "no-such-target"]) == ["make no-such-target: no such target"]
    assert command_problems(["kame", "talk", "--wav", "q.wav", "--out", "a.wav"]) == [
        "kame talk: required --timeline not given"
    ]
    assert command_problems(["kame", "status", "--no-such-flag"]) == [
        "kame status: no flag --no-such-flag"
    ]
    assert command_problems(["helm", "install", "kame", "deploy/helm/nope"]) == [
        "helm install kame deploy/helm/nope: deploy/helm/nope does not exist"
    ]
    assert command_problems(["curl", "example.com"])[0].endswith(
        "a command this test does not know"
    )
    bad = Block("python", "from openai import NoSuchClient\n", 1)
    assert python_problems(bad) == ["from openai import NoSuchClient: no such name"]
