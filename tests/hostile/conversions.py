"""Every conversion of a caller's values into Arrow, driven over generated edge values, in a
process of its own (``python -m tests.hostile.conversions``): a crash inside Arrow kills
this process, not the test run, and the test sees the signal.

Paths driven, for every admitted column type (decimals of several precisions and scales,
temporals, numbers, text, binary, lists and structs of them):

- ``json``: JSON rows as the HTTP edge takes them (:func:`gateway.wire.jsonrows.rows_to_batch`);
- ``jsonl`` and ``csv``: a file as ``tidegate append`` reads it;
- ``sdk``: Python values as the SDK producer takes them (the checked columns and the Arrow way);
- ``filter``: a scan filter comparing the column with the value, bound, turned into Arrow
  compute and run over rows, and translated to the cold tier's pushdown.

A value may be refused, with one of our errors (a :class:`TidegateError` whose message is a
sentence); any other exception is a finding, and so is a crash. The process prints one line
of counts and exits 0 when there was no finding, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from gateway.wire.errors import TidegateError
from gateway.wire.schema import parse_type

#: Column types under test, as a user writes them.
TYPES = [
    "int8",
    "int32",
    "int64",
    "float32",
    "float64",
    "bool",
    "string",
    "binary",
    "decimal128(1, 0)",
    "decimal128(1, 1)",
    "decimal128(10, 2)",
    "decimal128(18, 0)",
    "decimal128(19, 9)",
    "decimal128(38, 0)",
    "decimal128(38, 10)",
    "decimal128(38, 38)",
    "timestamp[us]",
    "timestamp[us, tz=UTC]",
    "date32",
    "time64[us]",
    "list<decimal128(10, 2)>",
    "list<timestamp[us, tz=UTC]>",
    "struct<d: decimal128(38, 10), t: timestamp[us], n: int16>",
]

_EXPONENTS = [0, 1, -1, 2, -2, 10, -10, 37, -37, 38, -38, 39, 76, -76, 77, 308, -308, 400,
              -400, 6143, -6143, 2**31 - 1, -(2**31), 2**31, 999_999_999, -999_999_999,
              10**10, -(10**10), 2**63 - 1, -(2**63)]  # fmt: skip
_INTS = [0, 1, -1, 127, -128, 128, 2**15, 2**31 - 1, -(2**31), 2**31, 2**53, 2**63 - 1,
         -(2**63), 2**63, 2**64, -(2**64), 10**38 - 1, 10**38, 10**40]  # fmt: skip


def _digits(rng: random.Random) -> str:
    n = rng.choice([0, 1, 1, 2, 9, 18, 19, 38, 39, 60])
    if not n:
        return "0"
    return "".join(rng.choice("0123456789") for _ in range(n))


def decimal_text(rng: random.Random) -> str:
    """Decimal text at the edges: any exponent, zeros with exponents, signs, specials."""
    pick = rng.random()
    if pick < 0.05:
        return rng.choice(["NaN", "-NaN", "sNaN", "Infinity", "-inf", "", " ", "1e", "E5",
                           "--1", "1.2.3", "0x10", "1_000", "١٢", "+.5", "-.0", "5."])  # fmt: skip
    sign = rng.choice(["", "", "-", "+"])
    whole = _digits(rng)
    frac = _digits(rng) if rng.random() < 0.5 else ""
    text = sign + whole + ("." + frac if frac or rng.random() < 0.1 else "")
    if rng.random() < 0.6:
        text += rng.choice("eE") + str(rng.choice(_EXPONENTS) + rng.choice([0, 0, 1, -1]))
    if rng.random() < 0.05:
        text = f" {text} "
    return text


def iso_text(rng: random.Random, *, date_only: bool = False, time_only: bool = False) -> str:
    year = rng.choice([1, 2, 999, 1000, 1969, 1970, 2024, 9999, 10000, 0])
    month, day = rng.choice([(1, 1), (2, 29), (2, 30), (12, 31), (13, 1), (0, 0)])
    d = f"{year:04d}-{month:02d}-{day:02d}"
    t = rng.choice(["00:00:00", "23:59:59.999999", "23:59:59.9999999", "24:00:00", "12:30",
                    "12", "23:59:60", "00:00:00.000000001"])  # fmt: skip
    if date_only:
        return d
    if time_only:
        return t
    zone = rng.choice(["", "Z", "+00:00", "-00:00", "+23:59", "-23:59", "+24:00", "+05:30", "z"])
    return f"{d}T{t}{zone}"


def json_value(rng: random.Random, t: pa.DataType, depth: int = 0) -> Any:
    """A JSON value aimed at ``t``'s edges (or at another type's, to be refused)."""
    if rng.random() < 0.1:
        return rng.choice([None, True, False, 0, -1, 1.5, "", "x", [], {}, 2**63, -(2**63) - 1,
                           1e308, -1e308, 5e-324])  # fmt: skip
    if pa.types.is_decimal(t):
        text = decimal_text(rng)
        if rng.random() < 0.2:
            try:
                d = decimal.Decimal(text)
                if rng.random() < 0.5 or not d.is_finite() or abs(d.adjusted()) > 60:
                    return float(text)  # JSON numbers are at most doubles or small ints
                return int(d)
            except (ValueError, OverflowError, decimal.InvalidOperation):
                return text
        return text
    if pa.types.is_integer(t):
        return rng.choice(_INTS) * rng.choice([1, -1])
    if pa.types.is_floating(t):
        return rng.choice([0.0, -0.0, 1e308, -1e308, 5e-324, 3.4028235e38, 3.5e38, 2**53 + 1])
    if pa.types.is_timestamp(t):
        if rng.random() < 0.3:
            return rng.choice([*_INTS, 253_402_300_799_999_999, -62_135_596_800_000_000,
                               253_402_300_800_000_000])  # fmt: skip
        return iso_text(rng)
    if pa.types.is_date(t):
        return iso_text(rng, date_only=True)
    if pa.types.is_time(t):
        return iso_text(rng, time_only=True)
    if pa.types.is_string(t):
        return rng.choice(["", "a", "\ud800", "é" * 3, "\x00", "x" * 1000])
    if pa.types.is_binary(t):
        return rng.choice(["", "AAE=", "AAE", "====", "not base64!", "/+/+"])
    if pa.types.is_list(t):
        if depth > 2:
            return []
        return [json_value(rng, t.value_type, depth + 1) for _ in range(rng.randint(0, 3))]
    if pa.types.is_struct(t):
        return {
            t.field(i).name: json_value(rng, t.field(i).type, depth + 1)
            for i in range(t.num_fields)
        }
    return None  # pragma: no cover


def python_value(rng: random.Random, t: pa.DataType, depth: int = 0) -> Any:
    """A Python value aimed at ``t``'s edges, as an SDK user would send it."""
    if pa.types.is_decimal(t):
        try:
            return decimal.Decimal(decimal_text(rng))
        except decimal.InvalidOperation:
            return decimal.Decimal(rng.choice(["NaN", "Infinity", "0E-999999999"]))
    if pa.types.is_timestamp(t):
        v = rng.choice([dt.datetime.min, dt.datetime.max, dt.datetime(1970, 1, 1)])
        zone = rng.choice([None, dt.UTC, dt.timezone(dt.timedelta(hours=23, minutes=59)),
                           dt.timezone(dt.timedelta(hours=-23, minutes=-59))])  # fmt: skip
        return v.replace(tzinfo=zone)
    if pa.types.is_date(t):
        return rng.choice([dt.date.min, dt.date.max, dt.date(1970, 1, 1)])
    if pa.types.is_time(t):
        return rng.choice([dt.time.min, dt.time.max, dt.time(12, tzinfo=dt.UTC)])
    if pa.types.is_list(t):
        if depth > 2:
            return []
        return [python_value(rng, t.value_type, depth + 1) for _ in range(rng.randint(0, 3))]
    if pa.types.is_struct(t):
        return {
            t.field(i).name: python_value(rng, t.field(i).type, depth + 1)
            for i in range(t.num_fields)
        }
    return json_value(rng, t, depth)


