"""Tiering: records land in Iceberg exactly once with dense offsets, watermarks in the
snapshot summary, on both hot tiers and with both runners."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Any

import pyarrow.parquet as pq
import pytest

from gateway.cold import fs_path
from gateway.cold.iceberg import IcebergColdStore
from gateway.config import Settings
from gateway.hot import PartitionId
from gateway.lake.runners import LocalRunner
from gateway.lake.scheduler import PARALLEL_TENANTS, embedded_parallel_tenants, run_once
from gateway.lake.tasks import RangeTask, write_range
from gateway.lake.tiering import each_table, tier_all, tier_table, trim_hot
from gateway.wire.codec import Compression, encode_stream
from gateway.wire.errors import CommitConflict
from gateway.wire.jsonrows import rows_to_batch
from gateway.wire.retry import ExponentialBackoff, Retry
from gateway.wire.schema import parse_fields
from tests.lake.conftest import FIELDS, Harness, tier_settings


def _rows(start: int, n: int) -> list[dict[str, Any]]:
    return [{"k": f"k{i}", "n": i} for i in range(start, start + n)]


def test_local_runner_tiers_each_record_once(harness: Harness) -> None:
    d = harness.create_table(partitions=2)
    harness.append(d, 0, _rows(0, 5))
    harness.append(d, 0, _rows(5, 3))
    harness.append(d, 1, _rows(100, 4))
    result = tier_table(harness.c, d, runner=LocalRunner(harness.c), trim=False)
    assert result.moved == {0: (0, 8), 1: (0, 4)}
    assert harness.watermarks(d) == {0: 8, 1: 4}
    rows = harness.cold_rows(d)
    assert [(r["_partition"], r["_offset"]) for r in rows] == [
        *((0, i) for i in range(8)),
        *((1, i) for i in range(4)),
    ]
    assert [r["n"] for r in rows] == [*range(8), *range(100, 104)]
    # Nothing new: no commit, no change.
    again = tier_table(harness.c, d, trim=False)
    assert again.moved == {}
    harness.append(d, 1, _rows(104, 2))
    third = tier_table(harness.c, d, trim=False)
    assert third.moved == {1: (4, 6)}
    assert [(r["_partition"], r["_offset"]) for r in harness.cold_rows(d)][-3:] == [
        (1, 3),
        (1, 4),
        (1, 5),
    ]
    assert harness.c.meta.partitions(d.table_id)[1].tiered_watermark == 6


def test_target_file_size_rolls_files(harness: Harness) -> None:
    settings = harness.settings.model_copy(
        update={"tiering": harness.settings.tiering.model_copy(update={"target_file_bytes": 1024})}
    )
    harness.c.settings = settings
    d = harness.create_table(partitions=1)
    for i in range(10):
        harness.append(d, 0, _rows(i * 50, 50))
    result = tier_table(harness.c, d, trim=False)
    assert result.files > 1
    files = harness.c.cold.table(d).files(harness.c.cold.table(d).snapshot(), 0, 0, 500)
    assert [(f.min_offset, f.max_offset) for f in files] == sorted(
        (f.min_offset, f.max_offset) for f in files
    )
    assert sum(f.record_count for f in files) == 500
    assert [r["_offset"] for r in harness.cold_rows(d)] == list(range(500))


def test_concurrent_runs_tier_each_record_once(harness: Harness) -> None:
    d = harness.create_table(partitions=3)
    for p in range(3):
        for j in range(4):
            harness.append(d, p, _rows(j * 10, 10))
    retry = Retry(ExponentialBackoff(base=0.01, cap=0.1), attempts=19, timeout=None)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            tier_table(harness.c, d, retry=retry, trim=False)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    rows = harness.cold_rows(d)
    assert [(r["_partition"], r["_offset"]) for r in rows] == [
        (p, o) for p in range(3) for o in range(40)
    ]
    assert harness.watermarks(d) == {0: 40, 1: 40, 2: 40}


def test_conflict_retried_from_the_new_snapshot(harness: Harness) -> None:
    d = harness.create_table(partitions=1)
    harness.append(d, 0, _rows(0, 5))
    cold = harness.c.cold.table(d)
    real_commit = cold.commit_tiered
    calls: list[int] = []

    class Racing:
        """The runner of a racing job: another run commits while this one writes."""

        def write(self, tenant: str, tasks: Any) -> Any:
            if not calls:
                calls.append(1)
                tier_table(harness.c, d, trim=False)
                harness.append(d, 0, _rows(5, 2))
            return LocalRunner(harness.c).write(tenant, tasks)

    result = tier_table(harness.c, d, runner=Racing(), trim=False)
    assert result.conflicts == 1
    assert result.moved == {0: (5, 7)}
    assert [r["_offset"] for r in harness.cold_rows(d)] == list(range(7))
    assert cold.commit_tiered == real_commit


def test_conflicts_are_bounded(harness: Harness) -> None:
    d = harness.create_table(partitions=1)
    harness.append(d, 0, _rows(0, 1))

    class AlwaysRacing:
        def write(self, tenant: str, tasks: Any) -> Any:
            files = LocalRunner(harness.c).write(tenant, tasks)
            tier_table(harness.c, d, trim=False)
            harness.append(d, 0, _rows(0, 1))
            return files

    with pytest.raises(CommitConflict):
        tier_table(
            harness.c,
            d,
            runner=AlwaysRacing(),
            retry=Retry(ExponentialBackoff(base=0.001), attempts=2, timeout=None),
            trim=False,
        )
    offsets = [r["_offset"] for r in harness.cold_rows(d)]
    assert offsets == list(range(len(offsets)))


def test_failing_table_does_not_stop_other_tenants(harness: Harness) -> None:
    good = [harness.create_table(partitions=2) for _ in range(2)]
    bad = harness.create_table(partitions=2)
    for d in [*good, bad]:
        harness.append(d, 0, _rows(0, 3))
        harness.append(d, 1, _rows(0, 3))
    # Poison: the Iceberg table of a table made long ago, and tiered into, is dropped from
    # the catalog behind the gateway's back. It is not made again, empty, at its next use:
    # that would say nothing was ever tiered.
    assert tier_all(harness.c, tables=[bad], trim=False).failures == {}
    harness.append(bad, 0, _rows(3, 2))
    cold = harness.c.cold
    assert isinstance(cold, IcebergColdStore)
    cold.catalog.drop_table((bad.tenant, bad.namespace, bad.name))
    bad = dataclasses.replace(bad, created_at=bad.created_at - dt.timedelta(hours=1))
    report = tier_all(harness.c, tables=[bad, *good], trim=False)
    assert list(report.failures) == [f"{bad.tenant}/{bad.qualified_name}"]
    for d in good:
        assert harness.watermarks(d) == {0: 3, 1: 3}


def test_a_table_gets_its_iceberg_table_at_its_first_tiering(harness: Harness) -> None:
    """A stream-table is created with no Iceberg table (a create stays cheap): its first
    tiering makes it and commits in the same pass, beside tables tiered before."""
    good = harness.create_table(partitions=1)
    harness.append(good, 0, _rows(0, 3))
    new = harness.c.meta.create_table(good.tenant, "ns", "new", list(FIELDS), 1)
    harness.append(new, 0, _rows(0, 2))
    cold = harness.c.cold
    assert isinstance(cold, IcebergColdStore)
    assert not cold.catalog.table_exists((new.tenant, new.namespace, new.name))
    report = tier_all(harness.c, tables=[new, good], trim=False)
    assert report.failures == {}
    assert harness.watermarks(new) == {0: 2}
    assert harness.watermarks(good) == {0: 3}
    assert [r["_offset"] for r in harness.cold_rows(new)] == [0, 1]


def test_a_table_dropped_during_a_pass_is_skipped_quietly(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Every lake job listed a table (an old one: not a create in flight) that is dropped
    before the job gets to it, its metadata row and Iceberg table gone and its hot log not
    yet: the Iceberg table "does not exist" is the race with the drop, one INFO line, no
    ERROR, no traceback, no failure; the other tables are done."""
    from gateway.lake.compaction import compact_all
    from gateway.lake.expiry import clean_all, expire_all
    from gateway.lake.retention import retain_all

    good, gone = harness.create_table(partitions=1), harness.create_table(partitions=1)
    for d in (good, gone):
        harness.append(d, 0, _rows(0, 3))
    tier_all(harness.c, tables=[good, gone], trim=False)
    harness.append(gone, 0, _rows(3, 2))
    harness.c.meta.drop_table(gone.tenant, gone.namespace, gone.name)
    harness.c.cold.drop_table(gone)
    harness.append(good, 0, _rows(3, 2))
    listed = dataclasses.replace(gone, created_at=gone.created_at - dt.timedelta(hours=1))
    caplog.set_level("INFO", logger="tidegate")
    for job in (tier_all, compact_all, expire_all, clean_all, retain_all):
        report = job(harness.c, tables=[listed, good])
        assert report.failures == {}, (job.__name__, report.failures)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert any("was dropped while the pass ran" in r.getMessage() for r in caplog.records)
    assert harness.watermarks(good) == {0: 5}


