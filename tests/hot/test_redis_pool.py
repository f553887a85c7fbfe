"""Issue 30.2: the Redis hot tier's connections stay bounded whatever the number of
partitions and callers at once."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import redis

from gateway.hot import PartitionId
from gateway.hot.redis import RedisHotLog
from gateway.hot.redis.shard import MAX_CONNECTIONS
from tests.services import RedisServer


def test_many_threads_on_many_partitions_share_a_bounded_pool(redis_server: RedisServer) -> None:
    hot = RedisHotLog(redis_server.url)
    probe = redis.Redis.from_url(redis_server.url)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    parts = [PartitionId(tenant, f"table{i}", 0) for i in range(300)]
    before = len(probe.client_list())

    def work(part: PartitionId) -> None:
        hot.open_partitions([part])
        hot.append(part, b"x", 1, 1)
        assert hot.offsets(part).high == 1

    try:
        with ThreadPoolExecutor(150) as pool:
            list(pool.map(work, parts))
        # A pool keeps the connections it opened: what is open now is its peak.
        opened = len(probe.client_list()) - before
        assert 1 <= opened <= MAX_CONNECTIONS
    finally:
        hot.close()
        probe.close()
