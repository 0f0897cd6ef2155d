"""The committed stubs in kamepb/ match the protos (run `make protos` if not),
and every RPC is a bidirectional stream that starts with a config message."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_are_fresh(tmp_path):
    generated = _generator().generate(tmp_path)
    stale = [
        p.name
        for p in generated
        if p.is_file() and p.read_bytes() != (ROOT / "kamepb" / p.name).read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run `make protos` and commit kamepb/"
    committed = {p.name for p in (ROOT / "kamepb").iterdir() if p.suffix in (".py", ".pyi")}
    assert committed == {p.name for p in generated if p.is_file()}


def test_every_rpc_is_a_config_first_bidi_stream():
    from kamepb import frontend_pb2, gateway_pb2, oracle_pb2, stt_pb2

    modules = [gateway_pb2, frontend_pb2, stt_pb2, oracle_pb2]
    methods = [
        m for mod in modules for s in mod.DESCRIPTOR.services_by_name.values() for m in s.methods
    ]
    assert {f"{m.containing_service.name}.{m.name}" for m in methods} == {
        "Gateway.Converse",
        "Frontend.Stream",
        "Stt.Transcribe",
        "Oracle.Guide",
    }
    for method in methods:
        assert method.client_streaming and method.server_streaming, method.full_name
        first_field = method.input_type.oneofs_by_name["msg"].fields[0]
        assert first_field.name == "config", method.full_name
    assert sys.modules["kamepb.common_pb2"].DESCRIPTOR.package == "kame.v1"
