"""Errors turned into wire errors in one place, for every edge: :func:`wire_error`."""

from __future__ import annotations

import errno
import logging
import os

from gateway.wire.errors import ResourceUnavailable, TidegateError

__all__ = ["RESOURCE_ERRNOS", "resource_error", "wire_error"]

log = logging.getLogger("tidegate.server")


#: ``errno`` values of a resource the process or the machine ran out of: descriptors,
#: disk space, memory. Retrying later may succeed, so they are never an INTERNAL error.
RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.ENOBUFS}
)

#: Seconds a client is told to wait before retrying after a resource error.
RESOURCE_RETRY_AFTER_MS = 1000


def resource_error(exc: BaseException) -> OSError | MemoryError | None:
    """The resource exhaustion behind ``exc`` (itself, or what it was raised from or
    while handling: pyiceberg, pyarrow and SQLAlchemy wrap the ``OSError``), or None."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, MemoryError):
            return at
        if isinstance(at, OSError) and at.errno in RESOURCE_ERRNOS:
            return at
        at = at.__cause__ or at.__context__
    return None


def wire_error(exc: BaseException, where: str = "a call") -> TidegateError:
    """The error to send for ``exc``: a :class:`TidegateError` as it is; a resource the
    gateway ran out of (descriptors, disk space, memory: :func:`resource_error`) as a
    retryable :class:`~gateway.wire.errors.ResourceUnavailable`; anything else is logged
    with its traceback and answered as a bare INTERNAL error, whose message names nothing
    of the gateway's internals."""
    if isinstance(exc, TidegateError):
        return exc
    short = resource_error(exc)
    if short is not None:
        what = "memory" if isinstance(short, MemoryError) else os.strerror(short.errno or 0).lower()
        log.warning("%s failed for want of a resource: %s", where, what)
        return ResourceUnavailable(
            f"the gateway is short of a resource ({what}); retry later",
            retry_after_ms=RESOURCE_RETRY_AFTER_MS,
        )
    log.error("unexpected error in %s", where, exc_info=exc)
    return TidegateError("internal error; see the gateway log")
