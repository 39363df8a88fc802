"""Which refresh mode a defining query can have, and the shape differential refresh maintains.

Pure: works on the PostgreSQL query text (``pg_get_viewdef``'s normalized
form) with sqlglot, never on a database.

Shapes
------
``LinearShape``
    scans, filters, projections, inner/cross joins, derived tables, CTEs,
    UNION ALL (:mod:`pgtrickle.dvm.linear`). The stream table is a multiset
    of rows; a refresh deletes and inserts rows by their net weight.
``AggregateShape``
    a top-level GROUP BY (or aggregates without GROUP BY), SELECT DISTINCT,
    or UNION over a linear core. Keyed by the group: COUNT / SUM / AVG of
    exact types are maintained from the delta alone with hidden state columns
    (``algebraic``); any other aggregate, a DISTINCT aggregate or a HAVING
    clause recomputes only the groups the delta touches (``rescan``).

``PartitionedShape``
    outer joins, EXISTS / NOT EXISTS / IN tied by one key
    (:mod:`pgtrickle.dvm.partitioned`): the touched keys are recomputed.
``RecomputeShape``
    constructs one change can affect everywhere — ORDER BY ... LIMIT
    (top-k), a window without PARTITION BY, INTERSECT / EXCEPT [ALL], NOT IN
    (a NULL in the subquery changes every row), scalar subqueries: when a
    source changes the query is recomputed in Spark and only the difference
    to the stream table is applied (explicit DELETE / INSERT).

Everything else refreshes in full and :attr:`Analysis.reason` names the
construct.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time

from sqlglot import exp

from pgtrickle.dvm.linear import (
    NotDifferentiable,
    RecomputeOnly,
    check_linear,
    check_linear_select,
    inline_ctes,
)
from pgtrickle.dvm.partitioned import PartitionedShape, analyze_partitioned
from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.clock import ClockValues, pin_clock, reads_clock
from pgtrickle.sql.translate import is_volatile, parse_query, translate_to_spark, unsupported_reason

COUNT_COLUMN = "__pgt_count"

_ANY_INSTANT = ClockValues(
    datetime(2000, 1, 1, tzinfo=UTC),
    date(2000, 1, 1),
    datetime(2000, 1, 1),
    time(0, 0, tzinfo=UTC),
    time(0, 0),
)
"""Clock values for deciding whether a clock-reading query can run at all (any instant will do)."""

ALGEBRAIC = "algebraic"
RESCAN = "rescan"


@dataclass(frozen=True)
class LinearShape:
    query: exp.Query


@dataclass(frozen=True)
class GroupKey:
    index: int
    expr: exp.Expr
    column: str
    """The stream-table column holding the key: a visible output, or hidden ``__pgt_g<i>``."""
    hidden: bool


@dataclass(frozen=True)
class AggSpec:
    index: int
    kind: str
    """``count_star`` | ``count`` | ``sum`` | ``avg`` (algebraic) or ``other``."""
    node: exp.Expr
    """The whole aggregate call as written (with its FILTER clause)."""
    arg: exp.Expr | None
    filter: exp.Expr | None

    @property
    def sum_column(self) -> str:
        return f"__pgt_a{self.index}_sum"

    @property
    def count_column(self) -> str:
        return f"__pgt_a{self.index}_cnt"

    def hidden_columns(self) -> tuple[str, ...]:
        if self.kind in ("sum", "avg"):
            return (self.sum_column, self.count_column)
        if self.kind in ("count", "count_star"):
            return (self.count_column,)
        return ()


@dataclass(frozen=True)
class OutputCol:
    name: str
    expr: exp.Expr
    key: int | None
    """Index of the group key this output is exactly, if any."""


@dataclass(frozen=True)
class AggregateShape:
    select: exp.Select
    """The top SELECT (CTEs inlined), as the user wrote it."""
    keys: tuple[GroupKey, ...]
    aggs: tuple[AggSpec, ...]
    outputs: tuple[OutputCol, ...]
    scalar: bool
    """No GROUP BY: exactly one row, even over no input."""
    strategy: str
    strategy_reason: str
    distinct_source: str = ""
    """How the shape arose: ``GROUP BY``, ``DISTINCT``, ``UNION``, ``WINDOW`` (keys are
    then the window partition: many rows per key, replaced together), or the set
    operation (``INTERSECT``, ``EXCEPT ALL``, ...: keys are the whole row)."""
    rescan_source: exp.Query | None = None
    """For INTERSECT / EXCEPT: the set operation the rows are recomputed from; ``select``
    is then the UNION ALL of its branches, whose delta names the touched rows."""

    @property
    def many_rows_per_key(self) -> bool:
        """Several stored rows can share a key (window partitions, INTERSECT ALL / EXCEPT ALL)."""
        return self.distinct_source == "WINDOW" or self.distinct_source.endswith(" ALL")

    def hidden_columns(self) -> tuple[str, ...]:
        cols: list[str] = []
        if self.strategy == ALGEBRAIC:
            cols.append(COUNT_COLUMN)
            for agg in self.aggs:
                cols.extend(agg.hidden_columns())
        cols.extend(k.column for k in self.keys if k.hidden)
        return tuple(cols)


@dataclass(frozen=True)
class RecomputeShape:
    query: exp.Query
    construct: str
    """What makes the query need a recompute (named in the reason)."""


@dataclass(frozen=True)
class Analysis:
    differential: bool
    reason: str
    shape: LinearShape | AggregateShape | PartitionedShape | RecomputeShape | None = field(default=None)
    runnable: bool = True
    """False: no refresh can run the query at all (not even FULL: Spark cannot compute it);
    ``reason`` names the construct. Creation refuses such queries (``pgtrickle._query_refusal``)."""


def analyze(pg_sql: str) -> Analysis:
    """Decide whether ``pg_sql`` can be maintained differentially, and how."""
    try:
        query = parse_query(pg_sql)
    except UnsupportedQueryError as err:
        return Analysis(False, str(err), runnable=False)
    # A query that reads the clock runs with the clock pinned to literals (sql/clock.py).
    reason = unsupported_reason(pin_clock(pg_sql, _ANY_INSTANT) if reads_clock(pg_sql) else pg_sql)
    if reason is not None:
        return Analysis(False, reason, runnable=False)
    if is_volatile(pg_sql):
        return Analysis(False, "the query calls a volatile function (now(), random(), ...)")
    try:
        query = inline_ctes(query)
        return _analyze(query)
    except RecomputeOnly as err:
        return Analysis(
            True,
            f"{err}: the query is recomputed in Spark when a source changes and only the "
            "difference is applied",
            RecomputeShape(query, str(err)),
        )
    except NotDifferentiable as err:
        return Analysis(False, f"{err} is not maintained differentially")


def _analyze(query: exp.Query) -> Analysis:
    if isinstance(query, exp.Select):
        try:
            return _analyze_select(query)
        except NotDifferentiable as err:
            if not err.partitionable:
                raise
            try:
                shape = analyze_partitioned(query)
            except RecomputeOnly:
                raise
            except NotDifferentiable as why:
                if isinstance(err, RecomputeOnly):
                    raise err from why
                raise why from err
            return Analysis(True, f"{err}: the join keys the delta touches are recomputed", shape)
    return _analyze_set_operation(query)


def _analyze_select(query: exp.Select) -> Analysis:
    if query.args.get("limit") or query.args.get("offset"):
        raise RecomputeOnly("ORDER BY ... LIMIT (top-k)")
    if query.args.get("distinct") and query.args["distinct"].args.get("on"):
        raise NotDifferentiable("DISTINCT ON")
    if any(node.find(exp.Subquery) for node in query.expressions):
        raise RecomputeOnly("a scalar subquery in the SELECT list", partitionable=True)
    if any(node.find(exp.Window) for node in query.expressions):
        return _window(query)
    if query.args.get("distinct"):
        return _distinct(query)
    if (
        query.args.get("group")
        or query.args.get("having")
        or any(node.find(exp.AggFunc) for node in query.expressions)
    ):
        return _aggregate(query)
    check_linear(query)
    return Analysis(True, "every operator has a delta rule (scan, filter, project, join)", LinearShape(query))


def _analyze_set_operation(query: exp.Query) -> Analysis:
    if isinstance(query, exp.Union):
        if query.args.get("limit") or query.args.get("offset"):
            raise RecomputeOnly("ORDER BY ... LIMIT (top-k)")
        if query.args.get("distinct"):
            check_linear(_union_all_copy(query))
            return _union_distinct(query)
        check_linear(query)
        return Analysis(
            True, "every operator has a delta rule (UNION ALL of linear queries)", LinearShape(query)
        )
    if isinstance(query, (exp.Intersect, exp.Except)):
        return _intersect_except(query)
    raise NotDifferentiable(f"{type(query).__name__} query")


def unparen(node: exp.Expr) -> exp.Expr:
    """``node`` without redundant parentheses anywhere (for comparing expressions)."""

    def strip(n: exp.Expr) -> exp.Expr:
        return n.this if isinstance(n, exp.Paren) else n

    return node.copy().transform(strip, copy=False)


def same_expr(a: exp.Expr, b: exp.Expr) -> bool:
    return unparen(a) == unparen(b)


def _output_name(node: exp.Expr, position: int) -> str:
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    return f"?column{position}?"


def _distinct(select: exp.Select) -> Analysis:
    core = select.copy()
    core.set("distinct", None)
    core.set("order", None)
    check_linear_select(core)
    keys = []
    outputs = []
    for i, node in enumerate(select.expressions):
        inner = node.this if isinstance(node, exp.Alias) else node
        name = _output_name(node, i)
        keys.append(GroupKey(i, inner.copy(), name, hidden=False))
        outputs.append(OutputCol(name, inner.copy(), i))
    shape = AggregateShape(
        core,
        tuple(keys),
        (),
        tuple(outputs),
        scalar=False,
        strategy=ALGEBRAIC,
        strategy_reason="multiplicity counts",
        distinct_source="DISTINCT",
    )
    return Analysis(True, "SELECT DISTINCT over linear operators: maintained with multiplicity counts", shape)


def _union_distinct(query: exp.Union) -> Analysis:
    """UNION = DISTINCT over UNION ALL; outputs are named after the first branch."""
    first = query
    while isinstance(first, exp.SetOperation):
        first = first.this
    while isinstance(first, exp.Subquery):
        first = first.this
    assert isinstance(first, exp.Select)
    names = [_output_name(node, i) for i, node in enumerate(first.expressions)]
    all_query = _union_all_copy(query)
    sub = exp.Subquery(
        this=all_query,
        alias=exp.TableAlias(
            this=exp.to_identifier("__pgt_u"), columns=[exp.to_identifier(n, quoted=True) for n in names]
        ),
    )
    select = exp.Select(expressions=[exp.column(n, table="__pgt_u", quoted=True) for n in names])
    select.set("from_", exp.From(this=sub))
    keys = tuple(
        GroupKey(i, exp.column(n, table="__pgt_u", quoted=True), n, hidden=False) for i, n in enumerate(names)
    )
    outputs = tuple(OutputCol(n, exp.column(n, table="__pgt_u", quoted=True), i) for i, n in enumerate(names))
    shape = AggregateShape(
        select,
        keys,
        (),
        outputs,
        scalar=False,
        strategy=ALGEBRAIC,
        strategy_reason="multiplicity counts",
        distinct_source="UNION",
    )
    return Analysis(True, "UNION over linear queries: maintained with multiplicity counts", shape)


def _chain_as_union_all(node: exp.Expr) -> exp.Expr:
    """Every set operation of the top chain made UNION ALL: its delta holds every touched row value."""
    while isinstance(node, exp.Subquery) and not node.alias:
        node = node.this
    if isinstance(node, exp.SetOperation):
        return exp.Union(
            this=_chain_as_union_all(node.this),
            expression=_chain_as_union_all(node.expression),
            distinct=False,
        )
    return node.copy()


def _intersect_except(query: exp.SetOperation) -> Analysis:
    """INTERSECT / EXCEPT [ALL]: a row's multiplicity depends only on that row value's multiplicities
    in the branches, so the row values the branches' delta touches are recomputed and replaced."""
    name = type(query).__name__.upper() + ("" if query.args.get("distinct") else " ALL")
    branches = _chain_as_union_all(query)
    try:
        check_linear(branches)
    except NotDifferentiable as err:
        raise RecomputeOnly(f"{name} over {err}", partitionable=err.partitionable) from err
    first: exp.Expr = query
    while isinstance(first, (exp.SetOperation, exp.Subquery)):
        first = first.this
    assert isinstance(first, exp.Select)
    names = [_output_name(node, i) for i, node in enumerate(first.expressions)]
    alias = exp.TableAlias(
        this=exp.to_identifier("__pgt_u"), columns=[exp.to_identifier(n, quoted=True) for n in names]
    )
    select = exp.Select(expressions=[exp.column(n, table="__pgt_u", quoted=True) for n in names])
    select.set("from_", exp.From(this=exp.Subquery(this=branches, alias=alias)))
    source = query.copy()
    source.set("order", None)
    keys = tuple(
        GroupKey(i, exp.column(n, table="__pgt_u", quoted=True), n, hidden=False) for i, n in enumerate(names)
    )
    outputs = tuple(OutputCol(n, exp.column(n, table="__pgt_u", quoted=True), i) for i, n in enumerate(names))
    why = "the row values the delta touches are recomputed"
    shape = AggregateShape(
        select,
        keys,
        (),
        outputs,
        scalar=False,
        strategy=RESCAN,
        strategy_reason=why,
        distinct_source=name,
        rescan_source=source,
    )
    return Analysis(True, f"{name} over linear queries: {why}", shape)


