"""Generate the gRPC stubs in gateway/wire/_proto from proto/ (or check them with --check).

The proto files are mapped under the virtual path ``gateway/wire/_proto`` so the generated
modules import each other as ``gateway.wire._proto.tidegate.v1...``: a real package, no
sys.path tricks.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_PKG = "gateway/wire/_proto"


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency

    protos = sorted(PROTO_DIR.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{OUT_PKG}={PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[f"{OUT_PKG}/{p.relative_to(PROTO_DIR)}" for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    pkg = out_root / OUT_PKG
    for d in [pkg, *[p for p in pkg.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return sorted(p for p in pkg.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the stubs are stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        gen_root = Path(tmp) / OUT_PKG
        committed = ROOT / OUT_PKG
        if ns.check:
            stale = []
            for f in files:
                rel = f.relative_to(gen_root)
                target = committed / rel
                if not target.exists() or not filecmp.cmp(f, target, shallow=False):
                    stale.append(str(rel))
            extra = (
                [
                    str(p.relative_to(committed))
                    for p in committed.rglob("*")
                    if p.is_file()
                    and "__pycache__" not in p.parts
                    and not (gen_root / p.relative_to(committed)).exists()
                ]
                if committed.exists()
                else []
            )
            if stale or extra:
                print(
                    f"gRPC stubs differ from proto/: {stale + extra}; run make proto",
                    file=sys.stderr,
                )
                return 1
            print("gRPC stubs are up to date")
            return 0
        if committed.exists():
            shutil.rmtree(committed)
        shutil.copytree(gen_root, committed)
        print(f"wrote {len(files)} files to {OUT_PKG}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
