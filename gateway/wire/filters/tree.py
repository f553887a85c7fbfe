"""The filter tree: its nodes, and what bounds a filter's size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALWAYS_FALSE",
    "ALWAYS_TRUE",
    "DEFAULT_LIMITS",
    "NEGATED_OP",
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
]


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
NEGATED_OP = {"=": "!=", "!=": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}


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
