"""The Kafka listener: an asyncio server, one request loop per connection.

A connection first authenticates with SASL/PLAIN (user: the tenant's name, password: one
of its API keys, checked by the same :class:`~gateway.tenancy.Gate` as every edge); until
then it may send only ApiVersions and the SASL requests, each at most
``kafka.auth_frame_bytes``, each within ``server.header_timeout_s``. Afterwards a request
may be as large as an append (``server.max_request_bytes``, plus room for Kafka's
framing). A declared size over the bound closes the connection before any of the request
is read; so do a frame that is not a request of a served API and version (as Kafka does),
a request that does not arrive whole within ``server.body_timeout_s`` once its size came
(``server.header_timeout_s`` before authentication), and ``kafka.idle_s`` without a
request. Requests of a connection are served one at a
time, in order, as Kafka serves them.

The gateway replicas that share a metadata store are the Kafka cluster's brokers
(:mod:`~gateway.server.kafka.cluster`): the listener registers this one once it listens
and leaves the cluster when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import time
from typing import Any

from gateway import metrics
from gateway.config import Settings
from gateway.server.calls import DataCalls, wire_error
from gateway.server.kafka.apis import LONGEST_MUTE_S, Broker, KafkaApis, held_while_throttled
from gateway.server.kafka.classic import ClassicGroups
from gateway.server.kafka.cluster import Cluster
from gateway.server.kafka.consumer_groups import ConsumerGroups
from gateway.server.kafka.logins import LoginRates
from gateway.server.kafka.producers import ProducerEpochs
from gateway.server.kafka.protocol import (
    API_VERSIONS_KEY,
    BEFORE_AUTH,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    ErrorCode,
    Request,
    Unanswerable,
    api_name,
    api_versions_fallback,
    build,
    encode_response,
    first_error,
    parse_request,
    response_class,
    supported_apis,
)
from gateway.server.kafka.published import GroupPublisher
from gateway.wire.errors import PermissionDenied, TidegateError, Unauthenticated

__all__ = ["CannotListen", "KafkaEdge"]

log = logging.getLogger("tidegate.server.kafka")

#: Room over ``server.max_request_bytes`` for a Produce request's framing (headers,
#: topic names, record batch headers).
_FRAMING_BYTES = 1024 * 1024


class _Close(Exception):
    """End the connection (the message, for the log; ``reason``, for the metric of the
    connections the gateway closed, empty when the client closed it)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class CannotListen(TidegateError):
    """The listener's settings cannot be served (its TLS files)."""

    reason = "CANNOT_START"


