"""The lowering of defining queries into the operator IR (pgtrickle.dvm.lower); no JVM, no database.

Inputs are PostgreSQL's own normalized text of each query (``pg_get_viewdef``), recorded with the
relations' and the views' columns by ``scripts/lower_viewdefs.py`` in ``lower_viewdefs.json``.
Every lowered tree is checked against the IR's contract (:func:`check_contract`), and the shapes
that matter are asserted node by node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.ir import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Node,
    Project,
    Scan,
    SetOp,
    SetOpKind,
    TopK,
    UnionAll,
    Values,
    Window,
)
from pgtrickle.dvm.lower import lower
from pgtrickle.errors import NoDeltaRuleError, UnsupportedQueryError
from pgtrickle.sql.translate import parse_query

DATA = json.loads((Path(__file__).parent / "lower_viewdefs.json").read_text())
CASES: dict[str, dict] = DATA["cases"]
RELATIONS: dict[str, list[str]] = DATA["relations"]


def lowered(name: str) -> Node:
    return lower(parse_query(CASES[name]["viewdef"]), RELATIONS)


def lower_sql(sql: str) -> Node:
    return lower(parse_query(sql), RELATIONS)


def of(tree: Node, cls: type) -> list:
    return [n for n in ir.walk(tree) if isinstance(n, cls)]


def joins(tree: Node, kind: JoinKind) -> list[Join]:
    return [j for j in of(tree, Join) if j.kind is kind]


def sql(e: exp.Expr | None) -> str:
    return e.sql("postgres") if e is not None else ""


def refs(e: exp.Expr) -> set[str]:
    return {c.name for c in e.find_all(exp.Column)}


def check_contract(tree: Node) -> None:
    """The IR's contract: unique names per node, disjoint join inputs, expressions over inputs."""
    for node in ir.walk(tree):
        assert len(set(node.columns)) == len(node.columns), (type(node).__name__, node.columns)
        inputs = [c for i in node.inputs for c in i.columns]
        exprs: list[exp.Expr] = []
        if isinstance(node, Join):
            assert not set(node.left.columns) & set(node.right.columns), node.columns
            assert node.condition is not None or node.kind is JoinKind.INNER
            exprs = [node.condition] if node.condition is not None else []
        elif isinstance(node, Filter):
            exprs = [node.predicate]
        elif isinstance(node, Project):
            exprs = [e for _, e in node.outputs]
        elif isinstance(node, Aggregate):
            exprs = [e for _, e in node.keys + node.aggregates]
        elif isinstance(node, Window):
            exprs = [e for _, e in node.functions]
        elif isinstance(node, TopK):
            exprs = list(node.order)
        elif isinstance(node, Scan):
            table = RELATIONS[node.relation]
            positions = [table.index(c) for c in node.source_columns]
            assert positions == sorted(set(positions)) and positions, node.source_columns
        elif isinstance(node, (UnionAll, SetOp)):
            assert all(len(i.columns) == len(node.columns) for i in node.inputs)
        for e in exprs:
            assert not e.find(exp.Subquery, exp.Select, exp.Exists), sql(e)
            assert all(not c.table for c in e.find_all(exp.Column)), sql(e)
            assert refs(e) <= set(inputs), (type(node).__name__, sql(e), inputs)


