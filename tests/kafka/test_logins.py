"""The Kafka listener's per-tenant login buckets, at given instants."""

from __future__ import annotations

import pytest

from gateway.server.kafka.logins import LoginRates


def test_logins_are_held_for_their_turn_and_refused_past_the_longest_hold() -> None:
    rates = LoginRates(2.0, longest_s=1.0)
    assert [rates.take("a", now=0.0) for _ in range(2)] == [0.0, 0.0]  # a burst of two
    assert rates.take("a", now=0.0) == pytest.approx(0.5)  # its turn in half a second
    assert rates.take("a", now=0.0) == pytest.approx(1.0)
    assert rates.take("a", now=0.0) is None  # 1.5 s away: refused, not counted
    assert rates.take("b", now=0.0) == 0.0  # another tenant's bucket
    assert rates.take("a", now=1.0) == pytest.approx(0.5)  # refilled by two a second
    assert rates.take("a", now=10.0) == 0.0  # full again, never above the burst
    assert rates.take("a", now=10.0) == 0.0
    assert rates.take("a", now=10.0) == pytest.approx(0.5)


def test_a_slow_rate_still_lets_one_login_through_at_once() -> None:
    rates = LoginRates(0.1, longest_s=5.0)
    assert rates.take("a", now=0.0) == 0.0
    assert rates.take("a", now=0.0) is None  # next turn in 10 s
    assert rates.take("a", now=6.0) == pytest.approx(4.0)
