"""Retries as data: how many attempts, and how long to wait between them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "Retry"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt ``n`` (0-based) waits a random time
    in ``[0, min(cap_s, base_s * factor**n)]``."""

    base_s: float = 0.05
    factor: float = 2.0
    cap_s: float = 2.0
    jitter: bool = True

    def delay(self, attempt: int) -> float:
        top = min(self.cap_s, self.base_s * self.factor**attempt)
        return random.uniform(0, top) if self.jitter else top


@dataclass(frozen=True, slots=True)
class Retry:
    """At most ``attempts`` tries in all (the first one included)."""

    attempts: int = 6
    backoff: Backoff = field(default_factory=Backoff)

    def delays(self) -> list[float]:
        """The waits before the 2nd, 3rd... attempt."""
        return [self.backoff.delay(i) for i in range(max(0, self.attempts - 1))]