def _union_all_copy(node: exp.Expr) -> exp.Expr:
    """The chain of UNION [ALL] under a top-level UNION, all made ALL (the outer DISTINCT absorbs them).

    Set operations inside a branch's own subqueries are left alone.
    """
    node = node.copy()

    def flatten(n: exp.Expr) -> None:
        while isinstance(n, exp.Subquery) and not n.alias:
            n = n.this
        if isinstance(n, exp.Union):
            n.set("distinct", False)
            flatten(n.this)
            flatten(n.expression)

    flatten(node)
    return node


def _window(select: exp.Select) -> Analysis:
    """Window functions over one PARTITION BY: recompute the partitions the delta touches."""
    if select.args.get("windows"):
        raise RecomputeOnly("a named WINDOW clause")
    if select.args.get("distinct") or select.args.get("group") or select.args.get("having"):
        raise RecomputeOnly("window functions with GROUP BY / DISTINCT")
    windows = [w for node in select.expressions for w in node.find_all(exp.Window)]
    partitions = [tuple(unparen(p) for p in (w.args.get("partition_by") or [])) for w in windows]
    if not partitions[0]:
        raise RecomputeOnly("a window function without PARTITION BY (the whole result depends on every row)")
    if any(p != partitions[0] for p in partitions[1:]):
        raise RecomputeOnly("window functions over different PARTITION BY lists")
    stripped = select.copy()
    stripped.set("order", None)
    for node in stripped.expressions:
        for window in list(node.find_all(exp.Window)):
            window.replace(exp.Literal.number(0))
    if any(node.find(exp.AggFunc) for node in stripped.expressions):
        raise RecomputeOnly("aggregates next to window functions")
    check_linear_select(stripped)
    outputs_raw = [
        (node.this if isinstance(node, exp.Alias) else node, _output_name(node, i))
        for i, node in enumerate(select.expressions)
    ]
    keys = []
    for i, key in enumerate(partitions[0]):
        visible = next((name for inner, name in outputs_raw if same_expr(inner, key)), None)
        keys.append(GroupKey(i, key.copy(), visible or f"__pgt_g{i}", hidden=visible is None))
    outputs = tuple(
        OutputCol(name, inner.copy(), next((k.index for k in keys if same_expr(k.expr, inner)), None))
        for inner, name in outputs_raw
    )
    why = "window functions: the partitions the delta touches are recomputed"
    shape = AggregateShape(
        select.copy(),
        tuple(keys),
        (),
        outputs,
        scalar=False,
        strategy=RESCAN,
        strategy_reason=why,
        distinct_source="WINDOW",
    )
    return Analysis(True, f"PARTITION BY over linear operators; {why}", shape)


