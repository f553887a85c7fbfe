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

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gateway.wire.errors import InvalidRequest

__all__ = [
    "ALWAYS_FALSE",
    "ALWAYS_TRUE",
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
    "bind",
    "columns_of",
    "compile_filter",
    "parse",
    "to_arrow",
    "to_text",
]


# --------------------------------------------------------------------------------------
# The tree
# --------------------------------------------------------------------------------------
class Expr:
    """A node of a filter. Bound trees (from :func:`bind`) hold no :class:`Not`: leaves
    carry their own negation (``negated``) and literal values have the column's type."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: bool


ALWAYS_TRUE = Const(True)
ALWAYS_FALSE = Const(False)


@dataclass(frozen=True, slots=True)
class And(Expr):
    children: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or(Expr):
    children: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not(Expr):
    child: Expr


#: Comparison operators, and each one's negation.
_NEGATED_OP = {"=": "!=", "!=": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    column: str
    op: str
    value: Any


@dataclass(frozen=True, slots=True)
class In(Expr):
    column: str
    values: tuple[Any, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNull(Expr):
    column: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNaN(Expr):
    column: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class StartsWith(Expr):
    column: str
    prefix: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class FilterLimits:
    """Bounds on a filter's text, so that no request can exhaust the process."""

    #: Characters of filter text.
    max_chars: int = 64 * 1024
    #: Predicates plus literals (``id in (1, 2, 3)`` is four terms).
    max_terms: int = 4096
    #: Nesting of parentheses and ``not``.
    max_depth: int = 64


