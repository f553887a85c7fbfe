"""What every call of the two client flavours shares: the channel, the credentials, the
reachability guard and the retry loop of unary calls (the classes the clients build on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from gateway.client._channel import (
    DEFAULT_CONNECT_TIMEOUT,
    Reach,
    call_metadata,
    channel_credentials,
    channel_options,
    normalise_target,
)
from gateway.client._flight import FlightReads, flight_location
from gateway.client._lake_read import ColdViews
from gateway.client._requests import ref
from gateway.client._types import TableInfo, TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.errors import SchemaMismatch, TidegateError
from gateway.wire.retry import Retry
from gateway.wire.status import error_from_rpc

__all__ = ["DEFAULT_CALL_RETRY", "AsyncCalls", "SyncCalls"]

#: Retry policy of idempotent unary calls (describe, list, offsets).
DEFAULT_CALL_RETRY = Retry(timeout=30.0)

_T = TypeVar("_T")


class _Channel:
    """What both flavours set up alike: target, credentials, options, metadata, the
    reachability guard and the stub; only the channel functions differ."""

    _insecure: Any
    _secure: Any

    def __init__(
        self,
        endpoint: str,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        root_certificates: bytes | None = None,
        timeout: float = 30.0,
        retry: Retry = DEFAULT_CALL_RETRY,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        options: Sequence[tuple[str, Any]] = (),
        flight: bool | str = True,
        warehouse: str | None = None,
    ) -> None:
        target, scheme_tls = normalise_target(endpoint)
        #: The gateway's local warehouse folder as this host sees it (the folder, or a
        #: mount of it): client-side scans read the plan's files there instead of
        #: through the gateway's links (see :mod:`gateway.client._lake_scan`).
        self.warehouse = warehouse
        #: Partitions' files as read plans gave them, for client-side reads
        #: (:mod:`gateway.client._lake_read`).
        self.lake_views = ColdViews()
        self.timeout = timeout
        self.retry = retry
        self.reach = Reach(target, connect_timeout)
        self.metadata = call_metadata(api_key)
        use_tls = tls if tls is not None else scheme_tls
        creds = channel_credentials(use_tls, root_certificates)
        self._target = target
        self._tls = bool(use_tls if use_tls is not None else root_certificates is not None)
        self._root_certificates = root_certificates
        self._api_key = api_key
        #: True: scans use the gateway's Flight edge when it offers one; False: never; a
        #: location (``grpc+tcp://host:port``): that Flight edge.
        self._flight_mode = flight
        self._flight_known = flight is False
        self._flight_reads: FlightReads | None = None
        opts = channel_options(options)
        self._channel = (
            self._insecure(target, options=opts)
            if creds is None
            else self._secure(target, creds, options=opts)
        )
        self._stub = pb_grpc.TidegateStub(self._channel)
        #: Table schemas read by ``append`` to convert dict rows, by table name.
        self._known_schemas: dict[str, TableInfo] = {}

    def _use_flight(self, info: pb.GatewayInfo | None) -> FlightReads | None:
        """Remember the Flight edge that ``info`` (or the ``flight`` argument) names."""
        mode = self._flight_mode
        location = (
            mode
            if isinstance(mode, str)
            else (flight_location(info, self._target, self._tls) if info is not None else None)
        )
        if location:
            self._flight_reads = FlightReads(
                location,
                f"Bearer {self._api_key}" if self._api_key else None,
                timeout=self.timeout,
                root_certificates=self._root_certificates,
            )
            # A location given by the caller is taken at its word: it appends too.
            self._flight_reads.appends = bool(info.flight_appends) if info is not None else True
        self._flight_known = True
        return self._flight_reads

    def _close_readers(self) -> None:
        self.lake_views.close()
        if self._flight_reads is not None:
            self._flight_reads.close()
            self._flight_reads = None


def _no_flight(err: TidegateError) -> bool:
    """Whether ``err`` says the gateway predates ``GetGatewayInfo`` (so has no Flight)."""
    return err.details.get("grpc_code") == "UNIMPLEMENTED"


class SyncCalls(_Channel):
    """The blocking channel and unary-call loop of :class:`~gateway.client.Client`."""

    _insecure = staticmethod(grpc.insecure_channel)
    _secure = staticmethod(grpc.secure_channel)

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        """The raw gRPC stub (pass ``metadata=client.metadata`` with each call)."""
        return self._stub

    def _call(
        self,
        method: str,
        request: Any,
        *,
        idempotent: bool = False,
        retry: Retry | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One unary call; an idempotent one is retried by ``retry`` (default the
        client's policy), each attempt waiting ``timeout`` (default the client's)."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = getattr(self._stub, method)(
                    request, timeout=timeout or self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = (
                    self.reach.next_delay(retry or self.retry, err, failures, started)
                    if idempotent
                    else self.reach.unsent_delay(err, failures, started)
                )
                if delay is None:
                    raise self.reach.explain(err) from None
                time.sleep(delay)
            else:
                self.reach.ok()
                return answer

    def describe_table(self, table: str | TableRef) -> TableInfo:
        """The table: schema, partitions and live per-partition offsets."""
        request = pb.DescribeTableRequest(table=ref(table))
        return TableInfo.from_pb(self._call("DescribeTable", request, idempotent=True))

    def table_info(self, table: str | TableRef) -> TableInfo:
        """:meth:`describe_table` with the schema parsed into Arrow."""
        return self.describe_table(table)

    def _known(self, table: str | TableRef, call: Callable[[TableInfo], _T]) -> _T:
        """``call(info)`` with the table as last described here, described again, once,
        when it raises SchemaMismatch (the table may have changed since); nothing is
        written by a refused call. Described once per table, not once per call."""
        key = str(TableRef.parse(table))
        cached = self._known_schemas.get(key)
        info = self._known_schemas[key] = cached or self.table_info(table)
        try:
            return call(info)
        except SchemaMismatch:
            if cached is None:
                raise
        info = self._known_schemas[key] = self.table_info(table)
        return call(info)

    def _flight(self) -> FlightReads | None:
        """The gateway's Flight edge, asked once; None when it has none."""
        if self._flight_known:
            return self._flight_reads
        info = None
        if self._flight_mode is True:
            try:
                info = self._call("GetGatewayInfo", pb.GetGatewayInfoRequest(), idempotent=True)
            except TidegateError as err:
                if not _no_flight(err):
                    raise
        return self._use_flight(info)


