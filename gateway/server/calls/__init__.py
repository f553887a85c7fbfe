"""The data plane as both edges serve it: each operation of the core with the work every
request needs done once, here, for gRPC and HTTP alike.

That work is: the tenant's quota charged before (table counts, append bytes, the read
bucket), usage metered and Prometheus metrics counted after, the read-memory budget held
for reads, follows and scans alike, Arrow append bodies measured, decoded and validated
(:meth:`DataCalls.append_arrow`), and encoding of large answers kept off the event loop.
An edge only turns its wire format into these calls and their answers back into its wire
format. Errors are turned into wire errors in one place too, :func:`wire_error`.

The calls are grouped by resource, one part each (:mod:`.tables`, :mod:`.appends`,
:mod:`.reads`, :mod:`.scans`, :mod:`.plans`), over :class:`~.base.CallsBase`;
:class:`DataCalls` is all of them.
"""

from __future__ import annotations

from gateway.server.calls.appends import AppendBody, AppendCalls, append_response
from gateway.server.calls.base import OFFLOAD_BYTES, OFFLOAD_RECORDS
from gateway.server.calls.errors import RESOURCE_ERRNOS, resource_error, wire_error
from gateway.server.calls.plans import PlanCalls
from gateway.server.calls.reads import ReadCalls
from gateway.server.calls.scans import ScanCalls, pieces
from gateway.server.calls.tables import TableCalls

__all__ = [
    "OFFLOAD_BYTES",
    "OFFLOAD_RECORDS",
    "RESOURCE_ERRNOS",
    "AppendBody",
    "DataCalls",
    "append_response",
    "pieces",
    "resource_error",
    "wire_error",
]


class DataCalls(TableCalls, AppendCalls, ReadCalls, ScanCalls, PlanCalls):
    """The metered data-plane operations of one gateway process."""
