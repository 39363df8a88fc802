"""Delta rule for queries partitioned by one join key: outer joins, EXISTS, IN, correlated scalar subqueries.

When every table occurrence of a query is tied to the others by equalities
on one key (``a.id = b.a_id`` in a LEFT JOIN, ``b.k = a.k`` in an EXISTS
subquery, ``a.g IN (SELECT c.g …)``, ``(SELECT count(*) FROM b WHERE
b.k = a.k)``), each result row depends only on source
rows with the same key value. The change of the result is then

    ΔQ = Q(state after | K) − Q(state before | K)

where K is the set of keys the changes touch, "state after | K" is read from
PostgreSQL at the refresh snapshot with ``key = ANY(K)`` pushed down, and
"state before | K" is that minus the delta (Z-set subtraction). This handles
the non-linear operators the linear rule cannot (LEFT / RIGHT / FULL JOIN,
EXISTS, NOT EXISTS, IN), and a GROUP BY or DISTINCT on top as long as the
key is grouped / output.

``x NOT IN (SELECT y …)`` (uncorrelated) is partitioned too, with NULL
semantics: the subquery's tables are read with their NULL-key rows as well
(one NULL ``y`` makes every ``x NOT IN`` unknown), and the refresh falls back
to a recompute when the change itself involves a NULL key or may empty the
subquery (:class:`NotInSubquery`). Pure: sqlglot trees only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm.linear import (
    OCC_SCHEMA,
    NotDifferentiable,
    Occurrence,
    RecomputeOnly,
    conjuncts,
    strip_parens,
)
from pgtrickle.sql.translate import is_correlated


@dataclass(frozen=True)
class KeyedOccurrence:
    occurrence: Occurrence
    key_column: str
    null_sensitive: bool = False
    """Inside a NOT IN subquery: its NULL-key rows matter to every key."""


@dataclass(frozen=True)
class NotInSubquery:
    sql: str
    """The subquery as PostgreSQL text over the real tables (uncorrelated): is it empty?"""
    occurrences: frozenset[int]


@dataclass(frozen=True)
class PartitionedShape:
    query: exp.Query
    """The query with every table renamed to ``pgt_occ.o<i>`` (aliased as before)."""
    occurrences: tuple[KeyedOccurrence, ...]
    not_in: tuple[NotInSubquery, ...] = ()


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(self, x: tuple[str, str]) -> tuple[str, str]:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: tuple[str, str], b: tuple[str, str]) -> None:
        self.parent[self.find(a)] = self.find(b)


def _column_key(node: exp.Expr) -> tuple[str, str] | None:
    node = strip_parens(node)
    if isinstance(node, exp.Column) and node.table:
        return (node.table, node.name)
    return None


def _selects(select: exp.Select) -> Iterator[exp.Select]:
    """``select`` and the SELECTs of its EXISTS / IN and scalar subqueries (checked to be simple)."""
    yield select
    for conjunct in conjuncts(select.args["where"].this if select.args.get("where") else None):
        inner = _subquery_of(conjunct)
        if inner is not None:
            yield from _selects(inner)
    for sub in _scalar_subqueries(select):
        yield from _selects(sub.this)


def _scalar_subqueries(select: exp.Select) -> Iterator[exp.Subquery]:
    """Scalar subqueries of ``select``'s output list and WHERE clause (not nested deeper)."""
    where = select.args.get("where")
    for node in [*select.expressions, *([where.this] if where is not None else [])]:
        for sub in node.find_all(exp.Subquery):
            if (
                sub.alias
                or isinstance(sub.parent, (exp.In, exp.Exists))
                or isinstance(sub.this, exp.Subquery)
            ):
                continue
            if sub.find_ancestor(exp.Select) is not select:
                continue
            if not isinstance(sub.this, exp.Select):
                raise RecomputeOnly("a scalar subquery over a set operation")
            yield sub