DEFAULT_LIMITS = FilterLimits()


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<string>'(?:[^']|'')*')
      | (?P<quoted>"(?:[^"]|"")+")
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op><=|>=|<>|!=|==|=|<|>)
      | (?P<punct>[(),])
    )""",
    re.VERBOSE,
)
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "null", "nan", "like", "true", "false"})
#: Digits of a numeric literal: past this it is refused rather than computed with.
_MAX_NUMBER_CHARS = 80


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number, string, name, keyword, op, punct, end
    text: str
    pos: int


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].isspace():
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            at = len(text) - len(text[pos:].lstrip())
            raise _syntax(text, f"unexpected {text[at : at + 10]!r} at position {at}")
        kind = m.lastgroup or "punct"
        value = m.group(kind)
        start = m.start(kind)
        if kind == "name" and value.lower() in _KEYWORDS:
            kind, value = "keyword", value.lower()
        elif kind == "quoted":
            kind, value = "name", value[1:-1].replace('""', '"')
        out.append(_Token(kind, value, start))
        pos = m.end()
    out.append(_Token("end", "", len(text)))
    return out


def _syntax(text: str, what: str) -> InvalidRequest:
    shown = text if len(text) <= 200 else text[:200] + "..."
    return InvalidRequest(f"cannot parse filter {shown!r}: {what}", filter=shown)


class _Parser:
    def __init__(self, text: str, limits: FilterLimits) -> None:
        self.text = text
        self.limits = limits
        self.tokens = _tokens(text)
        self.i = 0
        self.terms = 0

    # helpers ---------------------------------------------------------------------
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        if tok.kind == kind and (text is None or tok.text == text):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, text: str, what: str) -> None:
        if not self.accept(kind, text):
            raise self.fail(f"expected {what}")

    def fail(self, what: str) -> InvalidRequest:
        tok = self.peek()
        found = "the end" if tok.kind == "end" else repr(tok.text)
        return _syntax(self.text, f"{what}, found {found} at position {tok.pos}")

    def count(self, n: int = 1) -> None:
        self.terms += n
        if self.terms > self.limits.max_terms:
            raise InvalidRequest(
                f"the filter has more than {self.limits.max_terms} terms; split the scan or "
                "use a range instead of a long list",
                max_terms=self.limits.max_terms,
            )

    # grammar ---------------------------------------------------------------------
    def parse(self) -> Expr:
        expr = self.or_(0)
        if self.peek().kind != "end":
            raise self.fail("expected 'and', 'or' or the end")
        return expr

    def or_(self, depth: int) -> Expr:
        children = [self.and_(depth)]
        while self.accept("keyword", "or"):
            children.append(self.and_(depth))
        return children[0] if len(children) == 1 else Or(tuple(children))

    def and_(self, depth: int) -> Expr:
        children = [self.not_(depth)]
        while self.accept("keyword", "and"):
            children.append(self.not_(depth))
        return children[0] if len(children) == 1 else And(tuple(children))

    def nest(self, depth: int) -> int:
        if depth + 1 > self.limits.max_depth:
            raise InvalidRequest(
                f"the filter nests deeper than {self.limits.max_depth} levels",
                max_depth=self.limits.max_depth,
            )
        return depth + 1

    def not_(self, depth: int) -> Expr:
        if self.accept("keyword", "not"):
            return Not(self.not_(self.nest(depth)))
        return self.primary(depth)

    def primary(self, depth: int) -> Expr:
        if self.accept("punct", "("):
            expr = self.or_(self.nest(depth))
            self.expect("punct", ")", "')'")
            return expr
        if self.accept("keyword", "true"):
            return ALWAYS_TRUE
        if self.accept("keyword", "false"):
            return ALWAYS_FALSE
        tok = self.peek()
        if tok.kind != "name":
            raise self.fail("expected a column name, 'not' or '('")
        self.i += 1
        self.count()
        return self.predicate(tok.text)

    def predicate(self, column: str) -> Expr:
        tok = self.peek()
        if tok.kind == "op":
            self.i += 1
            op = {"==": "=", "<>": "!="}.get(tok.text, tok.text)
            return Compare(column, op, self.literal())
        if self.accept("keyword", "is"):
            negated = self.accept("keyword", "not")
            if self.accept("keyword", "null"):
                return IsNull(column, negated)
            if self.accept("keyword", "nan"):
                return IsNaN(column, negated)
            raise self.fail("expected 'null' or 'nan' after 'is'")
        negated = self.accept("keyword", "not")
        if self.accept("keyword", "in"):
            self.expect("punct", "(", "'(' after 'in'")
            values = [self.literal()]
            while self.accept("punct", ","):
                values.append(self.literal())
            self.expect("punct", ")", "')' or ','")
            return In(column, tuple(values), negated)
        if self.accept("keyword", "like"):
            tok = self.take()
            if tok.kind != "string":
                self.i -= 1
                raise self.fail("expected a quoted pattern after 'like'")
            return _like(column, _unquote(tok.text), negated)
        raise self.fail(f"expected a comparison, 'is', 'in' or 'like' after {column!r}")

    def literal(self) -> Any:
        self.count()
        tok = self.take()
        if tok.kind == "number":
            if len(tok.text) > _MAX_NUMBER_CHARS:
                raise InvalidRequest(
                    f"the number {tok.text[:20]}... in the filter has more than "
                    f"{_MAX_NUMBER_CHARS} characters",
                )
            if re.fullmatch(r"[-+]?\d+", tok.text):
                return int(tok.text)
            return decimal.Decimal(tok.text)
        if tok.kind == "string":
            return _unquote(tok.text)
        if tok.kind == "keyword" and tok.text in ("true", "false"):
            return tok.text == "true"
        self.i -= 1
        raise self.fail("expected a number, a 'quoted string', true or false")


def _unquote(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _like(column: str, pattern: str, negated: bool) -> Expr:
    """``like`` takes prefix patterns only (``'abc%'``), as Iceberg's ``starts_with``."""
    body = pattern[:-1] if pattern.endswith("%") else None
    if body is None or "%" in body or "_" in body:
        raise InvalidRequest(
            f"like {pattern!r}: only prefix patterns such as 'abc%' are supported "
            "(no '_' and no '%' but the last character)",
            column=column,
        )
    return StartsWith(column, body, negated)


def parse(text: str, limits: FilterLimits = DEFAULT_LIMITS) -> Expr:
    """The tree of a filter text (unbound: columns and literals are not checked yet).

    Raises:
        InvalidRequest: malformed text, or text past ``limits``.
    """
    if not isinstance(text, str):
        raise InvalidRequest("filter must be a string")
    if len(text) > limits.max_chars:
        raise InvalidRequest(
            f"the filter has {len(text)} characters; at most {limits.max_chars} are accepted",
            max_chars=limits.max_chars,
        )
    return _Parser(text, limits).parse()


