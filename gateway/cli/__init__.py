"""The ``tidegate`` command line: ``serve`` and ``tier`` (:mod:`~gateway.cli.jobs`), tables
and records (:mod:`~gateway.cli.data`), tenants (:mod:`~gateway.cli.tenants`)."""

from __future__ import annotations

from gateway.cli import data, jobs, tenants  # noqa: F401 - each registers its commands
from gateway.cli._common import app, run

__all__ = ["app", "main"]


def main() -> None:
    import sys

    sys.exit(run(sys.argv[1:]))
