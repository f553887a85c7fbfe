"""Issue 30.2 / 33.4: the disk hot tier keeps files open for recently used partitions
only (``hot.max_open_files``), reopens the others on demand, and loses nothing for it,
not even to a kill -9 while partitions are being closed and reopened."""

from __future__ import annotations

import inspect
import os
import random
import threading
import uuid
from pathlib import Path

from gateway.hot import PartitionId, ProducerSequence
from gateway.hot.disk import DiskHotLog
from tests.hot.test_disk import _acks_until_killed, crash_batch, read_all
from tests.services import REPO_ROOT


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_files_stay_within_the_bound_and_every_partition_reads_back(tmp_path: Path) -> None:
    """300 partitions written in turns through a log that keeps 16 files open: the log's
    own count and the process's descriptors stay within the bound, and every batch of
    every partition is read back after its partition was closed and opened again."""
    bound = 16
    log = DiskHotLog(tmp_path / "hot", max_open_files=bound)
    before = _open_descriptors()
    tenant = f"t{uuid.uuid4().hex[:8]}"
    parts = [PartitionId(tenant, f"table{i // 4}", i % 4) for i in range(300)]
    written: dict[PartitionId, list[bytes]] = {p: [] for p in parts}
    try:
        for rnd in range(3):
            for i, part in enumerate(parts):
                payload = f"{rnd}:{i}".encode() * 10
                r = log.append(part, payload, 2, rnd, ProducerSequence(f"p{i}", rnd))
                assert r.base_offset == 2 * rnd
                written[part].append(payload)
                assert log.open_files <= bound
                assert _open_descriptors() - before <= bound
        for part in random.Random(7).sample(parts, len(parts)):
            assert [b.payload for b in read_all(log, part)] == written[part]
            assert log.open_files <= bound
        # A retry of a batch acknowledged before its partition was closed is still known.
        again = log.append(parts[0], b"x", 2, 0, ProducerSequence("p0", 2))
        assert again.duplicate and again.base_offset == 4
    finally:
        log.close()
    assert _open_descriptors() <= before


def test_threads_on_many_partitions_through_a_small_bound(tmp_path: Path) -> None:
    """Eight threads appending to 64 partitions through 8 open files (partitions closed
    under other threads' feet all the time): offsets stay dense, each batch is stored
    once, where it was acknowledged."""
    log = DiskHotLog(tmp_path / "hot", max_open_files=8)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    parts = [PartitionId(tenant, "table", p) for p in range(64)]
    acked: dict[tuple[int, int], tuple[PartitionId, int]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def write(w: int) -> None:
        rnd = random.Random(w)
        try:
            for i in range(150):
                part = rnd.choice(parts)
                r = log.append(part, f"{w}:{i}".encode(), 1, i)
                with lock:
                    acked[(w, i)] = (part, r.base_offset)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stored: dict[tuple[int, int], tuple[PartitionId, int]] = {}
    try:
        for part in parts:
            for b in read_all(log, part):
                w, i = map(int, b.payload.split(b":"))
                assert (w, i) not in stored
                stored[(w, i)] = (part, b.base_offset)
    finally:
        log.close()
    assert stored == acked
    reopened = DiskHotLog(tmp_path / "hot", max_open_files=8)
    try:
        assert sum(reopened.offsets(p).high for p in parts) == len(acked)
    finally:
        reopened.close()


CHILD = """
import sys, threading
from gateway.hot.base import PartitionId, ProducerSequence
from gateway.hot.disk import DiskHotLog

{helpers}

root, tenant, rnd, writers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = DiskHotLog(root, fsync="batch", segment_bytes=64 * 1024, max_open_files=8)
out = threading.Lock()

def write(w):
    i = 0
    while True:
        # Each partition once in every 40 batches: one producer per writer and partition.
        partition = (i * 7 + w) % 40
        payload, count = crash_batch(rnd * 100 + w, i)
        r = log.append(PartitionId(tenant, "table", partition), payload, count, i,
                       ProducerSequence(f"p-{{rnd}}-{{w}}-{{partition}}", i // 40))
        with out:
            sys.stdout.write(f"{{rnd}} {{w}} {{i}} {{partition}} {{r.base_offset}} {{r.count}}\\n")
            sys.stdout.flush()
        i += 1

for w in range(writers):
    threading.Thread(target=write, args=(w,), daemon=True).start()
threading.Event().wait()
"""


def test_kill_9_while_partitions_are_closed_and_reopened_loses_nothing(tmp_path: Path) -> None:
    """Four threads append across 40 partitions through a log that keeps 8 files open
    (every few appends close one partition and reopen another) until a SIGKILL, three
    times: every acknowledged batch is where it was acknowledged, stored once and whole,
    and each writer has at most its one batch in flight stored unacknowledged."""
    root = tmp_path / "hot"
    tenant = f"t{uuid.uuid4().hex[:8]}"
    writers, rounds = 4, 3
    script = CHILD.format(helpers=inspect.getsource(crash_batch))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    acked: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for rnd in range(rounds):
        args = [script, str(root), tenant, str(rnd), str(writers)]
        for line in _acks_until_killed(args, 120 + 60 * rnd, env):
            r, w, i, partition, base, count = map(int, line.split())
            acked[(r, w, i)] = (partition, base, count)

    log = DiskHotLog(root, max_open_files=8)
    try:
        stored: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        for partition in range(40):
            next_offset = 0
            for batch in read_all(log, PartitionId(tenant, "table", partition)):
                assert batch.base_offset == next_offset
                next_offset = batch.next_offset
                key_s, i_s, _ = batch.payload.split(b":", 2)
                r, w, i = int(key_s) // 100, int(key_s) % 100, int(i_s)
                payload, count = crash_batch(r * 100 + w, i)
                assert (batch.payload, batch.count, batch.timestamp_us) == (payload, count, i)
                assert (r, w, i) not in stored
                stored[(r, w, i)] = (partition, batch.base_offset, batch.count)
        for key, where in acked.items():
            assert stored.get(key) == where, key
        for r in range(rounds):
            for w in range(writers):
                acked_i = sorted(i for rr, ww, i in acked if (rr, ww) == (r, w))
                stored_i = sorted(i for rr, ww, i in stored if (rr, ww) == (r, w))
                assert acked_i == list(range(len(acked_i)))
                assert stored_i in (acked_i, [*acked_i, len(acked_i)])
        # More partitions were written than the bound keeps open: they were evicted.
        assert len({p for p, _, _ in acked.values()}) == 40
    finally:
        log.close()


def test_a_partition_closed_unchanged_writes_no_state(tmp_path: Path) -> None:
    """A partition only looked at (its offsets read) and closed again, by eviction, keeps
    its state file as it was: no write and no fsync for a look. A partition written since
    its last state write gets a new one when closed."""
    log = DiskHotLog(tmp_path / "hot", max_open_files=8)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    looked, others = (
        PartitionId(tenant, "looked", 0),
        [PartitionId(tenant, f"o{i}", 0) for i in range(8)],
    )
    try:
        log.append(looked, b"x", 1, 0, None)
        for part in others:  # evicts `looked`: written, so its state is written
            log.append(part, b"y", 1, 0, None)
        state = log.partition_dir(looked) / "state.json"
        first = state.stat()
        assert log.offsets(looked).high == 1  # loaded again, only read
        for part in others:
            log.offsets(part)  # evicts it again
        assert (state.stat().st_ino, state.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
        log.append(looked, b"z", 1, 1, None)
        for part in others:
            log.offsets(part)
        assert state.stat().st_mtime_ns != first.st_mtime_ns or state.stat().st_ino != first.st_ino
    finally:
        log.close()