# --------------------------------------------------------------------------------------
# Binding: columns, literal types, SQL semantics, normal form
# --------------------------------------------------------------------------------------
def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@dataclass(frozen=True, slots=True)
class _Grid:
    """A column whose values lie on a grid: integers (step 1) or decimals (10**-scale),
    between ``lo`` and ``hi``. Literals off the grid or out of range are resolved exactly
    instead of being rounded."""

    step: decimal.Decimal
    lo: decimal.Decimal
    hi: decimal.Decimal
    to_value: Callable[[decimal.Decimal], Any]

    def clamp(self, v: decimal.Decimal) -> decimal.Decimal:
        """``v``, or one step past the range when it lies beyond (every value past the
        range compares alike), so that rounding works on bounded numbers only."""
        return min(max(v, self.lo - self.step), self.hi + self.step)

    def round(self, v: decimal.Decimal, rounding: str) -> decimal.Decimal:
        steps = _CTX.divide(self.clamp(v), self.step)
        return _CTX.multiply(steps.to_integral_value(rounding=rounding, context=_CTX), self.step)

    def floor(self, v: decimal.Decimal) -> decimal.Decimal:
        return self.round(v, decimal.ROUND_FLOOR)

    def ceil(self, v: decimal.Decimal) -> decimal.Decimal:
        return self.round(v, decimal.ROUND_CEILING)

    def holds(self, v: decimal.Decimal) -> bool:
        """Whether ``v`` is a value of the column (in range and on the grid)."""
        return self.lo <= v <= self.hi and self.floor(v) == v


#: Exact arithmetic for literals of at most ``_MAX_NUMBER_CHARS`` characters.
_CTX = decimal.Context(prec=200, Emax=100_000, Emin=-100_000)


def _grid(t: pa.DataType) -> _Grid | None:
    if pa.types.is_integer(t):
        lo, hi = _int_range(t)
        return _Grid(decimal.Decimal(1), decimal.Decimal(lo), decimal.Decimal(hi), int)
    if pa.types.is_decimal(t):
        step = decimal.Decimal(1).scaleb(-t.scale)
        top = (decimal.Decimal(10) ** t.precision - 1) * step

        def on_scale(d: decimal.Decimal) -> decimal.Decimal:
            return d.quantize(step, context=_CTX)

        return _Grid(step, -top, top, on_scale)
    return None


