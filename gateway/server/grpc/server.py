"""The gRPC edge (grpc.aio): the server with the Tidegate service
(:class:`~gateway.server.grpc.service.TidegateServicer`), the admin service, health and
reflection, and the bounds on its connections (:func:`server_options`).

Who is calling, admission and error translation are the
:class:`~gateway.server.grpc.calls.CallInterceptor`'s.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.server.calls import DataCalls
from gateway.server.grpc.calls import ADMIN_SERVICE_NAME, SERVICE_NAME, CallInterceptor
from gateway.server.grpc.service import TidegateServicer
from gateway.tenancy import Gate, OpenGate, Tenancy
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

__all__ = ["GrpcEdge", "TidegateServicer", "server_options"]


def _millis(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def server_options(settings: Settings, max_connections: int | None = None) -> list[tuple[str, int]]:
    """The grpc server's channel arguments: message limits, and bounds on connections that
    do nothing (a stranger's sockets, a vanished client's)."""
    s = settings.server
    options = [
        # 1 MiB more than the append limit, so that our check, with its clear reason,
        # answers an oversized append first.
        ("grpc.max_receive_message_length", s.max_request_bytes + 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
        # A connection that never finishes its HTTP/2 handshake (a bare TCP socket).
        ("grpc.server_handshake_timeout_ms", _millis(s.header_timeout_s)),
        ("grpc.max_allowed_incoming_connections", max_connections or s.max_connections),
        # One with no call for a while is closed; the client reconnects when it needs to.
        ("grpc.max_connection_idle_ms", _millis(s.grpc_max_connection_idle_s)),
        # A peer that vanished without closing is found by an unanswered ping.
        ("grpc.keepalive_time_ms", _millis(s.grpc_keepalive_s)),
        ("grpc.keepalive_timeout_ms", _millis(s.grpc_keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if s.grpc_max_connection_age_s:
        options += [
            ("grpc.max_connection_age_ms", _millis(s.grpc_max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", _millis(s.shutdown_grace_s)),
        ]
    return options


class GrpcEdge:
    """The grpc.aio server with the Tidegate service, health and reflection (and the admin
    service when the gate is a :class:`Tenancy`)."""

    def __init__(
        self,
        service: StreamTables,
        settings: Settings,
        gate: Gate | None = None,
        calls: DataCalls | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.settings = settings
        gate = gate or OpenGate(settings.tenant)
        calls = calls or DataCalls(service, gate)
        self.server = grpc.aio.server(
            interceptors=[CallInterceptor(gate)],
            options=server_options(settings, max_connections),
        )
        pb_grpc.add_TidegateServicer_to_server(TidegateServicer(calls, settings), self.server)
        services = [SERVICE_NAME]
        if isinstance(gate, Tenancy):
            from gateway.server.grpc.admin import AdminServicer
            from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc

            admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(gate), self.server)
            services.append(ADMIN_SERVICE_NAME)
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [
                *services,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        self.port = self.server.add_insecure_port(
            f"{settings.server.host}:{settings.server.grpc_port}"
        )

    async def start(self) -> None:
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        """Flip health to NOT_SERVING first, so balancers drain us, then stop."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
