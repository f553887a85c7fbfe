"""What every call of the two client flavours shares: the channel, the credentials, the
reachability guard and the retry loop of unary calls (the classes the clients build on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

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
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.retry import Retry
from gateway.wire.status import error_from_rpc

__all__ = ["DEFAULT_CALL_RETRY", "AsyncCalls", "SyncCalls"]

#: Retry policy of idempotent unary calls (describe, list, offsets).
DEFAULT_CALL_RETRY = Retry(timeout=30.0)


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
    ) -> None:
        target, scheme_tls = normalise_target(endpoint)
        self.timeout = timeout
        self.retry = retry
        self.reach = Reach(target, connect_timeout)
        self.metadata = call_metadata(api_key)
        creds = channel_credentials(tls if tls is not None else scheme_tls, root_certificates)
        opts = channel_options(options)
        self._channel = (
            self._insecure(target, options=opts)
            if creds is None
            else self._secure(target, creds, options=opts)
        )
        self._stub = pb_grpc.TidegateStub(self._channel)


class SyncCalls(_Channel):
    """The blocking channel and unary-call loop of :class:`~gateway.client.Client`."""

    _insecure = staticmethod(grpc.insecure_channel)
    _secure = staticmethod(grpc.secure_channel)

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        """The raw gRPC stub (pass ``metadata=client.metadata`` with each call)."""
        return self._stub

    def _call(self, method: str, request: Any, *, idempotent: bool = False) -> Any:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = getattr(self._stub, method)(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = (
                    self.reach.next_delay(self.retry, err, failures, started)
                    if idempotent
                    else None
                )
                if delay is None:
                    raise self.reach.explain(err) from None
                time.sleep(delay)
            else:
                self.reach.ok()
                return answer


class AsyncCalls(_Channel):
    """The asyncio channel and unary-call loop of :class:`~gateway.client.AsyncClient`."""

    _insecure = staticmethod(grpc.aio.insecure_channel)
    _secure = staticmethod(grpc.aio.secure_channel)

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        return self._stub

    async def _call(self, method: str, request: Any, *, idempotent: bool = False) -> Any:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = await getattr(self._stub, method)(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = (
                    self.reach.next_delay(self.retry, err, failures, started)
                    if idempotent
                    else None
                )
                if delay is None:
                    raise self.reach.explain(err) from None
                await asyncio.sleep(delay)
            else:
                self.reach.ok()
                return answer
