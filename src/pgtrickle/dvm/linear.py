"""Delta rule for the linear part of a query: scans, filters, projections,
inner and cross joins, derived tables, non-recursive CTEs and UNION ALL.

Such a query is *multilinear* in its table occurrences: as a function of the
Z-sets (rows with integer weights) it reads, it distributes over sums in each
occurrence separately. With only the state after the refresh window readable
(a past snapshot cannot be imported), the change of the result is, by
inclusion–exclusion over the occurrences that changed::

    ΔQ = Σ over non-empty S ⊆ changed occurrences of
         (-1)^(|S|+1) · Q[occurrence ∈ S ↦ its delta, others ↦ state after]

which for one join is the familiar ΔA⋈B₁ + A₁⋈ΔB − ΔA⋈ΔB. Every relation
carries a weight column ``__pgt_w``; each SELECT multiplies the weights of
the relations in its FROM clause, so a join of weighted rows is weighted by
the product. A UNION ALL is a sum: in a term it keeps only the branch that
holds the term's changed occurrences (a branch reading none of them
contributes nothing), or every branch when the term changes none of its
occurrences.

Everything here is pure: it rewrites sqlglot trees of the PostgreSQL query
and never touches a database.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sqlglot import exp

WEIGHT = "__pgt_w"
OCC_SCHEMA = "pgt_occ"
"""Placeholder schema of table occurrences in a weighted template."""

MAX_TERMS = 63
"""More changed occurrences than log2(this + 1) make too many terms: refresh in full."""


class NotDifferentiable(Exception):
    """The query (or this part of it) has no delta rule; the message says which construct.

    ``partitionable``: the construct is an outer join or a subquery, which the partitioned
    analysis (``dvm/partitioned.py``) may still maintain by recomputing the join keys a
    change touches. Callers branch on this flag, never on the message.
    """

    def __init__(self, message: str, *, partitionable: bool = False) -> None:
        super().__init__(message)
        self.partitionable = partitionable


class RecomputeOnly(NotDifferentiable):
    """A construct one change can affect everywhere (top-k, an unpartitioned window, ...).

    The query is recomputed in Spark when a source changes and only the
    difference to the stream table is applied (:class:`RecomputeShape`).
    """


@dataclass(frozen=True)
class Occurrence:
    """One reference to a source table in the query (a self-join has two)."""

    index: int
    schema: str
    table: str
    alias: str


@dataclass(frozen=True)
class EquiLink:
    """``occurrence.column = other.other_column`` holds for every row of a SELECT."""

    column: str
    other: int
    other_column: str


@dataclass
class Weighted:
    """A linear query with a weight column in every SELECT and placeholder tables."""

    query: exp.Query
    occurrences: tuple[Occurrence, ...]

    def occurrence_indexes(self) -> set[int]:
        return {o.index for o in self.occurrences}


# --------------------------------------------------------------------------- structure


def inline_ctes(query: exp.Query) -> exp.Query:
    """Replace every reference to a (non-recursive) CTE by a copy of its body.

    Every ``WITH`` is inlined, not only the top one: a ``WITH`` inside a
    derived table, a subquery or another CTE's body too. The innermost
    ``WITH`` goes first, so by the time an outer one is inlined no inner
    definition of the same name is left to shadow it, and a reference that
    remains in its scope is its own (PostgreSQL's normalized text qualifies
    every real table with its schema, so an unqualified name there is a CTE).
    """
    query = query.copy()
    withs = [w for w in query.find_all(exp.With)]
    for with_ in withs:
        if with_.args.get("recursive"):
            raise NotDifferentiable("WITH RECURSIVE")
    for with_ in sorted(withs, key=lambda w: -w.depth):
        owner = with_.parent
        bodies: dict[str, exp.Query] = {}
        for cte in with_.expressions:
            body = cte.this.copy()
            _replace_cte_refs(body, bodies)
            if cte.args.get("alias") is not None and cte.args["alias"].columns:
                body = _rename_outputs(body, [c.name for c in cte.args["alias"].columns])
            bodies[cte.alias_or_name] = body
        if owner is None:
            continue
        owner.set("with_", None)
        owner.set("with", None)
        _replace_cte_refs(owner, bodies)
    return query


def _rename_outputs(body: exp.Query, names: list[str]) -> exp.Query:
    selects = [body] if isinstance(body, exp.Select) else list(_union_branches(body))
    for select in selects:
        exprs = select.expressions
        for i, name in enumerate(names[: len(exprs)]):
            node = exprs[i]
            inner = node.this if isinstance(node, exp.Alias) else node
            exprs[i] = exp.alias_(inner.copy(), name, quoted=True)
        select.set("expressions", exprs)
    return body


def _replace_cte_refs(node: exp.Expr, bodies: Mapping[str, exp.Query]) -> None:
    for table in list(node.find_all(exp.Table)):
        if table.text("db") or table.name not in bodies:
            continue
        alias = table.alias or table.name
        sub = exp.Subquery(
            this=bodies[table.name].copy(), alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True))
        )
        if table.args.get("joins"):
            sub.set("joins", table.args["joins"])
        table.replace(sub)


def _union_branches(node: exp.Expr) -> Iterator[exp.Select]:
    if isinstance(node, exp.Union):
        yield from _union_branches(node.this)
        yield from _union_branches(node.expression)
    elif isinstance(node, exp.Subquery) and not node.alias:
        yield from _union_branches(node.this)
    elif isinstance(node, exp.Select):
        yield node
    else:
        raise NotDifferentiable(f"{type(node).__name__.upper()} in a set operation")


@dataclass
class FromItem:
    node: exp.Expr  # exp.Table (base) or exp.Subquery (derived)
    alias: str


def from_items(select: exp.Select) -> tuple[list[FromItem], list[exp.Expr]]:
    """The relations of a SELECT's FROM clause and its join conditions.

    Raises NotDifferentiable for outer joins, LATERAL, table functions and
    other constructs that are not linear.
    """
    items: list[FromItem] = []
    conditions: list[exp.Expr] = []

    def visit(node: exp.Expr) -> None:
        if isinstance(node, exp.Table):
            if not isinstance(node.this, exp.Identifier):
                raise NotDifferentiable(f"table function {node.this.sql('postgres')} in FROM")
            items.append(FromItem(node, node.alias or node.name))
            for join in node.args.get("joins") or []:
                visit_join(join)
        elif isinstance(node, exp.Subquery):
            if node.alias:
                items.append(FromItem(node, node.alias))
            else:
                visit(node.this)
            for join in node.args.get("joins") or []:
                visit_join(join)
        elif isinstance(node, exp.Lateral):
            raise NotDifferentiable("LATERAL")
        elif isinstance(node, (exp.Values,)):
            raise NotDifferentiable("VALUES in FROM")
        elif isinstance(node, (exp.Unnest, exp.Explode)):
            raise NotDifferentiable("a set-returning function in FROM")
        else:
            raise NotDifferentiable(f"{type(node).__name__} in FROM")

    def visit_join(join: exp.Join) -> None:
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if side in ("LEFT", "RIGHT", "FULL") or kind in ("OUTER",):
            raise NotDifferentiable(f"{side or kind} OUTER JOIN", partitionable=True)
        if kind in ("SEMI", "ANTI", "LATERAL") or join.args.get("method"):
            raise NotDifferentiable(f"{kind or join.args.get('method')} JOIN")
        if isinstance(join.this, exp.Lateral) or join.args.get("lateral"):
            raise NotDifferentiable("LATERAL")
        visit(join.this)
        if join.args.get("on") is not None:
            conditions.append(join.args["on"])

    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is not None:
        visit(from_.this)
    for join in select.args.get("joins") or []:
        visit_join(join)
    if select.args.get("where") is not None:
        conditions.append(select.args["where"].this)
    return items, conditions


_AGGREGATE_TYPES = (exp.AggFunc,)


def check_linear_select(select: exp.Select) -> None:
    """Raise NotDifferentiable naming the first construct of ``select`` that is not linear."""
    if select.args.get("distinct"):
        raise NotDifferentiable("DISTINCT below the top of the query")
    if select.args.get("group") or select.args.get("having"):
        raise NotDifferentiable("GROUP BY below the top of the query")
    if select.args.get("limit") or select.args.get("offset"):
        raise NotDifferentiable("LIMIT / OFFSET")
    for node in select.expressions:
        if node.find(exp.Window):
            raise NotDifferentiable("window function")
        if node.find(*_AGGREGATE_TYPES):
            raise NotDifferentiable("aggregate below the top of the query")
    items, conditions = from_items(select)
    for node in [*select.expressions, *conditions]:
        if node.find(exp.Subquery, exp.Exists, exp.Query) is not None:
            # (``x <> ALL (SELECT …)`` holds its SELECT without a Subquery node)
            raise NotDifferentiable("an EXISTS / IN / scalar subquery", partitionable=True)
        if node.find(exp.Window):
            raise NotDifferentiable("window function")
    for item in items:
        if isinstance(item.node, exp.Subquery):
            check_linear(item.node.this)


def check_linear(query: exp.Expr) -> None:
    """Raise NotDifferentiable unless ``query`` (CTEs inlined) is linear."""
    if isinstance(query, exp.Subquery) and not query.alias:
        check_linear(query.this)
        return
    if isinstance(query, exp.SetOperation):
        if not isinstance(query, exp.Union) or query.args.get("distinct"):
            name = type(query).__name__.upper()
            distinct = " ALL" if not query.args.get("distinct") else ""
            raise NotDifferentiable(f"{name}{distinct} below the top of the query")
        if query.args.get("limit") or query.args.get("offset"):
            raise NotDifferentiable("LIMIT / OFFSET")
        check_linear(query.this)
        check_linear(query.expression)
        return
    if not isinstance(query, exp.Select):
        raise NotDifferentiable(f"{type(query).__name__} query")
    check_linear_select(query)


# --------------------------------------------------------------------------- weights


def weighted(query: exp.Query) -> Weighted:
    """Copy ``query`` (linear, CTEs inlined) adding ``__pgt_w`` to every SELECT.

    Every source table becomes the placeholder ``pgt_occ.o<i>`` (aliased as
    before, or by its own name), the order of ``i`` being the text order.
    """
    query = query.copy()
    check_linear(query)
    occurrences: list[Occurrence] = []
    for table in list(query.find_all(exp.Table, bfs=False)):
        if not table.text("db") or not isinstance(table.this, exp.Identifier):
            continue
        alias = table.alias or table.name
        index = len(occurrences)
        occurrences.append(Occurrence(index, table.text("db"), table.name, alias))
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=table.this.quoted)))
        table.set("this", exp.to_identifier(f"o{index}"))
        table.set("db", exp.to_identifier(OCC_SCHEMA))
    order = query.args.get("order")
    if order is not None:
        query.set("order", None)
    _add_weights(query)
    return Weighted(query, tuple(occurrences))


def _add_weights(query: exp.Expr) -> None:
    if isinstance(query, exp.Subquery) and not query.alias:
        _add_weights(query.this)
        return
    if isinstance(query, exp.Union):
        _add_weights(query.this)
        _add_weights(query.expression)
        return
    assert isinstance(query, exp.Select)
    items, _ = from_items(query)
    factors: list[exp.Expr] = []
    for item in items:
        if isinstance(item.node, exp.Subquery):
            _add_weights(item.node.this)
            alias = item.node.args.get("alias")
            if alias is not None and alias.columns:
                alias.append("columns", exp.to_identifier(WEIGHT))
        factors.append(exp.column(WEIGHT, table=exp.to_identifier(item.alias, quoted=True)))
    weight: exp.Expr = exp.cast(exp.Literal.number(1), "bigint")
    if factors:
        weight = factors[0]
        for factor in factors[1:]:
            weight = exp.Mul(this=weight, expression=factor)
    query.append("expressions", exp.alias_(weight, WEIGHT))


# --------------------------------------------------------------------------- terms


def _occ_index(table: exp.Table) -> int | None:
    if table.text("db") != OCC_SCHEMA:
        return None
    return int(table.name[1:])


def _occurrences_under(node: exp.Expr) -> set[int]:
    found = set()
    for table in node.find_all(exp.Table):
        index = _occ_index(table)
        if index is not None:
            found.add(index)
    return found


def terms(template: Weighted, changed: set[int]) -> list[tuple[frozenset[int], int]]:
    """The (delta occurrences, sign) of every inclusion–exclusion term."""
    changed_list = sorted(changed)
    if 2 ** len(changed_list) - 1 > MAX_TERMS:
        raise NotDifferentiable(
            f"{len(changed_list)} changed table occurrences (more than {MAX_TERMS} delta terms)"
        )
    result = []
    for size in range(1, len(changed_list) + 1):
        for subset in itertools.combinations(changed_list, size):
            result.append((frozenset(subset), 1 if size % 2 == 1 else -1))
    return result


def term_query(
    template: Weighted, deltas: frozenset[int], view_for: Mapping[tuple[int, bool], str]
) -> exp.Expr | None:
    """The template with occurrences in ``deltas`` reading their delta view.

    ``view_for[(index, is_delta)]`` names the relation (``schema.table`` is
    taken as ``pgt_dvm.<name>``). Returns None when the term is empty (its
    changed occurrences sit in different branches of one UNION ALL).
    """
    query = template.query.copy()
    pruned = _prune(query, deltas)
    if pruned is None:
        return None
    present = _occurrences_under(pruned)
    return bind_views(pruned, {i: view_for[(i, i in deltas)] for i in present})


def term_occurrences(template: Weighted, deltas: frozenset[int]) -> frozenset[int]:
    """The occurrences the term over ``deltas`` reads (UNION ALL branches without its changes drop out)."""
    pruned = _prune(template.query.copy(), deltas)
    return frozenset() if pruned is None else frozenset(_occurrences_under(pruned))


def bind_views(query: exp.Expr, views: Mapping[int, str]) -> exp.Expr:
    """Point every placeholder occurrence ``pgt_occ.o<i>`` at the relation ``pgt_dvm.<views[i]>`` (in place)."""
    for table in list(query.find_all(exp.Table)):
        index = _occ_index(table)
        if index is None:
            continue
        table.set("this", exp.to_identifier(views[index]))
        table.set("db", exp.to_identifier("pgt_dvm"))
    return query


def _prune(node: exp.Expr, deltas: frozenset[int]) -> exp.Expr | None:
    """Keep, in every UNION ALL, only the branch holding this term's changed occurrences."""
    if isinstance(node, exp.Union):
        inside = deltas & _occurrences_under(node)
        branches = [node.this, node.expression]
        if not inside:
            for branch in branches:
                pruned = _prune(branch, deltas)
                assert pruned is not None
            return node
        for branch in branches:
            if inside <= _occurrences_under(branch):
                return _prune(branch, deltas)
        return None
    if isinstance(node, exp.Subquery) and not node.alias:
        inner = _prune(node.this, deltas)
        if inner is None:
            return None
        node.set("this", inner)
        return node
    # A SELECT: prune derived tables in its FROM; an empty one empties the SELECT.
    if isinstance(node, exp.Select):
        items, _ = from_items(node)
        for item in items:
            if isinstance(item.node, exp.Subquery):
                inner = _prune(item.node.this, deltas)
                if inner is None:
                    return None
                item.node.set("this", inner)
        return node
    return node


