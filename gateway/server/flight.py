"""The Arrow Flight edge: bulk reads (scans and stream reads) as Flight ``DoGet`` streams,
bulk appends as ``DoPut`` streams.

Bulk data then moves through Arrow's C++ transport: the batches a read produces are sent
as they are, with no protobuf wrapping and no Python-side IPC encoding. Tenancy is the
other edges': the same API keys (``authorization: Bearer ...``), the same per-tenant
in-flight slots, read quota and metering, through :class:`~gateway.server.calls.DataCalls`.

Flight serves each call on a thread of its own; the stream-table lives on the gateway's
event loop. A call therefore runs an async generator on that loop and pulls its items
one chunk (a few MiB) at a time, so the hop costs nothing per record.

Tickets are JSON (documented with ``GatewayInfo`` in ``proto/tidegate/v1/tidegate.proto``)::

    {"scan": {"namespace": "shop", "name": "orders", "columns": [...], "filter": "...",
              "as_of": null, "limit": null}}
    {"read": {"namespace": "shop", "name": "orders", "partition": 0, "offset": 0,
              "max_records": 10000, "max_bytes": null}}

``GetFlightInfo`` takes the same JSON as a command, or a path ``[namespace, name]`` (a
whole-table scan), and answers one endpoint whose ticket is that command: what generic
Flight clients (ADBC, DuckDB's and pandas' Flight readers) expect.

``DoPut`` appends to the table its descriptor names (a path ``[namespace, name]``, or the
command ``{"append": {"namespace": ..., "name": ...}}``). Each record batch written is one
append request, answered in order by one ``PutResult``: the batch's app metadata is an
``AppendStreamRequest`` (its ``request_id``, and in ``append`` the ``partition``,
``producer_id`` and ``sequence``; ``table`` and ``arrow_ipc`` unset) and the result's is the
``AppendStreamResponse``, exactly as on gRPC's ``AppendStream``; a batch without metadata
is routed by key with no idempotence. Arrow's C++ reads and decompresses the batches and
they are validated on the call's own thread: the event loop sees only decoded batches.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from gateway import metrics
from gateway.config import Settings
from gateway.core import ReadResult
from gateway.server.calls import DataCalls, append_response, pieces, wire_error
from gateway.tenancy import Gate
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import validate_batches
from gateway.wire.errors import (
    InvalidRequest,
    PermissionDenied,
    RetryableError,
    TidegateError,
    Unauthenticated,
    Unimplemented,
)
from gateway.wire.status import error_metadata, error_to_pb

__all__ = ["FlightEdge", "flight_error"]

log = logging.getLogger("tidegate.server")

#: Longest ticket or command accepted (they are a few hundred bytes).
MAX_TICKET_BYTES = 64 * 1024
#: Arrow data per scan chunk pulled from the loop (and per batch sent, at most).
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024
#: Arrow data per batch of a stream read.
_READ_CHUNK_BYTES = 1024 * 1024
_END = object()


def flight_error(err: TidegateError) -> fl.FlightError:
    """The Flight error carrying ``err``: its class by kind, and in ``extra_info`` the
    JSON the SDK turns back into the same :class:`TidegateError`."""
    info = json.dumps(
        {
            "reason": err.reason,
            "message": err.message,
            "metadata": error_metadata(err),
            "retry_after_ms": err.retry_after_ms if isinstance(err, RetryableError) else None,
        }
    ).encode()
    cls: type[fl.FlightError]
    if isinstance(err, Unauthenticated):
        cls = fl.FlightUnauthenticatedError
    elif isinstance(err, PermissionDenied):
        cls = fl.FlightUnauthorizedError
    elif isinstance(err, RetryableError):
        cls = fl.FlightUnavailableError
    else:
        cls = fl.FlightServerError
    return cls(err.message, extra_info=info)


# --------------------------------------------------------------------------------------
# Tickets
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScanCommand:
    namespace: str
    name: str
    columns: list[str] | None
    filter: str | None
    as_of: int | str | None
    limit: int | None


@dataclass(frozen=True, slots=True)
class ReadCommand:
    namespace: str
    name: str
    partition: int
    offset: int
    max_records: int | None
    max_bytes: int | None


def _field(body: dict[str, Any], key: str, kinds: tuple[type, ...], required: bool) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidRequest(f"the Flight ticket needs {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = " or ".join("an integer" if k is int else "a string" for k in kinds)
        raise InvalidRequest(f"{key!r} of the Flight ticket must be {wanted}, not {value!r}")
    return value


def parse_command(raw: bytes) -> ScanCommand | ReadCommand:
    """A ticket's or command's JSON as a command.

    Raises:
        InvalidRequest: not one JSON object ``{"scan": {...}}`` or ``{"read": {...}}``
            with fields of the right types.
    """
    if len(raw) > MAX_TICKET_BYTES:
        raise InvalidRequest(f"the Flight ticket is over {MAX_TICKET_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest(
            'the Flight ticket is not JSON; send {"scan": {...}} or {"read": {...}}'
        ) from None
    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in ("scan", "read"):
        raise InvalidRequest(
            'the Flight ticket must be one object, {"scan": {...}} or {"read": {...}}'
        )
    kind, body = next(iter(doc.items()))
    if not isinstance(body, dict):
        raise InvalidRequest(f"the Flight ticket's {kind!r} must be an object")
    unknown = sorted(set(body) - set(_KNOWN[kind]))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {unknown} in the Flight {kind} ticket; known: {_KNOWN[kind]}"
        )
    namespace = _field(body, "namespace", (str,), True)
    name = _field(body, "name", (str,), True)
    if kind == "scan":
        columns = body.get("columns")
        if columns is not None and (
            not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)
        ):
            raise InvalidRequest("'columns' of the Flight ticket must be a list of names")
        return ScanCommand(
            namespace,
            name,
            columns or None,
            _field(body, "filter", (str,), False) or None,
            _field(body, "as_of", (int, str), False),
            _field(body, "limit", (int,), False),
        )
    return ReadCommand(
        namespace,
        name,
        _field(body, "partition", (int,), True),
        _field(body, "offset", (int,), True),
        _field(body, "max_records", (int,), False),
        _field(body, "max_bytes", (int,), False),
    )


_KNOWN = {
    "scan": ["namespace", "name", "columns", "filter", "as_of", "limit"],
    "read": ["namespace", "name", "partition", "offset", "max_records", "max_bytes"],
}


# --------------------------------------------------------------------------------------
# Who is calling
# --------------------------------------------------------------------------------------
class _Caller(fl.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, tenant: str, authorization: str | None) -> None:
        self.tenant = tenant
        self.authorization = authorization


class _Auth(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Resolves every call's key to its tenant (and counts the request) before the call
    runs, as the gRPC interceptor does."""

    def __init__(self, edge: FlightEdge) -> None:
        super().__init__()
        self.edge = edge

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> _Caller:
        values = headers.get("authorization") or [None]
        raw = values[0]
        authorization = raw.decode() if isinstance(raw, bytes) else raw
        tenant = self.edge.on_loop(self.edge.gate.tenant_of(authorization))
        return _Caller(tenant, authorization)


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------
# pyarrow 26 turns any exception of a GetSchema handler, FlightError included, into a
# status carrying the Python traceback (its other handlers send a FlightError's message
# alone), and a traceback names the server's files. So this one handler is compiled under
# a name of its own and raises a fresh error from there: what the caller sees names no
# file of the server.
_GET_SCHEMA = """
def get_schema(self, context, descriptor):
    try:
        return self.edge.schema_result(context.get_middleware("tidegate"), descriptor)
    except BaseException as exc:
        error = self.edge.schema_error(exc)
    raise error
"""
_scope: dict[str, Any] = {}
exec(compile(_GET_SCHEMA, "<tidegate flight>", "exec"), _scope)
_get_schema = _scope["get_schema"]


