"""Disk hot tier only: file format, crash recovery, segments and producer-state files."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from gateway.hot import (
    AppendResult,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
    load_hot_log,
)
from gateway.hot.disk import (
    HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    MAGIC,
    STATE_FILE,
    DiskHotLog,
    segment_name,
)
from gateway.wire.errors import (
    InvalidIdempotentAppend,
    OutOfOrderSequence,
    TidegateError,
    Unavailable,
)
from tests.services import REPO_ROOT

BIG = 1 << 40
HEADER = struct.Struct(">4sIIqIqBqH")
INDEX = struct.Struct(">qII")

OpenLog = Callable[..., DiskHotLog]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "hot"


@pytest.fixture
def open_log(root: Path) -> Iterator[OpenLog]:
    """Open a DiskHotLog on ``root``; every log opened is closed at the end.

    These tests model a restart by opening the folder again while the first log is still
    open (as a crashed process would have left it). A crashed owner's folder lock goes with
    its process, which a log left open in this one cannot model: they open without the
    lock, which has tests of its own (tests/hot/test_disk_lock.py)."""
    opened: list[DiskHotLog] = []

    def factory(path: Path | None = None, **kwargs: Any) -> DiskHotLog:
        kwargs.setdefault("lock", False)
        log = DiskHotLog(path or root, **kwargs)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()


@pytest.fixture
def part() -> PartitionId:
    return PartitionId(f"t{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, 0)


def part_dir(root: Path, part: PartitionId) -> Path:
    return root / part.tenant / part.table_id / str(part.partition)


def segment_files(directory: Path, suffix: str = ".log") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == suffix)


def read_all(log: DiskHotLog, part: PartitionId) -> list[StoredBatch]:
    offsets = log.offsets(part)
    out: list[StoredBatch] = []
    offset = offsets.low
    while offset < offsets.high:
        batches = log.read(part, offset, 1000, BIG)
        out.extend(batches)
        offset = batches[-1].next_offset
    return out


def fill(
    log: DiskHotLog, part: PartitionId, n: int, size: int = 50, producer: str | None = None
) -> list[StoredBatch]:
    """Append ``n`` batches (count i % 3 + 1) and return them as the log should store them."""
    out = []
    for i in range(n):
        payload = f"{i}:".encode().ljust(size, bytes([65 + i % 26]))
        prod = ProducerSequence(producer, i) if producer else None
        r = log.append(part, payload, i % 3 + 1, 1_000 + i, prod)
        out.append(StoredBatch(r.base_offset, r.count, 1_000 + i, payload))
    return out


def crash_image(root: Path, dest: Path) -> Path:
    """Copy the files of a log that is still open: what a kill -9 right now would leave
    (the page cache survives a process crash, so every completed write is in the copy)."""
    shutil.copytree(root, dest)
    return dest


def record_positions(log_file: Path) -> list[int]:
    """Start position of every record in a segment file, parsed independently."""
    data = log_file.read_bytes()
    positions, pos = [], 0
    while pos < len(data):
        positions.append(pos)
        _, _, payload_len, *_, pid_len = HEADER.unpack_from(data, pos)
        pos += HEADER_SIZE + pid_len + payload_len
    assert pos == len(data)
    return positions


# Configuration and file format ------------------------------------------------------------
def test_from_settings(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    settings = Settings.explicit(
        data_dir=tmp_path / "data",
        hot={"type": "disk", "path": str(elsewhere), "fsync": "never", "segment_bytes": 4096},
    )
    log = load_hot_log(settings)
    try:
        assert isinstance(log, DiskHotLog)
        assert (log.root, log.fsync_policy, log.segment_bytes) == (elsewhere, "never", 4096)
        part = PartitionId("ten", "tab", 3)
        log.append(part, b"x", 1, 0)
        assert (elsewhere / "ten" / "tab" / "3" / f"{segment_name(0)}.log").is_file()
    finally:
        log.close()

    default = DiskHotLog.from_settings(Settings.explicit(data_dir=tmp_path / "data"))
    try:
        assert default.root == tmp_path / "data" / "hot"
        assert (default.fsync_policy, default.segment_bytes) == ("batch", 64 * 1024 * 1024)
    finally:
        default.close()
    with pytest.raises(TypeError):
        DiskHotLog.from_settings(Settings.explicit(data_dir=tmp_path, hot={"type": "redis"}))


def test_record_and_index_format(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    log = open_log()
    log.append(part, b"first", 3, 111)
    log.append(part, b"second!", 2, 222, ProducerSequence("prod-\u00e9", 0))
    directory = part_dir(root, part)
    data = (directory / f"{segment_name(0)}.log").read_bytes()

    magic, crc, plen, base, count, ts, flags, sequence, pid_len = HEADER.unpack_from(data, 0)
    assert (magic, plen, base, count, ts, flags, sequence, pid_len) == (
        MAGIC,
        5,
        0,
        3,
        111,
        0,
        -1,
        0,
    )
    first_end = HEADER_SIZE + 5
    assert crc == zlib.crc32(data[8:first_end])
    assert data[HEADER_SIZE:first_end] == b"first"

    magic, crc, plen, base, count, ts, flags, sequence, pid_len = HEADER.unpack_from(
        data, first_end
    )
    pid = "prod-\u00e9".encode()
    assert (magic, plen, base, count, ts, flags, sequence, pid_len) == (
        MAGIC,
        7,
        3,
        2,
        222,
        1,
        0,
        len(pid),
    )
    assert crc == zlib.crc32(data[first_end + 8 :])
    assert data[first_end + HEADER_SIZE :] == pid + b"second!"

    index = (directory / f"{segment_name(0)}.index").read_bytes()
    assert [INDEX.unpack_from(index, i) for i in range(0, len(index), INDEX_ENTRY_SIZE)] == [
        (0, 0, 5),
        (3, first_end, 7),
    ]


def test_partition_names_cannot_escape_the_root(open_log: OpenLog) -> None:
    log = open_log()
    for bad in (PartitionId("..", "t", 0), PartitionId("a", "b/c", 0), PartitionId("a", "", 0)):
        with pytest.raises(ValueError):
            log.append(bad, b"x", 1, 0)
    with pytest.raises(ValueError):
        log.offsets(PartitionId("a", "b", -1))


def test_lookups_do_not_create_folders(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    log = open_log()
    assert log.offsets(part) == LogOffsets(0, 0, 0)
    assert log.read(part, 0, 1, 1) == []
    assert log.trim(part, 5) == 0
    log.drop(part)
    assert not part_dir(root, part).exists()


# Crash recovery ---------------------------------------------------------------------------
@pytest.mark.parametrize("cut", ["in-header", "in-payload", "last-byte"])
def test_torn_tail_is_truncated(open_log: OpenLog, root: Path, part: PartitionId, cut: str) -> None:
    stored = fill(open_log(), part, 5, size=100)
    log_file = part_dir(root, part) / f"{segment_name(0)}.log"
    last = record_positions(log_file)[-1]
    size = log_file.stat().st_size
    keep = {"in-header": last + 10, "in-payload": last + HEADER_SIZE + 40, "last-byte": size - 1}
    os.truncate(log_file, keep[cut])

    log = open_log()
    assert log.offsets(part) == LogOffsets(0, stored[3].next_offset, 400)
    assert read_all(log, part) == stored[:4]
    assert log_file.stat().st_size == last
    index_file = log_file.with_suffix(".index")
    assert index_file.stat().st_size == 4 * INDEX_ENTRY_SIZE
    # The next batch goes where the torn one was, and everything is readable again.
    assert log.append(part, b"new", 2, 9) == AppendResult(stored[3].next_offset, 2)
    assert read_all(log, part) == [*stored[:4], StoredBatch(stored[3].next_offset, 2, 9, b"new")]
    assert record_positions(log_file)[-1] == last


@pytest.mark.parametrize("where", ["payload", "count"])
def test_corrupt_last_batch_is_dropped(
    open_log: OpenLog, root: Path, part: PartitionId, where: str
) -> None:
    stored = fill(open_log(), part, 4, size=64)
    log_file = part_dir(root, part) / f"{segment_name(0)}.log"
    last = record_positions(log_file)[-1]
    # count sits at bytes 24..28 of the header; flip a bit of it or of the payload.
    at = last + (HEADER_SIZE + 10 if where == "payload" else 27)
    data = bytearray(log_file.read_bytes())
    data[at] ^= 0x01
    log_file.write_bytes(bytes(data))

    log = open_log()
    assert read_all(log, part) == stored[:3]
    assert log.offsets(part).high == stored[2].next_offset
    assert log_file.stat().st_size == last


def test_corruption_inside_the_log_is_never_served(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    stored = fill(open_log(), part, 4, size=64)
    log_file = part_dir(root, part) / f"{segment_name(0)}.log"
    second = record_positions(log_file)[1]
    data = bytearray(log_file.read_bytes())
    data[second + HEADER_SIZE + 5] ^= 0xFF
    log_file.write_bytes(bytes(data))

    log = open_log()
    assert log.read(part, 0, 1, BIG) == stored[:1]
    with pytest.raises(TidegateError, match="corrupt"):
        log.read(part, stored[1].base_offset, 1, BIG)
    assert log.read(part, stored[2].base_offset, BIG, BIG) == stored[2:]


@pytest.mark.parametrize("keep_bytes", [0, INDEX_ENTRY_SIZE, 2 * INDEX_ENTRY_SIZE + 5, 5 * 16])
def test_index_lagging_behind_the_log_is_rebuilt(
    open_log: OpenLog, root: Path, part: PartitionId, keep_bytes: int
) -> None:
    stored = fill(open_log(), part, 6)
    index_file = part_dir(root, part) / f"{segment_name(0)}.index"
    complete = index_file.read_bytes()
    os.truncate(index_file, keep_bytes)

    log = open_log()
    assert read_all(log, part) == stored
    assert [log.read(part, b.base_offset + b.count - 1, 1, 1) for b in stored] == [
        [b] for b in stored
    ]
    assert index_file.read_bytes() == complete


def test_index_pointing_past_the_log_is_cut(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    stored = fill(open_log(), part, 3)
    index_file = part_dir(root, part) / f"{segment_name(0)}.index"
    complete = index_file.read_bytes()
    log_size = (part_dir(root, part) / f"{segment_name(0)}.log").stat().st_size
    # Entries for batches that never reached the log, then one that goes backwards.
    bogus = INDEX.pack(100, log_size, 5) + INDEX.pack(200, log_size + 500, 5) + INDEX.pack(1, 1, 1)
    index_file.write_bytes(complete + bogus)

    log = open_log()
    assert read_all(log, part) == stored
    assert log.offsets(part).high == stored[-1].next_offset
    assert index_file.read_bytes() == complete


def test_index_entry_that_disagrees_with_the_log_is_replaced(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    stored = fill(open_log(), part, 4)
    index_file = part_dir(root, part) / f"{segment_name(0)}.index"
    complete = index_file.read_bytes()
    # The last entry claims a base offset the record there does not have.
    base, position, payload_len = INDEX.unpack_from(complete, 3 * INDEX_ENTRY_SIZE)
    index_file.write_bytes(
        complete[:-INDEX_ENTRY_SIZE] + INDEX.pack(base + 1, position, payload_len)
    )

    log = open_log()
    assert read_all(log, part) == stored
    assert index_file.read_bytes() == complete


def test_a_new_segment_killed_before_its_index_existed_reopens(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    """A kill between creating a rolled segment's log file and its index file leaves an
    empty log without an index: reopening recreates the index and appends go on."""
    log = open_log()
    stored = fill(log, part, 3)
    log.close()
    directory = part_dir(root, part)
    end = stored[-1].next_offset
    (directory / f"{segment_name(end)}.log").write_bytes(b"")

    log = open_log()
    assert read_all(log, part) == stored
    after = log.append(part, b"after", 1, 0)
    assert after.base_offset == end
    assert (directory / f"{segment_name(end)}.index").exists()
    log.close()
    assert read_all(open_log(), part) == [*stored, StoredBatch(end, 1, 0, b"after")]


def test_segments_after_a_gap_are_removed(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    stored = fill(open_log(segment_bytes=1024), part, 20, size=200)
    directory = part_dir(root, part)
    logs = segment_files(directory)
    assert len(logs) >= 4
    # Tear the tail of the second segment: the third and later ones cannot follow it.
    second = directory / logs[1]
    os.truncate(second, second.stat().st_size - 3)
    second_base = int(logs[1][:20])
    kept = [b for b in stored if b.base_offset < int(logs[2][:20])][:-1]
    assert kept[-1].base_offset >= second_base

    log = open_log(segment_bytes=1024)
    assert read_all(log, part) == kept
    assert segment_files(directory) == logs[:2]
    assert segment_files(directory, ".index") == [n.replace(".log", ".index") for n in logs[:2]]
    assert log.append(part, b"x", 1, 0).base_offset == kept[-1].next_offset


CHILD = """
import sys
from gateway.hot.base import PartitionId, ProducerSequence
from gateway.hot.disk import DiskHotLog