def test_hot_retention_trims_only_below_the_tiered_watermark(harness: Harness) -> None:
    d = harness.create_table(partitions=1)
    for j in range(4):
        harness.append(d, 0, _rows(j * 5, 5))
    # A long retention: tiered, but nothing trimmed yet.
    settings = harness.c.settings
    harness.c.settings = settings.model_copy(
        update={"tiering": settings.tiering.model_copy(update={"hot_retention_s": 3600})}
    )
    tier_table(harness.c, d)
    assert harness.c.hot.offsets(PartitionId(d.tenant, d.table_id, 0)).low == 0
    harness.append(d, 0, _rows(20, 5))
    # An hour later the watermark of the first commit (20) has been held long enough;
    # the records appended after it (20..24) are not tiered and stay.
    trimmed = trim_hot(harness.c, d, now=time.time() + 3601)
    assert trimmed == {0: 20} or (0 in trimmed and trimmed[0] <= 20)
    o = harness.c.hot.offsets(PartitionId(d.tenant, d.table_id, 0))
    assert o.low <= 20 and o.high == 25
    # Never above T(p), even with no retention at all.
    harness.c.settings = settings
    trim_hot(harness.c, d)
    assert harness.c.hot.offsets(PartitionId(d.tenant, d.table_id, 0)).low <= 20
    assert harness.watermarks(d) == {0: 20}