_ALGEBRAIC_KINDS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}


def _agg_spec(index: int, node: exp.Expr) -> AggSpec:
    call = node.this if isinstance(node, exp.Filter) else node
    filter_ = node.expression.this if isinstance(node, exp.Filter) else None
    arg = call.this if isinstance(call, exp.AggFunc) else None
    kind = "other"
    for cls, name in _ALGEBRAIC_KINDS.items():
        if type(call) is cls:
            kind = name
    if kind != "other" and (
        isinstance(arg, exp.Distinct) or len(call.expressions or []) > 0 or call.args.get("order") is not None
    ):
        kind = "other"
    if kind == "count" and isinstance(arg, exp.Star):
        kind, arg = "count_star", None
    return AggSpec(
        index,
        kind,
        node.copy(),
        arg.copy() if arg is not None else None,
        filter_.copy() if filter_ is not None else None,
    )


def _aggregate(select: exp.Select) -> Analysis:
    core = select.copy()
    for arg in ("group", "having", "order", "distinct"):
        core.set(arg, None)
    core.set("expressions", [exp.Literal.number(1)])
    check_linear_select(core)
    group = select.args.get("group")
    group_exprs = list(group.expressions) if group is not None else []
    if group is not None and (
        group.args.get("rollup")
        or group.args.get("cube")
        or group.args.get("grouping_sets")
        or any(isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)) for g in group_exprs)
    ):
        raise NotDifferentiable("GROUPING SETS / ROLLUP / CUBE")
    outputs_raw = [
        (node.this if isinstance(node, exp.Alias) else node, _output_name(node, i))
        for i, node in enumerate(select.expressions)
    ]
    keys: list[GroupKey] = []
    for i, g in enumerate(group_exprs):
        if isinstance(g, exp.Literal) and g.is_int:
            raise NotDifferentiable("GROUP BY position")
        visible = next((name for inner, name in outputs_raw if same_expr(inner, g)), None)
        keys.append(GroupKey(i, g.copy(), visible or f"__pgt_g{i}", hidden=visible is None))

    aggs: list[AggSpec] = []
    seen: dict[str, AggSpec] = {}

    def collect(node: exp.Expr) -> None:
        for agg in _aggregate_calls(node):
            sql = agg.sql("postgres")
            if sql not in seen:
                spec = _agg_spec(len(aggs), agg)
                seen[sql] = spec
                aggs.append(spec)

    outputs: list[OutputCol] = []
    for inner, name in outputs_raw:
        key = next((k.index for k in keys if same_expr(k.expr, inner)), None)
        if key is None:
            collect(inner)
            _check_grouped(inner, [k.expr for k in keys])
        outputs.append(OutputCol(name, inner.copy(), key))
    having = select.args.get("having")
    strategy, why = ALGEBRAIC, "COUNT / SUM / AVG maintained from the delta with hidden state columns"
    others = [a for a in aggs if a.kind == "other"]
    if having is not None:
        strategy, why = RESCAN, "HAVING: the groups the delta touches are recomputed"
    elif others:
        strategy = RESCAN
        why = f"{_agg_name(others[0])}: the groups the delta touches are recomputed"
    shape = AggregateShape(
        select.copy(),
        tuple(keys),
        tuple(aggs),
        tuple(outputs),
        scalar=not group_exprs,
        strategy=strategy,
        strategy_reason=why,
        distinct_source="GROUP BY",
    )
    return Analysis(True, f"GROUP BY over linear operators; {why}", shape)


