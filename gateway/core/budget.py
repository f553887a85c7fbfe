"""How much read data the gateway holds at once: a budget for the process and a share of it
per tenant, so that no tenant's streams (however many) can grow the gateway without bound.

Every read reserves its bound (:data:`READ_COPIES` times its byte cap) before it reads,
and gives it back once its answer is handed to the network; a stream keeps its previous
answer's share while it goes on answering, as the transport may still hold it. Past the
budget a read either waits (follow streams and scans already under way: back-pressure) or
is refused at once with :class:`~gateway.wire.errors.Throttled` and a retry-after hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from gateway.wire.errors import Throttled

__all__ = ["READ_COPIES", "ReadBudget"]

#: Retry hint of a read refused for want of memory.
_RETRY_MS = 200
#: What an answer costs the gateway, in multiples of its size, and so what a read reserves:
#: the decoded rows, their Arrow IPC encoding, the protobuf message's copy, gRPC's serialized
#: copy and transport buffers, and the allocator's slack. Measured with stalled follow
#: streams (tests/hostile/test_memory.py): about six.
READ_COPIES = 6


class ReadBudget:
    """Bytes of read data held at once: at most ``total`` in all, ``per_tenant`` for one
    tenant. Used from the event loop only."""

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = min(per_tenant, total)
        self.held = 0
        self._tenants: dict[str, int] = {}
        #: Set (and replaced) whenever bytes are given back.
        self._freed = asyncio.Event()

    def held_by(self, tenant: str) -> int:
        return self._tenants.get(tenant, 0)

    def _fits(self, tenant: str, nbytes: int) -> bool:
        mine = self._tenants.get(tenant, 0)
        # A reservation alone may pass its cap (one large read), so nothing ever waits
        # forever; it still has to wait for everything else to be given back.
        if mine and mine + nbytes > self.per_tenant:
            return False
        return not self.held or self.held + nbytes <= self.total

    async def reserve(
        self, tenant: str, nbytes: int, *, wait_s: float = 0.0, force: bool = False
    ) -> None:
        """Take ``nbytes`` for the tenant; give them back with :meth:`release`. With
        ``force``, take them whatever is held (to account for data already read).

        Raises:
            Throttled: no room within ``wait_s`` seconds (at once for 0).
        """
        deadline = time.monotonic() + wait_s
        while not force and not self._fits(tenant, nbytes):
            left = deadline - time.monotonic()
            if left <= 0:
                raise Throttled(
                    "the gateway holds as much read data as its memory budget allows; "
                    "retry shortly",
                    retry_after_ms=_RETRY_MS,
                    quota="read_memory",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), left)
        self.held += nbytes
        self._tenants[tenant] = self._tenants.get(tenant, 0) + nbytes

    def release(self, tenant: str, nbytes: int) -> None:
        self.held -= nbytes
        # An empty answer holds 0 bytes: another read of the tenant may have emptied and
        # removed its entry meanwhile.
        left_held = self._tenants.get(tenant, 0) - nbytes
        if left_held > 0:
            self._tenants[tenant] = left_held
        else:
            self._tenants.pop(tenant, None)
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

    @contextlib.asynccontextmanager
    async def hold(
        self, tenant: str, nbytes: int, *, wait_s: float = 0.0, force: bool = False
    ) -> AsyncIterator[None]:
        """:meth:`reserve` ``nbytes`` while the block runs.

        Raises:
            Throttled: no room within ``wait_s`` seconds (at once for 0).
        """
        await self.reserve(tenant, nbytes, wait_s=wait_s, force=force)
        try:
            yield
        finally:
            self.release(tenant, nbytes)
