"""The command line loads only the jobs module for `serve` and the lake jobs."""

from __future__ import annotations

import subprocess
import sys

from gateway import cli
from tests.services import REPO_ROOT


def test_the_job_commands_are_what_the_jobs_module_registers() -> None:
    from gateway.cli import _common, jobs

    registered = {
        c.name or (c.callback.__name__ if c.callback else "")
        for c in _common.app.registered_commands
        if c.callback is not None and c.callback.__module__ == jobs.__name__
    }
    assert registered == set(cli.JOB_COMMANDS)


def test_serve_loads_no_client_command_and_help_lists_them_all() -> None:
    probe = (
        "import sys; from gateway import cli; cli.load_commands(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.startswith('gateway.cli.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe, "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    ).stdout
    assert "gateway.cli.jobs" in loaded
    assert "gateway.cli.records" not in loaded and "gateway.cli.tables" not in loaded
    listed = subprocess.run(
        [sys.executable, "-m", "gateway", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    ).stdout
    for command in ("serve", "table", "tenant", "group", "shard", "read"):
        assert command in listed
