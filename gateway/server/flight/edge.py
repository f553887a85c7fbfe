"""The Flight server of one gateway process (:class:`FlightEdge`): its reads, appends and
schemas, served on Flight's threads and run on the gateway's event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from gateway.config import Settings
from gateway.server.calls import DataCalls, wire_error
from gateway.server.flight.appends import FlightAppends
from gateway.server.flight.errors import flight_error, unimplemented
from gateway.server.flight.middleware import Auth, Caller
from gateway.server.flight.reads import FlightReads
from gateway.server.flight.tickets import ScanCommand, descriptor_command, parse_command
from gateway.tenancy import Gate

__all__ = ["FlightEdge"]


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
        super().__init__(location, middleware={"tidegate": Auth(edge)})
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
        raise unimplemented("ListFlights")

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        caller = context.get_middleware("tidegate")
        self.edge.guard(self.edge.do_put, caller, descriptor, reader, writer)

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise unimplemented("DoExchange")

    def do_action(self, context: Any, action: fl.Action) -> Any:
        raise unimplemented(f"DoAction ({str(action.type)[:40]!r})", "it has no actions")

    def list_actions(self, context: Any) -> list[Any]:
        return []  # none: an empty list is the answer


class FlightEdge(FlightReads, FlightAppends):
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

    def schema_result(self, caller: Caller, descriptor: fl.FlightDescriptor) -> Any:
        """GetSchema: the schema DoGet would stream for the descriptor's command."""
        command = parse_command(descriptor_command(descriptor))
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
        command = descriptor_command(descriptor)
        parse_command(command)  # a bad command fails here, not at DoGet
        endpoint = fl.FlightEndpoint(fl.Ticket(command), [])
        # The schema comes with the stream; an empty one here spares a second table load.
        return fl.FlightInfo(pa.schema([]), descriptor, [endpoint], -1, -1)
