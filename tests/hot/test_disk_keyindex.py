"""The disk hot tier's key index: keyed records (record version 2), the ``keys.idx``
checkpoint, and recovery from the log (with a checkpoint, without, with a bad one, after
kill -9 of a process appending keyed batches)."""

from __future__ import annotations

import inspect
import json
import os
import random
import struct
import uuid
import zlib
from pathlib import Path

import pytest

from gateway.hot import PartitionId, ProducerSequence
from gateway.hot.disk import DiskHotLog, segment_name
from gateway.hot.disk import keyindex as disk_keyindex
from gateway.hot.disk.keyindex import KEYS_FILE, KeyIndex
from gateway.hot.disk.records import STATE_FILE
from tests.hot.test_disk import (
    OpenLog,
    _acks_until_killed,
    crash_image,
    open_log,
    part,
    part_dir,
    read_all,
    root,
)
from tests.services import REPO_ROOT

__all__ = ["open_log", "part", "root"]  # fixtures this module uses from test_disk

Model = dict[bytes, int]


def random_batches(log: DiskHotLog, part: PartitionId, n: int, seed: int, model: Model) -> None:
    """Append ``n`` keyed batches of random keys (some repeated within a batch), folding
    them into ``model`` as they are acknowledged."""
    rnd = random.Random(seed)
    for _ in range(n):
        keys = [f"k{rnd.randrange(60)}".encode() for _ in range(rnd.randrange(1, 8))]
        r = log.append(part, b"v" * rnd.randrange(1, 40), len(keys), 0, keys=keys)
        model.update({key: r.base_offset + i for i, key in enumerate(keys)})


def closed_log(open_log: OpenLog, part: PartitionId, n: int, seed: int) -> tuple[Model, int]:
    """Append ``n`` random keyed batches to a log and close it: the model, the high mark."""
    log = open_log()
    model: Model = {}
    random_batches(log, part, n, seed, model)
    high = log.offsets(part).high
    log.close()
    return model, high


ASKED = [f"k{i}".encode() for i in range(64)]


def answers(log: DiskHotLog, part: PartitionId) -> list[int | None]:
    return log.latest_offsets(part, ASKED)


def expected(model: Model) -> list[int | None]:
    return [model.get(key) for key in ASKED]


def write_checkpoint(directory: Path, through: int, entries: Model) -> None:
    """A ``keys.idx`` written independently of the code under test (the documented layout)."""
    body = (
        struct.pack(">qI", through, len(entries))
        + b"".join(struct.pack(">I", len(k)) for k in entries)
        + b"".join(struct.pack(">q", o) for o in entries.values())
        + b"".join(entries)
    )
    (directory / KEYS_FILE).write_bytes(b"TGK\x01" + struct.pack(">I", zlib.crc32(body)) + body)