def _subquery_of(conjunct: exp.Expr) -> exp.Select | None:
    node = strip_parens(conjunct)
    if isinstance(node, exp.Not):
        node = strip_parens(node.this)
    if isinstance(node, exp.Exists):
        inner = node.this
    elif isinstance(node, exp.In) and node.args.get("query") is not None:
        inner = node.args["query"]
        inner = inner.this if isinstance(inner, exp.Subquery) else inner
    else:
        return None
    if not isinstance(inner, exp.Select):
        raise NotDifferentiable("a set operation inside EXISTS / IN")
    return inner


def analyze_partitioned(select: exp.Select) -> PartitionedShape:
    """Raise NotDifferentiable unless the whole query is partitioned by one join key."""
    select = select.copy()
    if select.args.get("limit") or select.args.get("offset"):
        raise RecomputeOnly("ORDER BY ... LIMIT (top-k)")
    if any(node.find(exp.Window) for node in select.expressions):
        raise RecomputeOnly("window functions with outer joins or subqueries")
    uf = _UnionFind()
    aliases: dict[str, exp.Table] = {}
    scalar = {id(sub.this) for part in _selects(select) for sub in _scalar_subqueries(part)}
    not_in = _not_in_subqueries(select)
    parts = {id(part) for part in _selects(select)}
    for inner in select.find_all(exp.Select):
        if id(inner) not in parts and not (isinstance(inner.parent, exp.Subquery) and inner.parent.alias):
            raise RecomputeOnly("a subquery compared with ANY / ALL")
    for part in _selects(select):
        _qualify_single_table(part)
    for part in _selects(select):
        for subquery in part.find_all(exp.Subquery):
            if subquery.alias and subquery.find_ancestor(exp.Select) is part:
                raise NotDifferentiable("a derived table next to an outer join or subquery")
        for table in _own_tables(part):
            if not table.text("db"):
                raise NotDifferentiable(f"a reference to {table.name} that is not a table")
            alias = table.alias or table.name
            if alias in aliases:
                raise NotDifferentiable(f"the alias {alias} used twice")
            aliases[alias] = table
        conditions = [j.args["on"] for j in _joins(part) if j.args.get("on") is not None]
        if any(j.args.get("using") for j in _joins(part)):
            raise NotDifferentiable("JOIN ... USING next to an outer join")
        if part.args.get("where") is not None:
            conditions.append(part.args["where"].this)
        for condition in conditions:
            for conjunct in conjuncts(condition):
                node = strip_parens(conjunct)
                if isinstance(node, exp.EQ):
                    left, right = _column_key(node.this), _column_key(node.expression)
                    if left and right and left[0] != right[0]:
                        uf.union(left, right)
                elif isinstance(node, exp.Not) and isinstance(strip_parens(node.this), exp.In):
                    node = strip_parens(node.this)
                if isinstance(node, exp.In) and node.args.get("query") is not None:
                    inner = node.args["query"]
                    inner = inner.this if isinstance(inner, exp.Subquery) else inner
                    outer = _column_key(node.this)
                    projected = _column_key(inner.expressions[0]) if len(inner.expressions) == 1 else None
                    if outer and projected:
                        uf.union(outer, projected)
        for node in [*part.expressions, *conditions]:
            for sub in node.find_all(exp.Subquery):
                inner = sub.this
                while isinstance(inner, exp.Subquery):
                    inner = inner.this
                if (
                    sub.find_ancestor(exp.Exists, exp.In) is None
                    and not sub.alias
                    and id(inner) not in scalar
                ):
                    raise RecomputeOnly("a scalar subquery")
    if not aliases:
        raise NotDifferentiable("a query without tables")
    classes: dict[tuple[str, str], dict[str, str]] = {}
    for alias, column in list(uf.parent):
        root = uf.find((alias, column))
        classes.setdefault(root, {}).setdefault(alias, column)
    chosen = next((members for members in classes.values() if set(members) == set(aliases)), None)
    if chosen is None:
        if scalar:
            raise RecomputeOnly("a scalar subquery not tied to the rest of the query by one key")
        raise NotDifferentiable("an outer join or subquery whose tables are not all joined on one key")
    _check_top(select, chosen)
    not_in_sql = {id(inner): inner.sql("postgres") for inner in not_in}
    not_in_aliases = {id(inner): {t.alias_or_name for t in inner.find_all(exp.Table)} for inner in not_in}
    occurrences = []
    indexes: dict[str, int] = {}
    for index, (alias, table) in enumerate(sorted(aliases.items(), key=lambda kv: _position(kv[1]))):
        sensitive = any(alias in names for names in not_in_aliases.values())
        occurrences.append(
            KeyedOccurrence(Occurrence(index, table.text("db"), table.name, alias), chosen[alias], sensitive)
        )
        indexes[alias] = index
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=table.this.quoted)))
        table.set("this", exp.to_identifier(f"o{index}"))
        table.set("db", exp.to_identifier(OCC_SCHEMA))
    select.set("order", None)
    subqueries = tuple(
        NotInSubquery(not_in_sql[key], frozenset(indexes[a] for a in names))
        for key, names in not_in_aliases.items()
    )
    return PartitionedShape(select, tuple(occurrences), subqueries)