{helpers}

root, tenant, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = DiskHotLog(root, fsync="batch", segment_bytes=256 * 1024)
part = PartitionId(tenant, "table", 0)
i = 0
while True:
    payload, count = crash_batch(rnd, i)
    r = log.append(part, payload, count, i, ProducerSequence(f"producer-{{rnd}}", i))
    sys.stdout.write(f"{{rnd}} {{i}} {{r.base_offset}} {{r.count}}\\n")
    sys.stdout.flush()
    i += 1
"""


def _acks_until_killed(args: list[str], target: int, env: dict[str, str]) -> list[bytes]:
    """Run ``python -c *args``, SIGKILL it once it has printed ``target`` lines, and answer
    its complete lines (an unfinished line was not an acknowledgement)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[bytes] = []
    for line in proc.stdout:
        lines.append(line)
        if len(lines) >= target:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    lines.extend(proc.stdout.read().splitlines(keepends=True))
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, stderr
    assert len(lines) >= target, stderr
    return [line for line in lines if line.endswith(b"\n")]


def crash_batch(rnd: int, i: int) -> tuple[bytes, int]:
    """The payload and count the crash child appends as batch ``i`` of round ``rnd``."""
    size = (i * 7919 + rnd * 104729) % 60_000
    return f"{rnd}:{i}:".encode() + bytes([(i + rnd) % 251]) * size, i % 5 + 1


