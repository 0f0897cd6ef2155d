"""For the tests of an adapter that guards a library's private names
(kame_common/private_names.py): `hiding` makes a copy of a package in which one
guarded name is gone, as if an upgrade had removed it (`missing_once_hidden`
asks the adapter about it), `constraints_pins` reads the pins the adapter must
match, and `spelled_private_names` lists the `._name`s an adapter's code touches."""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kame_common.private_names import Guarded

ROOT = Path(__file__).resolve().parents[2]


def without(real: type, hidden: str) -> type:
    """A subclass of `real` on which `hidden` cannot be found, neither on the class
    nor on its instances."""

    class Hiding(type(real)):  # type: ignore[misc]
        def __getattribute__(cls, name: str) -> Any:
            if name == hidden:
                raise AttributeError(name)
            return super().__getattribute__(name)

    class StandIn(real, metaclass=Hiding):  # type: ignore[misc, valid-type]
        def __getattribute__(self, name: str) -> Any:
            if name == hidden:
                raise AttributeError(name)
            return super().__getattribute__(name)

    return StandIn


def hiding(holder: object, path: list[str], hidden: str) -> object:
    """A copy of the module `holder` in which what is down `path` (a class, or a
    module when `path` is empty) hides `hidden`: the modules on the way copied
    too, the originals untouched."""
    copy = types.SimpleNamespace(**vars(holder))
    if not path:
        delattr(copy, hidden)
        return copy
    step, *rest = path
    inner = getattr(holder, step)
    if rest or isinstance(inner, types.ModuleType):
        setattr(copy, step, hiding(inner, rest, hidden))
    else:
        setattr(copy, step, without(inner, hidden))
    return copy


def missing_once_hidden(
    entry: Guarded,
    packages: Mapping[str, object],
    missing_private_names: Callable[[Mapping[str, object]], list[str]],
) -> list[str]:
    """What an adapter's `missing_private_names` says of `packages` in which
    `entry`'s name is hidden."""
    package, *path = entry.owner.split(".")
    return missing_private_names({**packages, package: hiding(packages[package], path, entry.name)})


def constraints_pins(names: Mapping[str, str]) -> dict[str, str]:
    """What constraints.txt pins each of `names` to."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if line.split("==")[0] in names)


def spelled_private_names(module: types.ModuleType) -> set[str]:
    """Every `_name` the module's code (past its docstring) reads, overrides or
    imports: `._name`, `def _name`, `class _name`, `import _name`."""
    code = Path(str(module.__file__)).read_text().split('"""', 2)[2]
    return set(re.findall(r"(?:\.|def |class |import |, )(_[a-zA-Z]\w*)", code))
