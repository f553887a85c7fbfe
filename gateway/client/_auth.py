"""Credentials on every call: ``authorization: Bearer <key>`` gRPC metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["AuthMetadata", "authorized_channel"]


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class AuthMetadata(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds the bearer credential to every call of a channel."""

    def __init__(self, api_key: str) -> None:
        self._header = ("authorization", f"Bearer {api_key.strip()}")  # see call_metadata

    def _details(self, details: Any) -> _Details:
        metadata = [m for m in (details.metadata or ()) if m[0] != "authorization"]
        metadata.append(self._header)
        return _Details(details, metadata)

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._details(details), requests)


def authorized_channel(channel: grpc.Channel, api_key: str | None) -> grpc.Channel:
    """``channel`` sending ``api_key`` with every call (unchanged when None)."""
    if not api_key or not api_key.strip():
        return channel
    return grpc.intercept_channel(channel, AuthMetadata(api_key))