def _not_in_subqueries(select: exp.Select) -> list[exp.Select]:
    """The subqueries of ``x NOT IN (SELECT …)`` conjuncts; each must be uncorrelated."""
    found = []
    for part in _selects(select):
        for conjunct in conjuncts(part.args["where"].this if part.args.get("where") else None):
            node = strip_parens(conjunct)
            if not (isinstance(node, exp.Not) and isinstance(strip_parens(node.this), exp.In)):
                continue
            inner = _subquery_of(conjunct)
            if inner is None:
                continue
            if is_correlated(inner):
                raise RecomputeOnly("NOT IN (a correlated subquery)")
            if any(
                isinstance(s, (exp.Subquery, exp.Exists)) for s in inner.find_all(exp.Subquery, exp.Exists)
            ):
                raise RecomputeOnly("NOT IN (a subquery with its own subqueries)")
            found.append(inner)
    return found


def _qualify_single_table(select: exp.Select) -> None:
    """PostgreSQL leaves columns of a one-table SELECT unqualified: qualify them with its alias."""
    tables = list(_own_tables(select))
    if len(tables) != 1:
        return
    alias = tables[0].alias or tables[0].name
    for column in select.find_all(exp.Column):
        if not column.table and column.find_ancestor(exp.Select) is select:
            column.set("table", exp.to_identifier(alias, quoted=True))


def _position(table: exp.Table) -> int:
    start = table.this.meta.get("start")
    return start if isinstance(start, int) else 0


def _joins(select: exp.Select) -> Iterator[exp.Join]:
    for join in select.find_all(exp.Join):
        if join.find_ancestor(exp.Select) is select:
            yield join


def _own_tables(select: exp.Select) -> Iterator[exp.Table]:
    for table in select.find_all(exp.Table):
        owner = table.find_ancestor(exp.Select)
        if owner is select and not isinstance(table.parent, exp.Lock):
            yield table


def _check_top(select: exp.Select, key_columns: dict[str, str]) -> None:
    """A GROUP BY must group by the key, a DISTINCT must output it (else groups mix keys)."""
    keys = {(alias, column) for alias, column in key_columns.items()}
    group = select.args.get("group")
    has_agg = any(
        agg.find_ancestor(exp.Select) is select
        for node in select.expressions
        for agg in node.find_all(exp.AggFunc)
    )
    if group is not None or has_agg:
        group_keys = {_column_key(g) for g in (group.expressions if group is not None else [])}
        if not group_keys & keys:
            raise NotDifferentiable("a GROUP BY without the join key next to an outer join or subquery")
    if select.args.get("distinct"):
        outputs = {
            _column_key(node.this if isinstance(node, exp.Alias) else node) for node in select.expressions
        }
        if not outputs & keys:
            raise NotDifferentiable("a DISTINCT without the join key next to an outer join or subquery")
