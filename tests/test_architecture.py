"""The package map's import rules (docs/architecture.md), checked by import-linter, and shown
to fail when a forbidden import is added."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import REPO_ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_keeps_every_contract() -> None:
    out = lint_imports(REPO_ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.fixture(scope="module")
def copy_of_the_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("gateway", "tiering"):
        shutil.copytree(REPO_ROOT / package, root / package, ignore=ignore)
    shutil.copy(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("gateway/core/base.py", "import gateway.hot.redis", "The core names no backend"),
        ("gateway/core/scans.py", "import pyiceberg", "The core names no backend"),
        ("gateway/cli/jobs.py", "import tiering.spark_runner", "gateway never imports tiering"),
        ("gateway/client/_types.py", "import gateway.config", "The client SDK is light"),
        ("gateway/wire/codec.py", "import sqlalchemy", "gateway.wire is light"),
        ("gateway/server/grpc/server.py", "import gateway.meta.tenants", "The edges reach"),
        ("gateway/hot/base.py", "import gateway.core", "Layers"),
        ("gateway/cold/base.py", "import gateway.hot.base", "Layers"),
        ("gateway/spark/_plan.py", "import gateway.core", "The Spark connector"),
        ("gateway/server/kafka/apis.py", "import gateway.server.http", "The edges do not"),
        (
            "gateway/server/kafka/fetch.py",
            "import gateway.server.kafka.apis",
            "A part never imports its whole: the Kafka APIs",
        ),
        (
            "gateway/server/flight/edge.py",
            "import gateway.server.kafka.records",
            "The edges do not",
        ),
        ("gateway/server/http/records.py", "import gateway.server.flight", "The edges do not"),
        ("gateway/server/kafka/server.py", "import gateway.server.grpc.calls", "The edges do not"),
        ("gateway/spark/_splits.py", "import pyiceberg", "The Spark connector"),
        (
            "gateway/cold/iceberg/table.py",
            "import gateway.cold.iceberg.store",
            "A part never imports its whole",
        ),
        (
            "gateway/cold/iceberg/commits.py",
            "import gateway.cold.iceberg.store",
            "A part never imports its whole: the Iceberg table its store",
        ),
        (
            "gateway/cold/iceberg/reading.py",
            "import gateway.cold.iceberg.table",
            "A part never imports its whole: the Iceberg table's parts",
        ),
        (
            "gateway/cold/values.py",
            "import gateway.cold.base",
            "A part never imports its whole: the cold values",
        ),
        (
            "gateway/cold/datafiles.py",
            "import gateway.cold.base",
            "A part never imports its whole: the cold values",
        ),
        (
            "gateway/hot/disk/partition.py",
            "import gateway.hot.disk.log",
            "A part never imports its whole: the disk partition",
        ),
        (
            "gateway/hot/redis/reads.py",
            "import gateway.hot.redis.log",
            "A part never imports its whole: the Redis log",
        ),
        (
            "gateway/server/flight/reads.py",
            "import gateway.server.flight.edge",
            "A part never imports its whole: the Flight edge",
        ),
        (
            "gateway/server/grpc/service/tables.py",
            "import gateway.server.grpc.server",
            "A part never imports its whole: the gRPC servicer",
        ),
        (
            "gateway/server/http/iceberg_oauth.py",
            "import gateway.server.http.iceberg",
            "A part never imports its whole: the route groups",
        ),
        (
            "gateway/client/_sync_producer.py",
            "import gateway.client._sync",
            "A part never imports its whole: the sync client",
        ),
        (
            "gateway/client/_sync_consumer.py",
            "import gateway.client._sync",
            "A part never imports its whole: the sync client",
        ),
        (
            "gateway/client/_aio_producer.py",
            "import gateway.client.aio",
            "A part never imports its whole: the asyncio client",
        ),
        (
            "gateway/client/_aio_consumer.py",
            "import gateway.client.aio",
            "A part never imports its whole: the asyncio client",
        ),
        (
            "gateway/tenancy/admin.py",
            "import gateway.tenancy.service",
            "A part never imports its whole: the tenant admin",
        ),
    ],
)
def test_a_forbidden_import_breaks_the_check(
    copy_of_the_tree: Path, module: str, line: str, contract: str
) -> None:
    path = copy_of_the_tree / module
    original = path.read_text()
    path.write_text(original + f"\n{line}  # noqa\n")
    try:
        out = lint_imports(copy_of_the_tree)
    finally:
        path.write_text(original)
    assert out.returncode != 0, out.stdout
    broken = [ln for ln in out.stdout.splitlines() if " BROKEN" in ln]
    assert any(ln.startswith(contract) for ln in broken), out.stdout


#: The sizes a room of the house may reach (issue 44): a module a person reads whole, a
#: function (route factories included) on one screen. Generated stubs aside.
MODULE_LINES = 600
FUNCTION_LINES = 120


def oversized(paths: list[Path], root: Path) -> list[str]:
    """Every module of ``paths`` over MODULE_LINES lines and every function over
    FUNCTION_LINES lines, named relative to ``root``."""
    found = []
    for path in paths:
        source = path.read_text()
        name = path.relative_to(root)
        lines = len(source.splitlines())
        if lines > MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    return found


def test_no_module_or_function_outgrows_its_room() -> None:
    rooms = sorted(
        path
        for package in ("gateway", "tiering")
        for path in (REPO_ROOT / package).rglob("*.py")
        if "_proto" not in path.parts
    )
    assert len(rooms) > 100
    assert oversized(rooms, REPO_ROOT) == []


def test_the_size_check_fails_on_an_oversized_room(tmp_path: Path) -> None:
    module = tmp_path / "big.py"
    body = "    x = 1\n" * FUNCTION_LINES
    module.write_text("def f() -> None:\n" + body + "\n" * (MODULE_LINES - FUNCTION_LINES))
    assert oversized([module], tmp_path) == ["big.py: 601 lines", "big.py:1 f(): 121 lines"]
