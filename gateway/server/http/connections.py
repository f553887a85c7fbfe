"""HTTP connections that cannot be held open for nothing: uvicorn's HTTP/1.1 protocol with
a connection cap and read timeouts.

uvicorn closes a keep-alive connection that stays silent after an answer
(``timeout_keep_alive``, :attr:`ServerConfig.http_keep_alive_s`), but nothing else: a
connection that never sends a byte, sends half its headers, or stops in the middle of its
body (``Content-Length`` or chunked) is kept forever, and so is one that goes on sending
the unread body of a request already answered. Each holds a descriptor and buffers, so a
stranger with a few thousand sockets could take the gateway's descriptors from everyone.

:func:`guarded_protocol` adds, per connection:

- **a cap**: past ``server.max_connections`` open connections a new one is answered
  ``503`` with ``Connection: close`` and closed at once;
- **a header timeout**: a request's headers must arrive within
  ``server.header_timeout_s`` of the connection being made or of the previous answer;
- **a body timeout**: a body being received may pause for at most
  ``server.body_timeout_s`` between two reads (not counted while the gateway itself is
  not reading, e.g. while a request waits for its turn);
- **a bounded drain**: a request answered before its body was read (401, 413, 429) may
  send at most :data:`LINGER_BYTES` more of it, read and dropped, then the connection is
  closed (the answer has been written before). A client sends its whole body before it
  reads the answer (httpx, requests, curl without ``Expect``): a connection closed while
  it is still sending resets, and a reset may reach it before it reads the answer, so
  the bound covers a body a few times over the JSON limit (``server.max_body_bytes``,
  4 MiB), the size of an honest mistake. Within it the connection serves the next request.

Each such closing is counted in ``tidegate_edge_connections_closed_total{edge="http"}`` and
logged at most every few seconds, never with a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway import metrics
from gateway.config import ServerConfig
from gateway.logs import LogLimiter

__all__ = ["LINGER_BYTES", "guarded_protocol"]

log = logging.getLogger("tidegate.server")

#: Most bytes of an answered request's unread body drained before the connection closes
#: (a body refused 413 at its declared length included: see the module).
LINGER_BYTES = 8 * 1024 * 1024
_BUSY_BODY = (
    b'{"error":{"reason":"UNAVAILABLE","message":"the gateway has as many connections open '
    b'as it takes; retry shortly"}}'
)
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n"
    % len(_BUSY_BODY)
    + _BUSY_BODY
)


def guarded_protocol(server: ServerConfig, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the bounds of the module, for one HTTP server."""
    limiter = LogLimiter(log)
    header_timeout_s = server.header_timeout_s
    body_timeout_s = server.body_timeout_s

    def closed(reason: str) -> None:
        metrics.record_connection_closed("http", reason)
        limiter.log(
            logging.WARNING if reason == "over_cap" else logging.INFO,
            reason,
            "closed an HTTP connection: %s",
            {
                "over_cap": f"{max_connections} connections are open, the most "
                "(server.max_connections)",
                "header_timeout": f"no complete request headers within {header_timeout_s} s",
                "body_timeout": f"the body paused for more than {body_timeout_s} s",
                "linger": f"an answered request's unread body went on past {LINGER_BYTES} bytes",
            }[reason],
        )

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._read_timer: asyncio.TimerHandle | None = None
            #: Bytes received of a body whose request was answered before it was read.
            self._drained: int | None = None

        # The cap ----------------------------------------------------------------------
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if len(self.connections) >= max_connections:
                self.transport = transport  # type: ignore[assignment]
                transport.write(_BUSY)  # type: ignore[attr-defined]
                transport.close()
                closed("over_cap")
                return
            super().connection_made(transport)  # type: ignore[arg-type]
            self._wait("header_timeout", header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        # Timers ---------------------------------------------------------------------
        def _stop_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _wait(self, reason: str, seconds: float) -> None:
            self._stop_timer()
            self._read_timer = self.loop.call_later(seconds, self._timed_out, reason, seconds)

        def _timed_out(self, reason: str, seconds: float) -> None:
            self._read_timer = None
            if self.transport is None or self.transport.is_closing():
                return
            if reason == "body_timeout" and self.flow is not None and self.flow.read_paused:
                # We are not reading (the app has not asked for more yet): not the client's
                # pause.
                self._wait(reason, seconds)
                return
            closed(reason)
            self.transport.close()

        def _track(self) -> None:
            """Set the read timer for what the connection is waiting for now."""
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._read_timer is None:  # the wait for headers started earlier
                    self._wait("header_timeout", header_timeout_s)
            elif state is h11.SEND_BODY:
                self._wait("body_timeout", body_timeout_s)
            else:  # the request is in: the gateway works, then answers
                self._stop_timer()

        # Data -----------------------------------------------------------------------
        def data_received(self, data: bytes) -> None:
            if self._drained is not None:
                self._drained += len(data)
                if self._drained > LINGER_BYTES:
                    closed("linger")
                    self.transport.close()
                    return
            super().data_received(data)
            if self.conn.their_state is not h11.SEND_BODY:
                self._drained = None
            if not self.transport.is_closing():
                self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            self._stop_timer()
            if self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY:
                # Answered before its body was read: take a little more of it, then close.
                self._drained = 0
            self._track()

    return GuardedH11Protocol
