"""Issue 33, item 3: a hot tier that lost its state never makes the gateway assign offsets
it assigned before.

What happened at 8d9a4e4: Redis restarted without persistence (``shutdown nosave``), and
the gateway appended from offset 0 again, below the tiered watermark ``T(p)``: those records
were shadowed by the tiered rows and never readable (57 % of the records acknowledged after
the restart). Here, on both hot tiers, the hot state is lost under a running gateway and
under a restarted one; every record acknowledged afterwards must read back exactly once,
at an offset above every offset assigned before, and tiering must go on.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.iceberg_catalog import tier
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

TABLE = "shop.orders"
PARTITIONS = 2


def append(gw: GatewayProcess, start: int, n: int) -> dict[int, list[tuple[int, int]]]:
    """``n`` one-record appends of ids from ``start``, alternating partitions; returns
    partition -> [(offset, id)] as acknowledged."""
    acked: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    with gw.client() as c:
        for i in range(start, start + n):
            p = i % PARTITIONS
            (r,) = c.append(TABLE, [{"id": i, "note": f"n{i}"}], partition=p)
            acked[p].append((r.base_offset, i))
    return acked


def stream(gw: GatewayProcess) -> dict[int, list[tuple[int, int]]]:
    """Every record of every partition, read by offset from 0: partition -> [(offset, id)]."""
    out: dict[int, list[tuple[int, int]]] = {}
    with gw.client() as c:
        for p in range(PARTITIONS):
            rows = c.read(TABLE, partition=p, offset=0, max_records=10_000).to_pylist()
            out[p] = [(r["_offset"], r["id"]) for r in rows]
    return out


def describe(gw: GatewayProcess) -> Any:
    with gw.client() as c:
        return c.describe_table(TABLE)


def check(
    gw: GatewayProcess,
    before: dict[int, list[tuple[int, int]]],
    after: dict[int, list[tuple[int, int]]],
    tiered_before: dict[int, int],
) -> None:
    """Records acknowledged after the loss read back exactly once, above every offset
    assigned before it; records tiered before it are all still there."""
    got = stream(gw)
    for p in range(PARTITIONS):
        offsets = [o for o, _ in got[p]]
        assert offsets == sorted(set(offsets)), f"partition {p}: not strictly increasing"
        assigned_before = max((o for o, _ in before[p]), default=-1)
        assert all(o > assigned_before for o, _ in after[p]), (p, after[p], assigned_before)
        assert set(after[p]) <= set(got[p]), f"partition {p}: acknowledged records unreadable"
        kept = [(o, i) for o, i in before[p] if o < tiered_before[p]]
        assert set(kept) <= set(got[p]), f"partition {p}: tiered records lost"
    with gw.client() as c:
        scanned = {r["id"] for r in c.scan(TABLE, columns=["id"]).to_pylist()}
    assert {i for p in after for _, i in after[p]} <= scanned


def settle(gw: GatewayProcess) -> dict[int, int]:
    """Tier everything, then return T(p) per partition."""
    tier(gw)
    return {p.partition: p.tiered_watermark for p in describe(gw).partition_info}


def forgetful(tmp_path: Path, **env: str) -> tuple[RedisServer, GatewayProcess]:
    """A Redis that keeps nothing on disk, and a gateway on it (tiering left to
    ``tidegate tier``, run beside it by :func:`tier`), with ``env`` besides."""
    server = RedisServer(tmp_path / "redis")
    server.extra_args = ["--appendonly", "no"]
    server.start()
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": server.url,
            "TIDEGATE_TIERING__ENABLED": "false",
            **env,
        },
    ).start()
    return server, gw


def test_an_emptied_redis_never_makes_the_gateway_reuse_offsets(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis")
    redis.extra_args = ["--appendonly", "no"]  # keeps nothing on disk, as in the report
    redis.start()
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis.url,
            "TIDEGATE_TIERING__ENABLED": "false",  # `tidegate tier` runs beside it
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        },
    ).start()
    try:
        assert "keeps nothing on disk" in gw.log()  # said once, at start
        with gw.client() as c:
            c.create_table(TABLE, {"id": "int64", "note": "string"}, partitions=PARTITIONS)
        before = append(gw, 0, 40)
        tiered = settle(gw)
        assert tiered == {0: 20, 1: 20}
        tail = append(gw, 40, 10)  # acknowledged, not tiered: lost with Redis below
        for p in tail:
            before[p] += tail[p]

        # 1. Redis restarts empty under the running gateway.
        redis.restart()
        after = append(gw, 100, 30)
        # The gateway remembered what it acknowledged: offsets go on from there.
        assert [o for o, _ in after[0]][:1] == [25] and [o for o, _ in after[1]][:1] == [25]
        check(gw, before, after, tiered)
        assert "re-seeded partition" in gw.log() and "were acknowledged, then lost" in gw.log()

        # 2. Redis and the gateway both restart: the new process knows only what the
        # Iceberg table and the metadata store say (each gateway records there every
        # second, and when it stops, the high watermarks it acknowledged).
        for p in after:
            before[p] += after[p]
        gw.stop()
        redis.restart()
        gw.start()
        again = append(gw, 200, 10)
        check(gw, before, again, tiered)
        for p in range(PARTITIONS):
            lowest = min(o for o, _ in again[p])
            assert lowest >= 40, f"partition {p}: offset {lowest} was assigned before"

        # 3. Tiering goes on past the lost offsets, and reads stay whole.
        tiered_now = settle(gw)
        for p in again:
            before[p] += again[p]
        high = {p.partition: p.high_watermark for p in describe(gw).partition_info}
        assert tiered_now == high
        check(gw, before, {p: [] for p in range(PARTITIONS)}, tiered)
        # What is left: the records tiered before the first loss and those acknowledged
        # after the last one; the untiered ones of each loss are gone (Redis kept nothing).
        got = stream(gw)
        for p in range(PARTITIONS):
            assert [i for _, i in got[p]] == [
                i for _, i in sorted(before[p]) if i < 40 or i >= 200
            ], f"partition {p}"
    finally:
        gw.stop()
        redis.stop()


def test_a_removed_disk_partition_never_makes_the_gateway_reuse_offsets(tmp_path: Path) -> None:
    data = tmp_path / "gw"
    gw = GatewayProcess(
        data,
        {"TIDEGATE_TIERING__ENABLED": "false", "TIDEGATE_TIERING__HOT_RETENTION_S": "0"},
    ).start()
    try:
        with gw.client() as c:
            c.create_table(TABLE, {"id": "int64", "note": "string"}, partitions=PARTITIONS)
        before = append(gw, 0, 20)
        gw.stop()
        tier(gw)  # the disk tier belongs to one process: tier while it is stopped
        gw.start()
        tiered = {p.partition: p.tiered_watermark for p in describe(gw).partition_info}
        assert tiered == {0: 10, 1: 10}
        tail = append(gw, 20, 6)
        for p in tail:
            before[p] += tail[p]
        gw.stop()
        # The hot tier's folder of the table is lost (a wiped volume).
        hot = data / "hot" / gw.tenant
        assert hot.is_dir(), sorted(p.name for p in (data / "hot").iterdir())
        shutil.rmtree(hot)
        gw.start()
        after = append(gw, 100, 10)
        for p in range(PARTITIONS):
            assert min(o for o, _ in after[p]) >= 10  # never below T(p)
        check(gw, before, after, tiered)
        gw.stop()
        tier(gw)
        gw.start()
        info = describe(gw).partition_info
        assert [p.tiered_watermark for p in info] == [p.high_watermark for p in info]
        for p in after:
            before[p] += after[p]
        check(gw, before, {p: [] for p in range(PARTITIONS)}, tiered)
    finally:
        gw.stop()


def test_the_gateway_waits_for_nothing_when_the_hot_tier_is_fine(tmp_path: Path) -> None:
    """No warning without a loss: a restart of a gateway on an intact hot tier re-seeds
    nothing."""
    gw = GatewayProcess(tmp_path / "gw", {"TIDEGATE_TIERING__INTERVAL_S": "0.5"}).start()
    try:
        with gw.client() as c:
            c.create_table(TABLE, {"id": "int64", "note": "string"}, partitions=PARTITIONS)
        append(gw, 0, 10)
        deadline = time.monotonic() + 60
        while any(p.lag_records for p in describe(gw).partition_info):
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.2)
        gw.restart()
        after = append(gw, 10, 4)
        assert [o for o, _ in after[0]] == [5, 6] and [o for o, _ in after[1]] == [5, 6]
        assert "re-seeded" not in gw.log()
    finally:
        gw.stop()


# Idempotent producers the hot tier forgot (issue 33, item 11 / the lead's follow-up) ------
PRODUCED = "shop.produced"


def produce(prod: Any, start: int, n: int, partition: int) -> list[tuple[int, int]]:
    """``n`` one-record sends of ids from ``start`` through the SDK producer, flushed;
    returns [(offset, id)] as acknowledged."""
    futures = [
        prod.send({"id": i, "note": f"n{i}"}, partition=partition) for i in range(start, start + n)
    ]
    prod.flush(60)
    return [(f.result().offset, i) for f, i in zip(futures, range(start, start + n), strict=True)]


def check_producer_after_loss(
    gw: GatewayProcess, lose: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the loss, a raw idempotent producer and an SDK producer write; the hot tier
    loses its state (``lose``); then a resend of the raw producer's last batch and its next
    one are refused with UNKNOWN_PRODUCER_ID (nothing stored: a retry can no longer be told
    from a new batch), sequence 0 starts it again, and the SDK producer goes on under a
    new epoch: every record acknowledged after the loss reads back exactly once."""
    from gateway.client import UnknownProducer

    with gw.client() as c:

        def raw_append(s: int) -> Any:
            """Batch ``s`` of the producer ``raw``: one record, id 1000 + s, partition 1."""
            row = [{"id": 1000 + s, "note": "raw"}]
            return c.append(PRODUCED, row, partition=1, producer_id="raw", sequence=s)[0]

        c.create_table(PRODUCED, {"id": "int64", "note": "string"}, partitions=PARTITIONS)
        raw = [raw_append(s) for s in range(3)]
        assert [r.base_offset for r in raw] == [0, 1, 2]
        with c.producer(PRODUCED, producer_id="sdk", linger=0.001) as prod:
            before = produce(prod, 0, 5, 0)
            assert [o for o, _ in before] == [0, 1, 2, 3, 4]
            lose()
            # The hot tier is found empty and re-seeded above what this gateway acknowledged.
            c.append(PRODUCED, [{"id": 2000, "note": "plain"}], partition=1)
            high = c.describe_table(PRODUCED).partition_info[1].high_watermark
            for s in (2, 3):  # a resend of the last batch, and the next one
                with pytest.raises(UnknownProducer) as refused:
                    raw_append(s)
                assert refused.value.reason == "UNKNOWN_PRODUCER_ID"
                assert "holds no state of this producer" in refused.value.message
                assert "\n" not in refused.value.message
            assert c.describe_table(PRODUCED).partition_info[1].high_watermark == high
            again = raw_append(0)  # the producer starts again
            assert (again.base_offset, again.duplicate) == (high, False)

            with caplog.at_level("WARNING", logger="tidegate.client"):
                after = produce(prod, 100, 5, 0)
            assert "no longer knows this producer" in caplog.text
            assert f"going on as {prod.producer_id}.1 from sequence 0" in caplog.text
            assert min(o for o, _ in after) >= 5  # never an offset assigned before
        rows = c.read(PRODUCED, partition=0, offset=after[0][0], max_records=100).to_pylist()
        assert [(r["_offset"], r["id"]) for r in rows] == after
        assert sorted(r["id"] for r in c.scan(PRODUCED, columns=["id"]).to_pylist()) == sorted(
            [2000, 1000, *(i for _, i in after)]
        )


