"""Filter text to an unbound tree: a tokenizer and a recursive-descent parser, bounded by
:class:`~gateway.wire.filters.tree.FilterLimits` (see the grammar in
:mod:`gateway.wire.filters`)."""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass
from typing import Any

from gateway.wire.errors import InvalidRequest
from gateway.wire.filters.tree import (
    ALWAYS_FALSE,
    ALWAYS_TRUE,
    DEFAULT_LIMITS,
    And,
    Compare,
    Expr,
    FilterLimits,
    In,
    IsNaN,
    IsNull,
    Not,
    Or,
    StartsWith,
)

__all__ = ["KEYWORDS", "number_literal", "parse"]


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
KEYWORDS = frozenset({"and", "or", "not", "in", "is", "null", "nan", "like", "true", "false"})
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
        if kind == "name" and value.lower() in KEYWORDS:
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
            return number_literal(tok.text)
        if tok.kind == "string":
            return _unquote(tok.text)
        if tok.kind == "keyword" and tok.text in ("true", "false"):
            return tok.text == "true"
        self.i -= 1
        raise self.fail("expected a number, a 'quoted string', true or false")


#: Beyond this power of ten a literal compares like any other that far out: larger than
#: every value of every column type (float64 ends near 1E+308, decimals at 1E+38), or,
#: the other way, closer to zero than any of them but zero (float64 stops near 1E-324).
_FAR = 10_000


def number_literal(text: str) -> decimal.Decimal:
    """A number literal with a point or an exponent, exactly, except that one beyond
    10**±_FAR is taken at 10**±_FAR (same sign): every comparison answers alike, and no
    decimal arithmetic meets an exponent past its context (``7E-9223372036854775809``)."""
    m = re.fullmatch(r"([-+]?)(\d*)(?:\.(\d*))?(?:[eE]([-+]?\d+))?", text)
    if m is None or not (m.group(2) or m.group(3)):
        return decimal.Decimal(text)  # NaN, Infinity; or InvalidOperation
    sign, whole, frac = m.group(1), m.group(2), m.group(3) or ""
    exponent = int(m.group(4) or 0) - len(frac)
    digits = (whole + frac).lstrip("0")
    if not digits:
        return decimal.Decimal(0)
    adjusted = exponent + len(digits) - 1  # the power of ten of the leading digit
    if adjusted > _FAR:
        return decimal.Decimal(f"{sign}1E+{_FAR}")
    if adjusted < -_FAR:
        return decimal.Decimal(f"{sign}1E-{_FAR}")
    return decimal.Decimal(f"{sign}{digits}E{exponent}")


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