# --------------------------------------------------------------------------- key links


def equi_links(template: Weighted) -> dict[int, list[EquiLink]]:
    """For each occurrence, the columns equated to a column of another occurrence.

    Only conjuncts of the same SELECT's WHERE / ON conditions between two
    qualified column references of base occurrences count. Used to read the
    state of an occurrence for the keys its partner's delta holds only.
    """
    links: dict[int, list[EquiLink]] = {}
    selects = list(template.query.find_all(exp.Select))
    for select in selects:
        items, conditions = from_items(select)
        alias_to_occ = {}
        for item in items:
            if isinstance(item.node, exp.Table):
                index = _occ_index(item.node)
                if index is not None:
                    alias_to_occ[item.alias] = index
        for condition in conditions:
            for conjunct in conjuncts(condition):
                if not isinstance(conjunct, exp.EQ):
                    continue
                left, right = strip_parens(conjunct.this), strip_parens(conjunct.expression)
                if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
                    continue
                lo, ro = alias_to_occ.get(left.table), alias_to_occ.get(right.table)
                if lo is None or ro is None or lo == ro:
                    continue
                links.setdefault(lo, []).append(EquiLink(left.name, ro, right.name))
                links.setdefault(ro, []).append(EquiLink(right.name, lo, left.name))
    return links


def strip_parens(node: exp.Expr) -> exp.Expr:
    """``node`` without enclosing parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def conjuncts(node: exp.Expr | None) -> Iterator[exp.Expr]:
    """The AND-ed parts of a condition (none for a missing condition)."""
    if node is None:
        return
    node = strip_parens(node)
    if isinstance(node, exp.And):
        yield from conjuncts(node.this)
        yield from conjuncts(node.expression)
    else:
        yield node