def _agg_name(spec: AggSpec) -> str:
    call = spec.node.this if isinstance(spec.node, exp.Filter) else spec.node
    name = call.sql_name() if hasattr(call, "sql_name") else type(call).__name__
    if isinstance(spec.arg, exp.Distinct):
        return f"{name}(DISTINCT ...)"
    return name


def _aggregate_calls(node: exp.Expr) -> list[exp.Expr]:
    """Outermost aggregate calls in ``node`` (with their FILTER wrapper)."""
    found: list[exp.Expr] = []

    def walk(n: exp.Expr) -> None:
        if isinstance(n, exp.Filter) and isinstance(n.this, exp.AggFunc):
            found.append(n)
            return
        if isinstance(n, exp.AggFunc):
            found.append(n)
            return
        for child in n.iter_expressions():
            walk(child)

    walk(node)
    return found


def _check_grouped(node: exp.Expr, keys: list[exp.Expr]) -> None:
    """Column references outside aggregates must sit inside a group key expression."""

    def walk(n: exp.Expr) -> None:
        if any(same_expr(n, k) for k in keys):
            return
        if isinstance(n, exp.AggFunc) or (isinstance(n, exp.Filter) and isinstance(n.this, exp.AggFunc)):
            return
        if isinstance(n, exp.Column):
            raise NotDifferentiable(
                f"column {n.sql('postgres')} used outside an aggregate without being a GROUP BY expression "
                "(functional dependency on a key)"
            )
        for child in n.iter_expressions():
            walk(child)

    walk(node)