@pytest.mark.parametrize("how", ["restart", "flushall"])
def test_a_producer_an_emptied_redis_forgot_is_refused_above_sequence_zero(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import redis as redis_py

    server, gw = forgetful(tmp_path)

    def lose() -> None:
        if how == "restart":
            server.restart()  # kill -9; nothing on disk
        else:
            with redis_py.Redis.from_url(server.url) as r:
                r.flushall()

    try:
        check_producer_after_loss(gw, lose, caplog)
    finally:
        gw.stop()
        server.stop()


def test_a_producer_a_wiped_disk_partition_forgot_is_refused_above_sequence_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "gw"
    gw = GatewayProcess(data, {"TIDEGATE_TIERING__ENABLED": "false"}).start()

    def lose() -> None:
        gw.stop()
        shutil.rmtree(data / "hot" / gw.tenant)  # a wiped volume
        gw.start()

    try:
        check_producer_after_loss(gw, lose, caplog)
    finally:
        gw.stop()


# A scan whose pinned hot range empties (issue 33, the lead's follow-up) --------------------
def scan_broken_midway(gw: GatewayProcess, breaking: Any) -> Any:
    """Fill partition 0 of ``TABLE`` with 24 MiB of rows on the wire (a few KiB stored,
    compressed: far more than a client's window and the sockets' buffers hold), open a
    gRPC scan and take its first answer, call ``breaking()`` while the scan is held open,
    then read on; returns the ``grpc.RpcError`` the scan ended with. The gateway reads
    one stored batch per hot read (``TIDEGATE_SERVER__MAX_READ_RECORDS`` 1024)."""
    import grpc

    from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

    with gw.client() as c:
        c.create_table(TABLE, {"id": "int64", "note": "string"}, partitions=PARTITIONS)
        for b in range(24):
            rows = [{"id": b * 1000 + i, "note": "x" * 1024} for i in range(1024)]
            c.append(TABLE, rows, partition=0)
    # No BDP probing: the client's receive window stays at 64 KiB.
    options = [("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 64 << 20)]
    with gw.channel(options=options) as channel:
        stub = pb_grpc.TidegateStub(channel)
        ref = pb.TableRef(namespace="shop", name="orders")
        answers = stub.Scan(pb.ScanRequest(table=ref, columns=["id", "note"]), timeout=120)
        assert next(answers).arrow_ipc
        breaking()
        with pytest.raises(grpc.RpcError) as failed:
            for _ in answers:
                pass
    log = gw.log()
    assert "unexpected error" not in log and "Traceback" not in log, log
    return failed.value


def test_a_scan_whose_pinned_hot_range_emptied_fails_unavailable(tmp_path: Path) -> None:
    """A scan pins ``[T(p), HW(p))`` per partition, then reads it as its client takes the
    rows. Redis is emptied while a client holds a scan open (its flow-control window full):
    the scan ends UNAVAILABLE (retryable: a new scan pins a new view) in one sentence, not
    an INTERNAL error with a traceback in the log."""
    import grpc
    import redis as redis_py

    server, gw = forgetful(tmp_path, TIDEGATE_SERVER__MAX_READ_RECORDS="1024")

    def flush() -> None:
        with redis_py.Redis.from_url(server.url) as r:
            r.flushall()

    try:
        failed = scan_broken_midway(gw, flush)
        assert failed.code() == grpc.StatusCode.UNAVAILABLE, failed.details()
        message = failed.details()
        assert "partition 0 of shop.orders no longer holds offsets" in message, message
        assert "scan again" in message and "\n" not in message
    finally:
        gw.stop()
        server.stop()


def test_a_table_dropped_under_a_scan_ends_it_not_found(tmp_path: Path) -> None:
    """The table is dropped (its hot logs removed) while a client holds a scan of it open:
    the scan ends NOT_FOUND, saying the table was dropped meanwhile; the gateway logs no
    ERROR and no traceback."""
    import grpc

    gw = GatewayProcess(
        tmp_path / "gw",
        {"TIDEGATE_TIERING__ENABLED": "false", "TIDEGATE_SERVER__MAX_READ_RECORDS": "1024"},
    ).start()

    def drop() -> None:
        with gw.client() as c:
            c.drop_table(TABLE)

    try:
        failed = scan_broken_midway(gw, drop)
        assert failed.code() == grpc.StatusCode.NOT_FOUND, failed.details()
        assert failed.details() == "table shop.orders was dropped while this call read it"
        assert " ERROR " not in gw.log()
    finally:
        gw.stop()


def test_a_gateway_re_seeds_above_what_another_live_gateway_acknowledged(
    tmp_path: Path,
) -> None:
    """Two gateways share a Redis that loses its data. Gateway A records the high
    watermarks it acknowledged once a second; gateway B, the first to append after the
    loss, re-seeds the partition. It must re-seed above the end of A's last batch, not at
    the last watermark A had recorded, which reused A's offsets for other keys (the fault
    run's seeds 225 and 231, and make test's seed 3: a batch A acknowledged 0.2 s before
    the loss was in no changelog, and not recorded lost). And A's lookups answer B's rows,
    not what A kept of its own batches (``get`` answered nothing for the keys B wrote)."""
    import redis as redis_py

    server = RedisServer(tmp_path / "redis")
    server.extra_args = ["--appendonly", "no"]
    server.start()
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_METADATA__URL": f"sqlite:///{tmp_path / 'metadata.db'}",
        "TIDEGATE_COLD__CATALOG__TYPE": "sql",
        "TIDEGATE_COLD__CATALOG__URI": f"sqlite:///{tmp_path / 'catalog.db'}",
        "TIDEGATE_COLD__WAREHOUSE": str(tmp_path / "warehouse"),
        "TIDEGATE_AUTH__OPERATOR_KEY": f"tgop_pair_{os.urandom(16).hex()}",
    }
    a = GatewayProcess(tmp_path / "a", env).start()
    b = GatewayProcess(tmp_path / "b", env, tenant=a.tenant, api_key=a.api_key).start()
    try:
        with a.client() as ca, b.client() as cb:
            for round_ in range(3):
                table = f"kv.t{round_}"
                ca.create_table(table, {"k": "string", "v": "string"}, partitions=1,
                                primary_key=["k"])  # fmt: skip
                ca.append(table, [{"k": f"old{i}", "v": "a"} for i in range(5)])
                ca.append(table, [{"k": f"old{i}", "v": "a"} for i in range(5, 10)])
                with redis_py.Redis.from_url(server.url) as r:
                    r.flushall()
                # Within a second of A's last batch: A has likely not recorded its end.
                at = cb.append(table, [{"k": f"new{i}", "v": "b"} for i in range(5)])
                assert at[0].base_offset >= 10, "B reused offsets A's last batch had"
                want = [{"k": f"new{i}", "v": "b"} for i in range(5)]
                for c in (ca, cb):
                    got = c.get(table, [{"k": f"new{i}"} for i in range(5)]).to_pylist()
                    assert [{"k": g["k"], "v": g["v"]} for g in got] == want, got
                    assert c.get(table, [{"k": f"old{i}"} for i in range(10)]).num_rows == 0
    finally:
        a.stop()
        b.stop()
        server.stop()


def test_get_answers_tiered_keys_from_the_state_table_while_the_hot_state_is_gone(
    tmp_path: Path,
) -> None:
    """Redis loses a key table's partition after tiering applied its changes: until the
    next append re-seeds the partition, the hot tier holds nothing at all (not a partition
    never trimmed), and ``get`` must find the keys in the state table (the fault run's
    seed 281: a key written, tiered, then Redis flushed, and ``get`` answered nothing)."""
    import redis as redis_py

    server, gw = forgetful(tmp_path)
    table = "kv.t"
    keys = [{"k": f"k{i}"} for i in range(5)]
    try:
        with gw.client() as c:
            c.create_table(table, {"k": "string", "v": "int64"}, partitions=1, primary_key=["k"])
            c.append(table, [{"k": f"k{i}", "v": i} for i in range(5)])
            tier(gw)
            with redis_py.Redis.from_url(server.url) as r:
                r.flushall()
            got = {g["k"]: g["v"] for g in c.get(table, keys).to_pylist()}
            assert got == {f"k{i}": i for i in range(5)}
            c.append(table, [{"k": "k0", "v": 100}])  # re-seeds the partition
            got = {g["k"]: g["v"] for g in c.get(table, keys).to_pylist()}
            assert got == {"k0": 100, **{f"k{i}": i for i in range(1, 5)}}
    finally:
        gw.stop()
        server.stop()


def test_a_loss_no_append_follows_is_recorded_by_describe(tmp_path: Path) -> None:
    """Redis loses a partition's state and nothing is appended to it again (the fault
    run's seed 3: a key writer's last batches, acknowledged just before a shard restarted
    empty, were in no changelog and not recorded lost, and read as if never assigned).
    ``describe``, which the read-back of a run asks first, finds the hot tier below the
    high watermark recorded, re-seeds the partition and records the range lost."""
    import redis as redis_py

    server, gw = forgetful(tmp_path)
    try:
        with gw.client() as c:
            c.create_table(TABLE, {"id": "int64", "note": "string"}, partitions=PARTITIONS)
        acked = append(gw, 0, 20)
        time.sleep(1.5)  # the gateway records what it acknowledged every second
        with redis_py.Redis.from_url(server.url) as r:
            r.flushall()
        info = {p.partition: p for p in describe(gw).partition_info}
        for p in range(PARTITIONS):
            end = max(o for o, _ in acked[p]) + 1
            assert info[p].high_watermark == end, (p, info[p])
            # Recorded lost: the offsets are passed over, never assigned again.
            assert info[p].tiered_watermark == end, (p, info[p])
        assert "were acknowledged, then lost" in gw.log()
        after = append(gw, 100, 4)
        for p in range(PARTITIONS):
            assert min(o for o, _ in after[p]) >= 10, after
    finally:
        gw.stop()
        server.stop()
