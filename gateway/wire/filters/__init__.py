"""Scan filters: one small expression language, the same on both tiers.

A filter is text such as ``v > 5 and tag = 'x'``, ``ts >= '2024-01-01T00:00:00Z'``,
``tag is null``, ``id in (1, 2)``, ``id not in (3)``, ``name like 'pre%'``, ``x is nan``,
``not (a < 1 or b = 'y')``. It is handled in three steps, all here and none of them tied to
a storage backend:

1. :func:`parse` turns the text into a small tree of our own (:class:`Expr`), refusing
   text that is too long, too deep or has too many terms (:class:`FilterLimits`) with a
   clear error instead of exhausting the process;
2. :func:`bind` checks the tree against a table's Arrow schema (unknown columns, columns of
   types that take no filter, literals that do not fit) and normalises it with SQL
   semantics: literals take the column's type exactly (``id > 1.5`` on an integer column
   is ``id >= 2``, ``id = 1.5`` matches nothing), negations are pushed down to the leaves,
   constants folded, ``and``/``or`` flattened;
3. :func:`to_arrow` gives the Arrow compute expression of a bound tree (the hot tier, and
   the rows of cold files); the cold backend translates the same bound tree to its own
   pushdown (pyiceberg's expressions). Both tiers therefore filter by one definition.

Comparisons follow SQL's three-valued logic: a comparison with a null is unknown and the
row is not returned, whatever negation surrounds it; ``x is nan`` is false and
``x is not nan`` true for a null ``x`` (Iceberg's rule).

The grammar (keywords are case-insensitive)::

    expr      := or
    or        := and ("or" and)*
    and       := not ("and" not)*
    not       := "not" not | primary
    primary   := "(" expr ")" | "true" | "false" | predicate
    predicate := column ( op literal
                        | "is" ["not"] ("null" | "nan")
                        | ["not"] "in" "(" literal ("," literal)* ")"
                        | ["not"] "like" string )
    op        := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    column    := identifier | "double-quoted identifier"
    literal   := number | 'string' ('' for a quote) | true | false
"""

from gateway.wire.filters.bind import bind, compile_filter
from gateway.wire.filters.parse import parse
from gateway.wire.filters.tree import (
    ALWAYS_FALSE,
    ALWAYS_TRUE,
    DEFAULT_LIMITS,
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
from gateway.wire.filters.use import balanced, columns_of, to_arrow, to_text

__all__ = [
    "ALWAYS_FALSE",
    "ALWAYS_TRUE",
    "DEFAULT_LIMITS",
    "And",
    "Compare",
    "Const",
    "Expr",
    "FilterLimits",
    "In",
    "IsNaN",
    "IsNull",
    "Not",
    "Or",
    "StartsWith",
    "balanced",
    "bind",
    "columns_of",
    "compile_filter",
    "parse",
    "to_arrow",
    "to_text",
]