def test_kill_9_during_appends_loses_nothing_acknowledged(root: Path) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    part = PartitionId(tenant, "table", 0)
    script = CHILD.format(helpers=inspect.getsource(crash_batch))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    acked: dict[tuple[int, int], tuple[int, int]] = {}
    rounds = 3
    for rnd in range(rounds):
        lines = _acks_until_killed([script, str(root), tenant, str(rnd)], 25 + 20 * rnd, env)
        for line in lines:
            r, i, base, count = map(int, line.split())
            acked[(r, i)] = (base, count)

    log = DiskHotLog(root)
    try:
        batches = read_all(log, part)
        stored: dict[tuple[int, int], tuple[int, int]] = {}
        next_offset = 0
        for batch in batches:
            assert batch.base_offset == next_offset
            next_offset = batch.next_offset
            rnd_s, i_s, _ = batch.payload.split(b":", 2)
            key = (int(rnd_s), int(i_s))
            payload, count = crash_batch(*key)
            assert (batch.payload, batch.count, batch.timestamp_us) == (payload, count, key[1])
            assert key not in stored
            stored[key] = (batch.base_offset, batch.count)

        # Every acknowledged batch is there, where it was acknowledged.
        for key, where in acked.items():
            assert stored.get(key) == where, key
        # At most the one batch in flight per round was stored without its acknowledgement.
        for rnd in range(rounds):
            acked_i = sorted(i for r, i in acked if r == rnd)
            stored_i = sorted(i for r, i in stored if r == rnd)
            assert acked_i == list(range(len(acked_i)))
            assert stored_i in (acked_i, [*acked_i, len(acked_i)])

        # Producer state was rebuilt from the records: retries are recognised.
        last_round = rounds - 1
        last_i = max(i for r, i in stored if r == last_round)
        payload, count = crash_batch(last_round, last_i)
        retry = log.append(
            part, payload, count, 0, ProducerSequence(f"producer-{last_round}", last_i)
        )
        assert retry == AppendResult(*stored[(last_round, last_i)], duplicate=True)
        with pytest.raises(OutOfOrderSequence):
            log.append(part, b"x", 1, 0, ProducerSequence(f"producer-{last_round}", last_i + 2))
    finally:
        log.close()


