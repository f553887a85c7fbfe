"""The operator console: server-rendered pages under ``/console`` for operators and tenants.

Sign in with the operator key (every tenant) or a tenant's key (that tenant only, read-only
but for its own tables). Pages: tenants (status, keys, quotas, usage charts), a tenant's
tables, a table (schema, partitions and their lag refreshed live, data files, snapshots), a
record browser that marks the tier of each record, consumer groups with their lag. The
session is an ``HttpOnly``/``SameSite=Strict`` cookie, every change carries a CSRF token,
and the scripts, styles and the chart library (uPlot, vendored with its licence) are served
from this package, so the console works with no internet.

It calls the same services as the JSON API (:class:`~gateway.server.calls.DataCalls`, the
:class:`~gateway.tenancy.Tenancy` and its admin) and authenticates through the same gate.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from gateway.server.calls import DataCalls
from gateway.server.http.console.routes import PREFIX, console_router
from gateway.tenancy import Tenancy

__all__ = ["PREFIX", "STATIC", "add_console"]

#: The console's scripts, styles and vendored files (package data).
STATIC = Path(__file__).parent / "static"


def add_console(app: FastAPI, tenancy: Tenancy, calls: DataCalls) -> None:
    """Serve the console's pages and its static files under ``/console``."""
    app.include_router(console_router(tenancy, calls))
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="console-static")
