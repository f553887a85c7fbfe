"""The Iceberg REST spec's expression JSON (a scan plan's ``filter``) as Tidegate's filter
tree (:mod:`gateway.wire.filters`), which both tiers prune with: the cold backend turns it
into pyiceberg's expression, the hot tier into Arrow's.

Both forms of the spec are read: the older ``{"type": "gt", "term": "id", "value": 5}``
(what pyiceberg 0.12 sends) and the newer ``{"type": "gt", "left": {"type": "reference",
"name": "id"}, "right": 5}``; literals bare or as ``{"type": "literal", "value": ...}``,
``in`` values as a list or ``{"type": "literals", "values": [...]}``, and ``true`` /
``false`` bare or as ``{"type": "true"}``. Transforms and functions are refused in one
sentence: a filter names columns of the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.wire.errors import InvalidRequest
from gateway.wire.filters import (
    And,
    Compare,
    Const,
    Expr,
    FilterLimits,
    In,
    IsNaN,
    IsNull,
    Not,
    Or,
    StartsWith,
)

__all__ = ["from_iceberg_json", "resolve_name"]

_COMPARE = {"lt": "<", "lt-eq": "<=", "gt": ">", "gt-eq": ">=", "eq": "=", "not-eq": "!="}
_UNARY = {"is-null", "not-null", "is-nan", "not-nan"}
_KINDS = sorted({*_COMPARE, *_UNARY, "and", "or", "not", "in", "not-in", "true", "false",
                 "starts-with", "not-starts-with"})  # fmt: skip


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(f"invalid filter: {message}")


def resolve_name(name: Any, names: Sequence[str], case_sensitive: bool, what: str) -> str:
    """``name`` as one of the table's column ``names`` (ignoring case unless
    ``case_sensitive``).

    Raises:
        InvalidRequest: not a column of the table (the message lists them).
    """
    if not isinstance(name, str):
        raise InvalidRequest(f"{what}: a column name must be a string, not {type(name).__name__}")
    if name in names:
        return name
    if not case_sensitive:
        found = [n for n in names if n.lower() == name.lower()]
        if len(found) == 1:
            return found[0]
    shown = name if len(name) <= 80 else name[:80] + "..."
    raise InvalidRequest(
        f"{what}: unknown column {shown!r}; the table has {list(names)}", column=shown
    )


class _Reader:
    def __init__(self, names: Sequence[str], case_sensitive: bool, limits: FilterLimits) -> None:
        self.names = names
        self.case_sensitive = case_sensitive
        self.limits = limits
        self.terms = 0

    def count(self, n: int = 1) -> None:
        self.terms += n
        if self.terms > self.limits.max_terms:
            raise _bad(f"more than {self.limits.max_terms} predicates and literals")

    def column(self, doc: Mapping[str, Any]) -> str:
        term = doc.get("term", doc.get("child", doc.get("left")))
        if isinstance(term, Mapping):
            kind = term.get("type")
            if kind == "reference" and isinstance(term.get("name", term.get("term")), str):
                term = term.get("name", term.get("term"))
            elif kind == "reference" and "id" in term:
                raise _bad("a reference by field id is not accepted; name the column")
            else:
                raise _bad(
                    f"{str(kind)[:40]!r} terms (transforms, functions) are not accepted; "
                    "a filter compares columns of the table with literals"
                )
        if term is None:
            raise _bad(f"a {doc.get('type')!r} predicate needs a column ('term' or 'child')")
        return resolve_name(term, self.names, self.case_sensitive, "invalid filter")

    def literal(self, value: Any) -> Any:
        self.count()
        if isinstance(value, Mapping):
            if value.get("type") != "literal" or "value" not in value:
                raise _bad("a literal is a value or {'type': 'literal', 'value': ...}")
            value = value["value"]
        if value is None or isinstance(value, list | dict):
            raise _bad(f"{str(value)[:60]} is not a literal value")
        return value

    def read(self, doc: Any, depth: int = 0) -> Expr:
        if depth > self.limits.max_depth:
            raise _bad(f"nested deeper than {self.limits.max_depth}")
        if isinstance(doc, bool):
            return Const(doc)
        if not isinstance(doc, Mapping):
            raise _bad("an expression is true, false or an object with a 'type'")
        kind = doc.get("type")
        if kind in ("true", "false"):
            return Const(kind == "true")
        if kind in ("and", "or"):
            self.count()
            if "left" not in doc or "right" not in doc:
                raise _bad(f"{kind!r} needs 'left' and 'right'")
            children = (self.read(doc["left"], depth + 1), self.read(doc["right"], depth + 1))
            return And(children) if kind == "and" else Or(children)
        if kind == "not":
            self.count()
            if "child" not in doc:
                raise _bad("'not' needs 'child'")
            return Not(self.read(doc["child"], depth + 1))
        if kind in _UNARY:
            self.count()
            column = self.column(doc)
            if kind in ("is-null", "not-null"):
                return IsNull(column, negated=kind == "not-null")
            return IsNaN(column, negated=kind == "not-nan")
        if kind in _COMPARE or kind in ("starts-with", "not-starts-with"):
            self.count()
            column = self.column({k: v for k, v in doc.items() if k != "right"})
            if "value" in doc:
                value = self.literal(doc["value"])
            elif "right" in doc:
                value = self.literal(doc["right"])
            else:
                raise _bad(f"{kind!r} needs a 'value'")
            if kind in _COMPARE:
                return Compare(column, _COMPARE[kind], value)
            if not isinstance(value, str):
                raise _bad(f"{kind!r} takes a string prefix")
            return StartsWith(column, value, negated=kind == "not-starts-with")
        if kind in ("in", "not-in"):
            self.count()
            column = self.column(doc)
            values = doc.get("values")
            if isinstance(values, Mapping) and values.get("type") == "literals":
                values = values.get("values")
            if not isinstance(values, list) or not values:
                raise _bad(f"{kind!r} needs a non-empty list of 'values'")
            return In(column, tuple(self.literal(v) for v in values), negated=kind == "not-in")
        raise _bad(f"unknown expression type {str(kind)[:40]!r}; one of {_KINDS}")


def from_iceberg_json(
    doc: Any, names: Sequence[str], case_sensitive: bool, limits: FilterLimits
) -> Expr:
    """The (unbound) filter tree of a spec expression over a table whose columns are
    ``names``; bind it with :func:`gateway.wire.filters.bind`.

    Raises:
        InvalidRequest: an expression the spec does not define, a transform, an unknown
            column, or one beyond ``limits`` (one sentence naming it).
    """
    return _Reader(names, case_sensitive, limits).read(doc)
