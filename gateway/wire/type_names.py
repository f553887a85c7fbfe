"""Arrow type names on the wire: the recursive-descent parser of the names a table schema
admits (``int64``, ``timestamp[us, tz=UTC]``, ``decimal128(10, 2)``, ``list<int32>``,
``struct<a: int32, b: string>``) and their canonical form. Only types that round-trip
losslessly through Iceberg are admitted. The schema functions built on it are in
:mod:`gateway.wire.schema`, which re-exports these names.
"""

from __future__ import annotations

import re

import pyarrow as pa

from gateway.wire.errors import InvalidSchema

__all__ = [
    "MAX_FIELDS",
    "MAX_TYPE_CHARS",
    "MAX_TYPE_DEPTH",
    "FieldBudget",
    "format_type",
    "parse_type",
]

#: Bounds of a type name: nesting of list<> and struct<>, and its length.
MAX_TYPE_DEPTH = 16
MAX_TYPE_CHARS = 16 * 1024
#: Fields a whole schema may have at every depth (columns, struct fields, list items: what
#: Iceberg gives a field id); each schema version is kept in every Iceberg metadata file.
MAX_FIELDS = 4096

_PRIMITIVES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float": pa.float32(),
    "float32": pa.float32(),
    "double": pa.float64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "utf8": pa.string(),
    "binary": pa.binary(),
    "date32": pa.date32(),
    "date32[day]": pa.date32(),
    "time64[us]": pa.time64("us"),
}


class FieldBudget:
    """The fields a schema may still have, counted while its types are parsed, so that
    an oversized schema is refused after at most ``MAX_FIELDS`` of them are built."""

    def __init__(self) -> None:
        self.used = 0
        self.column = ""

    def take(self) -> None:
        self.used += 1
        if self.used > MAX_FIELDS:
            raise InvalidSchema(
                f"the schema has more than {MAX_FIELDS} fields (columns, struct fields and "
                f"list items at every depth; column {self.column!r:.80} reaches field "
                f"{self.used}); at most {MAX_FIELDS} are accepted"
            )


class _TypeParser:
    """Recursive-descent parser for the Arrow type names we admit."""

    def __init__(self, text: str, budget: FieldBudget | None = None) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0
        self.budget = budget

    def fail(self, what: str) -> InvalidSchema:
        return InvalidSchema(f"cannot parse type {self.text!r}: {what} at position {self.pos}")

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip_ws()
        return self.text.startswith(token, self.pos)

    def expect(self, token: str) -> None:
        if not self.peek(token):
            raise self.fail(f"expected {token!r}")
        self.pos += len(token)

    def word(self) -> str:
        self.skip_ws()
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.pos)
        if not m:
            raise self.fail("expected a name")
        self.pos = m.end()
        return m.group(0)

    def integer(self) -> int:
        self.skip_ws()
        m = re.compile(r"\d+").match(self.text, self.pos)
        if not m:
            raise self.fail("expected a number")
        if len(m.group(0)) > 4:
            raise self.fail("a number of at most 4 digits")
        self.pos = m.end()
        return int(m.group(0))

    def parse(self) -> pa.DataType:
        t = self.type_()
        self.skip_ws()
        if self.pos != len(self.text):
            raise self.fail("unexpected trailing text")
        return t

    def type_(self) -> pa.DataType:
        self.depth += 1
        if self.depth > MAX_TYPE_DEPTH:
            raise InvalidSchema(
                f"type {self.text[:60]!r}... nests more than {MAX_TYPE_DEPTH} levels of "
                "list<> and struct<>"
            )
        if self.budget is not None:
            self.budget.take()
        try:
            return self._type()
        finally:
            self.depth -= 1

    def _type(self) -> pa.DataType:
        name = self.word()
        if name == "list":
            self.expect("<")
            item = self.field_or_type()
            self.expect(">")
            return pa.list_(item)
        if name == "struct":
            self.expect("<")
            fields: list[pa.Field] = []
            if not self.peek(">"):
                while True:
                    fname = self.word()
                    self.expect(":")
                    ftype = self.type_()
                    nullable = not self._not_null()
                    fields.append(pa.field(fname, ftype, nullable=nullable))
                    if not self.peek(","):
                        break
                    self.expect(",")
            self.expect(">")
            return pa.struct(fields)
        if name == "decimal128" or name == "decimal":
            self.expect("(")
            precision = self.integer()
            self.expect(",")
            scale = self.integer()
            self.expect(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise InvalidSchema(f"decimal128({precision}, {scale}) is out of range")
            return pa.decimal128(precision, scale)
        if name == "timestamp":
            self.expect("[")
            unit = self.word()
            tz: str | None = None
            if self.peek(","):
                self.expect(",")
                self.expect("tz")
                self.expect("=")
                self.skip_ws()
                m = re.compile(r"[^\]\s]+").match(self.text, self.pos)
                if not m:
                    raise self.fail("expected a time zone")
                tz = m.group(0)
                self.pos = m.end()
            self.expect("]")
            if unit != "us":
                raise InvalidSchema(
                    f"timestamp[{unit}] is not supported: Iceberg stores microseconds; "
                    "use timestamp[us] or timestamp[us, tz=UTC]"
                )
            if tz is not None and tz not in ("UTC", "+00:00", "Etc/UTC"):
                raise InvalidSchema(
                    f"time zone {tz!r} would not survive a round trip: Iceberg stores "
                    "instants in UTC; use timestamp[us, tz=UTC]"
                )
            return pa.timestamp("us", tz="UTC" if tz else None)
        # Primitive names may carry a bracket suffix: date32[day], time64[us]
        if self.peek("["):
            start = self.pos
            self.expect("[")
            self.word()
            self.expect("]")
            name += self.text[start : self.pos].replace(" ", "")
        if name in _PRIMITIVES:
            return _PRIMITIVES[name]
        raise InvalidSchema(
            f"type {name!r} is not supported; use one of "
            f"{sorted(set(_PRIMITIVES) - {'boolean', 'utf8', 'float', 'double', 'date32[day]'})}"
            ", timestamp[us], timestamp[us, tz=UTC], decimal128(p, s), list<...>, struct<...>"
        )

    def field_or_type(self) -> pa.DataType:
        # ``list<item: int32>`` (as pyarrow prints it) or ``list<int32>``.
        save = self.pos
        try:
            self.word()
            if self.peek(":"):
                self.expect(":")
                t = self.type_()
                self._not_null()
                return t
        except InvalidSchema:
            pass
        self.pos = save
        return self.type_()

    def _not_null(self) -> bool:
        if self.peek("not null"):
            self.expect("not null")
            return True
        return False


def parse_type(text: str, budget: FieldBudget | None = None) -> pa.DataType:
    """An admitted Arrow type from its name (counting its fields against ``budget``).

    Raises:
        InvalidSchema: unknown, malformed or not losslessly storable in Iceberg.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchema(f"a type must be a non-empty string, got {text!r:.80}")
    if len(text) > MAX_TYPE_CHARS:
        raise InvalidSchema(f"a type name has at most {MAX_TYPE_CHARS} characters")
    return _TypeParser(text.strip(), budget).parse()


def format_type(t: pa.DataType) -> str:
    """The canonical name of an admitted type (what ``parse_type`` reads back)."""
    return str(t)
