"""The servicer's append methods: unary appends and append streams."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway.server.calls import append_response, wire_error
from gateway.server.grpc.calls import current_call
from gateway.server.grpc.service.base import ServicerBase
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import PermissionDenied, Unauthenticated
from gateway.wire.status import error_to_pb

__all__ = ["AppendMethods"]

log = logging.getLogger("gateway.server.grpc.server")


class AppendMethods(ServicerBase):
    async def _append(self, request: pb.AppendRequest) -> pb.AppendResponse:
        ranges = await self.calls.append_arrow(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            # Each read of a protobuf bytes field returns a fresh copy: take it once.
            request.arrow_ipc,
            partition=request.partition if request.HasField("partition") else None,
            producer_id=request.producer_id or None,
            sequence=request.sequence if request.HasField("sequence") else None,
        )
        return append_response(ranges)

    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendResponse:
        return await self._append(request)

    async def AppendStream(
        self, request_iterator: AsyncIterator[pb.AppendStreamRequest], context: Any
    ) -> AsyncIterator[pb.AppendStreamResponse]:
        """Appends answered in order. The stream holds one of the tenant's append-stream
        slots (the interceptor's); each message is a request of its own (its credential
        checked again, charged to requests/s, served under one of the tenant's in-flight
        slots), and a stream that sends nothing for ``server.stream_idle_s`` is ended."""
        caller = current_call()
        idle_s = self.settings.server.stream_idle_s
        messages = aiter(request_iterator)
        while True:
            try:
                req = await asyncio.wait_for(anext(messages, None), idle_s)
            except TimeoutError:
                log.debug("an append stream of tenant %s was idle for %ss", caller.tenant, idle_s)
                return
            if req is None:
                return
            try:
                async with self.calls.stream_message(caller.tenant, caller.authorization):
                    ok = await self._append(req.append)
                yield pb.AppendStreamResponse(request_id=req.request_id, ok=ok)
            except (Unauthenticated, PermissionDenied):
                raise  # a revoked key or a suspended tenant ends the stream
            except Exception as exc:
                # One refused request does not end the stream: it is answered in place.
                err = wire_error(exc, "AppendStream")
                yield pb.AppendStreamResponse(request_id=req.request_id, error=error_to_pb(err))
