"""Flight appends: each batch of a ``DoPut`` one append request, answered in order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from gateway.server.calls import append_response
from gateway.server.flight.bridge import LoopBridge
from gateway.server.flight.middleware import Caller
from gateway.server.flight.tickets import parse_put
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import validate_batches
from gateway.wire.errors import InvalidRequest, PermissionDenied, TidegateError, Unauthenticated
from gateway.wire.status import error_to_pb

__all__ = ["FlightAppends"]


class FlightAppends(LoopBridge):
    """``DoPut``: appends."""

    def do_put(
        self, caller: Caller, descriptor: fl.FlightDescriptor, reader: Any, writer: Any
    ) -> None:
        """Appends of a ``DoPut``: each batch one request, answered in order (see the
        module's docstring). The call holds one of the tenant's append-stream slots and
        each batch is a request of its own, as on gRPC's ``AppendStream``; a refused
        batch is answered in place and the call goes on, a revoked key ends it."""
        namespace, name = parse_put(descriptor)
        slot = self.gate.admit(caller.tenant, stream=True)
        self.on_loop(slot.__aenter__())
        try:
            for number, chunk in enumerate(_chunks(reader)):
                writer.write(pa.py_buffer(self._put_one(caller, namespace, name, number, chunk)))
        finally:
            self.on_loop(slot.__aexit__(None, None, None))

    def _put_one(self, caller: Caller, namespace: str, name: str, number: int, chunk: Any) -> bytes:
        """The answer (an ``AppendStreamResponse``) to batch ``number`` of a ``DoPut``."""
        request = pb.AppendStreamRequest()
        try:
            if chunk.app_metadata is not None and chunk.app_metadata.size:
                try:
                    request.ParseFromString(chunk.app_metadata.to_pybytes())
                except Exception:
                    raise InvalidRequest(
                        f"the app metadata of DoPut batch {number} is not an "
                        "AppendStreamRequest (tidegate.v1)"
                    ) from None
            if chunk.data is None:
                raise InvalidRequest(f"DoPut message {number} carries no record batch")
            validate_batches([chunk.data], number)
            append = request.append
            ranges = self._on_loop_raw(self._append(caller, namespace, name, chunk.data, append))
            response = pb.AppendStreamResponse(
                request_id=request.request_id, ok=append_response(ranges)
            )
        except (Unauthenticated, PermissionDenied):
            raise  # a revoked key or a suspended tenant ends the call
        except TidegateError as err:
            response = pb.AppendStreamResponse(
                request_id=request.request_id, error=error_to_pb(err)
            )
        return response.SerializeToString()

    async def _append(
        self, caller: Caller, namespace: str, name: str, batch: pa.RecordBatch, append: Any
    ) -> Any:
        async with self.calls.stream_message(caller.tenant, caller.authorization):
            return await self.calls.append_batches(
                caller.tenant,
                namespace,
                name,
                [batch],
                partition=append.partition if append.HasField("partition") else None,
                producer_id=append.producer_id or None,
                sequence=append.sequence if append.HasField("sequence") else None,
            )


def _chunks(reader: Any) -> Iterator[Any]:
    """The messages of a ``DoPut`` (Arrow's C++ reads and decompresses them)."""
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return
