"""The hot tier's key index (issue 42, docs/decisions/primary-keys.md), on every backend
through ``hot_log`` (disk, Redis, and the Redis tier's virtual logs: see conftest): the
index follows keyed appends, conditional appends refuse a moved high watermark and store
nothing, duplicates touch nothing, trims hide and prune what they cut, drops take it all.
"""

from __future__ import annotations

import random

import pytest

from gateway.hot import AppendResult, HotLog, LogOffsets, PartitionId, ProducerSequence
from gateway.hot.redis import RedisHotLog
from gateway.wire.errors import HighWatermarkMoved, RetryableError
from tests.hot.conftest import VIRTUAL, reopen
from tests.hot.test_contract import new_partition, read_all


@pytest.fixture
def part(hot_log: HotLog) -> PartitionId:
    return new_partition()


def k(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


def keyed(
    log: HotLog,
    part: PartitionId,
    keys: list[bytes],
    *,
    producer: ProducerSequence | None = None,
    expect_high: int | None = None,
) -> AppendResult:
    payload = b"|".join(keys) or b"-"
    return log.append(part, payload, len(keys), 1_000, producer, keys=keys, expect_high=expect_high)


def test_index_follows_appends_last_change_wins(hot_log: HotLog, part: PartitionId) -> None:
    assert hot_log.latest_offsets(part, k("a", "b")) == [None, None]
    assert hot_log.key_count(part) == 0
    assert keyed(hot_log, part, k("a", "b", "a")) == AppendResult(0, 3)  # a: 0 then 2
    hot_log.append(part, b"plain", 2, 1_000)  # a batch without keys changes no entry
    assert keyed(hot_log, part, k("c", "b")) == AppendResult(5, 2)
    assert hot_log.latest_offsets(part, k("a", "b", "c", "zz", "a")) == [2, 6, 5, None, 2]
    assert hot_log.key_count(part) == 3
    assert hot_log.latest_offsets(part, []) == []
    other = new_partition(tenant=part.tenant)
    keyed(hot_log, other, k("x"))
    assert hot_log.key_counts([part, other, new_partition()]) == [3, 1, 0]


def test_keys_are_opaque_bytes(hot_log: HotLog, part: PartitionId) -> None:
    odd = [b"", b"\x00\xff", b"tg:{x}:keys", bytes(range(256)), b"%7B"]
    keyed(hot_log, part, odd)
    assert hot_log.latest_offsets(part, odd) == [0, 1, 2, 3, 4]
    assert hot_log.latest_offsets(part, [b"\x00", b"{x}"]) == [None, None]


@pytest.mark.parametrize("expect", [False, True])
def test_many_keys_in_one_batch(hot_log: HotLog, part: PartitionId, expect: bool) -> None:
    """More keys than the scripts pass to one Redis command (1000 at a time), with and
    without the base offset known (``expect_high``: the offsets are sent as they are)."""
    rnd = random.Random(7)
    keys = [f"key-{rnd.randrange(3000)}".encode() for _ in range(5000)]
    keyed(hot_log, part, k("first"))
    keyed(hot_log, part, keys, expect_high=1 if expect else None)
    model = {key: 1 + i for i, key in enumerate(keys)}
    asked = [f"key-{i}".encode() for i in range(3100)]
    assert hot_log.latest_offsets(part, asked) == [model.get(key) for key in asked]
    assert hot_log.key_count(part) == len(model) + 1


def test_keys_must_match_the_count(hot_log: HotLog, part: PartitionId) -> None:
    with pytest.raises(ValueError, match="needs 3 keys, not 2"):
        hot_log.append(part, b"x", 3, 0, keys=k("a", "b"))
    assert hot_log.offsets(part).high == 0
    assert hot_log.latest_offsets(part, k("a")) == [None]


def test_expect_high_refusal_stores_nothing(hot_log: HotLog, part: PartitionId) -> None:
    keyed(hot_log, part, k("a", "b"))
    before = read_all(hot_log, part)
    for wrong in (0, 1, 3, 1 << 40):
        with pytest.raises(HighWatermarkMoved) as exc:
            keyed(hot_log, part, k("a", "c"), expect_high=wrong)
        assert exc.value.details == {"expected": wrong, "high": 2}
        assert isinstance(exc.value, RetryableError)
        assert exc.value.reason == "HIGH_WATERMARK_MOVED"
    assert read_all(hot_log, part) == before
    assert hot_log.offsets(part).high == 2
    assert hot_log.latest_offsets(part, k("a", "b", "c")) == [0, 1, None]
    # The one it expects is taken, keyed or not.
    assert keyed(hot_log, part, k("a", "c"), expect_high=2) == AppendResult(2, 2)
    assert hot_log.append(part, b"p", 1, 0, expect_high=4) == AppendResult(4, 1)
    assert hot_log.latest_offsets(part, k("a", "b", "c")) == [2, 1, 3]


def test_expect_high_on_a_new_partition(hot_log: HotLog, part: PartitionId) -> None:
    with pytest.raises(HighWatermarkMoved):
        keyed(hot_log, part, k("a"), expect_high=1)
    assert hot_log.offsets(part).high == 0
    assert keyed(hot_log, part, k("a"), expect_high=0) == AppendResult(0, 1)


def test_duplicates_do_not_touch_the_index(hot_log: HotLog, part: PartitionId) -> None:
    first = keyed(hot_log, part, k("a", "b"), producer=ProducerSequence("p", 0))
    keyed(hot_log, part, k("a"), producer=ProducerSequence("p", 1))
    assert hot_log.latest_offsets(part, k("a", "b")) == [2, 1]
    # The retry of batch 0, even with other keys and an expect_high long gone, is
    # answered with its range and changes nothing.
    retry = keyed(hot_log, part, k("a", "x"), producer=ProducerSequence("p", 0), expect_high=0)
    assert retry == AppendResult(first.base_offset, 2, duplicate=True)
    assert hot_log.latest_offsets(part, k("a", "b", "x")) == [2, 1, None]
    assert hot_log.offsets(part).high == 3
    # A new sequence with a stale expect_high is refused, and takes effect once resolved.
    with pytest.raises(HighWatermarkMoved):
        keyed(hot_log, part, k("b"), producer=ProducerSequence("p", 2), expect_high=2)
    assert keyed(
        hot_log, part, k("b"), producer=ProducerSequence("p", 2), expect_high=3
    ) == AppendResult(3, 1)
    assert hot_log.latest_offsets(part, k("a", "b")) == [2, 3]


def test_trim_hides_and_prunes_entries_below_low(hot_log: HotLog, part: PartitionId) -> None:
    keyed(hot_log, part, k("a", "b"))  # 0, 1
    keyed(hot_log, part, k("c", "a"))  # 2, 3
    keyed(hot_log, part, k("d"))  # 4
    assert hot_log.key_count(part) == 4
    assert hot_log.trim(part, 4) == 4
    # b (1) and c (2) are in trimmed batches: the caller looks in the cold tier.
    assert hot_log.latest_offsets(part, k("a", "b", "c", "d")) == [None, None, None, 4]
    assert hot_log.key_count(part) == 1
    keyed(hot_log, part, k("b"))
    assert hot_log.latest_offsets(part, k("a", "b", "d")) == [None, 5, 4]
    # A trim inside a batch keeps the batch, and its keys.
    assert hot_log.trim(part, 5) == 5
    assert hot_log.latest_offsets(part, k("b", "d")) == [5, None]


def test_everything_trimmed(hot_log: HotLog, part: PartitionId) -> None:
    keyed(hot_log, part, k("a", "b"))
    assert hot_log.trim(part, 10) == 2
    assert hot_log.latest_offsets(part, k("a", "b")) == [None, None]
    assert hot_log.key_count(part) == 0
    assert keyed(hot_log, part, k("a"), expect_high=2) == AppendResult(2, 1)
    assert hot_log.latest_offsets(part, k("a", "b")) == [2, None]


def test_drop_takes_the_index(hot_log: HotLog, part: PartitionId) -> None:
    other = new_partition(tenant=part.tenant)
    keyed(hot_log, part, k("a", "b"))
    keyed(hot_log, other, k("a"))
    hot_log.drop(part)
    assert hot_log.key_count(part) == 0
    assert hot_log.latest_offsets(part, k("a", "b")) == [None, None]
    assert hot_log.latest_offsets(other, k("a")) == [0]
    hot_log.drop(other)
    hot_log.drop_tenant(part.tenant)
    assert hot_log.key_count(other) == 0


def test_index_survives_a_reopen(hot_log: HotLog, part: PartitionId) -> None:
    rnd = random.Random(11)
    model: dict[bytes, int] = {}
    for _ in range(30):
        keys = [f"k{rnd.randrange(40)}".encode() for _ in range(rnd.randrange(1, 6))]
        r = keyed(hot_log, part, keys)
        model.update({key: r.base_offset + i for i, key in enumerate(keys)})
    asked = [f"k{i}".encode() for i in range(45)]
    expected = [model.get(key) for key in asked]
    assert hot_log.latest_offsets(part, asked) == expected
    high = hot_log.offsets(part).high
    hot_log.close()
    again = reopen()
    try:
        assert again.latest_offsets(part, asked) == expected
        assert again.key_count(part) == len(model)
        assert keyed(again, part, k("k0"), expect_high=high) == AppendResult(high, 1)
        assert again.latest_offsets(part, k("k0")) == [high]
        assert again.offsets(part) == LogOffsets(0, high + 1, again.offsets(part).size_bytes)
    finally:
        again.close()


def test_conditional_appends_race(hot_log: HotLog, part: PartitionId) -> None:
    """Writers that each read the high watermark, then append expecting it (as the core
    resolves a key-table's batch): every stored batch starts where its writer expected,
    so none was resolved against a state another one changed; the refused ones stored
    nothing, and the index equals the fold of the stored batches."""
    import threading

    stored: list[tuple[int, list[bytes]]] = []
    guard = threading.Lock()

    def writer(w: int) -> None:
        rnd = random.Random(w)
        done = 0
        while done < 15:
            keys = [f"k{rnd.randrange(20)}".encode() for _ in range(rnd.randrange(1, 4))]
            high = hot_log.offsets(part).high
            try:
                r = keyed(hot_log, part, keys, expect_high=high)
            except HighWatermarkMoved:
                continue  # another writer's batch landed first: resolve again
            assert r.base_offset == high
            with guard:
                stored.append((r.base_offset, keys))
            done += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored.sort()
    offset, model = 0, dict[bytes, int]()
    for base, keys in stored:
        assert base == offset
        offset += len(keys)
        model.update({key: base + i for i, key in enumerate(keys)})
    assert hot_log.offsets(part).high == offset
    assert [b.base_offset for b in read_all(hot_log, part)] == [b for b, _ in stored]
    asked = [f"k{i}".encode() for i in range(20)]
    assert hot_log.latest_offsets(part, asked) == [model.get(key) for key in asked]


@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_against_a_model(
    hot_log: HotLog, hot_kind: str, part: PartitionId, seed: int
) -> None:
    """Keyed and plain appends, conditional ones with a stale watermark, trims and (on a
    tier with shards and placements) moves, at random: after each step the index answers
    what a dict replaying the acknowledged batches says, with trimmed keys missing."""
    rnd = random.Random(seed)
    model: dict[bytes, int] = {}
    low = high = 0
    moves = hot_log if hot_kind in VIRTUAL and isinstance(hot_log, RedisHotLog) else None
    asked = [f"k{i}".encode() for i in range(30)]
    moved = 0
    for step in range(60):
        op = rnd.random()
        if op < 0.55:
            keys = [f"k{rnd.randrange(30)}".encode() for _ in range(rnd.randrange(1, 6))]
            r = keyed(hot_log, part, keys, expect_high=high if rnd.random() < 0.5 else None)
            assert r.base_offset == high
            model.update({key: high + i for i, key in enumerate(keys)})
            high += len(keys)
        elif op < 0.65:
            hot_log.append(part, b"plain", 2, 0)
            high += 2
        elif op < 0.75:
            with pytest.raises(HighWatermarkMoved):
                keyed(hot_log, part, k("k0"), expect_high=max(0, high - 1) if high else 1)
        elif op < 0.9:
            low = hot_log.trim(part, rnd.randrange(low, high + 1))
        elif moves is not None:
            here = moves.chain(part).active.shard
            moves.move(part, rnd.choice([s for s in moves.shard_names() if s != here]))
            moved += 1
        want = [o if o is not None and o >= low else None for o in map(model.get, asked)]
        assert hot_log.latest_offsets(part, asked) == want, step
    assert hot_log.offsets(part).high == high
    assert moves is None or moved > 0


def test_an_empty_idempotent_append_advances_the_sequence_alone(
    hot_log: HotLog, part: PartitionId
) -> None:
    """A key-table write that changed nothing: count 0 with a producer stores no batch,
    moves no offset, takes its sequence (a retry is its duplicate, the next sequence
    follows) and survives a reopen; a resolved batch's retry is answered whatever its
    count."""
    p = ProducerSequence("p", 0, resolved=True)
    assert keyed(hot_log, part, k("a"), producer=p) == AppendResult(0, 1)
    # Resolved again to two changes, the retry is still the batch stored.
    assert keyed(hot_log, part, k("a", "a"), producer=p) == AppendResult(0, 1, duplicate=True)
    empty = ProducerSequence("p", 1, resolved=True)
    assert hot_log.append(part, b"", 0, 1_000, empty, expect_high=1) == AppendResult(1, 0)
    assert hot_log.append(part, b"", 0, 1_000, empty, expect_high=1) == AppendResult(
        1, 0, duplicate=True
    )
    assert hot_log.offsets(part).high == 1
    assert [b.count for b in read_all(hot_log, part)] == [1]
    with pytest.raises(HighWatermarkMoved):
        hot_log.append(part, b"", 0, 1_000, ProducerSequence("p", 2, resolved=True), expect_high=0)
    hot_log.close()
    again = reopen()
    try:
        assert again.append(part, b"", 0, 1_000, empty) == AppendResult(1, 0, duplicate=True)
        nxt = ProducerSequence("p", 2, resolved=True)
        assert keyed(again, part, k("b"), producer=nxt, expect_high=1) == AppendResult(1, 1)
    finally:
        again.close()
    with pytest.raises(ValueError):
        hot_log.append(part, b"", 0, 1_000)