class KafkaEdge:
    """The Kafka listener of one gateway process, on the gateway's event loop."""

    def __init__(self, calls: DataCalls, settings: Settings, max_connections: int) -> None:
        self.calls = calls
        self.settings = settings
        self.max_connections = max_connections
        self.connections: set[asyncio.Task[Any]] = set()
        #: Authenticated connections per tenant.
        self.tenants: dict[str, int] = {}
        #: Logins per tenant a second (``kafka.max_tenant_connection_rate``).
        self.logins = LoginRates(settings.kafka.max_tenant_connection_rate, LONGEST_MUTE_S)
        self._server: asyncio.Server | None = None
        self.port = settings.kafka.port
        #: The classic consumer groups of this listener's connections.
        self.groups = ClassicGroups()
        #: Its KIP-848 consumer groups.
        self.consumer_groups = ConsumerGroups(
            settings.kafka.consumer_session_timeout_ms / 1000,
            settings.kafka.consumer_heartbeat_interval_ms,
        )
        #: The newest epoch of each idempotent producer of its connections.
        self.producers = ProducerEpochs()
        #: The cluster's live brokers (this replica alone until it listens).
        self.cluster = Cluster(self.broker)
        #: Publishes its groups for the group description (from :meth:`start`).
        self.publisher: GroupPublisher | None = None

    @property
    def broker(self) -> Broker:
        """This replica as clients are told to reach it."""
        k, host = self.settings.kafka, self.settings.server.host
        if not k.advertised_host and host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return Broker(k.advertised_host or host, k.advertised_port or self.port)

    def _clustered(self) -> bool:
        """Whether this replica registers among the brokers of its metadata store."""
        mode = self.settings.kafka.cluster
        return mode == "on" or (
            mode == "auto" and not self.settings.metadata_url.startswith("sqlite")
        )

    def _tls(self) -> ssl.SSLContext | None:
        """The listener's TLS context from ``kafka.tls_cert_file`` and ``tls_key_file``,
        or None for plaintext.

        Raises:
            CannotListen: one file without the other, or files that are not a PEM
                certificate and its key.
        """
        k = self.settings.kafka
        if k.tls_cert_file is None and k.tls_key_file is None:
            return None
        if k.tls_cert_file is None or k.tls_key_file is None:
            raise CannotListen("kafka.tls_cert_file and kafka.tls_key_file go together")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(k.tls_cert_file, k.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise CannotListen(
                f"the Kafka listener's TLS certificate {k.tls_cert_file} and key "
                f"{k.tls_key_file} cannot be used: {exc}"
            ) from None
        return context

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            self.settings.server.host,
            self.settings.kafka.port,
            limit=64 * 1024,
            ssl=self._tls(),
            # A TLS handshake is part of what a connection owes before it authenticates.
            ssl_handshake_timeout=self.settings.server.header_timeout_s
            if self.settings.kafka.tls_cert_file
            else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        k = self.settings.kafka
        if self._clustered():
            self.cluster = Cluster(
                self.broker,
                registry=self.calls.service,
                replica_id=k.replica_id,
                lease_s=k.replica_lease_s,
            )
        else:
            self.cluster = Cluster(self.broker)
        try:
            await self.cluster.start()
        except Exception:
            self._server.close()
            raise
        self.publisher = GroupPublisher(
            self.calls.service,
            self.groups,
            self.consumer_groups,
            lambda tenant, group: self.cluster.coordinates(tenant, group),
            lambda: self.cluster.replica_id,
        )
        self.publisher.start()
        log.info(
            "Kafka broker %d at %s:%d", self.cluster.me.node_id, self.broker.host, self.broker.port
        )

    async def stop(self) -> None:
        if self.publisher is not None:
            await self.publisher.stop()
        await self.cluster.stop()
        if self._server is not None:
            self._server.close()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.wait(list(self.connections), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self.connections) >= self.max_connections:
            log.warning("Kafka connection refused: %d connections open", len(self.connections))
            metrics.record_connection_closed("kafka", "over_cap")
            writer.close()
            return
        self.connections.add(task)
        connection = _Connection(self, reader, writer)
        try:
            await connection.run()
        except (_Close, Unanswerable) as why:
            log.debug("Kafka connection closed: %s", why)
            reason = why.reason if isinstance(why, _Close) else "unanswerable"
            if reason:
                metrics.record_connection_closed("kafka", reason)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            wire_error(exc, "a Kafka connection")  # logged with its traceback
        finally:
            self.connections.discard(task)
            if connection.apis is not None:
                self.tenants[connection.apis.tenant] -= 1
                if not self.tenants[connection.apis.tenant]:
                    del self.tenants[connection.apis.tenant]
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)


