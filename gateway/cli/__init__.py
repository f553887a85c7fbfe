"""The ``tidegate`` command line: ``serve`` and ``tier`` (:mod:`~gateway.cli.jobs`), tables
(:mod:`~gateway.cli.tables`), records and groups (:mod:`~gateway.cli.records`), tenants
(:mod:`~gateway.cli.tenants`), hot-tier shards (:mod:`~gateway.cli.shards`)."""

from __future__ import annotations

from gateway.cli import jobs, records, shards, tables, tenants  # noqa: F401 - each registers its commands
from gateway.cli._common import app, run

__all__ = ["app", "main"]


def main() -> None:
    import sys

    sys.exit(run(sys.argv[1:]))
