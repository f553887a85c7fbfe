"""The Kafka listener's settings: an edge's section beside ``server`` (docs/kafka.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gateway.config._section import Section

__all__ = ["KafkaConfig"]


class KafkaConfig(Section):
    """The Kafka listener: Kafka's wire protocol over the same tables (docs/kafka.md)."""

    port: int = Field(
        9092, ge=0, le=65535, description="Kafka listener port (on server.host); 0 disables it."
    )
    advertised_host: str = Field(
        "",
        description="The host Kafka clients are told to connect to (Metadata's broker), e.g. "
        "the Service's name in a cluster; empty: server.host (127.0.0.1 for a wildcard).",
    )
    advertised_port: int = Field(
        0, ge=0, le=65535, description="The port clients are told; 0: the listener's port."
    )
    cluster: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Whether the gateway replicas sharing the metadata store answer as one "
        "Kafka cluster, each a broker that registers its advertised address in the store "
        "under a lease (docs/kafka.md): auto: on over any store but SQLite; off: this "
        "gateway alone is the cluster's one broker (node 0) and every group's coordinator.",
    )
    replica_id: str = Field(
        "",
        max_length=255,
        description="This replica's name among the cluster's brokers, from which its Kafka "
        "node id derives (stable across its restarts), e.g. the pod's name; empty: its "
        "advertised host:port.",
    )
    replica_lease_s: float = Field(
        10.0,
        ge=1.0,
        le=300.0,
        description="How long a replica's registration lasts unless renewed (it renews a "
        "third of the way): a replica killed leaves the cluster, and its groups move to "
        "another, this long after its last renewal.",
    )
    idle_s: float = Field(
        540.0,
        gt=0,
        description="A connection that sends no request for this long is closed (Kafka's "
        "connections.max.idle.ms).",
    )
    auth_frame_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request a connection may send before it authenticated; a "
        "larger declared size closes it before a byte of the request is read.",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="PEM certificate (chain) of the listener: set with tls_key_file, the "
        "listener speaks TLS only (clients use SASL_SSL).",
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")
    max_tenant_connections: int = Field(
        256,
        ge=1,
        description="Authenticated connections one tenant may hold open on this gateway's "
        "listener; past it a login is refused (the others keep theirs).",
    )
    max_tenant_connection_rate: float = Field(
        50.0,
        gt=0,
        description="Logins one tenant may make to this gateway's listener a second (as "
        "many at once); a login past it is held until its turn, and refused when that is "
        "more than 5 s away.",
    )
    consumer_session_timeout_ms: int = Field(
        45_000,
        ge=1_000,
        le=1_800_000,
        description="A member of a KIP-848 consumer group (group.protocol=consumer) whose "
        "heartbeats stop for this long is dropped and its partitions reassigned (Kafka's "
        "group.consumer.session.timeout.ms).",
    )
    consumer_heartbeat_interval_ms: int = Field(
        5_000,
        ge=100,
        le=600_000,
        description="How often members of a KIP-848 consumer group are told to heartbeat "
        "while their group is stable (Kafka's group.consumer.heartbeat.interval.ms); "
        "while it reconciles they are told 200 ms.",
    )
