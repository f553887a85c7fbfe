"""The hot log backends the contract runs on.

``disk`` and ``redis`` are the two hot tiers as configured by default. The three others
are the Redis tier's virtual log (Delos' chains of segments over named shards, issue 13),
each bound to a real metadata store on SQLite: ``redis-sharded`` places each new table's
partitions over three Redis servers, ``redis-cluster`` places them on a Redis Cluster
shard, and ``redis-sealed`` moves each new partition once before the test uses it, so its
chain holds a sealed segment and the test appends to the second one, on another shard.
A new partition of these is made by :func:`provision` (``new_partition`` in the contract
calls it), as the gateway makes one: a table in the metadata store, placed on shards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.config import RedisShardConfig
from gateway.hot import HotLog, PartitionId, load_hot_log
from gateway.hot.redis import RedisHotLog
from gateway.meta import MetadataStore
from tests.conftest import hot_settings
from tests.services import RedisClusterServer, RedisServer

#: The virtual-log variants: (shards the tables are placed on, whether a move seals first).
VIRTUAL = {
    "redis-sharded": (("default", "b", "c"), False),
    "redis-cluster": (("rc",), False),
    "redis-sealed": (("default",), True),
}

#: How the running test's backend makes a new partition: None makes it out of thin air
#: (``disk``, ``redis``: any partition id is a partition there).
Provision = Callable[[int, str, bool], PartitionId]
_provision: list[Provision | None] = [None]
#: A second instance over the same storage (and placements), as a restarted gateway has.
_reopen: list[Callable[[], HotLog] | None] = [None]


def provision(partition: int, tenant: str, moved: bool = True) -> PartitionId | None:
    """A new partition ``partition`` of a new table of ``tenant`` on the running test's
    backend (moved once on ``redis-sealed`` unless not ``moved``), or None when any id
    will do."""
    make = _provision[0]
    return make(partition, tenant, moved) if make is not None else None


@pytest.fixture(params=["disk", "redis", *VIRTUAL])
def hot_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def shard_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RedisServer]]:
    """Two more Redis servers, shards "b" and "c" beside the session's own."""
    started = {n: RedisServer(tmp_path_factory.mktemp(f"shard-{n}")).start() for n in "bc"}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    server = RedisClusterServer(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield server
    finally:
        server.stop()


def _virtual_log(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HotLog]:
    shards, seal = VIRTUAL[kind]
    default: RedisServer = request.getfixturevalue("redis_server")
    configs = [RedisShardConfig(name="default", url=default.url)]
    if kind == "redis-cluster":
        cluster: RedisClusterServer = request.getfixturevalue("redis_cluster")
        configs.append(RedisShardConfig(name="rc", url=cluster.url, cluster=True))
    else:
        servers: dict[str, RedisServer] = request.getfixturevalue("shard_servers")
        configs += [RedisShardConfig(name=n, url=s.url) for n, s in servers.items()]
    meta = MetadataStore(f"sqlite:///{tmp_path / 'placements.db'}")

    def open_log() -> HotLog:
        log = RedisHotLog(shards=configs)
        log.bind_placements(meta)
        return log

    log = open_log()

    def make(partition: int, tenant: str, moved: bool) -> PartitionId:
        meta.ensure_tenant(tenant)
        fields = [{"name": "v", "type": "int64"}]
        d = meta.create_table(
            tenant, "ns", f"t{uuid.uuid4().hex[:10]}", fields, partition + 1, (), shards
        )
        part = PartitionId(tenant, d.table_id, partition)
        if seal and moved:
            target = "b" if log.chain(part).active.shard != "b" else "c"
            log.begin_move(part, target)
            chain = log.finish_move(part)
            assert len(chain.segments) == 2 and chain.active.shard == target, chain
        return part

    _provision[0], _reopen[0] = make, open_log
    try:
        yield log
    finally:
        _provision[0] = _reopen[0] = None
        log.close()
        meta.close()


@pytest.fixture
def hot_log(hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HotLog]:
    if hot_kind in VIRTUAL:
        yield from _virtual_log(hot_kind, tmp_path, request)
        return
    redis_server: RedisServer | None = (
        request.getfixturevalue("redis_server") if hot_kind == "redis" else None
    )
    settings = hot_settings(hot_kind, tmp_path, redis_server)
    log = load_hot_log(settings)
    _reopen[0] = lambda: load_hot_log(settings)
    try:
        yield log
    finally:
        _reopen[0] = None
        log.close()


def reopen() -> HotLog:
    """Another instance of the running test's hot log over the same storage."""
    make = _reopen[0]
    assert make is not None, "no hot log is open"
    return make()