def filter_literal(rng: random.Random, t: pa.DataType) -> str:
    """A filter literal aimed at ``t``'s edges."""
    if pa.types.is_decimal(t) or pa.types.is_integer(t) or pa.types.is_floating(t):
        text = decimal_text(rng).strip()
        return text if rng.random() < 0.8 else f"'{text}'"
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return "'" + iso_text(rng, date_only=pa.types.is_date(t)) + "'"
    return "'" + json.dumps(json_value(rng, t))[:40].replace("'", "''") + "'"


class Drive:
    """Runs each path, counts outcomes and keeps the findings."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.findings: list[str] = []

    def run(self, path: str, what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
            self.counts[f"{path}:ok"] += 1
        except TidegateError as exc:
            self.counts[f"{path}:refused"] += 1
            text = str(exc)
            if "Traceback" in text or "\n" in text.strip():
                self.findings.append(f"{path} {what}: refusal is not one sentence: {text!r}")
        except Exception:
            # Every other exception is what this hunts (it would be a 500 at an edge).
            self.counts[f"{path}:finding"] += 1
            self.findings.append(f"{path} {what}:\n{traceback.format_exc(limit=6)}")


def _pushdown() -> Callable[[Any, pa.Schema], Any] | None:
    """The cold tier's filter translation, when the server extra is installed."""
    try:
        from gateway.cold.iceberg.filters import to_pyiceberg
    except ImportError:
        return None
    return to_pyiceberg


