"""Channel settings of both client flavours: message limits, reconnects, TLS, targets."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc

from gateway.wire.errors import TidegateError, Unavailable
from gateway.wire.retry import Retry

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "MAX_MESSAGE",
    "Reach",
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
    """The authorization header of every call. Whitespace around the key is dropped: a key
    read from a file (``operator.key`` ends with a newline) is otherwise an invalid
    header, which gRPC refuses with a C-level log line rather than a sentence."""
    key = (api_key or "").strip()
    return (("authorization", f"Bearer {key}"),) if key else ()


def normalise_target(endpoint: str) -> tuple[str, bool | None]:
    """Strip a scheme: ``grpcs://`` / ``https://`` imply TLS, ``grpc://`` / ``http://`` not."""
    for scheme, tls in (("grpcs://", True), ("https://", True), ("grpc://", False)):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :], tls
    if endpoint.startswith("http://"):
        return endpoint[len("http://") :], False
    return endpoint, None


#: Seconds a client keeps trying to reach a gateway it has never reached (a wrong address,
#: nothing listening) before it raises :class:`~gateway.wire.errors.Unavailable`.
DEFAULT_CONNECT_TIMEOUT = 5.0


#: gRPC's sentence for a call that found no connection to send itself on (refused,
#: unreachable, timed out while connecting): the call never reached any server.
_NEVER_CONNECTED = "failed to connect to all addresses"


class Reach:
    """Whether a channel has ever reached its gateway.

    Until it has, an UNAVAILABLE answer (refused, unresolvable, unreachable) is retried for
    ``connect_timeout`` seconds at most and then raised naming the address; once it has, the
    call's retry policy rules alone, so a gateway restart is ridden out as before.
    """

    def __init__(self, target: str, connect_timeout: float) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self.reached = False

    def ok(self) -> None:
        self.reached = True

    def explain(self, err: TidegateError) -> TidegateError:
        """``err``, or for a gateway never reached an :class:`Unavailable` naming the address."""
        if self.reached or not err.details.get("transport"):
            return err
        cause = err.message
        why = "connection refused" if "refused" in cause.lower() else "no answer"
        return Unavailable(
            f"cannot reach a Tidegate gateway at {self.target} ({why}): is it running, and "
            "is that its gRPC address? Set it with --target or TIDEGATE_TARGET.",
            target=self.target,
            cause=cause,
        )

    def unsent_delay(self, err: TidegateError, failures: int, started: float) -> float | None:
        """The wait before sending again a call that must not run twice (create a table or a
        tenant), or None to raise ``err``. Such a call is tried again only while its gateway
        has never been reached and gRPC says it never connected anywhere, so the call never
        left: a gateway that is still starting (its port not yet open, or its first
        connections not yet accepted) is waited for within the connect deadline, as the
        calls that may run twice wait for it."""
        if self.reached or not err.details.get("transport"):
            return None
        if _NEVER_CONNECTED not in err.message.lower():
            return None
        left = started + self.connect_timeout - time.monotonic()
        return None if left <= 0 else min(0.05 * 2 ** min(failures, 5), 1.0, left)

    def next_delay(
        self, retry: Retry, err: TidegateError, failures: int, started: float
    ) -> float | None:
        """``retry``'s wait before the next attempt, bounded by the connect deadline while
        the gateway has never been reached."""
        delay = retry.next_delay(err, failures, started)
        if delay is None or self.reached or not err.details.get("transport"):
            return delay
        left = started + self.connect_timeout - time.monotonic()
        return None if left <= 0 else min(delay, left)
