"""The Arrow Flight edge: bulk reads (scans and stream reads) as Flight ``DoGet`` streams,
bulk appends as ``DoPut`` streams.

Bulk data then moves through Arrow's C++ transport: the batches a read produces are sent
as they are, with no protobuf wrapping and no Python-side IPC encoding. Tenancy is the
other edges': the same API keys (``authorization: Bearer ...``), the same per-tenant
in-flight slots, read quota and metering, through :class:`~gateway.server.calls.DataCalls`.

Flight serves each call on a thread of its own; the stream-table lives on the gateway's
event loop. A call therefore runs an async generator on that loop and pulls its items
one chunk (a few MiB) at a time, so the hop costs nothing per record.

Tickets are JSON (documented with ``GatewayInfo`` in ``proto/tidegate/v1/tidegate.proto``)::

    {"scan": {"namespace": "shop", "name": "orders", "columns": [...], "filter": "...",
              "as_of": null, "limit": null}}
    {"read": {"namespace": "shop", "name": "orders", "partition": 0, "offset": 0,
              "max_records": 10000, "max_bytes": null}}

``GetFlightInfo`` takes the same JSON as a command, or a path ``[namespace, name]`` (a
whole-table scan), and answers one endpoint whose ticket is that command: what generic
Flight clients (ADBC, DuckDB's and pandas' Flight readers) expect.

``DoPut`` appends to the table its descriptor names (a path ``[namespace, name]``, or the
command ``{"append": {"namespace": ..., "name": ...}}``). Each record batch written is one
append request, answered in order by one ``PutResult``: the batch's app metadata is an
``AppendStreamRequest`` (its ``request_id``, and in ``append`` the ``partition``,
``producer_id`` and ``sequence``; ``table`` and ``arrow_ipc`` unset) and the result's is the
``AppendStreamResponse``, exactly as on gRPC's ``AppendStream``; a batch without metadata
is routed by key with no idempotence. Arrow's C++ reads and decompresses the batches and
they are validated on the call's own thread: the event loop sees only decoded batches.

The edge's parts: the server and its schemas (:mod:`.edge`), reads (:mod:`.reads`),
appends (:mod:`.appends`), who is calling (:mod:`.middleware`), tickets (:mod:`.tickets`),
errors (:mod:`.errors`) and the hop to the event loop (:mod:`.bridge`).
"""

from __future__ import annotations

from gateway.server.flight.edge import FlightEdge
from gateway.server.flight.errors import flight_error

__all__ = ["FlightEdge", "flight_error"]
