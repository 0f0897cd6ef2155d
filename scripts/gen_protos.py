"""Generate the Python gRPC stubs in kamepb/ from protos/kamepb/*.proto.

`make protos` runs this; tests/test_protos.py fails when the committed stubs
differ from a fresh generation.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir: Path) -> list[Path]:
    protos = sorted((ROOT / "protos" / "kamepb").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    # mypy-protobuf's plugins (installed beside this interpreter) write typed stubs
    # for the messages and for the gRPC stubs and servicers, so the type checker
    # sees every field and every RPC.
    plugins = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{ROOT / 'protos'}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={plugins / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugins / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    package = out_dir / "kamepb"
    docstring = '"""Generated gRPC stubs: do not edit; run `make protos`."""\n'
    (package / "__init__.py").write_text(docstring)
    return sorted(package.iterdir())


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in generate(out):
        print(path.relative_to(out))