class _Binder:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def field(self, name: str, what: str) -> pa.Field:
        index = self.schema.get_field_index(name)
        if index < 0:
            raise InvalidRequest(
                f"invalid filter: unknown column {name!r}; the table has {self.schema.names}",
                column=name,
            )
        f = self.schema.field(index)
        t = f.type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise InvalidRequest(
                f"invalid filter: column {name!r} is {t}, which takes no {what}; filters "
                "take columns of numbers, strings, booleans, dates, times and timestamps",
                column=name,
            )
        return f

    # literal coercion ---------------------------------------------------------------
    def number(self, f: pa.Field, v: Any) -> decimal.Decimal | float:
        if isinstance(v, bool):
            raise self.mistyped(f, v, "a number")
        if isinstance(v, str):
            try:
                v = decimal.Decimal(v.strip())
            except decimal.InvalidOperation:
                raise self.mistyped(f, v, "a number") from None
            if not v.is_finite() and not pa.types.is_floating(f.type):
                raise self.mistyped(f, v, "a finite number")
        if isinstance(v, int):
            return decimal.Decimal(v)
        if isinstance(v, decimal.Decimal):
            return v
        if isinstance(v, float):
            return v if not math.isfinite(v) else decimal.Decimal(repr(v))
        raise self.mistyped(f, v, "a number")

    def mistyped(self, f: pa.Field, v: Any, want: str) -> InvalidRequest:
        shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:60] + "..."
        return InvalidRequest(
            f"invalid filter: column {f.name!r} is {f.type}; compare it with {want}, not {shown}",
            column=f.name,
        )

    def value(self, f: pa.Field, v: Any) -> Any:
        """``v`` as a value of the (non-grid) column's type."""
        t = f.type
        if pa.types.is_floating(t):
            n = self.number(f, v)
            return float(n)
        if pa.types.is_boolean(t):
            if not isinstance(v, bool):
                raise self.mistyped(f, v, "true or false")
            return v
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if not isinstance(v, str):
                raise self.mistyped(f, v, "a 'quoted string'")
            return v
        if pa.types.is_timestamp(t):
            return self.timestamp(f, v)
        if pa.types.is_date(t):
            if not isinstance(v, str):
                raise self.mistyped(f, v, "an ISO date such as '2024-01-31'")
            try:
                return dt.date.fromisoformat(v)
            except ValueError:
                raise self.mistyped(f, v, "an ISO date such as '2024-01-31'") from None
        if pa.types.is_time(t):
            if not isinstance(v, str):
                raise self.mistyped(f, v, "an ISO time such as '12:30:00'")
            try:
                return dt.time.fromisoformat(v)
            except ValueError:
                raise self.mistyped(f, v, "an ISO time such as '12:30:00'") from None
        raise self.mistyped(f, v, "nothing: its type takes no filter")  # pragma: no cover

    def timestamp(self, f: pa.Field, v: Any) -> dt.datetime:
        zoned = f.type.tz is not None
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC if zoned else None)
        want = "an ISO-8601 time such as '2024-01-31T12:00:00" + ("Z'" if zoned else "'")
        if isinstance(v, int) and not isinstance(v, bool):
            try:
                return epoch + dt.timedelta(microseconds=v)
            except OverflowError:
                raise self.mistyped(f, v, "microseconds within years 1 to 9999") from None
        if not isinstance(v, str):
            raise self.mistyped(f, v, want)
        try:
            when = dt.datetime.fromisoformat(v)
        except ValueError:
            raise self.mistyped(f, v, want) from None
        if zoned:
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            try:
                return when.astimezone(dt.UTC)
            except OverflowError:
                raise self.mistyped(f, v, "a time within years 1 to 9999") from None
        if when.tzinfo is not None:
            raise self.mistyped(f, v, "a time without an offset (the column is naive)")
        return when

    # predicates ---------------------------------------------------------------------
    def compare(self, e: Compare) -> Expr:
        f = self.field(e.column, "comparison")
        grid = _grid(f.type)
        if grid is None:
            value = self.value(f, e.value)
            if isinstance(value, float) and math.isnan(value):
                # SQL: a comparison with NaN is false... except Arrow orders NaN; be exact.
                return IsNull(e.column, True) if e.op == "!=" else ALWAYS_FALSE
            return Compare(e.column, e.op, value)
        v = self.number(f, e.value)
        if isinstance(v, float):  # an infinity (NaN cannot reach a grid column)
            v = grid.hi + 1 if v > 0 else grid.lo - 1
        not_null = IsNull(e.column, True)
        op = e.op
        if op in ("=", "!="):
            on_grid = grid.holds(v)
            if op == "=":
                return Compare(e.column, "=", grid.to_value(v)) if on_grid else ALWAYS_FALSE
            return Compare(e.column, "!=", grid.to_value(v)) if on_grid else not_null
        # Ranges: the tightest bound on the grid, then clamped to the type's range.
        if op in (">", ">="):
            bound = _CTX.add(grid.floor(v), grid.step) if op == ">" else grid.ceil(v)
            if bound <= grid.lo:
                return not_null
            if bound > grid.hi:
                return ALWAYS_FALSE
            return Compare(e.column, ">=", grid.to_value(bound))
        bound = _CTX.subtract(grid.ceil(v), grid.step) if op == "<" else grid.floor(v)
        if bound >= grid.hi:
            return not_null
        if bound < grid.lo:
            return ALWAYS_FALSE
        return Compare(e.column, "<=", grid.to_value(bound))

    def in_(self, e: In) -> Expr:
        f = self.field(e.column, "'in' list")
        grid = _grid(f.type)
        values: list[Any] = []
        for raw in e.values:
            if grid is None:
                v = self.value(f, raw)
                if isinstance(v, float) and math.isnan(v):
                    continue  # NaN equals nothing
                values.append(v)
                continue
            n = self.number(f, raw)
            if isinstance(n, decimal.Decimal) and grid.holds(n):
                values.append(grid.to_value(n))
        unique = tuple(dict.fromkeys(values))
        if not unique:
            return IsNull(e.column, True) if e.negated else ALWAYS_FALSE
        return In(e.column, unique, e.negated)

    def leaf(self, e: Expr) -> Expr:
        if isinstance(e, Compare):
            return self.compare(e)
        if isinstance(e, In):
            return self.in_(e)
        if isinstance(e, IsNull):
            self.field(e.column, "null check")
            return e
        if isinstance(e, IsNaN):
            f = self.field(e.column, "'is nan'")
            if not pa.types.is_floating(f.type):
                # Only floating columns hold NaN (and a null is not NaN).
                return ALWAYS_TRUE if e.negated else ALWAYS_FALSE
            return e
        if isinstance(e, StartsWith):
            f = self.field(e.column, "'like'")
            if not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
                raise self.mistyped(f, e.prefix + "%", "no 'like' pattern (it is not a string)")
            return e
        raise TypeError(f"not a filter node: {e!r}")  # pragma: no cover

    def bind(self, e: Expr, negate: bool = False) -> Expr:
        """``e`` (negated when ``negate``) with negations pushed to the leaves."""
        if isinstance(e, Not):
            return self.bind(e.child, not negate)
        if isinstance(e, Const):
            return Const(e.value != negate)
        if isinstance(e, And | Or):
            children = [self.bind(c, negate) for c in e.children]
            conj = isinstance(e, And) != negate
            return _conjunction(children) if conj else _disjunction(children)
        # A leaf is negated before it is normalised: normal forms such as "v is not null"
        # for "v != 1.5" hold only un-negated (its negation is false, not "v is null").
        return self.leaf(_negate(e) if negate else e)