def test_retry_is_data() -> None:
    # Four attempts in all: three retries.
    retry = Retry(ExponentialBackoff(base=0.1, cap=0.3, jitter=False), attempts=3)
    assert retry.delays() == [0.1, 0.2, 0.3]
    assert all(0 <= ExponentialBackoff(base=1).compute(i + 1) <= 1 * 2**i for i in range(3))


def test_embedded_local_jobs_take_one_tenant_at_a_time(tmp_path: Any) -> None:
    """The embedded schedule's local runner works on one tenant at a time (its driver
    threads share the interpreter lock with the gateway's requests); Spark keeps four."""
    local = tier_settings("disk", tmp_path, None)
    assert embedded_parallel_tenants(local) == 1
    spark = Settings.explicit(**{**local.model_dump(), "tiering": {"runner": "spark"}})
    assert embedded_parallel_tenants(spark) == PARALLEL_TENANTS
    chosen = Settings.explicit(
        **{**local.model_dump(), "tiering": {"embedded_parallel_tenants": 3}}
    )
    assert embedded_parallel_tenants(chosen) == 3

    h = Harness(local)
    try:
        defs = [h.create_table(partitions=1) for _ in range(3)]
        for d in defs:
            h.append(d, 0, _rows(0, 5))
        running = most = 0
        lock = threading.Lock()

        def one(d: Any) -> str:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.05)  # long enough for another tenant's thread to overlap
            with lock:
                running -= 1
            return str(d.tenant)

        report = each_table(h.c, one, job="test", tables=defs, max_parallel_tenants=1)
        assert sorted(report.tables) == sorted(d.tenant for d in defs)
        assert most == 1
        # The same with three at once: all three tenants meet (or the barrier breaks).
        met = threading.Barrier(3, timeout=30)
        report = each_table(
            h.c, lambda d: met.wait(), job="test", tables=defs, max_parallel_tenants=3
        )
        assert not report.failures

        report = run_once(h.c, LocalRunner(h.c), "tier", tenants=1)
        assert not report.failures
        assert all(h.watermarks(d) == {0: 5} for d in defs)
    finally:
        h.close()


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_payloads_of_several_record_batches_in_any_compression(
    harness: Harness, compression: Compression
) -> None:
    """Hot payloads as a client may send them: several record batches, compressed or not.
    A pass moves each record once, with the offset and timestamp of its payload; a range
    cut inside payloads and inside record batches writes exactly that range."""
    d = harness.create_table(partitions=1)
    schema = parse_fields(d.fields, stored=True)
    part = PartitionId(d.tenant, d.table_id, 0)
    stamps = []
    for j in range(3):  # 10 records per payload, in record batches of 4, 4 and 2
        rows = _rows(j * 10, 10)
        batches = [rows_to_batch(rows[i : i + 4], schema) for i in range(0, 10, 4)]
        stamps.append(1_700_000_000_000_000 + j)
        harness.c.hot.append(part, encode_stream(batches, schema, compression), 10, stamps[-1])
    cold = harness.c.cold.table(d)
    task = RangeTask(
        tenant=d.tenant,
        table_id=d.table_id,
        table=d.qualified_name,
        partition=0,
        start=5,
        end=23,
        fields=tuple(d.fields),
        location=cold.data_location(0),
        storage=harness.c.cold.storage_options(),
        file_schema=cold.file_schema(),
        target_file_bytes=1 << 30,
        run_id="test",
    )
    [f] = write_range(task, harness.c.hot)
    assert (f.partition, f.record_count, f.min_offset, f.max_offset) == (0, 18, 5, 22)
    filesystem, _ = harness.c.cold.storage_options().filesystem()
    got = pq.read_table(fs_path(f.path), filesystem=filesystem)
    assert got.column("_offset").to_pylist() == list(range(5, 23))
    assert got.column("n").to_pylist() == list(range(5, 23))
    assert [t.timestamp() * 1e6 for t in got.column("_timestamp").to_pylist()] == [
        stamps[o // 10] for o in range(5, 23)
    ]

    result = tier_table(harness.c, d, trim=False)
    assert result.moved == {0: (0, 30)}
    rows = harness.cold_rows(d)
    assert [(r["_offset"], r["n"], r["k"]) for r in rows] == [(i, i, f"k{i}") for i in range(30)]
    assert [int(r["_timestamp"].timestamp() * 1e6) for r in rows] == [
        stamps[o // 10] for o in range(30)
    ]