class _Server(fl.FlightServerBase):  # type: ignore[misc]
    def __init__(self, edge: FlightEdge, location: str) -> None:
        super().__init__(location, middleware={"tidegate": _Auth(edge)})
        self.edge = edge

    def get_flight_info(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        return self.edge.guard(self.edge.flight_info, descriptor)

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.FlightDataStream:
        caller = context.get_middleware("tidegate")
        return self.edge.guard(self.edge.do_get, caller, ticket.ticket)

    get_schema = _get_schema  # see _GET_SCHEMA

    # What this edge does not serve answers one sentence (pyarrow's own answer to an
    # unimplemented method is a Python traceback). pyarrow has no Flight error of status
    # UNIMPLEMENTED: the transport status is UNKNOWN, the reason in the error's
    # extra_info (which the SDK reads) is UNIMPLEMENTED.
    def list_flights(self, context: Any, criteria: bytes) -> Any:
        raise _unimplemented("ListFlights")

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        caller = context.get_middleware("tidegate")
        self.edge.guard(self.edge.do_put, caller, descriptor, reader, writer)

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise _unimplemented("DoExchange")

    def do_action(self, context: Any, action: fl.Action) -> Any:
        raise _unimplemented(f"DoAction ({str(action.type)[:40]!r})", "it has no actions")

    def list_actions(self, context: Any) -> list[Any]:
        return []  # none: an empty list is the answer


def _unimplemented(method: str, instead: str = "") -> fl.FlightError:
    return flight_error(
        Unimplemented(
            f"Tidegate's Flight edge does not serve {method}; it serves GetFlightInfo, "
            f"DoGet (scans and stream reads) and DoPut (appends)"
            f"{'; ' + instead if instead else ''}"
        )
    )


class FlightEdge:
    """The Flight server of one gateway process, serving on its own threads and running
    each call's work on the gateway's event loop."""

    def __init__(self, calls: DataCalls, settings: Settings) -> None:
        self.calls = calls
        self.gate: Gate = calls.gate
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        host = settings.server.host
        self._server = _Server(self, f"grpc+tcp://{host}:{settings.server.flight_port}")
        self.port: int = self._server.port

    async def stop(self) -> None:
        await asyncio.to_thread(self._server.shutdown)

    # The loop bridge ---------------------------------------------------------------------
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
        return self.on_loop(anext(items, _END))

    def _close(self, items: Any) -> None:
        if not self.loop.is_closed():
            fut = asyncio.run_coroutine_threadsafe(items.aclose(), self.loop)
            try:
                fut.result(timeout=30)
            except Exception:  # closing after the client went away
                log.debug("closing a Flight stream failed", exc_info=True)

    # Calls -------------------------------------------------------------------------------
    @staticmethod
    def _command(descriptor: fl.FlightDescriptor) -> bytes:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            path = [p.decode() if isinstance(p, bytes) else str(p) for p in descriptor.path]
            if len(path) != 2:
                raise InvalidRequest(
                    f"a Flight path names a table as [namespace, name], not {path}"
                )
            return json.dumps({"scan": {"namespace": path[0], "name": path[1]}}).encode()
        return bytes(descriptor.command)

    def schema_result(self, caller: _Caller, descriptor: fl.FlightDescriptor) -> Any:
        """GetSchema: the schema DoGet would stream for the descriptor's command."""
        command = parse_command(self._command(descriptor))
        columns = command.columns if isinstance(command, ScanCommand) else None
        schema = self.on_loop(
            self.calls.scan_schema(caller.tenant, command.namespace, command.name, columns)
        )
        return fl.SchemaResult(schema)

    @staticmethod
    def schema_error(exc: BaseException) -> fl.FlightError:
        if isinstance(exc, fl.FlightError):
            return type(exc)(str(exc), extra_info=exc.extra_info)
        return flight_error(wire_error(exc, "GetSchema"))

    def flight_info(self, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        command = self._command(descriptor)
        parse_command(command)  # a bad command fails here, not at DoGet
        endpoint = fl.FlightEndpoint(fl.Ticket(command), [])
        # The schema comes with the stream; an empty one here spares a second table load.
        return fl.FlightInfo(pa.schema([]), descriptor, [endpoint], -1, -1)

    def do_put(
        self, caller: _Caller, descriptor: fl.FlightDescriptor, reader: Any, writer: Any
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

    def _put_one(
        self, caller: _Caller, namespace: str, name: str, number: int, chunk: Any
    ) -> bytes:
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
        self, caller: _Caller, namespace: str, name: str, batch: pa.RecordBatch, append: Any
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

    def do_get(self, caller: _Caller, raw: bytes) -> fl.FlightDataStream:
        command = parse_command(raw)
        kind = "scan" if isinstance(command, ScanCommand) else "read"
        items = (
            self._scan(caller.tenant, command)
            if isinstance(command, ScanCommand)
            else self._read(caller.tenant, command)
        )
        # The schema (or the call's error) and the first chunk in one trip to the loop.
        schema, first = self.on_loop(_head(items))
        return fl.GeneratorStream(schema, self._drain(kind, items, first))

    def _drain(self, kind: str, items: AsyncIterator[Any], chunk: Any) -> Iterator[Any]:
        """The chunks of ``items`` for Flight's GeneratorStream: a C++ reader is drained
        by Arrow's C++ (Python runs again only for the next chunk); a chunk marked
        :class:`_Last` ends the call without another trip to the loop."""
        closed = False
        try:
            while chunk is not _END:
                last = isinstance(chunk, _Last)
                if last:
                    chunk = chunk.items
                readers = sum(1 for c in chunk if isinstance(c, pa.RecordBatchReader))
                metrics.record_flight_sent(kind, readers, len(chunk) - readers)
                yield from chunk
                if last:
                    # The generator has nothing left: let it close on the loop, unawaited.
                    closed = True
                    if not self.loop.is_closed():
                        asyncio.run_coroutine_threadsafe(_quietly_close(items), self.loop)
                    return
                chunk = self._pull(items)
        finally:
            if not closed:
                self._close(items)

    async def _scan(self, tenant: str, cmd: ScanCommand) -> AsyncIterator[Any]:
        """The scan's schema, then its chunks: C++ readers over whole parts of it
        (:meth:`DataCalls.scan_parts`), or lists of batches for a scan with a limit."""
        async with self.gate.admit(tenant):
            result = await self.calls.scan(
                tenant,
                cmd.namespace,
                cmd.name,
                columns=cmd.columns,
                row_filter=cmd.filter,
                as_of=cmd.as_of,
                limit=cmd.limit,
            )
            yield result.schema
            if result.parts is not None:
                await result.batches.aclose()  # type: ignore[attr-defined]
                async for reader in self.calls.scan_parts(tenant, result, _SCAN_CHUNK_BYTES):
                    yield [reader]
                return
            async for batches in self.calls.scan_chunks(
                tenant, result, _as_is, _SCAN_CHUNK_BYTES, in_place=True
            ):
                yield batches

    async def _read(self, tenant: str, cmd: ReadCommand) -> AsyncIterator[Any]:
        """The table's schema, then stream reads from ``cmd.offset`` until
        ``max_records`` (default ``server.default_read_records``) or the high watermark:
        each read's batches but its last as a C++ reader, its last batch with
        ``next_offset``, ``high_watermark`` and ``tiered_watermark`` as JSON metadata."""
        wanted = cmd.max_records or self.settings.server.default_read_records
        if wanted < 0:
            raise InvalidRequest("max_records must not be negative")
        async with self.gate.admit(tenant):
            offset, seen, first = cmd.offset, 0, True
            while True:
                result: ReadResult = await self.calls.read(
                    tenant,
                    cmd.namespace,
                    cmd.name,
                    cmd.partition,
                    offset,
                    wanted - seen,
                    cmd.max_bytes,
                    _result_size,
                    in_place=True,
                )
                if first:
                    yield result.schema
                    first = False
                got = result.next_offset - offset
                meta = pa.py_buffer(
                    json.dumps(
                        {
                            "next_offset": result.next_offset,
                            "high_watermark": result.high_watermark,
                            "tiered_watermark": result.tiered_watermark,
                        }
                    ).encode()
                )
                cut = [p for b in result.batches for p in pieces(b, _READ_CHUNK_BYTES)]
                cut = cut or [pa.RecordBatch.from_pylist([], schema=result.schema)]
                chunk: list[Any] = [(cut[-1], meta)]
                if len(cut) > 1:
                    chunk.insert(0, pa.Table.from_batches(cut[:-1], result.schema).to_reader())
                seen += got
                offset = result.next_offset
                if got == 0 or seen >= wanted or offset >= result.high_watermark:
                    yield _Last(chunk)
                    return
                yield chunk


def parse_put(descriptor: fl.FlightDescriptor) -> tuple[str, str]:
    """The ``(namespace, name)`` a ``DoPut`` appends to: a path ``[namespace, name]`` or the
    command ``{"append": {"namespace": ..., "name": ...}}``.

    Raises:
        InvalidRequest: neither.
    """
    if descriptor.descriptor_type == fl.DescriptorType.PATH:
        path = [p.decode() if isinstance(p, bytes) else str(p) for p in descriptor.path]
        if len(path) == 2:
            return path[0], path[1]
        raise InvalidRequest(f"a DoPut path names a table as [namespace, name], not {path}")
    raw = bytes(descriptor.command)
    wanted = 'a DoPut command is {"append": {"namespace": ..., "name": ...}}'
    if len(raw) > MAX_TICKET_BYTES:
        raise InvalidRequest(f"the DoPut command is over {MAX_TICKET_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest(f"the DoPut command is not JSON; {wanted}") from None
    body = doc.get("append") if isinstance(doc, dict) and len(doc) == 1 else None
    if not isinstance(body, dict) or set(body) - {"namespace", "name"}:
        raise InvalidRequest(wanted)
    return _field(body, "namespace", (str,), True), _field(body, "name", (str,), True)


def _chunks(reader: Any) -> Iterator[Any]:
    """The messages of a ``DoPut`` (Arrow's C++ reads and decompresses them)."""
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return


@dataclass(frozen=True, slots=True)
class _Last:
    """The last chunk of a call."""

    items: list[Any]


async def _head(items: AsyncIterator[Any]) -> tuple[pa.Schema, Any]:
    schema = await anext(items)
    return schema, await anext(items, _END)


async def _quietly_close(items: Any) -> None:
    try:
        await items.aclose()
    except Exception:  # closing after the client went away
        log.debug("closing a Flight stream failed", exc_info=True)


def _as_is(batches: list[pa.RecordBatch]) -> tuple[list[pa.RecordBatch], int]:
    return batches, sum(b.nbytes for b in batches)


def _result_size(result: ReadResult) -> tuple[ReadResult, int]:
    return result, result.nbytes
