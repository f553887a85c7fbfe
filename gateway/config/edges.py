"""The network edges' settings: the servers (HTTP, gRPC, Flight) and what they serve alike
(consumer groups).

A new edge (the Kafka edge) adds its section here, and its field on
:class:`gateway.config.settings.Settings` beside ``server``.
"""

from __future__ import annotations

from pydantic import Field

from gateway.config._section import Section

__all__ = ["GroupsConfig", "ServerConfig"]


class ServerConfig(Section):
    """Network edges."""

    host: str = Field("127.0.0.1", description="Bind address of both servers.")
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 disables gRPC.")
    http_port: int = Field(8080, ge=0, le=65535, description="HTTP port; 0 disables HTTP.")
    flight_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Arrow Flight port for bulk reads (scans and stream reads as DoGet "
        "streams; the SDK uses it when offered); 0 disables Flight.",
    )
    flight_advertise: str = Field(
        "",
        description="The Flight location told to clients (e.g. grpc+tls://flight.example:443 "
        "behind a proxy); empty: the host the client dialled, at flight_port.",
    )
    http_advertise: str = Field(
        "",
        description="The gateway's HTTP address as executors reach it (e.g. "
        "http://gateway.internal:8080), for the file links of read plans over gRPC on a "
        "local warehouse; empty: http://<host>:<http_port> (127.0.0.1 for a wildcard host).",
    )
    max_request_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest append body accepted."
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        description="Largest HTTP body of any other request (table and schema definitions, "
        "scans, plans, group commits, admin calls); a body is read only once its caller "
        "is authenticated, and at most 64 KiB before.",
    )
    max_read_records: int = Field(100_000, ge=1, description="Cap on records per read call.")
    default_read_records: int = Field(10_000, ge=1, description="max_records when not given.")
    max_read_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Cap on the bytes of one read's answer (Arrow data, uncompressed).",
    )
    follow_read_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Cap on each answer of a follow read (a stream pushes many small ones).",
    )
    read_memory_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1024 * 1024,
        description="Read data the gateway holds at once, all tenants together; past it "
        "reads wait (streams) or are refused with a retry-after (RESOURCE_EXHAUSTED / 429).",
    )
    max_follows: int = Field(
        1024,
        ge=1,
        description="Follow reads (streams, long polls) of all tenants together on one "
        "gateway; quota.max_follows bounds each tenant's.",
    )
    max_streams: int = Field(
        1024,
        ge=1,
        description="Append streams (gRPC AppendStream) of all tenants together open on one "
        "gateway; quota.max_streams bounds each tenant's.",
    )
    stream_idle_s: float = Field(
        60.0,
        gt=0,
        description="An append stream that sends no message for this long is ended (cleanly: "
        "the SDK opens a new one when it next sends).",
    )
    tenant_read_memory_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Share of read_memory_bytes one tenant's reads may hold at once.",
    )
    follow_poll_ms: int = Field(
        100, ge=5, description="How often a follow read re-checks a log written elsewhere."
    )
    http_follow_wait_ms: int = Field(30_000, ge=0, description="Longest HTTP long-poll wait.")
    shutdown_grace_s: float = Field(5.0, ge=0, description="Drain time after SIGTERM.")
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Serve /metrics on this port of its own (e.g. not exposed by the public "
        "Service) instead of the HTTP port; 0: on the HTTP port.",
    )
    metrics_token: str | None = Field(
        None,
        min_length=16,
        description="When set, /metrics answers only 'authorization: Bearer <token>' "
        "(it names every tenant); unset: open to whoever reaches its port.",
    )
    max_connections: int = Field(
        4096,
        ge=16,
        description="Connections each edge (HTTP, gRPC) keeps open at once; past it a new "
        "one is closed at once (HTTP answers 503). Lowered at start to fit the process's "
        "descriptor limit.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send a request's headers (HTTP) or finish its "
        "HTTP/2 handshake (gRPC) within this long, or it is closed.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="Longest pause while an HTTP request's body is received."
    )
    http_keep_alive_s: float = Field(
        5.0, gt=0, description="An idle HTTP keep-alive connection is closed after this long."
    )
    grpc_max_connection_idle_s: float = Field(
        300.0,
        gt=0,
        description="A gRPC connection with no call for this long is closed (GOAWAY; clients "
        "reconnect by themselves).",
    )
    grpc_max_connection_age_s: float = Field(
        0.0,
        ge=0,
        description="Close gRPC connections older than this (GOAWAY, then "
        "server.shutdown_grace_s for their calls), to rebalance long-lived clients; 0: never "
        "(follow streams live long).",
    )
    grpc_keepalive_s: float = Field(
        60.0,
        gt=0,
        description="The gateway pings a gRPC connection silent for this long, and closes it "
        "when the ping is not answered within grpc_keepalive_timeout_s (a vanished peer).",
    )
    grpc_keepalive_timeout_s: float = Field(
        20.0, gt=0, description="How long a keepalive ping may go unanswered."
    )
    io_threads: int = Field(32, ge=1, description="Threads for blocking hot-tier calls.")
    max_filter_chars: int = Field(
        64 * 1024, ge=16, description="Longest scan or plan filter text accepted."
    )
    max_filter_terms: int = Field(
        4096, ge=1, description="Most predicates plus literals in one filter."
    )
    max_filter_depth: int = Field(
        64, ge=1, le=200, description="Deepest nesting of parentheses and 'not' in a filter."
    )


class GroupsConfig(Section):
    """Consumer groups: the bounds of a member's session timeout, and group metrics."""

    min_session_timeout_ms: int = Field(
        500, ge=100, description="Shortest session timeout a member may ask for."
    )
    max_session_timeout_ms: int = Field(
        1_800_000, ge=100, description="Longest session timeout a member may ask for."
    )
    metrics_max_groups: int = Field(
        100,
        ge=0,
        description="Groups labelled by name in tidegate_groups_lag_records (those with the "
        'largest lag); the others share group="_other".',
    )
