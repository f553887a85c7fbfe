"""The sync producer's futures bound to their batch (:meth:`SendFuture.bind`): the batch
publishes its answer once, and each future behaves as ``concurrent.futures.Future`` does
whether it was looked at before the answer, between its publication and the resolution of
the futures waited on, or after; the sync producer then never touches the others."""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading

import pytest

from gateway.client import RecordMetadata
from gateway.client._batching import Finished, ProducerBatch
from gateway.client._futures import SendFuture


def _batch(rows: int, partition: int = 2) -> tuple[ProducerBatch, list[SendFuture[RecordMetadata]]]:
    """A bound batch of ``rows`` one-dict sends, as the accumulator makes it."""
    batch = ProducerBatch(partition, bound=True)
    futures: list[SendFuture[RecordMetadata]] = []
    for _ in range(rows):
        f: SendFuture[RecordMetadata] = SendFuture()
        batch.add_values((1,), f, 8)
        futures.append(f)
    return batch, futures


def _answer(
    batch: ProducerBatch, base_offset: int | None, err: BaseException | None = None
) -> None:
    """What the producer does with an answer: the core publishes it under its lock, the
    driver resolves the futures waited on outside it."""
    done = Finished()
    if err is None:
        assert base_offset is not None
        done.acked(batch, base_offset)
    else:
        done.failed(batch, err)
    done.resolve()


def test_futures_nobody_looked_at_read_the_answer_when_asked() -> None:
    batch, futures = _batch(5)
    assert batch.owners == [] and batch.singles == 5  # the batch holds none of them
    batch.payload = b"encoded rows"
    _answer(batch, 100)
    assert all("_made" not in f.__dict__ for f in futures)  # nothing was made for them
    assert batch.payload == b""  # a future kept by its caller keeps no rows
    assert [f.result(0) for f in futures] == [RecordMetadata(2, 100 + i) for i in range(5)]
    assert all(f.done() and not f.cancelled() and f.exception(0) is None for f in futures)
    with pytest.raises(cf.InvalidStateError):
        futures[0].set_result(RecordMetadata(0, 0))
    assert futures[1].cancel() is False


def test_a_refused_batch_fails_every_future_of_it() -> None:
    batch, futures = _batch(3)
    watched = futures[0]
    seen: list[BaseException | None] = []
    watched.add_done_callback(lambda f: seen.append(f.exception(0)))
    err = ValueError("refused")
    _answer(batch, None, err)
    assert seen == [err]
    for f in futures:
        with pytest.raises(ValueError, match="refused"):
            f.result(0)


def test_callbacks_and_waiters_from_before_the_answer_are_resolved_once() -> None:
    batch, futures = _batch(4)
    calls: list[RecordMetadata] = []
    futures[1].add_done_callback(lambda f: calls.append(f.result(0)))
    got: list[RecordMetadata] = []
    waiter = threading.Thread(target=lambda: got.append(futures[2].result(timeout=10)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not futures[2].done()
    assert futures[3].cancel() and futures[3].cancelled()
    _answer(batch, 7)
    waiter.join(10)
    assert calls == [RecordMetadata(2, 8)] and got == [RecordMetadata(2, 9)]
    # A future cancelled before the answer stays cancelled; its neighbours are unaffected.
    assert futures[3].cancelled()
    with pytest.raises(cf.CancelledError):
        futures[3].result(0)
    after: list[RecordMetadata] = []
    futures[0].add_done_callback(lambda f: after.append(f.result(0)))
    assert after == [RecordMetadata(2, 7)]


def test_waiters_racing_the_answer_always_see_it() -> None:
    """Many rounds of a waiter (``result``, ``wait``, ``as_completed`` or a callback) and
    the producer's answer started together in random order: no waiter times out, none
    sees another offset."""
    rng = random.Random(11)
    for i in range(300):
        batch, futures = _batch(3)
        f = futures[i % 3]
        seen: list[object] = []

        def wait(
            f: SendFuture[RecordMetadata] = f, kind: int = i % 4, seen: list[object] = seen
        ) -> None:
            if kind == 0:
                seen.append(f.result(timeout=10))
            elif kind == 1:
                done, _ = cf.wait([f], timeout=10)
                seen.append(next(iter(done)).result(0))
            elif kind == 2:
                seen.extend(g.result(0) for g in cf.as_completed([f], timeout=10))
            else:
                event = threading.Event()
                f.add_done_callback(lambda g: (seen.append(g.result(0)), event.set()))
                event.wait(10)

        waiter = threading.Thread(target=wait)
        answer = threading.Thread(target=_answer, args=(batch, 1000 * i))
        first, second = (waiter, answer) if rng.random() < 0.5 else (answer, waiter)
        first.start()
        second.start()
        waiter.join(15)
        answer.join(15)
        assert seen == [RecordMetadata(2, 1000 * i + i % 3)], (i, seen)
