"""Compile an operator IR tree (a defining query, or a delta plan) into ONE SQL query.

Pure: builds a sqlglot tree, touches no database and no Spark. The same tree renders to
Spark SQL (the refresh) or PostgreSQL (tests, EXPLAIN); the IR's expressions have
PostgreSQL semantics and are translated for Spark by :mod:`pgtrickle.sql.translate`.

What the query returns
----------------------
The node's columns, in ``node.columns`` order, then ``__pgt_w`` (BIGINT): the Z-set the
node denotes (:mod:`pgtrickle.dvm.ir`), one row per (row, weight) pair - not necessarily
consolidated (the same row may come back several times, with weights that add up).
:func:`consolidate` turns it into the canonical form a refresh applies: grouped by all
columns, weights summed, zero weights dropped.

How
---
A fold over the tree (children first, shared subtrees once): every node becomes one common
table expression ``__pgt_n<i>`` reading its inputs' CTEs, and the query is
``WITH ... SELECT <columns>, __pgt_w FROM <root>``. Per node:

- ``Scan``: the relation ``reads.post(scan)`` names (it has the scan's ``source_columns``),
  weight 1; ``Delta``: ``reads.delta(scan)`` (source columns plus ``__pgt_w``);
  ``Materialized``: ``reads.materialized(node)`` (the node's columns), weight 1 (its change,
  ``change=True``: the node's columns and ``__pgt_w``);
  ``Values``: literal rows, weight 1.
- ``Filter``/``Project`` keep weights; ``UnionAll`` is UNION ALL; ``Negate`` negates.
- ``Join`` INNER (or cross) multiplies weights. SEMI/ANTI keep the left row's weight where a
  row of the right input's *net* weights (those with a positive sum) does (not) satisfy the
  condition (``EXISTS`` on PostgreSQL, ``LEFT SEMI``/``LEFT ANTI JOIN`` on Spark); an ANTI
  condition ``(l = r) IS NOT FALSE`` gives NOT IN's NULL rules. LEFT/RIGHT/FULL join the
  consolidated positive inputs, weight ``coalesce(wl, 1) * coalesce(wr, 1)`` (a padded row
  keeps its own side's multiplicity).
- ``Distinct``: the rows with a positive net weight, weight 1.
- ``Aggregate``, ``Window``, ``TopK``, ``SetOp``: see :mod:`pgtrickle.dvm.compile_ops`.

A relation whose weights are all positive by construction (a table read, a non-linear
node's output, and what filters, projections, unions and inner joins make of them) is used
by non-linear consumers without the GROUP BY of consolidation (:func:`statically_positive`).

Reads
-----
The relations the query reads, and what the caller does with them: :mod:`pgtrickle.dvm.compiled`.

Column types
------------
``column_types[relation][source column]`` (PostgreSQL type names, e.g. ``"integer"``,
``"numeric(12,2)"``) are propagated through the tree. They decide the Spark translation of
expressions (integer division, casts, ...) and which aggregates are computed by weight;
without them translations fall back to run-time type tests and aggregates to expansion.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from pgtrickle.dvm import compile_ops as ops
from pgtrickle.dvm.compile_sql import (
    DIALECTS,
    Dialect,
    alias,
    bigint,
    cast_untyped,
    col,
    columns_of,
    derived,
    ident,
    one,
    positive,
    render,
    select,
    table,
    weight,
)
from pgtrickle.dvm.compile_types import InvalidPlanError, check_node, node_types, statically_positive
from pgtrickle.dvm.compiled import Compiled, Read, ReadKind, Reads, RelationName, consolidate
from pgtrickle.dvm.ir import (
    WEIGHT,
    Aggregate,
    Delta,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Materialized,
    Negate,
    Node,
    Project,
    Scan,
    SetOp,
    TopK,
    UnionAll,
    Values,
    Window,
    walk,
)

__all__ = [
    "Compiled",
    "InvalidPlanError",
    "Read",
    "ReadKind",
    "Reads",
    "compile_ir",
    "consolidate",
    "statically_positive",
]


def compile_ir(
    node: Node, reads: Reads, *, dialect: Dialect, column_types: Mapping[str, Mapping[str, str]] | None = None
) -> Compiled:
    """Compile ``node`` into one query of ``dialect`` (``"spark"`` or ``"postgres"``).

    Raises:
        InvalidPlanError: the tree breaks the IR's contract (duplicate or reserved column
            names, branches of different widths, a negative limit, an unknown node type...).
        UnsupportedQueryError: (Spark) an expression has no Spark equivalent.
    """
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
    return _Fold(reads, dialect, column_types or {}).run(node)


_LEFT, _RIGHT = "__pgt_l", "__pgt_r"


def _table_read(node: Node) -> bool:
    """Whether ``node`` is a table read (``Scan``) seen through filters and projections. A join
    (Spark) reads such a side inline rather than through its CTE: Spark drops a join strategy
    hint (``BROADCAST`` on the view of a small table, refresh/delta_reads.py) inside a common
    table expression - its optimizer removes hints before it inlines the CTEs - so a small table
    joined by reference would be shuffled, not broadcast (pure)."""
    while isinstance(node, (Filter, Project)):
        node = node.input
    return isinstance(node, Scan)


def _reference_paths(root: Node) -> dict[int, int]:
    """For every node, how many times the query reads it: the number of paths from the root
    (a CTE referenced twice is read twice - Spark and PostgreSQL may inline it) (pure)."""
    order = list(walk(root))
    paths = {id(node): 0 for node in order}
    paths[id(root)] = 1
    for node in reversed(order):  # parents before children
        for child in node.inputs:
            paths[id(child)] += paths[id(node)]
    return paths


class _Fold:
    """One compilation: CTEs by node, reads by name, types and positivity by node."""

    def __init__(self, reads: Reads, dialect: Dialect, column_types: Mapping[str, Mapping[str, str]]) -> None:
        self._reads = reads
        self._dialect = dialect
        self._column_types = column_types
        self._ctes: list[exp.CTE] = []
        self._cte_of: dict[int, str] = {}
        self._read_order: list[tuple[ReadKind, RelationName]] = []
        self._read_first: dict[tuple[ReadKind, RelationName], Node] = {}
        self._read_by_node: dict[int, tuple[ReadKind, RelationName]] = {}
        self._types: dict[int, dict[str, str | None]] = {}
        self._positive: dict[int, bool] = {}
        self._inline: dict[int, exp.Query] = {}
        self._inlining = False

    def run(self, root: Node) -> Compiled:
        nodes = tuple(walk(root))
        for node in nodes:
            check_node(node)
            body = self._body(node)
            name = f"__pgt_n{len(self._ctes)}"
            self._ctes.append(exp.CTE(this=body, alias=exp.TableAlias(this=ident(name))))
            self._cte_of[id(node)] = name
            if self._dialect == "spark" and _table_read(node):
                self._inlining = True
                try:
                    self._inline[id(node)] = self._body(node)
                finally:
                    self._inlining = False
        query = select([*columns_of(root.columns), weight()], table(self._cte_of[id(root)]))
        query.set("with_", exp.With(expressions=self._ctes))
        paths = _reference_paths(root)
        uses: dict[tuple[ReadKind, RelationName], int] = {}
        for node_id, key in self._read_by_node.items():
            uses[key] = uses.get(key, 0) + paths[node_id]
        reads = tuple(
            Read(kind, name, self._read_first[(kind, name)], uses[(kind, name)])
            for kind, name in self._read_order
        )
        return Compiled(query, tuple(root.columns), reads, self._dialect, nodes)

    # -- helpers

    def _ref(self, node: Node, as_: str | None = None) -> exp.Table | exp.Subquery:
        """``node``'s CTE as a FROM item; a side of a join that only reads a table (Spark) is
        that read itself (:func:`_table_read`)."""
        inline = self._inline.get(id(node))
        if inline is not None and (self._inlining or as_ in (_LEFT, _RIGHT)):
            return derived(inline.copy(), as_ or self._cte_of[id(node)])
        return table(self._cte_of[id(node)], as_)

    def _types_of(self, node: Node) -> dict[str, str | None]:
        return node_types(node, self._column_types, self._types)

    def _render(self, expression: exp.Expr, node: Node) -> exp.Expr:
        return render(expression, self._types_of(node), self._dialect)

    def _positive_source(self, node: Node, as_: str) -> exp.Expr:
        """``node``'s consolidated positive weights, as a FROM item named ``as_``."""
        if statically_positive(node, self._positive):
            return self._ref(node, as_)
        return derived(positive(self._ref(node), list(node.columns)), as_)

    def _read(self, kind: ReadKind, node: Node, reader: Node, name: object) -> exp.Table:
        """The FROM item of ``reader`` (a leaf of the tree) reading relation ``name``."""
        given: object = (name,) if isinstance(name, str) else name
        if not (
            isinstance(given, tuple) and 1 <= len(given) <= 3 and all(isinstance(p, str) and p for p in given)
        ):
            raise InvalidPlanError(
                f"the reads resolver gave {name!r} for a {kind.value} read; it must give "
                "a relation name (a non-empty string, or a tuple of 1 to 3 of them)"
            )
        parts: tuple[str, ...] = given
        key: tuple[ReadKind, RelationName] = (kind, parts if len(parts) > 1 else parts[0])
        if key not in self._read_first:
            self._read_order.append(key)
            self._read_first[key] = node
        self._read_by_node[id(reader)] = key
        return table(parts, "__pgt_src")

    # -- one CTE body per node type

    def _body(self, node: Node) -> exp.Query:
        if isinstance(node, Scan):
            source = self._read(ReadKind.POST, node, node, self._reads.post(node))
            renamed = zip(node.source_columns, node.output, strict=True)
            return select([*(alias(col(s), o) for s, o in renamed), alias(one(), WEIGHT)], source)
        if isinstance(node, Delta):
            scan = node.scan
            source = self._read(ReadKind.DELTA, scan, node, self._reads.delta(scan))
            renamed = zip(scan.source_columns, scan.output, strict=True)
            return select([*(alias(col(s), o) for s, o in renamed), alias(bigint(weight()), WEIGHT)], source)
        if isinstance(node, Materialized):
            source = self._read(ReadKind.MATERIALIZED, node, node, self._reads.materialized(node))
            w = bigint(weight()) if node.change else one()
            return select([*columns_of(node.columns), alias(w, WEIGHT)], source)
        if isinstance(node, Values):
            return self._values(node)
        if isinstance(node, Filter):
            query = select([*columns_of(node.columns), weight()], self._ref(node.input))
            query.set("where", exp.Where(this=self._render(node.predicate, node.input)))
            return query
        if isinstance(node, Project):
            return select(
                [*(alias(self._render(e, node.input), n) for n, e in node.outputs), weight()],
                self._ref(node.input),
            )
        if isinstance(node, Negate):
            return select(
                [*columns_of(node.columns), alias(exp.Neg(this=weight()), WEIGHT)], self._ref(node.input)
            )
        if isinstance(node, UnionAll):
            target = self._types_of(node)
            branches = []
            for b in node.branches:
                own = self._types_of(b)
                branches.append(
                    select(
                        [
                            *(
                                alias(cast_untyped(col(c), own[c], target[o], self._dialect), o)
                                for c, o in zip(b.columns, node.output, strict=True)
                            ),
                            weight(),
                        ],
                        self._ref(b),
                    )
                )
            united: exp.Query = branches[0]
            for branch in branches[1:]:
                united = exp.union(united, branch, distinct=False)
            return united
        if isinstance(node, Join):
            return self._join(node)
        if isinstance(node, Distinct):
            names = list(node.columns)
            query = positive(self._ref(node.input), names)
            query.set("expressions", [*columns_of(names), alias(one(), WEIGHT)])
            return query
        if isinstance(node, Aggregate):
            return ops.aggregate(
                self._positive_source(node.input, "__pgt_p"),
                list(node.input.columns),
                self._types_of(node.input),
                node.keys,
                node.aggregates,
                self._dialect,
            )
        if isinstance(node, Window):
            return ops.window(
                self._positive_source(node.input, "__pgt_p"),
                list(node.input.columns),
                self._types_of(node.input),
                node.functions,
                self._dialect,
            )
        if isinstance(node, TopK):
            return ops.top_k(
                self._positive_source(node.input, "__pgt_p"),
                list(node.columns),
                self._types_of(node.input),
                node.order,
                node.limit,
                node.offset,
                self._dialect,
            )
        if isinstance(node, SetOp):
            return ops.set_operation(
                self._ref(node.left),
                list(node.left.columns),
                self._ref(node.right),
                list(node.right.columns),
                list(node.output),
                node.kind,
                node.all,
            )
        raise InvalidPlanError(f"the IR compiler has no rule for {type(node).__name__} nodes")

    def _values(self, node: Values) -> exp.Query:
        rows = [
            select(
                [
                    *(
                        alias(render(value, {}, self._dialect), name)
                        for value, name in zip(row, node.output, strict=True)
                    ),
                    alias(one(), WEIGHT),
                ]
            )
            for row in node.rows
        ]
        if not rows:
            empty = select([*(alias(exp.Null(), n) for n in node.output), alias(one(), WEIGHT)])
            query = select([*columns_of(node.output), weight()], derived(empty, "__pgt_v"))
            never = exp.EQ(this=exp.Literal.number(1), expression=exp.Literal.number(0))
            query.set("where", exp.Where(this=never))
            return query
        result: exp.Query = rows[0]
        for row in rows[1:]:
            result = exp.union(result, row, distinct=False)
        return result

    def _join(self, node: Join) -> exp.Query:
        both = {**self._types_of(node.left), **self._types_of(node.right)}
        condition = render(node.condition, both, self._dialect) if node.condition is not None else exp.true()
        left_cols = columns_of(node.left.columns, _LEFT)
        right_cols = columns_of(node.right.columns, _RIGHT)
        if node.kind is JoinKind.INNER:
            query = select(
                [
                    *left_cols,
                    *right_cols,
                    alias(exp.Mul(this=weight(_LEFT), expression=weight(_RIGHT)), WEIGHT),
                ],
                self._ref(node.left, _LEFT),
            )
            if node.condition is None:
                return query.join(self._ref(node.right, _RIGHT), join_type="cross")
            return query.join(self._ref(node.right, _RIGHT), on=condition)
        if node.kind in (JoinKind.SEMI, JoinKind.ANTI):
            anti = node.kind is JoinKind.ANTI
            right = self._positive_source(node.right, _RIGHT)
            query = select([*left_cols, weight(_LEFT)], self._ref(node.left, _LEFT))
            if self._dialect == "spark":
                return query.join(right, on=condition, join_type="left anti" if anti else "left semi")
            exists: exp.Expr = exp.Exists(this=select([exp.Literal.number(1)], right).where(condition))
            return query.where(exp.Not(this=exists) if anti else exists)
        side = {JoinKind.LEFT: "left", JoinKind.RIGHT: "right", JoinKind.FULL: "full"}[node.kind]
        product = exp.Mul(
            this=exp.Coalesce(this=weight(_LEFT), expressions=[exp.Literal.number(1)]),
            expression=exp.Coalesce(this=weight(_RIGHT), expressions=[exp.Literal.number(1)]),
        )
        query = select(
            [*left_cols, *right_cols, alias(product, WEIGHT)], self._positive_source(node.left, _LEFT)
        )
        return query.join(self._positive_source(node.right, _RIGHT), on=condition, join_type=side)