def _negate(e: Expr) -> Expr:
    """The negation of a leaf."""
    if isinstance(e, Const):
        return Const(not e.value)
    if isinstance(e, Compare):
        return Compare(e.column, _NEGATED_OP[e.op], e.value)
    if isinstance(e, In):
        return In(e.column, e.values, not e.negated)
    if isinstance(e, IsNull):
        return IsNull(e.column, not e.negated)
    if isinstance(e, IsNaN):
        return IsNaN(e.column, not e.negated)
    if isinstance(e, StartsWith):
        return StartsWith(e.column, e.prefix, not e.negated)
    raise TypeError(f"not a filter leaf: {e!r}")  # pragma: no cover


def _conjunction(children: Iterable[Expr]) -> Expr:
    flat: list[Expr] = []
    for c in children:
        if c == ALWAYS_FALSE:
            return ALWAYS_FALSE
        if c == ALWAYS_TRUE:
            continue
        flat.extend(c.children if isinstance(c, And) else [c])
    if not flat:
        return ALWAYS_TRUE
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def _disjunction(children: Iterable[Expr]) -> Expr:
    flat: list[Expr] = []
    for c in children:
        if c == ALWAYS_TRUE:
            return ALWAYS_TRUE
        if c == ALWAYS_FALSE:
            continue
        flat.extend(c.children if isinstance(c, Or) else [c])
    if not flat:
        return ALWAYS_FALSE
    return flat[0] if len(flat) == 1 else Or(tuple(flat))


def bind(expr: Expr, schema: pa.Schema) -> Expr:
    """``expr`` checked against ``schema`` and normalised (see the module docstring).

    Raises:
        InvalidRequest: an unknown column, a column whose type takes no filter, or a
            literal that does not fit the column (each named in the message).
    """
    return _Binder(schema).bind(expr)