GROUP_CHILD = """
import sys, threading
from gateway.hot.base import PartitionId, ProducerSequence
from gateway.hot.disk import DiskHotLog

{helpers}

root, tenant, rnd, writers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = DiskHotLog(root, fsync="batch", segment_bytes=256 * 1024)
out = threading.Lock()

def write(w):
    part = PartitionId(tenant, "table", w % 2)
    i = 0
    while True:
        payload, count = crash_batch(rnd * 100 + w, i)
        r = log.append(part, payload, count, i, ProducerSequence(f"p-{{rnd}}-{{w}}", i))
        with out:
            sys.stdout.write(f"{{rnd}} {{w}} {{i}} {{r.base_offset}} {{r.count}}\\n")
            sys.stdout.flush()
        i += 1

for w in range(writers):
    threading.Thread(target=write, args=(w,), daemon=True).start()
threading.Event().wait()
"""


def test_kill_9_during_group_commits_loses_nothing_acknowledged(root: Path) -> None:
    """Six threads append to two partitions (three each, so their fsyncs are shared) until
    a SIGKILL, three times: every acknowledged batch is where it was acknowledged, each
    batch is stored once and whole, and each writer has at most its one batch in flight
    stored without an acknowledgement."""
    tenant = f"t{uuid.uuid4().hex[:8]}"
    writers, rounds = 6, 3
    script = GROUP_CHILD.format(helpers=inspect.getsource(crash_batch))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    acked: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for rnd in range(rounds):
        args = [script, str(root), tenant, str(rnd), str(writers)]
        for line in _acks_until_killed(args, 60 + 40 * rnd, env):
            r, w, i, base, count = map(int, line.split())
            acked[(r, w, i)] = (w % 2, base, count)

    log = DiskHotLog(root)
    try:
        stored: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        for partition in (0, 1):
            next_offset = 0
            for batch in read_all(log, PartitionId(tenant, "table", partition)):
                assert batch.base_offset == next_offset
                next_offset = batch.next_offset
                key_s, i_s, _ = batch.payload.split(b":", 2)
                r, w, i = int(key_s) // 100, int(key_s) % 100, int(i_s)
                payload, count = crash_batch(r * 100 + w, i)
                assert (batch.payload, batch.count, batch.timestamp_us) == (payload, count, i)
                assert w % 2 == partition
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
        assert len({(r, w) for r, w, _ in acked}) > writers  # several writers, every round
    finally:
        log.close()