def json_row(value: Any, schema: pa.Schema) -> None:
    from gateway.wire.jsonrows import rows_to_batch

    rows_to_batch([{"k": 1, "c": value}], schema)


def file_rows(path: Path, fmt: str, schema: pa.Schema) -> None:
    from gateway.cli.records import _file_batches

    list(_file_batches(path, fmt, schema, 10))


def sdk_rows(value: Any, schema: pa.Schema) -> None:
    from gateway.client._batching import Accumulator, ProducerConfig
    from gateway.client._types import TableInfo, TableRef

    acc = Accumulator(TableInfo(TableRef("ns", "t"), schema, 1, ()), ProducerConfig())
    acc.add({"k": 1, "c": value}, 0)  # one dict: the checked columns
    acc.add([{"k": 2, "c": value}, {"k": 3, "c": None}], 0)  # a list: the same or Arrow's way
    for batch in acc.drain(time.monotonic(), force=True):
        batch.seal(schema, "none")


def scan_filter(expression: str, schema: pa.Schema, pushdown: Callable[..., Any] | None) -> None:
    from gateway.wire.filters import compile_filter, to_arrow

    bound = compile_filter(expression, schema)
    if bound is None:
        return
    t = schema.field("c").type
    rows = pa.table({"k": pa.array([1, None], pa.int64()), "c": pa.nulls(2, t)})
    rows.filter(to_arrow(bound, schema))
    if pushdown is not None:
        pushdown(bound, schema)


def drive_type(drive: Drive, rng: random.Random, text: str, examples: int, tmp: Path) -> None:
    """``examples`` values of the column type ``text`` through every path."""
    t = parse_type(text)
    schema = pa.schema([pa.field("k", pa.int64()), pa.field("c", t)])
    pushdown = _pushdown()
    jsonl, csv = tmp / "rows.jsonl", tmp / "rows.csv"
    for _ in range(examples):
        value = json_value(rng, t)
        what = f"{text} value {json.dumps(value)[:120]}"
        drive.run("json", what, json_row, value, schema)
        jsonl.write_text(json.dumps({"k": 1, "c": value}) + "\n")  # ASCII: \ud800 escaped
        drive.run("jsonl", what, file_rows, jsonl, "jsonl", schema)
        if not pa.types.is_nested(t) and isinstance(value, str | int | float):
            cell = str(value).replace('"', '""')
            csv.write_bytes(f'k,c\n1,"{cell}"\n'.encode("utf-8", "surrogatepass"))
            drive.run("csv", what, file_rows, csv, "csv", schema)
        py = python_value(rng, t)
        drive.run("sdk", f"{text} value {py!r:.120}", sdk_rows, py, schema)
        if pa.types.is_nested(t) or pa.types.is_binary(t):
            continue
        literal = filter_literal(rng, t)
        op = rng.choice(["=", "<", ">=", "!=", "in"])
        expression = f"c in ({literal}, {literal})" if op == "in" else f"c {op} {literal}"
        drive.run("filter", f"{text} filter {expression!r:.160}", scan_filter, expression,
                  schema, pushdown)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--examples", type=int, default=200, help="values per column type")
    args.add_argument("--seed", type=int, default=0)
    opts = args.parse_args(argv)
    rng = random.Random(opts.seed)
    drive = Drive()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tg-conv-") as tmp:
        for text in TYPES:
            drive_type(drive, rng, text, opts.examples, Path(tmp))
    elapsed = time.monotonic() - started
    total = sum(drive.counts.values())
    print(
        f"conversions: {total} in {elapsed:.1f} s, seed {opts.seed}, "
        f"{len(drive.findings)} findings; "
        + ", ".join(f"{k} {v}" for k, v in sorted(drive.counts.items()))
    )
    for finding in drive.findings[:20]:
        print(finding)
    return 1 if drive.findings else 0


if __name__ == "__main__":
    sys.exit(main())
