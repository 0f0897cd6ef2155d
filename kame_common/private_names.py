"""A third-party library's private names, each relied on by one adapter module
and guarded: the adapter lists them (`Guarded`: where the name lives and the
shape expected of it), `missing` says what of the list the installed packages
lack, and `check` refuses to run on versions the adapter does not fit, naming
what went, before anything breaks halfway through a call.

The adapters: services/telephony/sip_adapter.py (aiosipua, aiortp) and
services/frontend/engines/kame/moshi_adapter.py (moshi). Their tests check the
list against the installed libraries on every run, and that the guard notices
a name gone (tests/support/private_names.py hides one).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version


@dataclass(frozen=True)
class Guarded:
    """A private name an adapter relies on, and the shape it expects of it."""

    owner: str  # dotted path: the package, then attributes down to a module or class
    name: str
    params: tuple[str, ...] | None = None  # a function or method: its first parameters
    # The name is set by __init__: looked for on an instance `sample(owner)` made.
    sample: Callable[[type], object] | None = None
    keys: tuple[str, ...] | None = None  # a mapping: keys it must have

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}"


class IncompatibleLibraries(RuntimeError):
    """An installed library lacks a private name its adapter relies on."""


def missing(guarded: Sequence[Guarded], packages: Mapping[str, object]) -> list[str]:
    """What of `guarded` the `packages` (by package name) lack or have in another
    shape: "aiortp.RTPSession._sender: missing", ...; empty when all is there."""
    problems = ((entry, _problem(entry, packages)) for entry in guarded)
    return [f"{entry.label}: {problem}" for entry, problem in problems if problem]


def check(adapter: str, pinned: Mapping[str, str], problems: Sequence[str]) -> None:
    """Raise IncompatibleLibraries when there are `problems` (from `missing`), saying
    which versions the adapter (its path) is written for and which are installed."""
    if not problems:
        return
    written_for = ", ".join(f"{name} {pin}" for name, pin in pinned.items())
    installed = ", ".join(f"{name} {version(name)}" for name in pinned)
    raise IncompatibleLibraries(
        f"{adapter} is written for {written_for} (constraints.txt); "
        f"the installed {installed} differ in: {'; '.join(problems)}"
    )


def _problem(entry: Guarded, packages: Mapping[str, object]) -> str:
    """What is wrong with one guarded name ("" = nothing)."""
    package, *path = entry.owner.split(".")
    try:
        holder = packages[package]
        for step in path:
            holder = getattr(holder, step)
        if entry.sample is not None:
            assert isinstance(holder, type)
            holder = entry.sample(holder)
    except Exception as error:  # the class moved, or its constructor changed
        return f"cannot be looked for ({error!r})"
    if not hasattr(holder, entry.name):
        return "missing"
    value = getattr(holder, entry.name)
    if entry.keys is not None:
        return _keys_problem(value, entry.keys)
    if entry.params is not None:
        return _params_problem(value, entry.params)
    return ""


def _keys_problem(value: object, keys: tuple[str, ...]) -> str:
    if not isinstance(value, Mapping):
        return f"not a mapping ({type(value).__name__})"
    lacking = [key for key in keys if key not in value]
    return f"lacks keys {', '.join(lacking)}" if lacking else ""


def _params_problem(value: object, params: tuple[str, ...]) -> str:
    if not callable(value):
        return "not callable"
    takes = [name for name in inspect.signature(value).parameters if name != "self"]
    if takes[: len(params)] != list(params):
        return f"takes ({', '.join(takes)}), expected ({', '.join(params)})"
    return ""