def sample(name: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name) or 0.0


def test_appends_waiting_for_an_fsync_share_the_next_one(
    open_log: OpenLog, part: PartitionId
) -> None:
    """Group commit: appends that arrive while an fsync is under way are written at once,
    wait (unacknowledged, unseen by readers) for their batches to be durable, and are all
    made durable by one fsync."""
    log = open_log()
    log.append(part, b"first", 1, 0)
    partition = log._parts[part]
    results: list[AppendResult] = []
    n = 8

    def append(i: int) -> None:
        results.append(log.append(part, f"b{i}".encode(), 1, i))

    fsyncs = sample("tidegate_hot_disk_fsync_duration_seconds_count")
    batches = sample("tidegate_hot_disk_fsync_batches_total")
    threads = [threading.Thread(target=append, args=(i,)) for i in range(n)]
    with partition.sync_lock:  # as if a slow fsync were under way
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while partition.end < 1 + n and time.monotonic() < deadline:
            time.sleep(0.005)
        assert partition.end == 1 + n  # every batch is written...
        assert results == []  # ...none is acknowledged before it is durable...
        assert log.offsets(part).high == 1  # ...nor seen by readers
    for t in threads:
        t.join(60)
    assert sorted(r.base_offset for r in results) == list(range(1, 1 + n))
    assert log.offsets(part).high == 1 + n
    assert sample("tidegate_hot_disk_fsync_duration_seconds_count") - fsyncs == 1
    assert sample("tidegate_hot_disk_fsync_batches_total") - batches == n


