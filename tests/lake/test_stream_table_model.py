"""The stream-table model, checked by hypothesis: random interleavings of appends,
tiering runs (local runner), hot retention trims (within and past the retention), added
columns (appends after one give it a value or leave it out), stream reads and scans, on
both hot tiers. Every stream read and every scan equals a reference
model: no gap, no duplicate, no reordering, the same values, wherever the tier boundary
falls."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.lake.components import Components
from gateway.lake.tiering import tier_table, trim_hot
from gateway.server.app import build_service
from tests.services import RedisServer

PARTITIONS = 2
RETENTION_S = 60.0
#: Columns the program may add (to the first, "v").
MAX_ADDED = 3

#: A partition's rows in the model: ``{"v": ..., added column: value or None}``; a row
#: written before a column was added lacks it and reads it as null.
Model = list[list[dict[str, int | None]]]

Op = tuple[Any, ...]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, PARTITIONS - 1), st.integers(1, 7)),
        st.tuples(st.just("tier")),
        st.tuples(st.just("trim")),
        st.tuples(st.just("trim_later")),
        st.tuples(
            st.just("read"),
            st.integers(0, PARTITIONS - 1),
            st.integers(0, 40),
            st.integers(1, 9),
        ),
        st.tuples(st.just("scan")),
        st.tuples(st.just("add_column")),
    ),
    min_size=1,
    max_size=14,
)


def _settings(kind: str, data_dir: Path, redis: RedisServer) -> Settings:
    hot: dict[str, Any] = (
        {"type": "disk", "fsync": "never"}
        if kind == "disk"
        else {"type": "redis", "url": redis.url}
    )
    return Settings.explicit(
        data_dir=data_dir,
        tenant="default",
        hot=hot,
        tiering={"hot_retention_s": RETENTION_S, "enabled": False},
        server={"default_read_records": 1000},
    )


def _user(row: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    return {c: row.get(c) for c in columns}


async def _check_reads(
    svc: StreamTables, name: str, model: Model, p: int, offset: int, n: int
) -> None:
    if offset > len(model[p]):
        offset = len(model[p])
    res = await svc.read("default", "ns", name, p, offset, max_records=n)
    columns = res.schema.names[:-3]
    got = [(r["_offset"], _user(r, columns)) for b in res.batches for r in b.to_pylist()]
    want = [(o, _user(r, columns)) for o, r in enumerate(model[p])][offset : offset + n]
    assert got == want, (p, offset, n)
    # The whole partition, from 0, in as many calls as it takes.
    seen: list[tuple[int, int]] = []
    at = 0
    while at < len(model[p]):
        res = await svc.read("default", "ns", name, p, at, max_records=5)
        rows = [(r["_offset"], _user(r, columns)) for b in res.batches for r in b.to_pylist()]
        assert rows, f"empty read at {at} below HW {len(model[p])}"
        seen.extend(rows)
        at = res.next_offset
    assert seen == [(o, _user(r, columns)) for o, r in enumerate(model[p])]


async def _check_scan(svc: StreamTables, name: str, model: Model) -> None:
    result = await svc.scan("default", "ns", name)
    columns = result.schema.names[:-3]
    rows = [r for b in [b async for b in result.batches] for r in b.to_pylist()]
    got = sorted(
        ((r["_partition"], r["_offset"], _user(r, columns)) for r in rows), key=lambda t: t[:2]
    )
    assert len(got) == len(rows) == sum(len(m) for m in model)
    assert got == [
        (p, o, _user(r, columns)) for p in range(PARTITIONS) for o, r in enumerate(model[p])
    ]


def _run(kind: str, redis: RedisServer, program: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        svc = build_service(_settings(kind, Path(tmp), redis))
        assert svc.cold is not None
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        name = f"t{uuid.uuid4().hex[:10]}"
        model: Model = [[] for _ in range(PARTITIONS)]
        added: list[str] = []
        counter = 0

        async def main() -> None:
            nonlocal counter
            await svc.create_table("default", "ns", name, {"v": "int64"}, PARTITIONS)
            d = (await svc.table("default", "ns", name)).definition
            for op in program:
                if op[0] == "append":
                    _, p, n = op
                    values = list(range(counter, counter + n))
                    counter += n
                    # Odd sizes fill the added columns, even ones leave them out (rows
                    # of a producer still on the older schema): nulls.
                    given = added if n % 2 else []
                    columns = {"v": pa.array(values, pa.int64())}
                    columns.update({c: pa.array([-v for v in values]) for c in given})
                    batch = pa.record_batch(columns)
                    await svc.append("default", "ns", name, [batch], partition=p)
                    model[p].extend({"v": v, **dict.fromkeys(given, -v)} for v in values)
                elif op[0] == "add_column":
                    if len(added) < MAX_ADDED:
                        added.append(f"c{len(added)}")
                        change = {"op": "add_column", "column": added[-1], "type": "int64"}
                        await svc.alter_schema("default", "ns", name, [change])
                elif op[0] == "tier":
                    await asyncio.to_thread(tier_table, c, d, trim=False)
                elif op[0] == "trim":
                    # Within the retention: trims nothing tiered less than 60 s ago.
                    assert await asyncio.to_thread(trim_hot, c, d) == {}
                elif op[0] == "trim_later":
                    # As if the retention had passed since every commit so far.
                    later = time.time() + RETENTION_S + 1
                    await asyncio.to_thread(trim_hot, c, d, now=later)
                elif op[0] == "read":
                    await _check_reads(svc, name, model, op[1], op[2], op[3])
                else:
                    await _check_scan(svc, name, model)
            # Finally, every partition and the whole table once more.
            for p in range(PARTITIONS):
                await _check_reads(svc, name, model, p, 0, 1000)
            await _check_scan(svc, name, model)

        try:
            asyncio.run(main())
        finally:
            svc.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disk", "redis"])
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(program=ops)
def test_stream_table_matches_model(
    kind: str, redis_server: RedisServer, program: list[Op]
) -> None:
    _run(kind, redis_server, program)
