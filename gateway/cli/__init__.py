"""The ``tidegate`` command line: ``serve`` and ``tier`` (:mod:`~gateway.cli.jobs`), tables
(:mod:`~gateway.cli.tables`), records and groups (:mod:`~gateway.cli.records`), tenants
(:mod:`~gateway.cli.tenants`), hot-tier shards (:mod:`~gateway.cli.shards`)."""

from __future__ import annotations

import os
import time

#: When this process started running the command line: the connect deadline counts from
#: here, so "reported within 5 s" holds for the whole command, imports included.
STARTED = time.monotonic()

# Every Arrow allocation of a tidegate process on jemalloc, whose freed pages go back to
# the system at once (the server sets its decay to 0), before pyarrow is first imported:
# Arrow's C++ default pool is chosen then, from this variable, and pyarrow's own
# set_memory_pool does not reach it. Left to its default (mimalloc), the allocations
# of compute kernels, Parquet and IPC reads kept freed memory in a 1 GiB reservation
# that grew by 5-10 MiB a minute under the soak. An operator's own choice wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import importlib  # noqa: E402 - after STARTED and the pool choice
from typing import Any  # noqa: E402

from gateway.cli._common import run  # noqa: E402 - after STARTED and the pool choice

__all__ = ["app", "main"]

#: The modules that register commands, and the commands of the jobs module: `serve`, `tier`
#: and the other lake jobs load only it (the client-side commands' imports cost every
#: gateway and job process a fifth of a second of CPU; tests/test_cli_loading.py holds this
#: list equal to what the module registers).
COMMAND_MODULES = ("jobs", "records", "shards", "tables", "tenants")
JOB_COMMANDS = frozenset(
    {"serve", "tier", "compact", "expire", "clean-orphans", "retention", "migrate"}
)


def load_commands(argv: list[str] | None = None) -> None:
    """Register the commands ``argv`` may run: the jobs module's alone when its first word
    is one of :data:`JOB_COMMANDS`, else every command (``--help`` lists them all)."""
    names = ("jobs",) if argv and argv[0] in JOB_COMMANDS else COMMAND_MODULES
    for name in names:
        importlib.import_module(f"gateway.cli.{name}")


def __getattr__(name: str) -> Any:
    """``app``: the whole command line, every command registered."""
    if name == "app":
        from gateway.cli._common import app

        load_commands()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    import sys

    argv = sys.argv[1:]
    load_commands(argv)
    sys.exit(run(argv))
