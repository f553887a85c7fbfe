"""What the SDK reads of the lake itself (issue 43): stream reads below the tiered
watermark read from the files by the client, stitched with the gateway's read of the rest;
reads through a plan's file links metered as the tenant's reads, the way the gateway's own
scan is.

Real gateway processes on both hot tiers (disk, Redis) over a local warehouse, whose plans
give their files as links through the gateway (``/v1/files/<token>``), tiering on their own
schedule every 0.3 s while the tests append and read.
"""

from __future__ import annotations

import json
import re
import resource
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow as pa
import pytest

from gateway.wire.errors import Unavailable
from tests.integration.conftest import gateway_env
from tests.integration.flavours import LoopThread, synced_client
from tests.integration.test_cli import tidegate
from tests.integration.test_lake_scans import (
    BATCH,
    SCHEMA,
    Appender,
    _row,
    _tiering_env,
    _wait_tiered,
    unlinked,
)
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration
__all__ = ["unlinked"]  # a fixture of test_lake_scans, used here too


@pytest.fixture(scope="module", params=["disk", "redis"])
def gw(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp(f"reads-{request.param}")
    env = {**gateway_env(request.param, redis_server), **_tiering_env()}
    gateway = GatewayProcess(tmp, env).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def _tenant(gw: GatewayProcess) -> tuple[str, str]:
    tenant = f"rd{uuid.uuid4().hex[:8]}"
    with gw.admin() as admin:
        admin.create_tenant(tenant)
        return tenant, admin.issue_key(tenant)[1]


def _usage(gw: GatewayProcess, tenant: str) -> dict[str, int]:
    with gw.admin() as admin:
        rows = admin.usage(tenant)
    return {k: sum(r[k] for r in rows) for k in ("read_records", "read_bytes", "throttled")}


def _link_metrics(gw: GatewayProcess) -> dict[str, float]:
    text = httpx.get(f"{gw.http_url}/metrics", timeout=10).text

    def one(name: str) -> float:
        found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    return {
        "bytes": one("tidegate_file_link_bytes_total"),
        "records": one("tidegate_file_link_records_total"),
        "read_records": one("tidegate_read_records_total"),
    }


def _filled(gw: GatewayProcess, key: str, records: int) -> str:
    """A table of ``records`` rows, tiered, then a hot tail of ``BATCH`` more."""
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with gw.client(api_key=key) as c:
        c.create_table(table, SCHEMA, partitions=3)
        for start in range(0, records, BATCH):
            c.append(table, [_row(v) for v in range(start, start + BATCH)])
        _wait_tiered(c, table, records)
        c.append(table, [_row(v) for v in range(records, records + BATCH)])
    return table


def _settled_metrics(gw: GatewayProcess) -> dict[str, float]:
    """:func:`_link_metrics` once they stopped moving (0.3 s apart, within 10 s): a read
    that ended is counted when its last answer went out, which may be a moment after the
    client stopped reading (a consumer's read ahead)."""
    last, deadline = _link_metrics(gw), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = _link_metrics(gw)
        if now == last:
            break
        last = now
    return last


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: after[k] - before[k] for k in before}