# Producer state ---------------------------------------------------------------------------
@pytest.mark.parametrize("state_file", ["kept", "deleted", "garbage", "crash"])
def test_producer_state_survives_reopen(
    open_log: OpenLog, root: Path, tmp_path: Path, part: PartitionId, state_file: str
) -> None:
    log = open_log()
    stored = fill(log, part, 20, producer="p")
    if state_file == "crash":
        # No clean close, no roll, no trim: the state file predates every batch, the
        # producer state is only in the record headers.
        path = crash_image(root, tmp_path / "image")
        state = json.loads((part_dir(path, part) / STATE_FILE).read_bytes())
        assert (state["high"], state["producers"]) == (0, {})
    else:
        path = root
        log.close()
        state = part_dir(root, part) / STATE_FILE
        assert state.is_file()
        if state_file == "deleted":
            state.unlink()
        elif state_file == "garbage":
            state.write_bytes(b'{"version": 1, "low": ')

    log = open_log(path)
    for i in (19, 4):
        payload = stored[i].payload
        assert log.append(part, payload, stored[i].count, 0, ProducerSequence("p", i)) == (
            AppendResult(stored[i].base_offset, stored[i].count, duplicate=True)
        )
    with pytest.raises(InvalidIdempotentAppend):
        log.append(part, b"x", 1, 0, ProducerSequence("p", 3))
    with pytest.raises(OutOfOrderSequence):
        log.append(part, b"x", 1, 0, ProducerSequence("p", 21))
    assert log.append(part, b"x", 1, 0, ProducerSequence("p", 20)).base_offset == (
        stored[-1].next_offset
    )


@pytest.mark.parametrize("reopen", ["clean", "crash"])
def test_producer_state_survives_trim_of_its_segments(
    open_log: OpenLog, root: Path, tmp_path: Path, part: PartitionId, reopen: str
) -> None:
    log = open_log(segment_bytes=1024)
    producers = ["early", "late"]
    stored = {pid: fill(log, part, 6, size=280, producer=pid) for pid in producers}
    directory = part_dir(root, part)
    assert len(segment_files(directory)) == 4
    high = stored["late"][-1].next_offset

    def retry(log: DiskHotLog, pid: str, i: int) -> AppendResult:
        return log.append(part, b"retry", stored[pid][i].count, 0, ProducerSequence(pid, i))

    def original(pid: str, i: int) -> AppendResult:
        return AppendResult(stored[pid][i].base_offset, stored[pid][i].count, duplicate=True)

    # Trim the segments of the first producer only, then everything.
    assert log.trim(part, stored["late"][0].base_offset) == stored["late"][0].base_offset
    assert len(segment_files(directory)) == 2
    assert retry(log, "early", 5) == original("early", 5)
    assert log.trim(part, high) == high
    # Only an empty segment named by the high watermark is left.
    assert segment_files(directory) == [f"{segment_name(high)}.log"]
    assert (directory / f"{segment_name(high)}.log").stat().st_size == 0
    for pid, i in [("early", 5), ("early", 0), ("late", 5)]:
        assert retry(log, pid, i) == original(pid, i)

    if reopen == "crash":
        path = crash_image(root, tmp_path / "image")
    else:
        path = root
        log.close()
    log = open_log(path, segment_bytes=1024)
    assert log.offsets(part) == LogOffsets(high, high, 0)
    for pid, i in [("early", 5), ("early", 2), ("late", 5), ("late", 0)]:
        assert retry(log, pid, i) == original(pid, i)
    with pytest.raises(OutOfOrderSequence):
        log.append(part, b"next", 1, 0, ProducerSequence("late", 7))
    assert log.append(part, b"next", 1, 0, ProducerSequence("late", 6)) == AppendResult(high, 1)


