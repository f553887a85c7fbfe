"""``GET /v1/files/{token}``: a data file of a local warehouse, through the link a read
plan gave for it.

On object storage a plan names each data file by a presigned URL; on a local warehouse
it names it by a link through this gateway (:meth:`DataCalls.plan`), so that a plan shows
no path of the server and an executor needs no access to its folders. The token is the
credential, as a presigned URL's signature is: sealed for one tenant's file until it
expires. Range requests are served (a Parquet reader fetches the footer and the column
chunks it needs).

What a link serves is its tenant's read: the read bucket is checked before (429 with
``Retry-After`` while it is in debt), and the bytes sent are metered and charged after,
with the rows of the row groups they held, each once per link
(:meth:`DataCalls.file_read`, :mod:`gateway.server.calls.links`; docs/decisions/client.md).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import FileResponse
from starlette.types import Message, Receive, Scope, Send

from gateway.server.calls import DataCalls
from gateway.server.http.models import ERRORS
from gateway.wire.errors import NotFound, Unavailable

__all__ = ["files_router"]

log = logging.getLogger(__name__)


class DataFileResponse(FileResponse):
    """A data file, or the range of it asked for, read 4 MiB per trip to a worker thread.

    Starlette reads a file 64 KiB at a time, each read a hop to a thread and back to the
    event loop, so a Parquet reader's column chunk of a few MiB took dozens of hops.
    Executors fetch whole column chunks, so large reads are the common case; 4 MiB per hop
    bounds what one request holds in memory. Measured, this did not move Spark's ratio
    through links (the HTTP edge itself is the cost: the ``warehouse`` read option is what
    reads at disk speed, docs/decisions/spark.md).
    """

    chunk_size = 4 * 1024 * 1024


class MeteredFileResponse(DataFileResponse):
    """A :class:`DataFileResponse` that reports, once sent, its status and the bytes of
    body it sent (``sent(status, nbytes)``)."""

    def __init__(self, path: str, sent: Callable[[int, int], Awaitable[None]]) -> None:
        super().__init__(path, media_type="application/octet-stream")
        self._sent = sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, nbytes = 0, 0

        async def counted(message: Message) -> None:
            nonlocal status, nbytes
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                nbytes += len(message.get("body", b""))
            await send(message)

        try:
            await super().__call__(scope, receive, counted)
        finally:
            if status in (200, 206) and nbytes:
                try:
                    await self._sent(status, nbytes)
                except Exception:  # the bytes went out: the answer stands, the log says
                    log.exception("metering a file link's read failed")


def _openable(path: str) -> None:
    """Open and close the file before any byte of the answer is sent: Starlette opens it
    only after the status and length went out, so a failure there (no descriptor free,
    the file expired) cut the answer short with a traceback in the log.

    Raises:
        Unavailable: no file descriptor is free in the gateway now (retry in a second).
        NotFound: the file is gone (compacted and expired since the plan).
    """
    try:
        os.close(os.open(path, os.O_RDONLY))
    except FileNotFoundError:
        raise NotFound(
            "the data file of this link is gone (compacted and expired since the read was "
            "planned): plan the read again"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        raise Unavailable(
            "the gateway has no file descriptor free to serve this file link now; retry",
            retry_after_ms=1000,
        ) from None


def files_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(prefix="/v1/files", tags=["scans"])

    @router.get(
        "/{token}",
        response_class=DataFileResponse,
        responses={
            200: {"content": {"application/octet-stream": {}}},
            206: {"description": "The range asked for"},
            **ERRORS,
        },
        summary="A data file of a read plan on a local warehouse (the plan's link).",
    )
    async def data_file(
        request: Request,
        token: Annotated[str, Path(max_length=4096, description="The link's sealed token.")],
    ) -> FileResponse:
        """The file's bytes (a ``Range`` header is honoured), metered as the tenant's
        read. 404 when the link is not one of this deployment's, was altered or has
        expired (a plan's links last ``cold.presign_expiry_s``); 429 while the tenant's
        read quota is in debt."""
        found = await calls.linked_file(token)
        if found is None:
            raise NotFound(
                "no such file link, or it has expired: plan the read again for fresh links"
            )

        _openable(str(found.path))
        range_header = request.headers.get("range")

        async def sent(status: int, nbytes: int) -> None:
            await calls.file_read(found, status=status, range_header=range_header, nbytes=nbytes)

        return MeteredFileResponse(str(found.path), sent)

    return router