def test_scans_through_file_links_are_metered_as_the_gateways_scan(gw: GatewayProcess) -> None:
    tenant, key = _tenant(gw)
    table = _filled(gw, key, 600)
    total = 600 + BATCH
    with gw.client(api_key=key) as c:
        base = _usage(gw, tenant)
        assert c.scan(table, mode="server").num_rows == total
        server = _delta(base, _usage(gw, tenant))
        assert server["read_records"] == total and server["read_bytes"] > 0

        # The same scan read by the client through the plan's links: the files' rows are
        # metered when their footers are served, the hot rows as the gateway sends them.
        base, links = _usage(gw, tenant), _link_metrics(gw)
        assert c.plan_read(table).files, "nothing tiered: no link would be read"
        assert c.scan(table, mode="client").num_rows == total
        client = _delta(base, _usage(gw, tenant))
        served = _delta(links, _link_metrics(gw))
        assert client["read_records"] == server["read_records"], (client, server)
        assert served["records"] > 0 and served["bytes"] > 0, served
        assert served["records"] + served["read_records"] == total, served
        # Every byte a link served is charged, with the hot rows' bytes on top (tiering
        # may have moved them all to the files by now).
        assert client["read_bytes"] >= served["bytes"], (client, served)
        assert (client["read_bytes"] > served["bytes"]) == (served["read_records"] > 0)

        # Batch by batch (the dataset reader, a filter): each file's rows once.
        base, links = _usage(gw, tenant), _link_metrics(gw)
        streamed = sum(b.num_rows for b in c.scan_batches(table, mode="client", filter="v >= 0"))
        assert streamed == total
        assert _delta(base, _usage(gw, tenant))["read_records"] == total

    # A client that reads the warehouse folder itself passes nothing through the
    # gateway: only the hot rows it fetched are metered.
    folder = str(gw.data_dir / "warehouse")
    with gw.client(api_key=key, warehouse=folder) as c:
        base, links = _usage(gw, tenant), _link_metrics(gw)
        assert c.scan(table, mode="client").num_rows == total
        local = _delta(base, _usage(gw, tenant))
        served = _delta(links, _link_metrics(gw))
        assert served["bytes"] == 0 and served["records"] == 0, served
        assert local["read_records"] == served["read_records"] < total, (local, served)


