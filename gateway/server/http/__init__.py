"""The HTTP edge (FastAPI): the stream-table operations under ``/v1``, health and metrics.

Bodies are JSON or Arrow IPC streams (``application/vnd.apache.arrow.stream``), chosen by
``Content-Type`` on appends and by ``Accept`` on reads. One module per group of routes
(:mod:`~gateway.server.http.tables`, :mod:`~gateway.server.http.records`,
:mod:`~gateway.server.http.groups`, :mod:`~gateway.server.http.scans`,
:mod:`~gateway.server.http.health`, :mod:`~gateway.server.http.admin`), assembled with the
error handlers and metrics middleware by :func:`create_app`.
"""

from gateway.server.http.app import create_app
from gateway.server.http.models import (
    ARROW_STREAM,
    HEADER_HIGH_WATERMARK,
    HEADER_NEXT_OFFSET,
    JSON,
)

__all__ = ["ARROW_STREAM", "HEADER_HIGH_WATERMARK", "HEADER_NEXT_OFFSET", "JSON", "create_app"]
