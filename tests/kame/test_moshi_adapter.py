"""services/frontend/engines/kame/moshi_adapter.py's guard: every private name of
moshi it relies on is there, in the shape it expects, in the installed package;
the guard notices when one goes or changes; reading a checkpoint refuses a moshi
that lacks one; and no file but the adapter spells one."""

from __future__ import annotations

import re
import types
from pathlib import Path

import moshi
import pytest
import torch

from kame_common.private_names import Guarded, IncompatibleLibraries
from services.frontend.engines.kame import checkpoint, moshi_adapter
from services.frontend.engines.kame.moshi_adapter import (
    GUARDED,
    PINNED,
    builtin_lm_kwargs,
    builtin_mimi_config,
    missing_private_names,
)
from tests.support.private_names import (
    constraints_pins,
    missing_once_hidden,
    spelled_private_names,
)

ROOT = Path(__file__).resolve().parents[2]
# Where a private name of moshi could be spelled: everything of ours that is Python.
SOURCES = ("services", "kame_common", "kame_cli", "kame_client", "scripts", "tests")


def test_the_installed_moshi_has_every_guarded_name():
    assert missing_private_names() == []


def test_the_adapter_touches_no_private_name_it_does_not_guard():
    """Every `_name` the adapter's code reads, overrides or imports is in GUARDED,
    but for the adapter's own: a touch added without a guard fails here."""
    guarded = {entry.name for entry in GUARDED}
    assert spelled_private_names(moshi_adapter) - set(vars(moshi_adapter)) - guarded == set()


def files_spelling(root: Path, names: set[str], skip: set[Path]) -> list[str]:
    """ "file: name" for each Python file of ours under `root` (but `skip`) that
    spells one of `names`."""
    pattern = re.compile(rf"\b({'|'.join(sorted(names))})\b")
    found = []
    for top in SOURCES:
        for path in sorted((root / top).rglob("*.py")):
            if path in skip or "__pycache__" in path.parts:
                continue
            found += [f"{path.relative_to(root)}: {m}" for m in pattern.findall(path.read_text())]
    return found


def test_no_other_file_spells_a_guarded_name():
    """moshi's private names only behind the adapter: the engines, `kame replay`,
    the benchmarks and the tests use what it offers."""
    skip = {Path(moshi_adapter.__file__).resolve(), Path(__file__).resolve()}
    assert files_spelling(ROOT, {entry.name for entry in GUARDED}, skip) == []


def test_the_search_finds_a_spelled_name(tmp_path):
    """The check above can fail: a file that reads one is found, wherever it is."""
    (tmp_path / "kame_cli" / "bench").mkdir(parents=True)
    (tmp_path / "kame_cli" / "bench" / "x.py").write_text("kwargs = loaders._lm_kwargs\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "y.py").write_text(
        "from moshi.utils.compile import _is_cuda_graph_enabled\n"
    )
    names = {entry.name for entry in GUARDED}
    assert files_spelling(tmp_path, names, set()) == [
        "kame_cli/bench/x.py: _lm_kwargs",
        "tests/y.py: _is_cuda_graph_enabled",
    ]


def test_the_pinned_version_is_that_of_constraints_txt():
    assert constraints_pins(PINNED) == PINNED


@pytest.mark.parametrize("entry", GUARDED, ids=lambda entry: entry.label)
def test_the_guard_reports_a_removed_name(entry: Guarded):
    missing = missing_once_hidden(entry, {"moshi": moshi}, missing_private_names)
    assert missing == [f"{entry.label}: missing"]


def test_the_guard_reports_a_changed_shape():
    def delay_sequence(tensor: torch.Tensor) -> torch.Tensor:
        """As if an upgrade had dropped the delays."""
        return tensor

    lm_utils = types.SimpleNamespace(
        **{**vars(moshi.models.lm_utils), "_delay_sequence": delay_sequence}
    )
    loaders = types.SimpleNamespace(**{**vars(moshi.models.loaders), "_lm_kwargs": {"dim": 8}})
    models = types.SimpleNamespace(
        **{**vars(moshi.models), "lm_utils": lm_utils, "loaders": loaders}
    )
    changed = types.SimpleNamespace(**{**vars(moshi), "models": models})
    assert missing_private_names({"moshi": changed}) == [
        "moshi.models.loaders._lm_kwargs: lacks keys n_q, dep_q, card, text_card, delays",
        "moshi.models.lm_utils._delay_sequence: takes (tensor), expected (delays, tensor, padding)",
    ]


def test_reading_a_checkpoint_refuses_a_moshi_without_a_name(monkeypatch, tmp_path):
    gone = "moshi.models.loaders._mimi_config: missing"
    monkeypatch.setattr(moshi_adapter, "missing_private_names", lambda: [gone])
    with pytest.raises(IncompatibleLibraries) as refused:
        checkpoint.read(tmp_path)
    message = str(refused.value)
    assert "moshi_adapter.py is written for moshi 0.2.13" in message and gone in message


def test_the_builtin_settings_are_copies():
    """A caller that changes what it got (a bench shrinking the model) changes
    nothing for the next one."""
    lm, mimi = builtin_lm_kwargs(), builtin_mimi_config()
    assert (lm["dim"], lm["num_layers"], mimi["seanet"]["dimension"]) == (4096, 32, 512)
    lm["dim"] = 64
    mimi["seanet"]["dimension"] = 32
    assert builtin_lm_kwargs()["dim"] == 4096
    assert builtin_mimi_config()["seanet"]["dimension"] == 512