class _Connection:
    def __init__(
        self, edge: KafkaEdge, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.edge = edge
        self.reader = reader
        self.writer = writer
        self.apis: KafkaApis | None = None
        self.mechanism: str | None = None
        #: A SaslHandshake v0 was answered: the next frame is a bare SASL token.
        self.bare_token = False

    async def run(self) -> None:
        while True:
            frame = await self._frame()
            if self.bare_token:
                self.bare_token = False
                await self._authenticate(frame)
                self.writer.write(b"\0\0\0\0")  # an empty SASL answer: authenticated
                await self.writer.drain()
                continue
            try:
                request = parse_request(frame)
            except Unanswerable:
                fallback = api_versions_fallback(frame)
                if fallback is None:
                    raise
                self.writer.write(fallback)
                await self.writer.drain()
                continue
            started = time.monotonic()
            answer = await self._answer(request)
            if answer is not None:
                self.writer.write(encode_response(request.correlation_id, answer))
                await self.writer.drain()
            error = "none" if answer is None else first_error(answer)
            metrics.observe_kafka_request(api_name(request), error, time.monotonic() - started)

    async def _frame(self) -> bytes:
        settings = self.edge.settings
        authenticated = self.apis is not None
        idle = settings.kafka.idle_s if authenticated else settings.server.header_timeout_s
        try:
            # asyncio.timeout, not wait_for: no task of its own made per frame.
            async with asyncio.timeout(idle):
                head = await self.reader.readexactly(4)
        except asyncio.IncompleteReadError as exc:
            raise _Close("the client closed the connection") from exc
        except TimeoutError:
            raise _Close(
                f"no request for {idle} s", "idle" if authenticated else "header_timeout"
            ) from None
        (size,) = struct.unpack(">i", head)
        bound = (
            settings.server.max_request_bytes + _FRAMING_BYTES
            if authenticated
            else settings.kafka.auth_frame_bytes
        )
        if not 0 < size <= bound:
            raise _Close(f"a request of {size} bytes declared (at most {bound} here)", "too_large")
        # Before authentication the whole of a request arrives within the header timeout.
        arrive = settings.server.body_timeout_s if authenticated else idle
        try:
            async with asyncio.timeout(arrive):
                return await self.reader.readexactly(size)
        except TimeoutError:
            raise _Close("a request did not arrive whole in time", "body_timeout") from None

    async def _answer(self, request: Request) -> Any | None:
        key = request.api_key
        if key == API_VERSIONS_KEY:
            return build(response_class(request), {"api_keys": supported_apis()})
        if key == SASL_HANDSHAKE:
            return self._handshake(request)
        if key == SASL_AUTHENTICATE:
            return await self._sasl_authenticate(request)
        if self.apis is None:
            raise _Close(
                f"API key {key} sent before authenticating (SASL/PLAIN is required)",
                "unauthenticated",
            )
        if key in BEFORE_AUTH:  # pragma: no cover - all answered above
            raise _Close(f"API key {key}")
        try:
            return await self.apis.handle(request)
        except (Unauthenticated, PermissionDenied) as err:
            raise _Close(
                f"the connection's credential no longer stands: {err.message}", "unauthenticated"
            ) from None

    def _handshake(self, request: Request) -> Any:
        mechanism = request.body.mechanism
        ok = mechanism == "PLAIN" and self.apis is None
        if ok:
            self.mechanism = mechanism
            self.bare_token = request.api_version == 0
        return build(
            response_class(request),
            {
                "error_code": ErrorCode.none
                if ok
                else (
                    ErrorCode.illegal_sasl_state
                    if self.apis is not None
                    else ErrorCode.unsupported_sasl_mechanism
                ),
                "mechanisms": ["PLAIN"],
            },
        )

    async def _sasl_authenticate(self, request: Request) -> Any:
        cls = response_class(request)
        if self.mechanism is None or self.apis is not None:
            return build(
                cls,
                {
                    "error_code": ErrorCode.illegal_sasl_state,
                    "error_message": "send SaslHandshake with mechanism PLAIN first",
                },
            )
        try:
            await self._authenticate(request.body.auth_bytes)
        except _Close as why:
            # Answered, then closed (Kafka closes a connection that failed to authenticate).
            self.writer.write(
                encode_response(
                    request.correlation_id,
                    build(
                        cls,
                        {
                            "error_code": ErrorCode.sasl_authentication_failed,
                            "error_message": str(why),
                        },
                    ),
                )
            )
            await self.writer.drain()
            raise
        return build(cls, {"error_code": ErrorCode.none, "auth_bytes": b""})

    async def _authenticate(self, token: bytes) -> None:
        """SASL/PLAIN: ``[authzid] NUL user NUL password``; the user must be the tenant
        whose API key the password is.

        Raises:
            _Close: not authenticated (the reason is said to the client).
        """
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise _Close("SASL/PLAIN expects [authzid] NUL username NUL password", "auth_failed")
        user, password = (p.decode("utf-8", "replace") for p in parts[1:])
        gate = self.edge.calls.gate
        authorization = f"Bearer {password}"
        try:
            # Over requests/s, the login is held as any request is.
            tenant, _ = await held_while_throttled(
                lambda: gate.tenant_of(authorization), time.monotonic() + LONGEST_MUTE_S
            )
        except TidegateError as err:
            raise _Close(f"authentication failed: {err.message}", "auth_failed") from None
        if tenant != user:
            raise _Close(
                "authentication failed: the username must be the tenant whose API key is "
                "the password",
                "auth_failed",
            )
        wait = self.edge.logins.take(tenant)
        if wait is None:
            rate = self.edge.settings.kafka.max_tenant_connection_rate
            raise _Close(
                f"tenant {tenant!r} opens Kafka connections to this gateway faster than "
                f"{rate:g} a second (kafka.max_tenant_connection_rate): reuse connections or "
                "reconnect more slowly",
                "over_tenant_rate",
            )
        if wait:  # held until its turn, as Kafka throttles connection creation
            await asyncio.sleep(wait)
        held, most = (
            self.edge.tenants.get(tenant, 0),
            self.edge.settings.kafka.max_tenant_connections,
        )
        if held >= most:
            raise _Close(
                f"tenant {tenant!r} holds {held} Kafka connections to this gateway; at most "
                f"{most} (kafka.max_tenant_connections): close some",
                "over_tenant_cap",
            )
        self.edge.tenants[tenant] = held + 1
        self.apis = KafkaApis(
            self.edge.calls,
            self.edge.cluster,
            tenant,
            authorization,
            groups=self.edge.groups,
            consumer_groups=self.edge.consumer_groups,
            producers=self.edge.producers,
        )
