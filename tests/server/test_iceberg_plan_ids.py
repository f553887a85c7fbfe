"""Issue 40: plan ids are the plan's state sealed: they open only under the key that
sealed them, unaltered and before they expire."""

from __future__ import annotations

from gateway.core.catalog_plans import PlanState
from gateway.server.http.iceberg_plans import PlanIds

STATE = PlanState("acme", "t-1", 42, "lease-1", ((0, 10, 20), (3, 5, 6)), 1_000)


def test_a_plan_id_opens_to_its_state_until_it_expires() -> None:
    now = [999.0]
    ids = PlanIds(b"k" * 32, clock=lambda: now[0])
    sealed = ids.seal(STATE)
    assert ids.open(sealed) == STATE
    assert ids.seal(STATE) != sealed  # a fresh nonce each time: ids reveal nothing
    now[0] = 1_000.0
    assert ids.open(sealed) is None


def test_forged_altered_or_foreign_ids_do_not_open() -> None:
    ids = PlanIds(b"k" * 32, clock=lambda: 0.0)
    sealed = ids.seal(STATE)
    flipped = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    other = PlanIds(b"o" * 32, clock=lambda: 0.0)
    for text in (flipped, "tgplan.", "tgplan.!!", "nope", sealed[:-10], "tgplan." + "A" * 20_000):
        assert ids.open(text) is None
    assert other.open(sealed) is None


def test_many_partitions_fit() -> None:
    ids = PlanIds(b"k" * 32, clock=lambda: 0.0)
    wide = PlanState("acme", "t-1", 1, None, tuple((p, 10**9, 10**9 + 500) for p in range(256)), 5)
    sealed = ids.seal(wide)
    assert ids.open(sealed) == wide and len(sealed) < 8_000


def test_a_submitted_plans_id_carries_when_it_was_submitted() -> None:
    ids = PlanIds(b"k" * 32, clock=lambda: 0.0)
    submitted = PlanState("acme", "t-1", 42, "lease-1", ((0, 10, 20),), 1_000, None, 123_456)
    opened = ids.open(ids.seal(submitted))
    assert opened == submitted and opened.submitted_at == 123_456
    assert ids.open(ids.seal(STATE)).submitted_at is None  # type: ignore[union-attr]
    # A plan task of a submitted plan opens to the same state and its task.
    assert ids.open_task(ids.seal(submitted, {"start": 3})) == (submitted, {"start": 3})
