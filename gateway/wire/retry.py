"""Retries as data (redis-py's ``Retry`` and ``Backoff`` objects): which errors, how
often, how long, and the wait between attempts. One pair for the whole project: the client
SDK retries calls with it and the jobs retry conflicting commits with it."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from gateway.wire.errors import RetryableError, TidegateError

__all__ = ["Backoff", "ConstantBackoff", "ExponentialBackoff", "Retry"]


class Backoff(ABC):
    """How long to wait before retry number ``failures`` (1 for the first retry)."""

    @abstractmethod
    def compute(self, failures: int) -> float:
        """Seconds to wait."""


@dataclass(frozen=True)
class ConstantBackoff(Backoff):
    delay: float = 0.1

    def compute(self, failures: int) -> float:
        return self.delay


@dataclass(frozen=True)
class ExponentialBackoff(Backoff):
    """``base * 2**(failures-1)`` capped at ``cap``; with ``jitter``, a uniform draw from
    the upper half of that ("equal jitter"), so retrying clients spread out."""

    base: float = 0.05
    cap: float = 2.0
    jitter: bool = True

    def compute(self, failures: int) -> float:
        delay = min(self.cap, self.base * (2 ** max(0, failures - 1)))
        return random.uniform(delay / 2, delay) if self.jitter else delay


def _default_retry_on() -> tuple[type[TidegateError], ...]:
    return (RetryableError,)


@dataclass(frozen=True)
class Retry:
    """A retry policy: which errors, how often, how long, and the wait between attempts.

    The wait is the larger of the backoff and the server's retry-after hint
    (``RetryInfo`` / ``Retry-After``), so a throttled client never comes back early.

    Args:
        backoff: wait between attempts.
        attempts: most retries after the first attempt; None for no limit (``timeout``
            still applies).
        timeout: give up once this many seconds passed since the first attempt; None for
            no limit.
        retry_on: error classes worth retrying; by default every
            :class:`~gateway.wire.errors.RetryableError` (UNAVAILABLE, RESOURCE_EXHAUSTED,
            OUT_OF_ORDER_SEQUENCE).
    """

    backoff: Backoff = field(default_factory=ExponentialBackoff)
    attempts: int | None = None
    timeout: float | None = 120.0
    retry_on: tuple[type[TidegateError], ...] = field(default_factory=_default_retry_on)

    @classmethod
    def none(cls) -> Retry:
        """Never retry."""
        return cls(ConstantBackoff(0.0), attempts=0, timeout=0.0)

    def retryable(self, err: BaseException) -> bool:
        if isinstance(err, TidegateError) and err.details.get("grpc_code") == "DEADLINE_EXCEEDED":
            return True
        return isinstance(err, self.retry_on)

    def delay(self, err: BaseException, failures: int) -> float:
        """Seconds to wait before retry number ``failures``."""
        wait = self.backoff.compute(failures)
        hint = getattr(err, "retry_after_ms", None)
        if hint:
            wait = max(wait, hint / 1000)
        return wait

    def delays(self) -> list[float]:
        """The waits before retry 1, 2, ... ``attempts`` (empty when ``attempts`` is None:
        a policy bounded by time only has no fixed list)."""
        return [self.backoff.compute(n) for n in range(1, (self.attempts or 0) + 1)]

    def next_delay(self, err: BaseException, failures: int, started: float) -> float | None:
        """The wait before retry number ``failures``, or None to give up.

        ``started`` is the ``time.monotonic()`` of the first attempt.
        """
        if not self.retryable(err):
            return None
        if self.attempts is not None and failures > self.attempts:
            return None
        wait = self.delay(err, failures)
        if self.timeout is not None and time.monotonic() + wait - started > self.timeout:
            return None
        return wait
