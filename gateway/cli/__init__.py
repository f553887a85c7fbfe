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

from gateway.cli import jobs, records, shards, tables, tenants  # noqa: E402, F401 - each registers its commands
from gateway.cli._common import app, run  # noqa: E402 - after STARTED and the pool choice

__all__ = ["app", "main"]


def main() -> None:
    import sys

    sys.exit(run(sys.argv[1:]))