REFUSED = {
    "props.limit_only": "LIMIT / OFFSET without ORDER BY",
    "props.exists_or": "EXISTS (subquery) that is not a WHERE conjunct of its own",
    "props.in_select_list": "IN / NOT IN (subquery) that is not a WHERE conjunct of its own",
    "props.not_in_select_list": "IN / NOT IN (subquery) that is not a WHERE conjunct of its own",
    "props.scalar_correlated_two_keys": (
        "a correlated scalar subquery whose correlation is not `inner = outer`"
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_recorded_cases_without_a_rule_are_refused(name: str) -> None:
    with pytest.raises(NoDeltaRuleError) as info:
        lowered(name)
    assert info.value.construct == REFUSED[name]


@pytest.mark.parametrize("name", sorted(n for n in CASES if n not in REFUSED))
def test_every_case_lowers_with_the_views_columns(name: str) -> None:
    tree = lowered(name)
    assert list(tree.columns) == CASES[name]["columns"]
    check_contract(tree)


def test_all_22_tpch_queries_lower() -> None:
    assert sum(n.startswith("tpch.") for n in CASES) == 22
    for name in (n for n in CASES if n.startswith("tpch.")):
        check_contract(lowered(name))


# --------------------------------------------------------------------------- TPC-H shapes


def test_q04_exists_is_a_semi_join_on_the_correlation() -> None:
    tree = lowered("tpch.q04")
    (semi,) = joins(tree, JoinKind.SEMI)
    assert sql(semi.condition) == "l_orderkey = o_orderkey"
    assert isinstance(semi.left, Filter) and semi.left.input.relation == "tpch.orders"  # type: ignore[attr-defined]
    assert isinstance(semi.right, Filter) and sql(semi.right.predicate) == "l_commitdate < l_receiptdate"
    assert isinstance(tree, Project) and isinstance(tree.input, Aggregate)
    assert tree.input.input is semi


def test_q13_left_join_under_an_aggregate_under_an_aggregate() -> None:
    tree = lowered("tpch.q13")
    outer = tree.input  # type: ignore[attr-defined]
    assert isinstance(outer, Aggregate) and sql(outer.aggregates[0][1]) == "COUNT(*)"
    inner_project = outer.input
    assert isinstance(inner_project, Project)
    inner = inner_project.input
    assert isinstance(inner, Aggregate) and sql(inner.aggregates[0][1]) == "COUNT(o_orderkey)"
    left = inner.input
    assert isinstance(left, Join) and left.kind is JoinKind.LEFT
    # the ON predicate on the padded side stays in the condition (not a WHERE)
    assert "NOT LIKE '%special%requests%'" in sql(left.condition)


def test_q16_not_in_is_an_anti_join_with_not_ins_null_rule() -> None:
    tree = lowered("tpch.q16")
    (anti,) = joins(tree, JoinKind.ANTI)
    assert sql(anti.condition) == "NOT (ps_suppkey = s_suppkey) IS FALSE"
    assert isinstance(anti.right, Filter) and anti.right.input.relation == "tpch.supplier"  # type: ignore[attr-defined]
    (agg,) = of(tree, Aggregate)
    assert sql(agg.aggregates[0][1]) == "COUNT(DISTINCT ps_suppkey)"


def _correlated_aggregate(join: Join) -> tuple[Aggregate, Project]:
    assert join.kind is JoinKind.LEFT
    right = join.right
    assert isinstance(right, Project) and isinstance(right.input, Aggregate)
    return right.input, right


def test_q17_correlated_avg_is_a_left_join_to_an_aggregate_grouped_by_the_correlation_key() -> None:
    tree = lowered("tpch.q17")
    (left,) = joins(tree, JoinKind.LEFT)
    agg, right = _correlated_aggregate(left)
    assert [sql(k) for _, k in agg.keys] == ["l_partkey_1"]
    assert [sql(a) for _, a in agg.aggregates] == ["AVG(l_quantity_1)"]
    assert sql(left.condition) == f"p_partkey = {agg.keys[0][0]}"
    (flt,) = [f for f in of(tree, Filter) if f.input is left]
    value = dict(right.outputs)
    assert any(sql(v) == "0.2 * avg" for v in value.values())
    assert sql(flt.predicate).startswith("l_quantity < ")  # AVG over no rows is NULL: no CASE needed
    assert "CASE" not in sql(flt.predicate)


def test_q20_nested_in_and_a_two_key_correlated_sum() -> None:
    tree = lowered("tpch.q20")
    semis = joins(tree, JoinKind.SEMI)
    assert len(semis) == 2  # s_suppkey IN (...) and ps_partkey IN (...)
    (left,) = joins(tree, JoinKind.LEFT)
    agg, _ = _correlated_aggregate(left)
    assert [sql(k) for _, k in agg.keys] == ["l_partkey", "l_suppkey"]
    assert sql(left.condition) == "ps_partkey = corr_key AND ps_suppkey = corr_key_1"
    outer = next(j for j in semis if sql(j.condition) == "s_suppkey = ps_suppkey")
    assert left in list(ir.walk(outer.right))


def test_q15_cte_read_twice_is_one_shared_node() -> None:
    tree = lowered("tpch.q15")
    aggregates = of(tree, Aggregate)
    grouped = [a for a in aggregates if a.keys]
    assert len(grouped) == 1  # the CTE's aggregate, once
    cte = next(p for p in of(tree, Project) if p.input is grouped[0])
    consumers = [n for n in ir.walk(tree) if cte in n.inputs]
    assert len(consumers) == 2
    scalar = next(a for a in aggregates if not a.keys)
    assert sql(scalar.aggregates[0][1]).startswith("MAX(")


def test_q21_exists_and_not_exists_on_a_self_join() -> None:
    tree = lowered("tpch.q21")
    (semi,) = joins(tree, JoinKind.SEMI)
    (anti,) = joins(tree, JoinKind.ANTI)
    assert sql(semi.condition) == "l_orderkey_1 = l_orderkey AND l_suppkey_1 <> l_suppkey"
    assert sql(anti.condition) == "l_orderkey_2 = l_orderkey AND l_suppkey_2 <> l_suppkey"
    assert isinstance(tree, TopK) and tree.limit == 100
    assert [sql(o) for o in tree.order] == ["numwait DESC", "s_name ASC"]


def test_q22_uncorrelated_scalar_is_a_cross_join_with_its_one_row() -> None:
    tree = lowered("tpch.q22")
    crosses = [
        j
        for j in joins(tree, JoinKind.INNER)
        if isinstance(j.right, Project) and isinstance(j.right.input, Aggregate) and not j.right.input.keys
    ]
    (cross,) = crosses
    assert sql(cross.condition).startswith("c_acctbal > ")
    (anti,) = joins(tree, JoinKind.ANTI)
    assert sql(anti.condition) == "o_custkey = c_custkey"


def test_q11_having_with_an_uncorrelated_scalar_is_a_filter_above_the_aggregate() -> None:
    tree = lowered("tpch.q11")
    assert isinstance(tree, Project) and isinstance(tree.input, Filter)
    join = tree.input.input
    assert isinstance(join, Join) and join.kind is JoinKind.INNER and join.condition is None
    assert isinstance(join.left, Aggregate) and join.left.keys


def test_q18_grouped_in_subquery_is_lowered_whole_and_semi_joined() -> None:
    tree = lowered("tpch.q18")
    (semi,) = joins(tree, JoinKind.SEMI)
    assert isinstance(semi.right, Project) and isinstance(semi.right.input, Filter)
    assert isinstance(semi.right.input.input, Aggregate)
    assert isinstance(tree, TopK) and tree.limit == 100 and tree.offset == 0


@pytest.mark.parametrize("name", ["tpch.q02", "tpch.q03", "tpch.q10", "tpch.q18", "tpch.q21"])
def test_order_by_limit_queries_are_top_k(name: str) -> None:
    tree = lowered(name)
    assert isinstance(tree, TopK)
    assert list(tree.columns) == CASES[name]["columns"]


def test_comma_joins_follow_the_join_conditions() -> None:
    """``FROM part, supplier, partsupp, ...``: no cross product of part and supplier."""
    tree = lowered("tpch.q02")
    assert all(j.condition is not None for j in joins(tree, JoinKind.INNER))
    tree = lowered("tpch.q09")
    assert all(j.condition is not None for j in joins(tree, JoinKind.INNER))


def test_scans_read_only_the_columns_used() -> None:
    tree = lowered("tpch.q04")  # EXISTS (SELECT * FROM lineitem ...) names all sixteen columns
    reads = {s.relation: s.source_columns for s in of(tree, Scan)}
    assert reads == {
        "tpch.orders": ("o_orderkey", "o_orderdate", "o_orderpriority"),
        "tpch.lineitem": ("l_orderkey", "l_commitdate", "l_receiptdate"),
    }
    (scan,) = of(lowered("props.agg_scalar_filtered"), Scan)  # count(*) WHERE k > 10
    assert scan.source_columns == ("k",)


def test_pruning_keeps_a_shared_cte_one_node_with_what_every_reader_needs() -> None:
    tree = lower_sql(
        "WITH t AS (SELECT a.id, a.k, a.g FROM props.a) SELECT t1.id, t2.g FROM t t1 JOIN t t2 ON t1.k = t2.k"
    )
    (join,) = of(tree, Join)
    assert isinstance(join.right, Project) and join.right.input is join.left
    assert len(join.left.columns) == 3  # id for t1, k for the join, g for t2
    assert of(tree, Scan)[0].source_columns == ("id", "k", "g")


def test_pruning_keeps_every_column_under_distinct_and_top_k() -> None:
    tree = lower_sql("SELECT d.k FROM (SELECT DISTINCT a.k, a.g FROM props.a) d")
    (scan,) = of(tree, Scan)
    assert scan.source_columns == ("k", "g")
    tree = lower_sql("SELECT t.id FROM (SELECT a.id, a.n FROM props.a ORDER BY a.v LIMIT 3) t")
    (scan,) = of(tree, Scan)
    assert scan.source_columns == ("id", "v", "n")


# --------------------------------------------------------------------------- CTEs, derived tables


def test_issue17_with_nested_in_a_derived_table_sees_the_outer_cte() -> None:
    tree = lowered("props.issue17_nested_with")
    assert tree.columns == ("i", "j")
    relations = sorted(s.relation for s in of(tree, Scan))
    assert relations == ["props.base_a", "props.base_b"]
    (join,) = of(tree, Join)
    assert join.kind is JoinKind.INNER and refs(join.condition) <= set(join.left.columns) | set(
        join.right.columns
    )


def test_cte_read_twice_in_one_join_is_shared_and_renamed() -> None:
    tree = lowered("props.cte_twice")
    (join,) = of(tree, Join)
    assert isinstance(join.right, Project) and join.right.input is join.left
    assert len(of(tree, Scan)) == 1


def test_cte_defined_inside_a_cte() -> None:
    tree = lowered("props.cte_in_cte")
    (flt,) = of(tree, Filter)
    assert sql(flt.predicate) == "k > 0"


def test_cte_over_an_aggregate_shared_by_a_self_join() -> None:
    tree = lowered("props.cte_shared")
    assert len(of(tree, Aggregate)) == 1 and len(of(tree, Scan)) == 1


# --------------------------------------------------------------------------- joins


def test_using_and_natural_joins() -> None:
    tree = lowered("props.join_using")
    (join,) = of(tree, Join)
    assert sql(join.condition) == "id = id_1 AND k = k_1"
    assert tree.columns == ("id", "k", "g", "v", "n", "f", "name", "w")
    tree = lowered("props.join_natural")
    (join,) = of(tree, Join)
    assert sql(join.condition) == "id = id_1"


def test_full_join_using_merges_the_key_with_coalesce() -> None:
    tree = lowered("props.full_using")
    (join,) = of(tree, Join)
    assert join.kind is JoinKind.FULL
    merged = tree.input  # type: ignore[attr-defined]
    assert isinstance(merged, Project) and sql(merged.outputs[-1][1]) == "COALESCE(k, k_1)"
    assert sql(dict(tree.outputs)["k"]) == merged.outputs[-1][0]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name, kind",
    [
        ("props.left_join", JoinKind.LEFT),
        ("props.right_join", JoinKind.RIGHT),
        ("props.full_join", JoinKind.FULL),
    ],
)
def test_outer_joins_keep_their_on_predicate(name: str, kind: JoinKind) -> None:
    (join,) = of(lowered(name), Join)
    assert join.kind is kind and join.condition is not None


def test_outer_join_over_a_parenthesized_inner_join() -> None:
    tree = lowered("props.left_nested")
    (left,) = joins(tree, JoinKind.LEFT)
    assert isinstance(left.right, Join) and left.right.kind is JoinKind.INNER
    assert sql(left.condition) == "k_1 = k AND n > 1"


def test_where_on_the_padded_side_stays_above_the_outer_join() -> None:
    tree = lowered("props.anti_join_left")
    assert isinstance(tree, Project) and isinstance(tree.input, Filter)
    assert isinstance(tree.input.input, Join) and tree.input.input.kind is JoinKind.LEFT


# --------------------------------------------------------------------------- subqueries


def test_in_and_not_exists() -> None:
    (semi,) = joins(lowered("props.in_subquery"), JoinKind.SEMI)
    assert sql(semi.condition) == "k = k_1"
    (anti,) = joins(lowered("props.not_exists"), JoinKind.ANTI)
    assert sql(anti.condition) == "k_1 = k"


def test_quantified_comparisons() -> None:
    (semi,) = joins(lowered("props.any_lt"), JoinKind.SEMI)
    assert sql(semi.condition) == "k < w"
    (anti,) = joins(lowered("props.all_gt"), JoinKind.ANTI)
    assert sql(anti.condition) == "id_1 = id AND NOT (k > w) IS TRUE"
    (anti,) = joins(lowered("props.not_equal_all"), JoinKind.ANTI)
    assert sql(anti.condition) == "NOT (k = w) IS FALSE"


def test_uncorrelated_exists_semi_joins_on_true() -> None:
    (semi,) = joins(lowered("props.exists_uncorrelated"), JoinKind.SEMI)
    assert sql(semi.condition) == "TRUE"


def test_correlated_count_keeps_zero_for_rows_without_a_group() -> None:
    tree = lowered("props.scalar_correlated")
    value = sql(dict(tree.outputs)["nb"])  # type: ignore[attr-defined]
    (left,) = joins(tree, JoinKind.LEFT)
    present = left.right.columns[-1]
    assert value == f"CASE WHEN {present} IS NULL THEN 0 ELSE count_1 END"
    tree = lowered("props.scalar_correlated_expr_count")
    assert "THEN 0 + 1 ELSE" in sql(dict(tree.outputs)["nb1"])  # type: ignore[attr-defined]


def test_correlation_on_the_outer_row_alone_joins_the_aggregate_on_it() -> None:
    tree = lower_sql(
        "SELECT a.id, (SELECT count(*) FROM props.b WHERE b.k = a.k AND a.n > 1) AS nb FROM props.a"
    )
    (left,) = joins(tree, JoinKind.LEFT)
    assert sql(left.condition) == "k = corr_key AND n > 1"
    assert sql(dict(tree.outputs)["nb"]).startswith("CASE WHEN matched IS NULL THEN 0")  # type: ignore[attr-defined]


def test_correlated_max_needs_no_case() -> None:
    tree = lowered("props.scalar_correlated_where")
    (left,) = joins(tree, JoinKind.LEFT)
    flt = next(f for f in of(tree, Filter) if f.input is left)
    assert "CASE" not in sql(flt.predicate)


def test_uncorrelated_scalar_in_the_select_list() -> None:
    tree = lowered("props.scalar_uncorrelated")
    (join,) = of(tree, Join)
    assert join.kind is JoinKind.INNER and join.condition is None
    assert isinstance(join.right, Project) and not join.right.input.keys  # type: ignore[attr-defined]


def test_subquery_in_a_derived_table() -> None:
    (anti,) = joins(lowered("props.exists_in_derived"), JoinKind.ANTI)
    assert sql(anti.condition) == "a_id = id AND x > n"


# --------------------------------------------------------------------------- grouping, windows, sets, top-k


def test_group_by_expression_having_and_expressions_over_aggregates() -> None:
    tree = lowered("props.group_expr_having")
    assert isinstance(tree, Project) and isinstance(tree.input, Filter)
    agg = tree.input.input
    assert isinstance(agg, Aggregate)
    assert [sql(k) for _, k in agg.keys] == ["(k % 2)"]
    assert [sql(a) for _, a in agg.aggregates] == ["SUM(v)", "COUNT(DISTINCT g)"]
    assert sql(tree.input.predicate) == "count > 1"
    assert sql(dict(tree.outputs)["parity"]) == "expr"


def test_aggregate_filter_clause_is_kept() -> None:
    (agg,) = of(lowered("props.agg_filter"), Aggregate)
    assert [sql(a) for _, a in agg.aggregates] == [
        "COUNT(*) FILTER(WHERE v > CAST(20 AS DECIMAL))",
        "SUM(n) FILTER(WHERE k = 1)",
    ]


def test_scalar_aggregate_has_no_keys() -> None:
    (agg,) = of(lowered("props.agg_scalar"), Aggregate)
    assert agg.keys == ()


def test_window_over_an_aggregate() -> None:
    tree = lowered("props.agg_in_window")
    (window,) = of(tree, Window)
    assert isinstance(window.input, Aggregate)
    assert sql(window.functions[0][1]) == "SUM(count) OVER ()"


def test_window_partitioned() -> None:
    (window,) = of(lowered("props.window_rank"), Window)
    assert sql(window.functions[0][1]) == "RANK() OVER (PARTITION BY k ORDER BY v, id)"


def test_distinct_union_and_set_operations() -> None:
    assert isinstance(lowered("props.distinct"), Distinct)
    tree = lowered("props.union_three")
    assert isinstance(tree, Distinct) and isinstance(tree.input, UnionAll)
    assert len(tree.input.branches) == 3 and isinstance(tree.input.branches[2], Values)
    tree = lowered("props.union_all_in_union")
    assert isinstance(tree, Distinct) and len(tree.input.branches) == 3  # type: ignore[attr-defined]
    tree = lowered("props.union_all_filtered")
    assert isinstance(tree, UnionAll) and len(tree.branches) == 3
    tree = lowered("props.intersect_all")
    assert isinstance(tree, SetOp) and tree.kind is SetOpKind.INTERSECT and tree.all
    tree = lowered("props.intersect_except_chain")
    assert isinstance(tree, SetOp) and tree.kind is SetOpKind.EXCEPT and not tree.all
    assert isinstance(tree.left, SetOp) and tree.left.kind is SetOpKind.INTERSECT


def test_distinct_on_is_row_number_over_the_on_keys() -> None:
    tree = lowered("props.distinct_on")
    assert isinstance(tree, Project) and isinstance(tree.input, Filter)
    (window,) = of(tree, Window)
    assert sql(window.functions[0][1]) == (
        "ROW_NUMBER() OVER (PARTITION BY k_1 ORDER BY k_1 ASC, v_1 DESC, id_1 ASC)"
    )


def test_top_k_with_offset_and_order_by_without_limit() -> None:
    tree = lowered("props.top_k_offset")
    assert isinstance(tree, TopK) and (tree.limit, tree.offset) == (4, 2)
    assert not of(lowered("props.order_no_limit"), TopK)
    tree = lowered("props.topk_in_derived")
    assert isinstance(tree.input.input, TopK)  # type: ignore[attr-defined]


def test_top_k_on_a_key_outside_the_select_list_is_dropped_after() -> None:
    tree = lower_sql("SELECT a.id FROM props.a ORDER BY a.v DESC LIMIT 3")
    assert tree.columns == ("id",) and isinstance(tree, Project)
    assert isinstance(tree.input, TopK) and len(tree.input.columns) == 2


def test_set_operation_with_order_by_limit_and_limit_all() -> None:
    tree = lower_sql("SELECT a.k FROM props.a UNION SELECT b.w FROM props.b ORDER BY 1 DESC LIMIT 2")
    assert isinstance(tree, TopK) and isinstance(tree.input, Distinct) and tree.limit == 2
    assert [sql(o) for o in tree.order] == ["k DESC"]
    tree = lower_sql("SELECT a.id FROM props.a ORDER BY a.id LIMIT ALL")
    assert not of(tree, TopK)  # no limit, no offset: the order is dropped
    tree = lower_sql("SELECT a.id FROM props.a ORDER BY a.id LIMIT ALL OFFSET 3")
    assert isinstance(tree, TopK) and (tree.limit, tree.offset) == (None, 3)


def test_order_by_an_aggregate_outside_the_select_list() -> None:
    tree = lower_sql("SELECT a.k FROM props.a GROUP BY a.k ORDER BY sum(a.v) DESC LIMIT 3")
    assert isinstance(tree, Project) and tree.columns == ("k",)
    top = tree.input
    assert isinstance(top, TopK) and isinstance(top.input, Project)
    assert [sql(a) for _, a in of(tree, Aggregate)[0].aggregates] == ["SUM(v)"]


def test_values_in_from_and_row_in_subquery() -> None:
    tree = lower_sql("SELECT v.x, v.y FROM (VALUES (1, 'a'), (2, 'b')) v(x, y)")
    assert tree.columns == ("x", "y") and len(of(tree, Values)[0].rows) == 2
    (semi,) = joins(
        lower_sql("SELECT a.id FROM props.a WHERE (a.k, a.n) IN (SELECT b.k, b.w FROM props.b)"),
        JoinKind.SEMI,
    )
    assert sql(semi.condition) == "k = k_1 AND n = w"


def test_fromless_select_is_values() -> None:
    tree = lowered("props.fromless")
    assert isinstance(tree, Values) and tree.columns == ("one", "two") and len(tree.rows) == 1


def test_star_expansion() -> None:
    assert lower_sql("SELECT * FROM props.c").columns == ("id", "a_id", "x")
    assert lower_sql("SELECT c.*, b.name FROM props.c JOIN props.b ON b.id = c.a_id").columns == (
        "id",
        "a_id",
        "x",
        "name",
    )


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "query, construct",
    [
        (
            "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT n FROM t",
            "WITH RECURSIVE",
        ),
        ("SELECT g FROM generate_series(1, 3) g", "the set-returning function generate_series()"),
        ("SELECT generate_series(1, a.k) AS s FROM props.a", "the set-returning function generate_series()"),
        ("SELECT a.id, l.x FROM props.a, LATERAL (SELECT c.x FROM props.c WHERE c.a_id = a.id) l", "LATERAL"),
        ("SELECT a.id FROM props.a FOR UPDATE", "FOR UPDATE / FOR SHARE"),
        ("SELECT a.id, random() AS r FROM props.a", "the volatile function random()"),
        ("SELECT a.id, clock_timestamp() AS t FROM props.a", "the volatile function clock_timestamp()"),
        ("SELECT nextval('s') AS n FROM props.a", "the volatile function nextval()"),
        ("SELECT a.k, count(*) AS n FROM props.a GROUP BY ROLLUP (a.k)", "GROUPING SETS / ROLLUP / CUBE"),
        (
            "SELECT a.k, count(*) AS n FROM props.a GROUP BY GROUPING SETS ((a.k), ())",
            "GROUPING SETS / ROLLUP / CUBE",
        ),
        ("SELECT sum(a.n) OVER w AS s FROM props.a WINDOW w AS (PARTITION BY a.k)", "a named WINDOW clause"),
        ("SELECT a.id FROM props.a LIMIT 3", "LIMIT / OFFSET without ORDER BY"),
        (
            "SELECT a.id FROM props.a WHERE a.k = 1 OR EXISTS (SELECT 1 FROM props.b WHERE b.k = a.k)",
            "EXISTS (subquery) that is not a WHERE conjunct of its own",
        ),
        (
            "SELECT a.id, a.k NOT IN (SELECT b.w FROM props.b) AS absent FROM props.a",
            "IN / NOT IN (subquery) that is not a WHERE conjunct of its own",
        ),
        (
            "SELECT a.id, (SELECT b.name FROM props.b WHERE b.id = a.k) AS name FROM props.a",
            "a correlated subquery of this form",
        ),
        (
            "SELECT a.id, (SELECT sum(c.x) FROM props.c WHERE c.a_id = a.id AND c.x > a.n) AS s FROM props.a",
            "a correlated scalar subquery whose correlation is not `inner = outer`",
        ),
        (
            "SELECT a.id FROM props.a WHERE a.k IN (SELECT b.k FROM props.b WHERE b.id = a.id GROUP BY b.k)",
            "a correlated subquery of this form",
        ),
        (
            "SELECT a.id FROM props.a WHERE EXISTS (SELECT 1 FROM props.b WHERE EXISTS "
            "(SELECT 1 FROM props.c WHERE c.a_id = a.id))",
            "a subquery correlated with a query two levels out",
        ),
        ("SELECT a.id FROM props.a TABLESAMPLE SYSTEM (10)", "TABLESAMPLE"),
    ],
)
def test_refusals_name_the_construct(query: str, construct: str) -> None:
    with pytest.raises(NoDeltaRuleError) as info:
        lower_sql(query)
    assert info.value.construct == construct
    assert construct in str(info.value)


