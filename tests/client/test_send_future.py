"""The sync producer's futures (:class:`gateway.client._futures.SendFuture`) behave as
``concurrent.futures.Future`` does, whichever thread gets to them first: a waiter that
arrives before, during or after the outcome is stored always sees it."""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading

import pytest

from gateway.client._futures import SendFuture


def test_an_outcome_nobody_waited_for_reads_back_as_on_any_future() -> None:
    ok: SendFuture[int] = SendFuture()
    ok.set_result(7)
    assert "_made" not in ok.__dict__  # stored without making a Condition
    assert ok.done() and not ok.cancelled() and ok.result(0) == 7 and ok.exception(0) is None
    with pytest.raises(cf.InvalidStateError):
        ok.set_result(8)
    with pytest.raises(cf.InvalidStateError):
        ok.set_exception(ValueError("late"))
    assert ok.cancel() is False and ok.result() == 7

    failed: SendFuture[int] = SendFuture()
    failed.set_exception(ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        failed.result(0)
    assert isinstance(failed.exception(0), ValueError)


def test_a_cancelled_future_takes_no_outcome() -> None:
    f: SendFuture[int] = SendFuture()
    assert f.cancel() and f.cancelled()
    with pytest.raises(cf.InvalidStateError):
        f.set_result(1)
    with pytest.raises(cf.CancelledError):
        f.result(0)


def test_callbacks_run_once_whether_added_before_or_after_the_outcome() -> None:
    calls: list[int] = []
    before: SendFuture[int] = SendFuture()
    before.add_done_callback(lambda f: calls.append(f.result()))
    before.set_result(1)
    after: SendFuture[int] = SendFuture()
    after.set_result(2)
    after.add_done_callback(lambda f: calls.append(f.result()))
    assert calls == [1, 2]


def test_waiters_racing_the_outcome_always_see_it() -> None:
    """Many rounds of a waiter (``result``, ``wait`` or ``as_completed``) and a setter
    started together in random order: no waiter times out, none sees another value."""
    rng = random.Random(5)
    for i in range(400):
        f: SendFuture[int] = SendFuture()
        seen: list[object] = []

        def wait(f: SendFuture[int] = f, kind: int = i % 3, seen: list[object] = seen) -> None:
            if kind == 0:
                seen.append(f.result(timeout=10))
            elif kind == 1:
                done, _ = cf.wait([f], timeout=10)
                seen.append(next(iter(done)).result(0))
            else:
                seen.extend(g.result(0) for g in cf.as_completed([f], timeout=10))

        waiter = threading.Thread(target=wait)
        setter = threading.Thread(target=f.set_result, args=(i,))
        first, second = (waiter, setter) if rng.random() < 0.5 else (setter, waiter)
        first.start()
        second.start()
        waiter.join(15)
        setter.join(15)
        assert seen == [i], (i, seen)


def test_a_waiter_blocked_before_the_outcome_is_woken() -> None:
    f: SendFuture[str] = SendFuture()
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(f.result(timeout=10)))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # waiting on the Condition it made
    f.set_result("stored")
    t.join(10)
    assert got == ["stored"]
