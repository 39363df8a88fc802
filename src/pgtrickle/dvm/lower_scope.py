"""Name resolution for the lowering: unique column names, FROM-item bindings, scopes.

Pure. Every column of every node the lowering builds gets a name unique in
the whole tree (:class:`Names`), so a join's two inputs never share a name
and an expression can name any column of a join's inputs without a
qualifier. A :class:`Scope` is one SELECT's view of its FROM clause: each
FROM item is a :class:`Binding` from the names the query writes
(``alias.column``) to those unique names. Resolving an expression
(:meth:`Scope.resolve`) replaces every ``exp.Column`` by the unique name it
denotes, unqualified — the form :mod:`pgtrickle.dvm.ir` expects. A name not
found in the scope is looked up in the enclosing query's scope (a correlated
reference); the caller learns which outer names an expression used and
decides whether that correlation can be lifted into a join condition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from pgtrickle.errors import NoDeltaRuleError, UnsupportedQueryError

PLACEHOLDER = "pgt_resolved"
"""Meta key of a column that already names a unique column (a decorrelated subquery's value)."""

_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")


def col(name: str) -> exp.Column:
    """An unqualified reference to the column ``name`` (quoted when it needs quoting)."""
    return exp.column(name, quoted=not _PLAIN.fullmatch(name))


def conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed terms of a predicate, parentheses stripped (none for ``None``)."""
    if node is None:
        return []
    node = unparen(node)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def conjoin(terms: Sequence[exp.Expr]) -> exp.Expr | None:
    """``t1 AND t2 AND ...`` (``None`` for no term)."""
    if not terms:
        return None
    result = terms[0]
    for term in terms[1:]:
        result = exp.and_(result, term, copy=False)
    return result


def unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def same(a: exp.Expr, b: exp.Expr) -> bool:
    """Whether two expressions are the same up to redundant parentheses."""

    def strip(n: exp.Expr) -> exp.Expr:
        return n.this if isinstance(n, exp.Paren) else n

    return a.copy().transform(strip, copy=False) == b.copy().transform(strip, copy=False)


def column_names(node: exp.Expr) -> set[str]:
    """The unqualified column names an expression (already resolved) reads."""
    return {c.name for c in node.find_all(exp.Column)}


def refuse(construct: str, detail: str = "") -> NoDeltaRuleError:
    """The error for a construct the delta engine has no rule for."""
    return NoDeltaRuleError(construct, detail)


class Names:
    """Allocates column names unique in one lowered tree: ``base``, else ``base_1``, ``base_2``..."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def fresh(self, base: str) -> str:
        base = base or "col"
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name


@dataclass
class Binding:
    """One FROM item as a query names it: ``alias`` and its columns, visible name -> unique name."""

    alias: str
    columns: dict[str, str]

    def names(self) -> list[str]:
        return list(self.columns)


@dataclass
class Scope:
    """The names one SELECT can use: its FROM items, its CTEs, and the enclosing query's scope.

    ``merged`` holds the columns a ``USING`` / ``NATURAL`` join merged: written without a
    qualifier they denote the merged column (the left one, the right one of a RIGHT join, or
    ``COALESCE`` of both for a FULL join), and ``SELECT *`` shows them once, first.
    """

    bindings: list[Binding] = field(default_factory=list)
    merged: dict[str, str] = field(default_factory=dict)
    star_order: list[tuple[str | None, str, str]] = field(default_factory=list)
    """``SELECT *`` in order: (alias or None for a merged column, visible name, unique name)."""
    outer: Scope | None = None
    ctes: Mapping[str, object] = field(default_factory=dict)

    def binding(self, alias: str) -> Binding | None:
        for b in self.bindings:
            if b.alias == alias:
                return b
        return None

    def lookup(self, name: str, table: str | None) -> str | None:
        """The unique name of ``table.name`` (or unqualified ``name``) in this scope only."""
        if table:
            b = self.binding(table)
            if b is None:
                return None
            return b.columns.get(name)
        if name in self.merged:
            return self.merged[name]
        found = [b.columns[name] for b in self.bindings if name in b.columns]
        if len(found) > 1:
            raise UnsupportedQueryError(f"column reference {name!r} is ambiguous")
        return found[0] if found else None

    def star(self, table: str | None) -> list[tuple[str, str]]:
        """``(visible name, unique name)`` of ``*`` or ``table.*``."""
        if table is None:
            return [(name, unique) for _, name, unique in self.star_order]
        b = self.binding(table)
        if b is None:
            raise UnsupportedQueryError(f"missing FROM-clause entry for table {table!r} in {table}.*")
        return list(b.columns.items())


@dataclass
class Resolved:
    """An expression over unique names, and the names it took from enclosing queries."""

    expr: exp.Expr
    outer: set[str]
    outer_depth: int = 0
    """How many query levels out the farthest outer reference reaches (0: none)."""


def resolve(node: exp.Expr, scope: Scope) -> Resolved:
    """``node`` with every column reference replaced by its unique name (unqualified).

    Subqueries inside ``node`` must have been replaced before (the lowering decorrelates them).
    """
    outer: set[str] = set()
    depth = 0

    def swap(n: exp.Expr) -> exp.Expr:
        nonlocal depth
        if not isinstance(n, exp.Column) or isinstance(n.this, exp.Star):
            return n
        if isinstance(n.parent, exp.Column) or n.meta.get(PLACEHOLDER):
            return n
        if n.find_ancestor(exp.Subquery, exp.Select, exp.SetOperation) is not None:
            return n
        name, table = n.name, (n.table or None)
        level = 0
        current: Scope | None = scope
        while current is not None:
            unique = current.lookup(name, table)
            if unique is not None:
                if level:
                    outer.add(unique)
                    depth = max(depth, level)
                return col(unique)
            current, level = current.outer, level + 1
        where = f"{table}.{name}" if table else name
        raise UnsupportedQueryError(f"column {where} does not exist in the query's FROM clause")

    expr = node.copy().transform(swap, copy=False)
    return Resolved(expr, outer, depth)


def output_name(node: exp.Expr, position: int) -> str:
    """The name PostgreSQL gives a select-list item: its alias, column name or function name."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    inner = unparen(node)
    if isinstance(inner, exp.Cast):
        return output_name(inner.this, position)
    if isinstance(inner, exp.Func):
        name = inner.name if isinstance(inner, exp.Anonymous) else inner.sql_name()
        return name.lower()
    return "?column?"


def walk_skipping_subqueries(node: exp.Expr) -> Iterator[exp.Expr]:
    """Every node of ``node``'s tree that is not inside a subquery."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in current.iter_expressions():
            if isinstance(child, (exp.Subquery, exp.Select, exp.SetOperation)):
                yield child
                continue
            stack.append(child)


def is_subquery(node: exp.Expr) -> bool:
    return isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation))


def subquery_body(node: exp.Expr) -> exp.Query:
    """The query of a subquery operand: ``(SELECT ...)`` with any parentheses."""
    while isinstance(node, (exp.Paren, exp.Subquery)):
        node = node.this
    if not isinstance(node, exp.Query):
        raise UnsupportedQueryError(f"expected a subquery, found {node.sql('postgres')}")
    return node


def has_subquery(node: exp.Expr) -> bool:
    return any(is_subquery(n) for n in walk_skipping_subqueries(node) if n is not node)


def dedupe(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)