def test_state_ahead_of_a_shortened_log(
    open_log: OpenLog, root: Path, tmp_path: Path, part: PartitionId
) -> None:
    """A power cut under fsync="never" can lose log data the state file already covers:
    producer entries for lost batches must not answer retries with offsets now gone."""
    log = open_log(fsync="never", segment_bytes=1024)
    stored = fill(log, part, 7, size=280, producer="p")  # segments [0-2] [3-5] [6]
    image = crash_image(root, tmp_path / "image")
    directory = part_dir(image, part)
    state = json.loads((directory / STATE_FILE).read_bytes())
    assert state["high"] == stored[5].next_offset  # written when the third segment began
    for base in (stored[3].base_offset, stored[6].base_offset):
        (directory / f"{segment_name(base)}.log").unlink()

    log = open_log(image, fsync="never", segment_bytes=1024)
    assert log.offsets(part).high == stored[2].next_offset
    assert log.append(part, b"x", stored[2].count, 0, ProducerSequence("p", 2)) == AppendResult(
        stored[2].base_offset, stored[2].count, duplicate=True
    )
    assert log.append(part, b"again", 1, 0, ProducerSequence("p", 3)) == AppendResult(
        stored[2].next_offset, 1
    )


# Segments and trim ------------------------------------------------------------------------
def test_segments_roll_at_segment_bytes(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    log = open_log(segment_bytes=1024)
    stored = fill(log, part, 10, size=280)
    big = log.append(part, b"B" * 5000, 4, 0)
    stored.append(StoredBatch(big.base_offset, 4, 0, b"B" * 5000))
    stored += [
        StoredBatch(r.base_offset, 1, 0, b"after")
        for r in [log.append(part, b"after", 1, 0) for _ in range(2)]
    ]
    directory = part_dir(root, part)
    logs = segment_files(directory)
    bases = [int(name[:20]) for name in logs]
    assert all(name == f"{segment_name(b)}.log" for name, b in zip(logs, bases, strict=True))
    # Each segment starts at a batch boundary, holds whole batches and only outgrows
    # segment_bytes when a single batch is bigger than that.
    assert set(bases) <= {b.base_offset for b in stored}
    assert bases[0] == 0
    for name in logs:
        size = (directory / name).stat().st_size
        assert size <= 1024 or len(record_positions(directory / name)) == 1
    assert big.base_offset in bases
    assert len(record_positions(directory / f"{segment_name(big.base_offset)}.log")) == 1
    assert len(logs) == 6  # three 280-byte batches (323 bytes with header) fit in 1024

    # Reads cross segment boundaries, from any offset, also after reopening.
    assert read_all(log, part) == stored
    assert log.read(part, stored[2].base_offset, 5, BIG) == stored[2:5]
    log.close()
    log = open_log(segment_bytes=1024)
    assert read_all(log, part) == stored
    assert segment_files(directory) == logs


def test_trim_deletes_only_whole_segments(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    log = open_log(segment_bytes=1024)
    stored = fill(log, part, 12, size=280)  # 3 batches per segment: 4 segments
    directory = part_dir(root, part)
    logs = segment_files(directory)
    assert len(logs) == 4
    # Trim inside the second segment: the first goes, the second stays for its later batches.
    below = stored[4].base_offset + 1
    assert log.trim(part, below) == stored[4].base_offset
    assert segment_files(directory) == logs[1:]
    assert read_all(log, part) == stored[4:]
    assert log.offsets(part).size_bytes == 8 * 280
    # Trimming up to a segment boundary frees that segment too.
    assert log.trim(part, stored[6].base_offset) == stored[6].base_offset
    assert segment_files(directory) == logs[2:]
    log.close()

    log = open_log(segment_bytes=1024)
    assert log.offsets(part) == LogOffsets(stored[6].base_offset, stored[-1].next_offset, 6 * 280)
    assert read_all(log, part) == stored[6:]


def test_trim_state_is_written_before_segments_go(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    """A trim whose segment deletions were lost still reopens at the trimmed low mark."""
    log = open_log(segment_bytes=1024)
    stored = fill(log, part, 9, size=280)
    directory = part_dir(root, part)
    saved = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    log.trim(part, stored[5].base_offset)
    log.close()
    for name, data in saved.items():  # the deleted segments come back
        if name != STATE_FILE:
            (directory / name).write_bytes(data)

    log = open_log(segment_bytes=1024)
    assert log.offsets(part).low == stored[5].base_offset
    assert read_all(log, part) == stored[5:]
    # Recovery finishes the job.
    assert len(segment_files(directory)) == 2


# Policies, threads, lifecycle -------------------------------------------------------------
@pytest.mark.parametrize("policy", ["interval", "never"])
def test_other_fsync_policies(open_log: OpenLog, part: PartitionId, policy: Any) -> None:
    log = open_log(fsync=policy, fsync_interval_ms=5, segment_bytes=1024)
    stored = fill(log, part, 10, size=200)
    assert read_all(log, part) == stored
    if policy == "interval":
        partition = log._parts[part]
        deadline = time.monotonic() + 60
        while partition.durable < partition.end and time.monotonic() < deadline:
            time.sleep(0.01)
        assert partition.durable == partition.end, "the flusher never ran"
    log.close()
    assert not [t for t in threading.enumerate() if t.name == "tidegate-hot-disk-flusher"]
    assert read_all(open_log(fsync=policy), part) == stored


def test_one_partition_does_not_block_another(open_log: OpenLog) -> None:
    log = open_log()
    a, b = PartitionId("t", "tab", 0), PartitionId("t", "tab", 1)
    log.append(a, b"a", 1, 0)
    done = threading.Event()

    def other() -> None:
        log.append(b, b"b", 1, 0)
        log.read(b, 0, 1, 1)
        done.set()

    with log._parts[a].lock:  # as if a slow append to ``a`` were under way
        worker = threading.Thread(target=other)
        worker.start()
        worker.join(60)
        assert done.is_set()


def test_drop_removes_the_folder(open_log: OpenLog, root: Path) -> None:
    log = open_log(segment_bytes=1024)
    a, b = PartitionId("t", "tab", 0), PartitionId("t", "tab", 1)
    fill(log, a, 10, size=300)
    kept = fill(log, b, 3)
    log.drop(a)
    assert not part_dir(root, a).exists()
    assert read_all(log, b) == kept
    assert log.append(a, b"x", 1, 0) == AppendResult(0, 1)
    assert segment_files(part_dir(root, a)) == [f"{segment_name(0)}.log"]


def test_closed_log_refuses_work(open_log: OpenLog, part: PartitionId) -> None:
    log = open_log()
    fill(log, part, 2)
    log.close()
    log.close()
    with pytest.raises(Unavailable):
        log.append(part, b"x", 1, 0)
    with pytest.raises(Unavailable):
        log.read(part, 0, 1, 1)
