"""Request bodies: read only once the caller is known, and never past a limit.

Every HTTP request passes :class:`BodyGuard`, an ASGI middleware around the whole app that
counts the bytes of the body as the app reads them:

- until a route has authenticated its caller, at most :data:`PRE_AUTH_BODY_BYTES` of it may
  be read: enough for the forms whose credential is in the body (the console's sign-in, the
  Iceberg catalog's OAuth2 token request), and a small bound on what a stranger makes the
  gateway hold;
- once the caller is known, the route allows what it takes (:func:`allow_body`):
  ``server.max_body_bytes`` for JSON bodies, ``server.max_request_bytes`` for appends.

A body over the allowance is refused with 413 ``REQUEST_TOO_LARGE`` at its declared
``Content-Length``, before any byte of it is read, or as soon as a chunked body passes it.
An answer given before the body was read says ``Connection: close`` unless the connection
will read the rest of it and drop it (a declared rest of at most
:data:`~gateway.server.http.connections.LINGER_BYTES`): a client must not send its next
request on a connection that is about to close.

The data-plane and admin routers authenticate in their route class
(:class:`~gateway.server.http.deps.CallerRoute`, ``operator_route``) before FastAPI reads
and validates a body model, so a request without a valid key is answered 401 whatever its
body; the guard makes a route that would read first fail its tests instead of buffering.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.server.http.connections import LINGER_BYTES
from gateway.wire.errors import InvalidRequest, RequestTooLarge

__all__ = [
    "PRE_AUTH_BODY_BYTES",
    "BodyGuard",
    "BodyTooLarge",
    "allow_body",
    "check_declared_length",
]

#: Most body bytes read before the caller is known.
PRE_AUTH_BODY_BYTES = 64 * 1024
_ALLOWANCE = "tidegate.body_allowance"


class BodyTooLarge(RequestTooLarge, HTTPException):
    """:class:`RequestTooLarge` raised while the body is read.

    Also an ``HTTPException`` so that FastAPI, which answers 400 to any other error it
    meets while it reads a body model, lets it through to our handler (which answers it as
    the :class:`RequestTooLarge` it is, 413)."""

    def __init__(self, message: str, *, limit: int, size: int) -> None:
        RequestTooLarge.__init__(self, message, limit=limit, size=size)
        self.status_code = self.http_status
        self.detail = message
        self.headers = None


@dataclass(slots=True)
class _Allowance:
    limit: int
    declared: int | None
    #: Whether the request has a body (a declared length above 0, or chunked).
    has_body: bool = False
    received: int = 0
    #: The whole body was received (or the client went away).
    complete: bool = False

    def took(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
        else:
            self.complete = True

    def left_unread(self) -> bool:
        """Whether an answer now leaves a body the connection will not read to its end."""
        if not self.has_body or self.complete:
            return False
        return self.declared is None or self.declared - self.received > LINGER_BYTES

    def check(self, size: int) -> None:
        if size > self.limit:
            raise BodyTooLarge(
                f"the body has {size} bytes; the limit is {self.limit}"
                if size == self.declared
                else f"the body passed the limit of {self.limit} bytes",
                limit=self.limit,
                size=size,
            )


def _declared_length(scope: Scope) -> tuple[int | None, bool]:
    """The request's declared body length, and whether it has a body at all."""
    chunked = False
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value), int(value) > 0
            except ValueError:
                return None, True  # the server refuses such a request before we see it
        if key == b"transfer-encoding":
            chunked = True
    return None, chunked


class BodyGuard:
    """Bounds every request's body by the allowance of the moment (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowance = _Allowance(PRE_AUTH_BODY_BYTES, *_declared_length(scope))
        scope[_ALLOWANCE] = allowance

        async def guarded() -> Message:
            if allowance.declared is not None:
                allowance.check(allowance.declared)  # before reading anything
            message = await receive()
            allowance.took(message)
            if message["type"] == "http.request":
                allowance.check(allowance.received)
            return message

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start" and allowance.left_unread():
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, guarded, answer)


def check_declared_length(request: Request, limit: int) -> None:
    """Refuse a body whose declared ``Content-Length`` is over ``limit``, before reading it.

    Raises:
        RequestTooLarge: over ``limit``.
        InvalidRequest: a ``Content-Length`` that is not a number.
    """
    declared = request.headers.get("content-length")
    if declared is None:
        return
    try:
        length = int(declared)
    except ValueError:
        raise InvalidRequest(f"Content-Length {declared[:40]!r} is not an integer") from None
    if length > limit:
        raise RequestTooLarge(
            f"the body has {length} bytes; the limit is {limit}", limit=limit, size=length
        )


def allow_body(request: Request, limit: int) -> None:
    """Let the route read up to ``limit`` bytes of the body: call it once the caller is
    authenticated.

    Raises:
        RequestTooLarge, InvalidRequest: see :func:`check_declared_length`.
    """
    check_declared_length(request, limit)
    allowance = request.scope.get(_ALLOWANCE)
    if isinstance(allowance, _Allowance):
        allowance.limit = limit
