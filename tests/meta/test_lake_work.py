"""Issue 30.1: the lake work rows, on SQLite and PostgreSQL: marks only widen the work,
clears are conditional, so a mark racing a job is never lost."""

from __future__ import annotations

import datetime as dt

from gateway.meta import MetadataStore
from gateway.meta.work import TABLE_LEVEL, Mark
from tests.meta.test_metadata import db_url, open_store, scratch_postgres, store  # noqa: F401

FIELDS = [{"name": "k", "type": "string"}]


def _at(seconds: float) -> dt.datetime:
    return dt.datetime(2026, 11, 25, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)


def test_marks_widen_and_tiering_clears_only_what_it_covered(
    store: MetadataStore,  # noqa: F811 - the fixture
) -> None:
    a = store.create_table("acme", "ns", "a", FIELDS, 2)
    b = store.create_table("acme", "ns", "b", FIELDS, 2)
    assert store.due_tables(["tier"]) == []
    store.record_appends({a.table_id: {0: (5, _at(10)), 1: (3, _at(20))}})
    store.record_appends({a.table_id: {0: (9, _at(30))}})  # later: same row, wider
    assert [d.name for d in store.due_tables(["tier"], now=_at(15))] == ["a"]
    assert store.due_tables(["tier"], now=_at(5)) == []
    assert {p.partition: p.high_watermark for p in store.partitions(a.table_id)} == {0: 9, 1: 3}
    # A run that tiered partition 0 to 5 (an append to 9 came meanwhile) and 1 to 3.
    store.finish_tiering(a.table_id, {0: 5, 1: 3}, _at(40))
    [(_, _, p, _)] = store.marked_partitions()
    assert p == 0
    store.finish_tiering(a.table_id, {0: 9, 1: 3}, _at(50))
    assert store.due_tables(["tier"]) == [] and store.marked_partitions() == []
    # A sweep marks every table once; a run clears its own table's mark.
    assert store.mark_all_tables("tier") == 2
    assert [d.name for d in store.due_tables(["tier"])] == ["a", "b"]
    store.finish_tiering(b.table_id, {0: 0, 1: 0}, dt.datetime.now(dt.UTC))
    assert [d.name for d in store.due_tables(["tier"])] == ["a"]
    # Marks of a dropped table are ignored; its rows go with it.
    store.drop_table("acme", "ns", "a")
    store.record_appends({a.table_id: {0: (1, _at(60))}})
    assert store.due_tables(["tier"]) == []


def test_table_work_comes_due_and_stays_for_a_later_mark(
    store: MetadataStore,  # noqa: F811 - the fixture
) -> None:
    d = store.create_table("acme", "ns", "t", FIELDS, 1)
    now = dt.datetime.now(dt.UTC)
    store.mark_work([Mark(d.table_id, TABLE_LEVEL, "expire", since=now, due_at=now)])
    assert [t.name for t in store.due_tables(["expire"])] == ["t"]
    assert store.due_tables(["compact"]) == []
    # Done for every mark before the run: the row goes.
    store.finish_work(d.table_id, "expire", now + dt.timedelta(seconds=1), 60)
    assert store.due_tables(["expire"]) == []
    # A mark after the run's horizon stays, due window_s after that mark.
    store.mark_work([Mark(d.table_id, TABLE_LEVEL, "expire", since=now, due_at=now)])
    store.finish_work(d.table_id, "expire", now - dt.timedelta(seconds=10), 60)
    assert store.due_tables(["expire"]) == []
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=61)
    assert [t.name for t in store.due_tables(["expire"], now=later)] == ["t"]
    assert store.pending_work() == {"expire": 1}
