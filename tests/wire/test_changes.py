"""Primary-key tables' pure core (gateway.wire.changes) against a model: a dict replaying
generated upserts and deletes over a few keys, one write at a time, under each merge
engine. The current state of the writes, a snapshot of the state at any point merged with
the writes after it, and the changelog those writes make replayed on that snapshot all
equal the model (issue 42)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.changes import (
    CHANGE_COLUMN,
    Change,
    FirstRow,
    LastRow,
    MergeEngine,
    PartialUpdate,
    PrimaryKey,
    Versioned,
    changelog,
    check_primary_key,
    current_rows,
    delete_rows,
    engine_from_json,
    engine_to_json,
    merge_snapshot,
)
from gateway.wire.errors import InvalidSchema, SchemaMismatch

SCHEMA = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        pa.field("r", pa.string(), nullable=False),
        pa.field("a", pa.int64()),
        pa.field("b", pa.string()),
        pa.field("ver", pa.int64()),
    ]
)
WRITES = pa.schema(
    [*(f.with_nullable(True) for f in SCHEMA), pa.field(CHANGE_COLUMN, pa.int8(), False)]
)
KEY = ("k", "r")
ENGINES: list[MergeEngine] = [LastRow(), FirstRow(), Versioned("ver"), PartialUpdate()]

Key = tuple[int, str]
Row = dict[str, Any]


@dataclass(frozen=True)
class Write:
    delete: bool
    row: Row

    @property
    def key(self) -> Key:
        return (self.row["k"], self.row["r"])


@st.composite
def writes(draw: st.DrawFn) -> list[Write]:
    keys = draw(st.integers(1, 6))
    out = []
    for _ in range(draw(st.integers(0, 60))):
        row = {
            "k": draw(st.integers(0, keys - 1)),
            "r": draw(st.sampled_from(["x", "y"])),
            "a": draw(st.none() | st.integers(-3, 3)),
            "b": draw(st.none() | st.sampled_from(["", "p", "q"])),
            "ver": draw(st.integers(0, 4)),
        }
        out.append(Write(draw(st.integers(0, 4)) == 0, row))
    return out


def apply(state: dict[Key, Row], w: Write, engine: MergeEngine) -> None:
    """One write, as each engine defines it."""
    old = state.get(w.key)
    if w.delete:
        state.pop(w.key, None)
    elif old is None or isinstance(engine, LastRow):
        state[w.key] = dict(w.row)
    elif isinstance(engine, Versioned):
        if w.row["ver"] >= old["ver"]:
            state[w.key] = dict(w.row)
    elif isinstance(engine, PartialUpdate):
        state[w.key] = {c: old[c] if v is None else v for c, v in w.row.items()}


def model(ws: list[Write], engine: MergeEngine, state: dict[Key, Row] | None = None) -> dict:
    state = dict(state or {})
    for w in ws:
        apply(state, w, engine)
    return state


def table_of(ws: list[Write]) -> pa.Table:
    rows = []
    for w in ws:
        row = {**w.row, CHANGE_COLUMN: int(Change.DELETE if w.delete else Change.UPDATE_AFTER)}
        if w.delete:
            row.update(a=None, b=None, ver=None)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=WRITES)


def state_table(state: dict[Key, Row]) -> pa.Table:
    return pa.Table.from_pylist(list(state.values()), schema=SCHEMA)


def by_key(rows: pa.Table) -> dict[Key, Row]:
    found = rows.to_pylist()
    out = {(r["k"], r["r"]): r for r in found}
    assert len(out) == len(found), "two rows of one key"
    return out


@settings(max_examples=40, deadline=None)
@given(ws=writes(), engine=st.sampled_from(ENGINES))
def test_current_rows_equal_the_model(ws: list[Write], engine: MergeEngine) -> None:
    got = current_rows(table_of(ws), PrimaryKey(KEY, engine))
    assert CHANGE_COLUMN not in got.column_names
    assert by_key(got) == model(ws, engine)


@settings(max_examples=40, deadline=None)
@given(ws=writes(), engine=st.sampled_from(ENGINES), data=st.data())
def test_a_snapshot_merged_with_the_changes_above_it_equals_the_model(
    ws: list[Write], engine: MergeEngine, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(ws)), label="cut")
    pk = PrimaryKey(KEY, engine)
    before = model(ws[:cut], engine)
    snapshot = state_table(before)
    merged = merge_snapshot(snapshot, table_of(ws[cut:]), pk)
    assert merged.schema == SCHEMA
    assert by_key(merged) == model(ws, engine)
    # The same on the changelog the writes made (what the hot tier holds), under the
    # engine or as plain last-row: the engine was applied once, at write.
    changes = changelog(table_of(ws[cut:]), snapshot, pk)
    for e in (engine, LastRow()):
        assert by_key(merge_snapshot(snapshot, changes, PrimaryKey(KEY, e))) == model(ws, engine)


@settings(max_examples=40, deadline=None)
@given(ws=writes(), engine=st.sampled_from(ENGINES), data=st.data())
def test_the_changelog_replayed_equals_the_model(
    ws: list[Write], engine: MergeEngine, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(ws)), label="cut")
    pk = PrimaryKey(KEY, engine)
    state = model(ws[:cut], engine)
    changes = changelog(table_of(ws[cut:]), state_table(state), pk)
    assert changes.column_names == WRITES.names
    kinds = changes.column(CHANGE_COLUMN).to_pylist()
    for i, row in enumerate(changes.drop_columns([CHANGE_COLUMN]).to_pylist()):
        key = (row["k"], row["r"])
        kind = Change(kinds[i])
        if kind is Change.INSERT:
            assert key not in state
            state[key] = row
        elif kind is Change.UPDATE_BEFORE:
            # The before-image is the row the key held, and its after-image follows.
            assert state[key] == row
            assert kinds[i + 1] == Change.UPDATE_AFTER
        elif kind is Change.UPDATE_AFTER:
            assert kinds[i - 1] == Change.UPDATE_BEFORE
            state[key] = row
        else:
            assert state.pop(key) == row
    assert state == model(ws, engine)


def test_an_ignored_write_makes_no_change() -> None:
    ws = [
        Write(False, {"k": 1, "r": "x", "a": 1, "b": None, "ver": 5}),
        Write(False, {"k": 1, "r": "x", "a": 2, "b": None, "ver": 4}),
        Write(True, {"k": 2, "r": "x", "a": None, "b": None, "ver": None}),
    ]
    for engine in (FirstRow(), Versioned("ver")):
        changes = changelog(table_of(ws), state_table({}), PrimaryKey(KEY, engine))
        assert changes.column(CHANGE_COLUMN).to_pylist() == [Change.INSERT]


def test_delete_rows_delete_their_keys() -> None:
    state = {(1, "x"): {"k": 1, "r": "x", "a": 1, "b": "p", "ver": 0}}
    deletes = delete_rows(pa.table({"k": [1, 7], "r": ["x", "x"]}), SCHEMA)
    pk = PrimaryKey(KEY)
    assert merge_snapshot(state_table(state), deletes, pk).num_rows == 0
    changes = changelog(deletes, state_table(state), pk)
    assert changes.column(CHANGE_COLUMN).to_pylist() == [Change.DELETE]
    assert changes.drop_columns([CHANGE_COLUMN]).to_pylist() == list(state.values())


@pytest.mark.parametrize(
    ("rows", "writes_only", "message"),
    [
        ({"k": [1, None], "r": ["x", "x"]}, False, "primary key column 'k' is null in row 1"),
        ({"k": [1]}, False, "the rows have no primary key column 'r'"),
        ({"k": [1], "r": ["x"], CHANGE_COLUMN: [7]}, False, "holds 7 in row 0"),
        ({"k": [1], "r": ["x"], CHANGE_COLUMN: [1]}, True, r"holds 1 in row 0; 0 or 2 \(upsert\)"),
    ],
)
def test_bad_rows_are_refused_in_one_sentence(
    rows: dict[str, list[Any]], writes_only: bool, message: str
) -> None:
    table = pa.table(rows)
    with pytest.raises(SchemaMismatch, match=message):
        if writes_only:
            changelog(table, table.slice(0, 0), PrimaryKey(KEY))
        else:
            current_rows(table, PrimaryKey(KEY))


def test_a_null_version_is_refused() -> None:
    rows = pa.table({"k": [1], "r": ["x"], "ver": pa.array([None], pa.int64())})
    with pytest.raises(SchemaMismatch, match="version column 'ver' is null in row 0"):
        current_rows(rows, PrimaryKey(KEY, Versioned("ver")))


def test_a_key_declaration_makes_its_columns_non_null() -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.float64())])
    checked = check_primary_key(schema, PrimaryKey(("id",)))
    assert not checked.field("id").nullable and checked.field("v").nullable


@pytest.mark.parametrize(
    ("key", "routing", "message"),
    [
        (PrimaryKey(()), (), "at least one column"),
        (PrimaryKey(("nope",)), (), "primary key column 'nope' is not a column"),
        (PrimaryKey(("k", "k")), (), "'k' is named twice"),
        (PrimaryKey(("f",)), (), "'f' is double; a key column is an integer"),
        (PrimaryKey(("l",)), (), "'l' is list<item: int32>; a key column"),
        (PrimaryKey(("k",)), ("s",), "key column 's' is not in the primary key"),
        (PrimaryKey(("k",), Versioned("s")), (), "version column 's' is string; a version"),
        (PrimaryKey(("k",), Versioned("k")), (), "version column 'k' is in the primary key"),
        (PrimaryKey(("k",), Versioned("x")), (), "version column 'x' is not a column"),
        (PrimaryKey(("k",), PartialUpdate()), (), "column 'n' is not nullable"),
        (PrimaryKey(tuple(f"c{i}" for i in range(17))), (), "at most 16"),
    ],
)
def test_bad_key_declarations_are_refused_in_one_sentence(
    key: PrimaryKey, routing: tuple[str, ...], message: str
) -> None:
    schema = pa.schema(
        [
            pa.field("k", pa.int64()),
            pa.field("s", pa.string()),
            pa.field("f", pa.float64()),
            pa.field("l", pa.list_(pa.int32())),
            pa.field("n", pa.int32(), nullable=False),
        ]
    )
    with pytest.raises(InvalidSchema, match=message):
        check_primary_key(schema, key, routing)


def test_merge_engines_round_trip_as_json() -> None:
    for engine in ENGINES:
        assert engine_from_json(engine_to_json(engine)) == engine
    assert engine_from_json("first_row") == FirstRow()
    for bad, message in [
        ("newest", "merge engine 'newest' is unknown"),
        ({"type": "versioned"}, "needs 'column'"),
        ({"type": "last_row", "column": "v"}, "takes no column"),
        ({"type": "last_row", "order": 1}, "'order' is not one"),
        (3, "a name or an object"),
    ]:
        with pytest.raises(InvalidSchema, match=message):
            engine_from_json(bad)