def compile_filter(
    text: str | None, schema: pa.Schema, limits: FilterLimits = DEFAULT_LIMITS
) -> Expr | None:
    """Parse and bind a filter text; None when there is nothing to filter (no text, or a
    filter that is always true).

    Raises:
        InvalidRequest: see :func:`parse` and :func:`bind`.
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidRequest("filter must be a string")
    if not text.strip():
        return None
    bound = bind(parse(text, limits), schema)
    return None if bound == ALWAYS_TRUE else bound


# --------------------------------------------------------------------------------------
# Using a bound tree
# --------------------------------------------------------------------------------------
def balanced(items: Sequence[Any], join: Callable[[Any, Any], Any]) -> Any:
    """``items`` joined pairwise into a tree of depth log2(n), never a chain of depth n
    (deep chains overflow recursive visitors and Arrow's expression simplifier)."""
    level = list(items)
    while len(level) > 1:
        nxt = [join(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _scalar(schema: pa.Schema, column: str, value: Any) -> pa.Scalar:
    t = schema.field(column).type
    # Floats compare as float64, so a float32 column is widened, never the literal rounded.
    return pa.scalar(value, pa.float64() if pa.types.is_floating(t) else t)


def to_arrow(expr: Expr, schema: pa.Schema) -> pc.Expression:
    """The Arrow compute expression of a bound tree over rows of ``schema``."""
    if isinstance(expr, Const):
        return pc.scalar(expr.value)
    if isinstance(expr, And):
        return balanced([to_arrow(c, schema) for c in expr.children], lambda a, b: a & b)
    if isinstance(expr, Or):
        return balanced([to_arrow(c, schema) for c in expr.children], lambda a, b: a | b)
    if isinstance(expr, Compare):
        field, value = pc.field(expr.column), _scalar(schema, expr.column, expr.value)
        ops: dict[str, Callable[[Any, Any], pc.Expression]] = {
            "=": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b,
        }
        return ops[expr.op](field, value)
    if isinstance(expr, In):
        t = schema.field(expr.column).type
        values = pa.array(expr.values, pa.float64() if pa.types.is_floating(t) else t)
        field = pc.field(expr.column)
        if pa.types.is_floating(t):
            field = field.cast(pa.float64())
        found = field.isin(values)
        # is_in answers false for a null; a null must stay unknown under 'not in' too.
        return (~found & pc.field(expr.column).is_valid()) if expr.negated else found
    if isinstance(expr, IsNull):
        f = pc.field(expr.column)
        return f.is_valid() if expr.negated else f.is_null()
    if isinstance(expr, IsNaN):
        nan = pc.is_nan(pc.field(expr.column))
        # Iceberg: a null is not NaN, so 'is not nan' keeps it.
        return (~nan | pc.field(expr.column).is_null()) if expr.negated else nan
    if isinstance(expr, StartsWith):
        found = pc.starts_with(pc.field(expr.column), pattern=expr.prefix)
        return ~found if expr.negated else found
    raise TypeError(f"not a bound filter node: {expr!r}")  # pragma: no cover


def columns_of(expr: Expr | None) -> set[str]:
    """The columns a tree reads."""
    if expr is None or isinstance(expr, Const):
        return set()
    if isinstance(expr, And | Or):
        return set().union(*(columns_of(c) for c in expr.children))
    if isinstance(expr, Not):
        return columns_of(expr.child)
    if isinstance(expr, Compare | In | IsNull | IsNaN | StartsWith):
        return {expr.column}
    raise TypeError(f"not a filter node: {expr!r}")  # pragma: no cover


def _literal_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        value = value.isoformat()
    return "'" + str(value).replace("'", "''") + "'"


def _name_text(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and name.lower() not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def to_text(expr: Expr) -> str:
    """The filter text of a tree (bound or not); :func:`parse` reads it back."""
    if isinstance(expr, Const):
        return "true" if expr.value else "false"
    if isinstance(expr, And | Or):
        joiner = " and " if isinstance(expr, And) else " or "
        return joiner.join(f"({to_text(c)})" for c in expr.children)
    if isinstance(expr, Not):
        return f"not ({to_text(expr.child)})"
    if isinstance(expr, Compare):
        return f"{_name_text(expr.column)} {expr.op} {_literal_text(expr.value)}"
    if isinstance(expr, In):
        values = ", ".join(_literal_text(v) for v in expr.values)
        return f"{_name_text(expr.column)} {'not in' if expr.negated else 'in'} ({values})"
    if isinstance(expr, IsNull):
        return f"{_name_text(expr.column)} is {'not ' if expr.negated else ''}null"
    if isinstance(expr, IsNaN):
        return f"{_name_text(expr.column)} is {'not ' if expr.negated else ''}nan"
    if isinstance(expr, StartsWith):
        pattern = _literal_text(expr.prefix + "%")
        return f"{_name_text(expr.column)} {'not like' if expr.negated else 'like'} {pattern}"
    raise TypeError(f"not a filter node: {expr!r}")  # pragma: no cover
