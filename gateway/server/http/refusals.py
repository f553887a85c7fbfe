"""Refusing an over-quota tenant's HTTP appends before anything else runs.

:class:`AppendRefusals` wraps the whole HTTP app (FastAPI, Starlette's middleware and
routing, the route class): a ``POST .../records`` whose tenant this replica refuses
appends for a while after a throttle (:meth:`~gateway.tenancy.Gate.append_refusal`, no
I/O) is answered 429 from its headers by a few ASGI messages, the cheapest refusal the
edge allows (issue 33, item 9: a tenant at many times its quota must not take the event
loop from its neighbours). Every other request goes on as before; the route refuses the
rest of the over-quota appends (``DataCalls.refuse_append_early``).

The refused body is not read into memory: a declared body of at most
:data:`DRAIN_BYTES` is received and dropped, so the client's connection stays open (a new
connection per refusal costs both sides more than the bytes do); a larger or chunked one
is left unread and the connection closed after the answer.
"""

from __future__ import annotations

import json
import math
import re
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import metrics
from gateway.tenancy import Gate

__all__ = ["DRAIN_BYTES", "AppendRefusals"]

#: Largest declared body of a refused append that is received (and dropped) to keep the
#: connection open.
DRAIN_BYTES = 1024 * 1024
#: The append route's template, as the HTTP metrics name it.
_ROUTE = "/v1/tables/{namespace}/{name}/records"
_APPEND = re.compile(r"/v1/tables/[^/]+/[^/]+/records")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class AppendRefusals:
    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not _APPEND.fullmatch(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        auth = _header(scope, b"authorization")
        err = await self.gate.append_refusal(auth.decode("latin-1") if auth else None)
        if err is None:
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        keep = declared is not None and declared.isdigit() and int(declared) <= DRAIN_BYTES
        if keep:
            while True:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body"):
                    break
        body = json.dumps({"error": err.to_dict()}, separators=(",", ":")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        wait_ms = getattr(err, "retry_after_ms", None)
        if wait_ms is not None:
            headers.append((b"retry-after", str(max(0, math.ceil(wait_ms / 1000))).encode()))
        if not keep:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": err.http_status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        metrics.observe_http_request(_ROUTE, "POST", err.http_status, time.perf_counter() - started)