@pytest.mark.parametrize(
    "query, words",
    [
        ("SELECT x.id FROM props.missing x", "relation props.missing"),
        ("SELECT a.nope FROM props.a", "column a.nope does not exist"),
        ("SELECT id FROM props.a JOIN props.b ON a.k = b.k", "'id' is ambiguous"),
        ("SELECT a.id, b.id FROM props.a JOIN props.b ON a.k = b.k", "'id' appears twice"),
        ("SELECT a.k, a.n FROM props.a GROUP BY a.k", "column n must appear in the GROUP BY clause"),
    ],
)
def test_bad_input_is_an_unsupported_query_error(query: str, words: str) -> None:
    with pytest.raises(UnsupportedQueryError) as info:
        lower_sql(query)
    assert not isinstance(info.value, NoDeltaRuleError)
    assert words in str(info.value)


def test_lowering_does_not_change_the_parsed_query() -> None:
    query = parse_query(CASES["tpch.q20"]["viewdef"])
    before = query.sql("postgres")
    lower(query, RELATIONS)
    assert query.sql("postgres") == before


def test_quoted_mixed_case_names_keep_their_spelling() -> None:
    relations = {"public.Orders": ["Id", "Amount", "region name"]}
    query = parse_query(
        'SELECT o."Id", sum(o."Amount") AS "Total", o."region name" FROM public."Orders" o '
        'GROUP BY o."Id", o."region name"'
    )
    tree = lower(query, relations)
    assert tree.columns == ("Id", "Total", "region name")
    (scan,) = of(tree, Scan)
    assert scan.relation == "public.Orders" and scan.source_columns == ("Id", "Amount", "region name")
    (agg,) = of(tree, Aggregate)
    assert [sql(k) for _, k in agg.keys] == ['"Id"', '"region name"']


def test_lowering_is_deterministic() -> None:
    def shape(tree: Node) -> list[tuple[str, tuple[str, ...]]]:
        return [(type(n).__name__, n.columns) for n in ir.walk(tree)]

    assert shape(lowered("tpch.q20")) == shape(lowered("tpch.q20"))
