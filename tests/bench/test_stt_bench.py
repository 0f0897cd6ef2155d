"""kame_cli/bench/stt_bench.py, the stt's capacity at real time, measures one of
`kame bench --stt-wer`'s options when named: its capacity row is that row's."""

from __future__ import annotations

import json

from kame_cli.bench import stt_bench, stt_wer


def test_capacity_of_a_named_option(tmp_path):
    out = tmp_path / "stt.json"
    option = next(o for o in stt_wer.OPTIONS if o.name == "tiny.en-pre0.5")
    args = ["--sessions", "1", "--rounds", "1", "--sentences", "2", "--option", option.name]
    args += ["--out", str(out)]
    assert stt_bench.main(args) == 0
    report = json.loads(out.read_text())
    assert report["option"] == option.name
    assert {k: report["settings"][k] for k in option.settings} == option.settings
    (level,) = report["levels"]
    assert level["sessions"] == 1 and level["finals"] == level["utterances"] == 2
    assert report["script"]["sentences"] == stt_bench.SENTENCES[:2]
