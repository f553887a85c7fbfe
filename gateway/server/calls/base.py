"""What every part of :class:`~gateway.server.calls.DataCalls` stands on: the core and the
gate it calls, and the I/O pool large answers are encoded on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gateway.core import StreamTables
from gateway.tenancy import Gate

__all__ = ["OFFLOAD_BYTES", "OFFLOAD_RECORDS", "CallsBase"]

T = TypeVar("T")


#: Answers of at least this many records are encoded on the I/O pool.
OFFLOAD_RECORDS = 2_000
#: Bodies of at least this many bytes (on the wire or decompressed) are read on the I/O pool.
OFFLOAD_BYTES = 256 * 1024


class CallsBase:
    """The core and the gate of one gateway process, which each part of
    :class:`~gateway.server.calls.DataCalls` calls."""

    def __init__(self, service: StreamTables, gate: Gate) -> None:
        self.service = service
        self.gate = gate

    async def offload(self, big: bool, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the I/O pool when ``big``, else here."""
        if big:
            return await self.service.offload(fn, *args)
        return fn(*args)
