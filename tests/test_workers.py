"""What keeps the suite safe on pytest-xdist workers (docs/decisions/test-suite.md): each xdist
group runs on one worker, and no two processes are given the same port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.services import REPO_ROOT, _PortBlocks

#: A test that writes down which worker ran it.
_RECORD = """
import os, pathlib, pytest

def record(request):
    out = pathlib.Path(os.environ["RECORD_DIR"]) / (request.node.name + ".worker")
    out.write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def _suite(root: Path) -> None:
    (root / "conftest.py").write_text(
        "import pytest\n"
        "from tests.xdist_groups import (  # noqa: F401\n"
        "    pytest_collection_finish, pytest_collection_modifyitems, pytest_configure_node,\n"
        "    pytest_unconfigure, pytest_xdist_make_scheduler,\n"
        ")\n\n"
        "@pytest.fixture(scope='session')\n"
        "def spark():\n"
        "    return 'a stand-in for the SparkSession'\n"
    )
    (root / "test_module_fixture.py").write_text(
        _RECORD
        + textwrap.dedent(
            """
            @pytest.fixture(scope="module")
            def shared():
                return 1

            @pytest.mark.parametrize("i", range(6))
            def test_m(shared, request, i):
                record(request)
            """
        )
    )
    for name in ("a", "b"):
        (root / f"test_spark_{name}.py").write_text(
            _RECORD
            + textwrap.dedent(
                f"""
                @pytest.mark.parametrize("i", range(3))
                def test_s{name}(spark, request, i):
                    record(request)
                """
            )
        )
    (root / "test_marked.py").write_text(
        _RECORD
        + textwrap.dedent(
            """
            @pytest.mark.xdist_group("spark")
            def test_asks_for_spark_itself(request):
                record(request)
            """
        )
    )
    (root / "test_free.py").write_text(
        _RECORD
        + textwrap.dedent(
            """
            @pytest.mark.parametrize("i", range(12))
            def test_f(request, i):
                record(request)
            """
        )
    )


def test_each_group_runs_on_one_worker(tmp_path: Path) -> None:
    """Through the same hooks as the suite, on three workers: a module with a module-scoped
    fixture runs on one worker, every test of the ``spark`` fixture (and one marked for its
    group) on one, and the tests in no group spread over the workers."""
    suite, record = tmp_path / "suite", tmp_path / "record"
    suite.mkdir()
    record.mkdir()
    _suite(suite)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RECORD_DIR": str(record)}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # xdist alone: four interpreters start
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-n", "3", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "-q", str(suite)],
        cwd=suite, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = {p.stem: p.read_text() for p in record.glob("*.worker")}
    assert len(ran) == 6 + 3 + 3 + 1 + 12, sorted(ran)
    module = {w for name, w in ran.items() if name.startswith("test_m[")}
    spark = {w for name, w in ran.items() if name.startswith(("test_sa[", "test_sb[", "test_asks"))}
    free = {w for name, w in ran.items() if name.startswith("test_f[")}
    assert len(module) == 1 and len(spark) == 1, ran
    # The groups go out first, one to a worker; the free tests fill every worker.
    assert module != spark and len(free) >= 2, ran


def test_no_two_processes_are_given_one_port() -> None:
    """Two processes alive at once take ports: none is given to both, and none comes from
    the kernel's ephemeral range, where an outgoing connection could take it first. (A
    process's blocks are free again once it ends, with the servers it started.)"""
    code = (
        "import json, sys\n"
        "from tests.services import free_port\n"
        "print(json.dumps([free_port() for _ in range(150)]), flush=True)\n"  # > a block
        "sys.stdin.read()\n"  # alive, holding its blocks, until the test has both lists
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        taken = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.communicate("", timeout=60)
    assert all(p.returncode == 0 for p in procs)
    first, second = (set(t) for t in taken)
    assert len(first) == len(second) == 150
    assert not first & second
    high = _PortBlocks._high()
    assert all(_PortBlocks.LOW <= port < high for port in first | second)