def test_keyed_record_format(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    log = open_log()
    log.append(part, b"plain", 1, 7)
    log.append(part, b"payload", 2, 8, ProducerSequence("p", 0), keys=[b"ab", b""])
    data = (part_dir(root, part) / f"{segment_name(0)}.log").read_bytes()
    v1 = struct.Struct(">4sIIqIqBqH")
    assert v1.unpack_from(data)[0] == b"TGB\x01"  # a batch without keys: version 1, as before
    pos = v1.size + len(b"plain")
    magic, crc, plen, base, count, ts, flags, seq, pid_len = v1.unpack_from(data, pos)
    assert (magic, plen, base, count, ts, flags, seq, pid_len) == (
        b"TGB\x02",
        7,
        1,
        2,
        8,
        0x03,
        0,
        1,
    )
    (keys_len,) = struct.unpack_from(">I", data, pos + v1.size)
    rest = data[pos + v1.size + 4 :]
    assert rest == b"p" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x00" + b"payload"
    assert keys_len == 10
    assert crc == zlib.crc32(data[pos + 8 :])
    assert [b.payload for b in read_all(log, part)] == [b"plain", b"payload"]


def test_checkpoint_at_close_is_read_on_open(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    model, high = closed_log(open_log, part, 20, 1)
    directory = part_dir(root, part)
    found = KeyIndex.read(directory)
    assert found == (high, model)
    assert json.loads((directory / STATE_FILE).read_bytes())["keyed"] is True
    # The checkpoint is what a reopen starts from: one with an entry the log never had
    # (written whole, CRC and all) is believed for the records it says it folds.
    write_checkpoint(directory, high, {**model, b"ghost": 3})
    again = open_log()
    assert again.latest_offsets(part, [b"ghost"]) == [3]
    assert answers(again, part) == expected(model)


def test_checkpoint_plus_the_log_after_it(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    """A crash image taken after a checkpoint and more appends: the checkpoint, then the
    records after it."""
    model, _ = closed_log(open_log, part, 15, 2)
    log = open_log()
    first = log.append(part, b"x", 2, 0, keys=[b"only-after", b"k1"])  # just past `through`
    model.update({b"only-after": first.base_offset, b"k1": first.base_offset + 1})
    random_batches(log, part, 15, 3, model)  # no checkpoint of these
    image = crash_image(root, root.parent / "image")
    through = KeyIndex.read(part_dir(image, part))
    assert through is not None and through[0] < log.offsets(part).high
    again = open_log(image)
    assert answers(again, part) == expected(model)
    assert again.latest_offsets(part, [b"only-after"]) == [first.base_offset]


@pytest.mark.parametrize("damage", ["missing", "bad crc", "cut short", "ahead of the log"])
def test_a_missing_or_bad_checkpoint_rebuilds_from_the_log(
    open_log: OpenLog, root: Path, part: PartitionId, damage: str
) -> None:
    model, high = closed_log(open_log, part, 25, 4)
    path = part_dir(root, part) / KEYS_FILE
    raw = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "bad crc":
        path.write_bytes(raw[:-3] + bytes([raw[-3] ^ 0x40]) + raw[-2:])
    elif damage == "cut short":
        path.write_bytes(raw[: len(raw) // 2])
    else:  # a power cut lost records the checkpoint folds: none of it can be trusted
        write_checkpoint(path.parent, high + 5, {b"k1": high + 2})
    again = open_log()
    assert answers(again, part) == expected(model)
    assert again.key_count(part) == len(model)
    if damage != "missing":
        # Replaced on open: once the log grows past the bad one's `through`, it would
        # otherwise be believed after a crash.
        assert KeyIndex.read(path.parent) == (high, model)
    again.append(part, b"x", 1, 0, keys=[b"k1"])
    model[b"k1"] = high
    again.close()
    assert KeyIndex.read(path.parent) == (high + 1, model)  # and written at close


def test_a_checkpoint_ahead_of_the_log_is_not_believed_later(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    """A power cut lost records a checkpoint folds: the log is rebuilt on open, then grows
    past that checkpoint's `through`; a crash then must not bring the old checkpoint back."""
    model, high = closed_log(open_log, part, 10, 9)
    write_checkpoint(part_dir(root, part), high + 6, {b"k1": high + 3, b"lost": high + 5})
    log = open_log()
    random_batches(log, part, 10, 10, model)  # past high + 6, not checkpointed
    assert log.offsets(part).high > high + 6
    image = crash_image(root, root.parent / "image")
    again = open_log(image)
    assert answers(again, part) == expected(model)
    assert again.latest_offsets(part, [b"lost"]) == [None]


def test_periodic_checkpoints(
    open_log: OpenLog, root: Path, part: PartitionId, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_keyindex, "MIN_CHECKPOINT_CHANGES", 10)
    log = open_log()
    model: Model = {}
    directory = part_dir(root, part)
    seen: set[int] = set()
    history: dict[int, Model] = {0: {}}  # the model at each high watermark
    rnd = random.Random(5)
    for _ in range(60):
        keys = [f"k{rnd.randrange(8)}".encode() for _ in range(3)]
        r = log.append(part, b"x", 3, 0, keys=keys)
        model.update({key: r.base_offset + i for i, key in enumerate(keys)})
        history[r.base_offset + 3] = dict(model)
        checkpoint = KeyIndex.read(directory)
        if checkpoint is not None:
            through, entries = checkpoint
            seen.add(through)
            # A checkpoint is the fold of exactly the records below its `through`.
            assert entries == history[through]
    assert len(seen) >= 10  # written as the log went, not per append
    image = crash_image(root, root.parent / "image")
    assert answers(open_log(image), part) == expected(model)


def test_a_table_without_keys_keeps_no_checkpoint(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    log = open_log()
    for i in range(5):
        log.append(part, b"row", 2, i)
    log.close()
    directory = part_dir(root, part)
    assert not (directory / KEYS_FILE).exists()
    assert json.loads((directory / STATE_FILE).read_bytes())["keyed"] is False
    again = open_log()
    assert again.latest_offsets(part, [b"a"]) == [None]
    assert again.key_count(part) == 0


def test_a_state_file_from_before_key_tables(
    open_log: OpenLog, root: Path, part: PartitionId
) -> None:
    """A state without ``keyed`` says nothing: the log is looked at."""
    model, _ = closed_log(open_log, part, 10, 6)
    directory = part_dir(root, part)
    state = json.loads((directory / STATE_FILE).read_bytes())
    del state["keyed"]
    (directory / STATE_FILE).write_text(json.dumps(state))
    (directory / KEYS_FILE).unlink()
    again = open_log()
    assert answers(again, part) == expected(model)
    assert json.loads((directory / STATE_FILE).read_bytes())["keyed"] is True


def test_segments_trimmed_away_and_rolled(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    log = open_log(segment_bytes=512)
    model: Model = {}
    random_batches(log, part, 80, 7, model)
    assert len(list(part_dir(root, part).glob("*.log"))) > 3
    low = log.trim(part, log.offsets(part).high // 2)
    live = {key: o for key, o in model.items() if o >= low}
    assert answers(log, part) == expected(live)
    assert log.key_count(part) == len(live)
    image = crash_image(root, root.parent / "image")
    (part_dir(image, part) / KEYS_FILE).unlink(missing_ok=True)
    assert answers(open_log(image, segment_bytes=512), part) == expected(live)


def test_starting_over_forgets_the_index(open_log: OpenLog, root: Path, part: PartitionId) -> None:
    _, high = closed_log(open_log, part, 5, 8)
    again = open_log()
    assert again.open_partition(part, high + 100) == high + 100
    assert answers(again, part) == [None] * len(ASKED)
    assert not (part_dir(root, part) / KEYS_FILE).exists()


KEYED_CHILD = """
import sys
from gateway.hot.base import PartitionId, ProducerSequence
from gateway.hot.disk import DiskHotLog
from gateway.hot.disk import keyindex

{helpers}

keyindex.MIN_CHECKPOINT_CHANGES = 40  # checkpoints as it goes, one may be cut by the kill
root, tenant, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = DiskHotLog(root, fsync="batch", segment_bytes=64 * 1024)
part = PartitionId(tenant, "table", 0)
i = 0
while True:
    payload, keys = keyed_batch(rnd, i)
    r = log.append(part, payload, len(keys), i, ProducerSequence(f"p-{{rnd}}", i), keys=keys)
    sys.stdout.write(f"{{rnd}} {{i}} {{r.base_offset}} {{r.count}}\\n")
    sys.stdout.flush()
    i += 1
"""


def keyed_batch(rnd: int, i: int) -> tuple[bytes, list[bytes]]:
    """The payload and keys the crash child appends as batch ``i`` of round ``rnd``."""
    n = (i * 31 + rnd * 7) % 9 + 1
    keys = [f"key-{(i * 17 + j * 101 + rnd * 13) % 257}".encode() for j in range(n)]
    return f"{rnd}:{i}:".encode() + b"#" * ((i * 7919) % 3000), keys


def test_kill_9_during_keyed_appends(root: Path) -> None:
    """Three rounds of a child appending keyed batches (checkpointing as it goes) until a
    SIGKILL: afterwards the index equals the fold of the batches stored, in offset order,
    and those are every acknowledged one and at most the one in flight per round."""
    tenant = f"t{uuid.uuid4().hex[:8]}"
    part = PartitionId(tenant, "table", 0)
    script = KEYED_CHILD.format(helpers=inspect.getsource(keyed_batch))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    acked: dict[tuple[int, int], int] = {}
    for rnd in range(3):
        for line in _acks_until_killed([script, str(root), tenant, str(rnd)], 150 + 60 * rnd, env):
            r, i, base, _ = map(int, line.split())
            acked[(r, i)] = base
    assert KeyIndex.read(root / tenant / "table" / "0") is not None  # checkpointed as it went
    log = DiskHotLog(root)
    try:
        model: Model = {}
        stored: dict[tuple[int, int], int] = {}
        for batch in read_all(log, part):
            r_s, i_s, _ = batch.payload.split(b":", 2)
            key = (int(r_s), int(i_s))
            payload, keys = keyed_batch(*key)
            assert (batch.payload, batch.count) == (payload, len(keys))
            stored[key] = batch.base_offset
            model.update({k: batch.base_offset + j for j, k in enumerate(keys)})
        for key, base in acked.items():
            assert stored.get(key) == base, key
        assert len(stored) - len(acked) <= 3
        asked = [f"key-{n}".encode() for n in range(260)]
        assert log.latest_offsets(part, asked) == [model.get(k) for k in asked]
        assert log.key_count(part) == len(model)
    finally:
        log.close()