def test_reads_through_file_links_wait_out_the_read_quota(gw: GatewayProcess) -> None:
    """Links charge the tenant's read bucket: over its quota they answer 429 with a
    Retry-After, which the SDK waits out, and the scan still answers every row."""
    tenant, key = _tenant(gw)
    table = _filled(gw, key, 600)
    with gw.client(api_key=key) as c:
        plan = c.plan_read(table)
        size = sum(f.file_size_bytes for f in plan.files)
        with gw.admin() as admin:
            admin.set_quota(tenant, read_bytes_per_s=max(1, size // 2))
        first = httpx.get(plan.files[0].url, timeout=10)
        assert first.status_code == 200
        for f in list(plan.files) * 3:  # drain the bucket: it goes into debt (~5 s of it)
            httpx.get(f.url, timeout=10)
        # A link's bytes are charged once sent: the next request may come before that.
        deadline = time.monotonic() + 3
        while (refused := httpx.get(plan.files[0].url, timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, "the links never ran into the read quota"
            time.sleep(0.05)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["reason"] == "THROTTLED"
        # A hot tail too: its range is read through the gateway, charged to the same
        # bucket, and waited out alike.
        c.append(table, [_row(v) for v in range(600 + BATCH, 600 + 2 * BATCH)])
        got = c.scan(table, mode="client")
        assert got.num_rows == 600 + 2 * BATCH
        assert sorted(got.column("v").to_pylist()) == list(range(600 + 2 * BATCH))
    assert _usage(gw, tenant)["throttled"] >= 1


# Cold stream reads ---------------------------------------------------------------------
def _partition_marks(c: Any, table: str, p: int) -> tuple[int, int]:
    """(tiered watermark, high watermark) of partition ``p``."""
    info = c.describe_table(table).partition_info[p]
    return info.tiered_watermark, info.high_watermark


def _dense(t: pa.Table, start: int, count: int) -> None:
    """``t`` is records ``start..start+count-1`` of one partition, each as appended."""
    assert t.num_rows == count, (t.num_rows, count)
    assert t.column("_offset").to_pylist() == list(range(start, start + count))
    for r in t.to_pylist():
        assert {k: r[k] for k in SCHEMA} == _row(r["v"]), r


def test_a_link_the_gateway_cannot_open_its_file_for_is_refused_before_any_byte(
    gw: GatewayProcess,
) -> None:
    """A link served while the gateway has no file descriptor free is answered 503 with
    ``Retry-After`` and one sentence, before any byte (it sent 206 and its length, then
    failed to open the file: the fault run's scanners died of ``IncompleteRead``, and the
    log held a traceback); once descriptors are free again it is served."""
    _, key = _tenant(gw)
    table = _filled(gw, key, 200)
    with gw.client(api_key=key) as c:
        url = c.plan_read(table).files[0].url
    assert gw.proc is not None
    pid, head = gw.proc.pid, {"Range": "bytes=0-3"}
    with httpx.Client(timeout=10) as http:
        assert http.get(url, headers=head).status_code == 206  # the connection is open
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # No new descriptor at all (the open ones stay): an open fails whatever the
        # gateway's other threads opened or closed meanwhile.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (0, hard))
        try:
            refused = http.get(url, headers=head)
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("retry-after") == "1"
        assert "no file descriptor free to serve this file link" in refused.text
        assert http.get(url, headers=head).status_code == 206


@pytest.fixture(params=["sync-links", "aio-folder"])
def reader(request: pytest.FixtureRequest, gw: GatewayProcess) -> Iterator[Any]:
    """The sync client reads the files through the gateway's links; the asyncio one from
    the warehouse folder (so both ways run on both hot tiers)."""
    if request.param == "sync-links":
        with gw.client() as c:
            yield c
        return
    folder = str(gw.data_dir / "warehouse")
    lt = LoopThread()
    try:
        with synced_client(lambda: gw.async_client(warehouse=folder), lt) as c:
            yield c
    finally:
        lt.close()


def test_cold_reads_read_the_files_and_equal_the_gateways_read(
    gw: GatewayProcess, reader: Any
) -> None:
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    reader.create_table(table, SCHEMA, partitions=2)
    reads: list[tuple[int, int, int, pa.Table]] = []
    with Appender(gw, table):
        deadline = time.monotonic() + 60
        while _partition_marks(reader, table, 0)[0] < 300:
            assert time.monotonic() < deadline, "tiering never ran under the reads"
            time.sleep(0.1)
        # Reads across the tiered watermark while records are appended and tiered: the
        # records below it come from the files, the gateway serves only the rest.
        for i in range(6):
            tiered, high = _partition_marks(reader, table, 0)
            start = (i * 97) % (tiered - 50)
            count = tiered - start + 30  # past T(p): the stitch is in every read
            seen = _link_metrics(gw)
            got = reader.read(table, partition=0, offset=start, max_records=count, mode="client")
            served = _delta(seen, _link_metrics(gw))
            assert min(count, high - start) <= got.num_rows <= count, (got.num_rows, high)
            _dense(got, start, got.num_rows)
            # Records below T(p) as it was before the read never went through the data plane.
            assert served["read_records"] <= got.num_rows - (tiered - start), (served, tiered)
            reads.append((0, start, count, got))
        # Pages from the start, each on from where the last ended: no gap, no repeat.
        pages, offset = [], 0
        while offset < 400:
            page = reader.read(table, partition=1, offset=offset, max_records=70)
            assert page.num_rows > 0
            pages.append(page)
            offset = page.column("_offset")[-1].as_py() + 1
        _dense(pa.concat_tables(pages), 0, offset)
        reads.append((1, 0, offset, pa.concat_tables(pages)))

    # The same records as the gateway's own read, once appends stopped.
    for p, start, count, got in reads:
        theirs = reader.read(table, partition=p, offset=start, max_records=count, mode="server")
        assert got.schema == theirs.schema
        assert got.to_pylist() == theirs.to_pylist()[: got.num_rows]
    # A byte cap stops the read early, at one record at least.
    capped = reader.read(table, partition=0, offset=0, max_records=200, max_bytes=1)
    _dense(capped, 0, 1)
    hot_tail = reader.read(table, partition=0, offset=_partition_marks(reader, table, 0)[1])
    assert hot_tail.num_rows == 0


def test_cold_reads_fall_back_to_the_gateway_where_the_files_cannot_be_reached(
    unlinked: GatewayProcess,
) -> None:
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with unlinked.client() as c:
        c.create_table(table, SCHEMA, partitions=1)
        for start in range(0, 200, BATCH):
            c.append(table, [_row(v) for v in range(start, start + BATCH)])
        _wait_tiered(c, table, 200)
        seen = _link_metrics(unlinked)
        auto = c.read(table, partition=0, offset=10, max_records=150)
        assert _delta(seen, _link_metrics(unlinked))["read_records"] == 150  # the gateway's
        _dense(auto, 10, 150)
        with pytest.raises(Unavailable, match="read with mode='server'") as err:
            c.read(table, partition=0, offset=10, max_records=150, mode="client")
        assert table in str(err.value)
        # Reads of the hot tail need no file: client mode reads them through the gateway.
        c.append(table, [_row(v) for v in range(200, 210)])
        _dense(c.read(table, partition=0, offset=205, mode="client"), 205, 5)
        # A consumer asked to read the files itself does, where it can.
        with unlinked.client(warehouse=str(unlinked.data_dir / "warehouse")) as local:
            seen = _link_metrics(unlinked)
            with local.consumer(table, follow=False, mode="client") as consumer:
                rows = pa.Table.from_batches(list(consumer.batches()))
            _dense(rows.sort_by("_offset"), 0, rows.num_rows)
            assert rows.num_rows >= 210
            served = _delta(seen, _link_metrics(unlinked))["read_records"]
            assert served <= rows.num_rows - 200, served

    # The command line's read is the SDK's: the files themselves where given the folder.
    def cli_offsets(*args: str) -> list[int]:
        out = tidegate(unlinked, "read", table, "--max-records", "150", *args)
        return [json.loads(line)["_offset"] for line in out.stdout.splitlines()]

    folder = str(unlinked.data_dir / "warehouse")
    # Every record tiered, the last ten too: a command's consumer reads ahead of the 150
    # records it prints, and would read a hot tail through the gateway.
    with unlinked.client() as c:
        _wait_tiered(c, table, 210)
    seen = _settled_metrics(unlinked)
    assert cli_offsets("--mode", "client", "--warehouse", folder) == list(range(150))
    assert _delta(seen, _link_metrics(unlinked))["read_records"] == 0
    seen = _link_metrics(unlinked)
    assert cli_offsets() == list(range(150))  # auto: the links are out of reach
    assert _delta(seen, _link_metrics(unlinked))["read_records"] >= 150
    refused = tidegate(unlinked, "read", table, "--mode", "client", ok=False)
    assert refused.returncode != 0 and "mode='server'" in refused.stderr, refused.stderr
    # Files out of this host's reach are no outage: refused at once, never waited out.
    assert "reconnecting" not in refused.stderr, refused.stderr


def test_cold_reads_of_nested_columns_and_a_widened_schema_equal_the_gateways(
    gw: GatewayProcess,
) -> None:
    """Nested columns put several Parquet leaves before ``_offset``; a column added after
    the files were written reads as nulls from them, a widened one in its new type."""
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with gw.client() as c:
        c.create_table(
            table, {"l": "list<int32>", "st": "struct<a: int64, b: string>", "w": "int32"}
        )
        rows = [{"l": [v, v + 1], "st": {"a": v, "b": f"b{v}"}, "w": v} for v in range(300)]
        c.append(table, rows)
        _wait_tiered(c, table, 300)
        c.alter_schema(
            table,
            [
                {"op": "add_column", "column": "note", "type": "string"},
                {"op": "update_type", "column": "w", "type": "int64"},
            ],
        )
        c.append(table, [{"l": [], "st": None, "w": 1, "note": "n"}] * 5)
        for start, count in ((0, 300), (120, 200), (299, 6)):
            mine = c.read(table, partition=0, offset=start, max_records=count, mode="client")
            theirs = c.read(table, partition=0, offset=start, max_records=count, mode="server")
            assert mine.schema == theirs.schema
            assert mine.to_pylist() == theirs.to_pylist()
            assert mine.num_rows == min(count, 305 - start)
