"""Channel settings of both client flavours: message limits, reconnects, TLS, targets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

__all__ = [
    "MAX_MESSAGE",
    "call_metadata",
    "channel_credentials",
    "channel_options",
    "normalise_target",
]

MAX_MESSAGE = 128 * 1024 * 1024


def channel_options(extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        # Come back quickly after a gateway restart (grpc's default waits up to 120 s).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        *extra,
    ]


def channel_credentials(
    tls: bool | None, root_certificates: bytes | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for a plaintext channel."""
    if tls is None:
        tls = root_certificates is not None
    if not tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=root_certificates)


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def normalise_target(endpoint: str) -> tuple[str, bool | None]:
    """Strip a scheme: ``grpcs://`` / ``https://`` imply TLS, ``grpc://`` / ``http://`` not."""
    for scheme, tls in (("grpcs://", True), ("https://", True), ("grpc://", False)):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :], tls
    if endpoint.startswith("http://"):
        return endpoint[len("http://") :], False
    return endpoint, None