def with_translation(
    analysis: Analysis,
    pg_sql: str,
    table_map: Mapping[tuple[str, str], str],
    column_types: Mapping[tuple[str, str], Mapping[str, str]],
) -> Analysis:
    """``analysis``, made not runnable when the query does not translate to Spark with its sources' types.

    Some refusals depend on column types (a ``LIKE`` on a ``bpchar`` without a
    length, sql/blank_padded.py), which the text alone does not show: trying
    the translation here means no refresh is planned that its FULL path
    would refuse. Pure (translation does not touch Spark or a database).
    """
    if not analysis.runnable:
        return analysis
    try:
        translate_to_spark(
            pin_clock(pg_sql, _ANY_INSTANT) if reads_clock(pg_sql) else pg_sql, table_map, column_types
        )
    except UnsupportedQueryError as err:
        return Analysis(False, str(err), runnable=False)
    return analysis


INEXACT_TYPES = ("double precision", "real")


def respect_sum_types(analysis: Analysis, state_types: dict[str, str]) -> Analysis:
    """Demote an algebraic aggregate to rescan when a SUM/AVG state is a float.

    Floating-point sums depend on the order of addition: maintained by
    additions and subtractions they drift from a recomputation, so such
    groups are recomputed instead. ``state_types`` maps hidden state columns
    to their PostgreSQL types.
    """
    shape = analysis.shape
    if not isinstance(shape, AggregateShape) or shape.strategy != ALGEBRAIC:
        return analysis
    for agg in shape.aggs:
        if agg.kind in ("sum", "avg") and state_types.get(agg.sum_column) in INEXACT_TYPES:
            why = f"{agg.kind.upper()} of a floating-point value: the groups the delta touches are recomputed"
            demoted = replace(shape, strategy=RESCAN, strategy_reason=why)
            return Analysis(True, f"GROUP BY over linear operators; {why}", demoted)
    return analysis