class AsyncCalls(_Channel):
    """The asyncio channel and unary-call loop of :class:`~gateway.client.AsyncClient`."""

    _insecure = staticmethod(grpc.aio.insecure_channel)
    _secure = staticmethod(grpc.aio.secure_channel)

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        return self._stub

    async def _call(
        self,
        method: str,
        request: Any,
        *,
        idempotent: bool = False,
        retry: Retry | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One unary call; an idempotent one is retried by ``retry`` (default the
        client's policy), each attempt waiting ``timeout`` (default the client's)."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = await getattr(self._stub, method)(
                    request, timeout=timeout or self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = (
                    self.reach.next_delay(retry or self.retry, err, failures, started)
                    if idempotent
                    else self.reach.unsent_delay(err, failures, started)
                )
                if delay is None:
                    raise self.reach.explain(err) from None
                await asyncio.sleep(delay)
            else:
                self.reach.ok()
                return answer

    async def describe_table(self, table: str | TableRef) -> TableInfo:
        request = pb.DescribeTableRequest(table=ref(table))
        return TableInfo.from_pb(await self._call("DescribeTable", request, idempotent=True))

    async def table_info(self, table: str | TableRef) -> TableInfo:
        return await self.describe_table(table)

    async def _known(self, table: str | TableRef, call: Callable[[TableInfo], Awaitable[_T]]) -> _T:
        """``call(info)`` with the table as last described here, described again, once,
        when it raises SchemaMismatch (the table may have changed since); nothing is
        written by a refused call. Described once per table, not once per call."""
        key = str(TableRef.parse(table))
        cached = self._known_schemas.get(key)
        info = self._known_schemas[key] = cached or await self.table_info(table)
        try:
            return await call(info)
        except SchemaMismatch:
            if cached is None:
                raise
        info = self._known_schemas[key] = await self.table_info(table)
        return await call(info)

    async def _flight(self) -> FlightReads | None:
        """The gateway's Flight edge, asked once; None when it has none."""
        if self._flight_known:
            return self._flight_reads
        info = None
        if self._flight_mode is True:
            try:
                info = await self._call(
                    "GetGatewayInfo", pb.GetGatewayInfoRequest(), idempotent=True
                )
            except TidegateError as err:
                if not _no_flight(err):
                    raise
        return self._use_flight(info)
