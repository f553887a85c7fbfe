"""The fork server the suite starts its gateways from (tests/forkserver.py) makes processes
that behave as ``python -m gateway`` ones: what an interpreter sets up before its first
line, and what it does at exit, are the same."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.forkserver import ForkedProcess, can_fork, fork_server
from tests.services import REPO_ROOT, GatewayProcess


def _ignored(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn for {pid}")


def test_a_forked_gateway_ignores_the_signals_an_interpreter_ignores(tmp_path: Path) -> None:
    """SIGPIPE above all: a gateway that wrote to a socket its client had closed died of it
    (a Kafka client going away), where an interpreter gets EPIPE."""
    gw = GatewayProcess(tmp_path / "gw").start()
    try:
        assert isinstance(gw.proc, ForkedProcess)
        ignored = _ignored(gw.proc.pid)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            assert ignored & (1 << (sig - 1)), f"{sig.name} is not ignored"
        with gw.client() as c:
            c.create_table("ns.t", {"n": "int64"})
    finally:
        gw.stop()
    assert gw.proc.returncode == 0


def test_a_cli_command_runs_to_its_exit_code_with_its_own_output(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    assert can_fork(env) and not can_fork({**env, "LD_PRELOAD": "x.so"})
    got = fork_server().run(["--version"], env, str(REPO_ROOT))
    assert got.returncode == 0 and got.stdout.startswith("tidegate"), got
    bad = fork_server().run(["table", "nope"], env, str(tmp_path))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad


#: Modules of ours a forked gateway may still import itself: none today. A module named
#: here costs every forked gateway its import (tests/forkserver.py, ``_preload``).
IMPORTED_AFTER_FORK: frozenset[str] = frozenset()


def test_a_forked_gateway_imports_no_module_of_ours_the_server_left_out(tmp_path: Path) -> None:
    """The fork server imports by hand what a gateway imports when it starts (``_preload``):
    an edge or a store added to the gateway but not there would be imported again by every
    forked gateway of the suite, silently. A gateway that starts, serves a table's append,
    read and scan, and stops imports nothing of ``gateway`` or ``tiering`` itself."""
    report = tmp_path / "imports.txt"
    gw = GatewayProcess(tmp_path / "gw").start(imports=report)
    try:
        assert isinstance(gw.proc, ForkedProcess)
        with gw.client() as c:
            c.create_table("ns.t", {"n": "int64"})
            c.append("ns.t", [{"n": 1}, {"n": 2}])
            assert c.read("ns.t", partition=0, offset=0).num_rows == 2
            assert c.scan("ns.t").num_rows == 2
    finally:
        gw.stop()
    assert gw.proc.returncode == 0, gw.log()
    ours = {m for m in report.read_text().split() if m.partition(".")[0] in ("gateway", "tiering")}
    missing = sorted(ours - IMPORTED_AFTER_FORK)
    assert not missing, (
        f"a forked gateway imported {len(missing)} modules of ours after the fork; import "
        f"them in tests/forkserver.py's _preload: {', '.join(missing)}"
    )
