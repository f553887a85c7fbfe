"""The hop between Flight's threads and the gateway's event loop, which every part of
:class:`~gateway.server.flight.FlightEdge` runs its work through."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pyarrow.flight as fl

from gateway.config import Settings
from gateway.server.calls import DataCalls, wire_error
from gateway.server.flight.errors import flight_error
from gateway.tenancy import Gate
from gateway.wire.errors import TidegateError

__all__ = ["END", "LoopBridge"]

log = logging.getLogger("tidegate.server")

#: What an exhausted call's generator answers.
END = object()


class LoopBridge:
    """The calls, gate, settings and event loop of the edge, and the loop bridge."""

    calls: DataCalls
    gate: Gate
    settings: Settings
    loop: asyncio.AbstractEventLoop

    def on_loop(self, coro: Any) -> Any:
        """Run ``coro`` on the gateway's loop and wait for its result here (a Flight
        thread); a :class:`TidegateError` comes back as its Flight error."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        except TidegateError as err:
            raise flight_error(err) from None
        except fl.FlightError:
            raise
        except Exception as exc:
            raise flight_error(wire_error(exc, "a Flight call")) from None

    def _on_loop_raw(self, coro: Any) -> Any:
        """Run ``coro`` on the gateway's loop and wait for its result here; its error comes
        back as a :class:`TidegateError` (an unexpected one as the error it maps to)."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        except TidegateError:
            raise
        except Exception as exc:
            raise wire_error(exc, "a Flight call") from None

    def guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except TidegateError as err:
            raise flight_error(err) from None

    def _pull(self, items: AsyncIterator[Any]) -> Any:
        return self.on_loop(anext(items, END))

    def _close(self, items: Any) -> None:
        if not self.loop.is_closed():
            fut = asyncio.run_coroutine_threadsafe(items.aclose(), self.loop)
            try:
                fut.result(timeout=30)
            except Exception:  # closing after the client went away
                log.debug("closing a Flight stream failed", exc_info=True)
