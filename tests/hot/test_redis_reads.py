"""What a read of the Redis hot tier fetches inside Redis: only the stream entries it
answers with (and at most one more), whatever the limits, watched with MONITOR on the
session's redis-server. The read script once asked XRANGE for as many *entries* as the
read had *records* left (up to 256): a 10,000-record read of 1,000-record batches copied
256 payloads into Lua to answer with 10."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.hot import PartitionId, load_hot_log
from gateway.hot.redis import RedisHotLog, partition_keys
from tests.conftest import hot_settings
from tests.services import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def log(redis_server: RedisServer, tmp_path: Path) -> Iterator[RedisHotLog]:
    hot = load_hot_log(hot_settings("redis", tmp_path, redis_server))
    assert isinstance(hot, RedisHotLog)
    try:
        yield hot
    finally:
        hot.close()


def fetched_entries(server: RedisServer, key: str, read: object) -> tuple[object, int]:
    """``read()``'s answer and the stream entries the commands on ``key`` asked Redis for
    meanwhile (the COUNT of each XRANGE/XREVRANGE, as MONITOR shows them)."""
    client = redis.Redis(port=server.port)
    marker = f"end-of-read-{uuid.uuid4().hex}"
    try:
        with client.monitor() as m:
            answer = read()  # type: ignore[operator]
            client.echo(marker)
            asked = 0
            while True:
                command = m.next_command()["command"]
                if marker in command:
                    return answer, asked
                if re.match(r"X(REV)?RANGE ", command) and key in command:
                    asked += int(command.rsplit(" ", 1)[1])
    finally:
        client.close()


@pytest.mark.parametrize(
    ("offset", "max_records", "max_bytes", "answered"),
    [
        (0, 100, 1 << 30, 10),  # ten whole batches
        (5, 30, 1 << 30, 4),  # 5 of the first, then three whole ones
        (15, 10, 1 << 30, 2),  # across two batches
        (0, 10_000, 3 * 64, 3),  # the byte cap: the batch that reaches it is the last
        (450, 10_000, 1 << 30, 5),  # to the end of the log
    ],
)
def test_a_read_fetches_only_the_entries_it_answers_with(
    log: RedisHotLog,
    redis_server: RedisServer,
    offset: int,
    max_records: int,
    max_bytes: int,
    answered: int,
) -> None:
    part = PartitionId(f"t{uuid.uuid4().hex[:8]}", "tbl", 0)
    for i in range(50):
        log.append(part, bytes([i]) * 64, 10, i)
    key = partition_keys(part, 0)[0]
    for read in (log.read, lambda *a: log.read_at(*a)[1]):
        got, asked = fetched_entries(
            redis_server, key, lambda r=read: r(part, offset, max_records, max_bytes)
        )
        batches = list(got)  # type: ignore[call-overload]
        assert [b.base_offset for b in batches] == [
            offset // 10 * 10 + 10 * i for i in range(answered)
        ]
        assert [b.payload for b in batches] == [bytes([b.base_offset // 10]) * 64 for b in batches]
        assert asked <= answered + 1, f"{asked} entries fetched to answer with {answered}"


def test_a_read_over_batches_of_unequal_sizes_still_reaches_its_limit(log: RedisHotLog) -> None:
    """The script guesses how many entries the rest of a read needs from the entries it
    has taken: a guess too small (smaller batches ahead) fetches again until the limit."""
    part = PartitionId(f"t{uuid.uuid4().hex[:8]}", "tbl", 0)
    sizes = [500, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 400, 2, 3, 700]
    at = 0
    for n in sizes:
        log.append(part, b"x" * n, n, 0)
        at += n
    for offset, want in [(0, 520), (499, 14), (500, 600), (0, at)]:
        batches = log.read(part, offset, want, 1 << 30)
        assert batches[0].base_offset <= offset
        got = batches[-1].next_offset - offset
        assert got >= min(want, at - offset)
        assert got - batches[-1].count < want  # no batch past the one that reached it
        for prev, nxt in itertools.pairwise(batches):
            assert nxt.base_offset == prev.next_offset
