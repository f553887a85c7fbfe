"""The per-tenant connection-rate cap of the Kafka listener (issue 41, item 7).

A tenant's logins to one gateway's listener refill at ``kafka.max_tenant_connection_rate``
a second, with as many in a burst. A login over the rate is held (its SaslAuthenticate
answer waits, the client's connection with it) until its turn, as Kafka throttles the
creation of connections past its rate instead of refusing them; one whose turn is further
than ``longest_s`` away is refused, so a client reconnecting in a tight loop is told why
and holds no connection for long. Another tenant's logins are never held by these.
"""

from __future__ import annotations

import time
from collections import OrderedDict

__all__ = ["LoginRates"]

#: Tenants whose buckets are remembered at most; past it the longest unused is forgotten
#: (a forgotten bucket starts full: at worst one more burst).
TENANTS_KEPT = 10_000


class LoginRates:
    """Token buckets of logins, one per tenant (``rate`` a second, ``rate`` at once, at
    least one)."""

    def __init__(self, rate: float, longest_s: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.longest_s = longest_s
        #: tenant -> (tokens, when they were counted); tokens below 0 are logins waiting.
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, tenant: str, now: float | None = None) -> float | None:
        """Count one login of ``tenant``: the seconds it must wait for its turn (0: at
        once), or None when its turn is more than ``longest_s`` away (refused, and not
        counted)."""
        now = time.monotonic() if now is None else now
        tokens, then = self._buckets.pop(tenant, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        if wait > self.longest_s:
            self._keep(tenant, tokens, now)
            return None
        self._keep(tenant, tokens - 1, now)
        return wait

    def _keep(self, tenant: str, tokens: float, now: float) -> None:
        self._buckets[tenant] = (tokens, now)
        while len(self._buckets) > TENANTS_KEPT:
            self._buckets.popitem(last=False)
