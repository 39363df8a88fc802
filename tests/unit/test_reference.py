"""The reference evaluator against hand-computed results (pure: no JVM, no database)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest
import sqlglot
from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.reference import Table, at_pre, evaluate
from pgtrickle.dvm.reference_scalar import EvaluationError, scalar
from pgtrickle.errors import UnsupportedQueryError


def e(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="postgres")


def order(sql: str) -> tuple[exp.Ordered, ...]:
    return tuple(sqlglot.parse_one(f"SELECT 1 ORDER BY {sql}", read="postgres").args["order"].expressions)


T = ir.Scan("public.t", ("a", "b"), ("a", "b"))
U = ir.Scan("public.u", ("c", "d"), ("c", "d"))
ENV = {
    "public.t": Table(("a", "b"), Counter({(1, 10): 1, (1, None): 2, (2, 20): 1, (None, 30): 1})),
    "public.u": Table(("d", "c"), Counter({(100, 1): 1, (200, 1): 1, (300, None): 1})),
}


def z(*rows: tuple, weight: int = 1) -> Counter:
    out: Counter = Counter()
    for row in rows:
        out[row] += weight
    return out


@pytest.mark.parametrize(
    ("sql", "row", "expected"),
    [
        ("a = 1", {"a": None}, None),
        ("a = 1 AND FALSE", {"a": None}, False),
        ("a = 1 OR TRUE", {"a": None}, True),
        ("NOT (a = 1)", {"a": None}, None),
        ("a IS NULL", {"a": None}, True),
        ("a IS NOT NULL", {"a": None}, False),
        ("a IS NOT DISTINCT FROM NULL", {"a": None}, True),
        ("a IS DISTINCT FROM 1", {"a": None}, True),
        ("a IN (1, NULL)", {"a": 2}, None),
        ("a IN (1, NULL)", {"a": 1}, True),
        ("a IN (1, 2)", {"a": 3}, False),
        ("a IN (1, 2)", {"a": None}, None),
        ("COALESCE(a, b, 7)", {"a": None, "b": None}, 7),
        ("CASE WHEN a > 0 THEN 'p' WHEN a < 0 THEN 'n' END", {"a": None}, None),
        ("CASE WHEN a > 0 THEN 'p' ELSE 'z' END", {"a": 0}, "z"),
        ("CASE a WHEN 1 THEN 'one' ELSE 'other' END", {"a": 1}, "one"),
        ("-7 / 2", {}, -3),
        ("7 / 2.0", {}, Decimal("3.5")),
        ("(a + 1) * 2 - 1", {"a": 3}, 7),
        ("a + 1", {"a": None}, None),
        ("(a = 1) IS NOT FALSE", {"a": None}, True),
        ("CAST(a AS NUMERIC) / 4", {"a": 2}, Decimal("0.5")),
        ("'x' <> 'y'", {}, True),
    ],
)
def test_scalar_three_valued_logic(sql: str, row: dict, expected: object) -> None:
    assert scalar(e(sql), row) == expected


def test_division_by_zero_has_the_sqlstate() -> None:
    with pytest.raises(EvaluationError) as raised:
        scalar(e("1 / a"), {"a": 0})
    assert raised.value.sqlstate == "22012"


@pytest.mark.parametrize("sql", ["UPPER(a)", "a LIKE 'x%'", "a IN (SELECT 1)"])
def test_unsupported_construct_is_named(sql: str) -> None:
    with pytest.raises(UnsupportedQueryError, match="does not support"):
        scalar(e(sql), {"a": "x"})


def test_scan_reads_by_column_name_and_filter_rejects_null() -> None:
    assert evaluate(U, ENV) == z((1, 100), (1, 200), (None, 300))
    assert evaluate(ir.Filter(T, e("b > 10")), ENV) == z((2, 20), (None, 30))


def test_project_and_union_all_add_weights() -> None:
    p = ir.Project(T, (("x", e("a")),))
    assert evaluate(p, ENV) == Counter({(1,): 3, (2,): 1, (None,): 1})
    u = ir.UnionAll((p, ir.Project(U, (("y", e("c")),))), ("x",))
    assert evaluate(u, ENV) == Counter({(1,): 5, (2,): 1, (None,): 2})
    assert evaluate(ir.Negate(p), ENV) == Counter({(1,): -3, (2,): -1, (None,): -1})


def test_joins_null_never_matches() -> None:
    cond = e("a = c")
    inner = ir.Join(ir.JoinKind.INNER, T, U, cond)
    assert evaluate(inner, ENV) == Counter(
        {(1, 10, 1, 100): 1, (1, 10, 1, 200): 1, (1, None, 1, 100): 2, (1, None, 1, 200): 2}
    )
    left = evaluate(ir.Join(ir.JoinKind.LEFT, T, U, cond), ENV)
    assert left[(2, 20, None, None)] == 1 and left[(None, 30, None, None)] == 1 and sum(left.values()) == 8
    right = evaluate(ir.Join(ir.JoinKind.RIGHT, T, U, cond), ENV)
    assert right[(None, None, None, 300)] == 1 and sum(right.values()) == 7
    full = evaluate(ir.Join(ir.JoinKind.FULL, T, U, cond), ENV)
    assert sum(full.values()) == 9
    assert evaluate(ir.Join(ir.JoinKind.SEMI, T, U, cond), ENV) == Counter({(1, 10): 1, (1, None): 2})
    assert evaluate(ir.Join(ir.JoinKind.ANTI, T, U, cond), ENV) == z((2, 20), (None, 30))
    # NOT IN: one NULL on the right makes every comparison unknown, so no row survives.
    not_in = ir.Join(ir.JoinKind.ANTI, T, U, e("(a = c) IS NOT FALSE"))
    assert evaluate(not_in, ENV) == Counter()
    assert sum(evaluate(ir.Join(ir.JoinKind.INNER, T, U), ENV).values()) == 15


def test_aggregates_with_null_distinct_filter() -> None:
    agg = ir.Aggregate(
        T,
        (("a", e("a")),),
        (
            ("n", e("COUNT(*)")),
            ("nb", e("COUNT(b)")),
            ("s", e("SUM(b)")),
            ("avg", e("AVG(b)")),
            ("mx", e("MAX(b)")),
            ("f", e("COUNT(*) FILTER (WHERE b IS NULL)")),
            ("dn", e("COUNT(DISTINCT a)")),
        ),
    )
    assert evaluate(agg, ENV) == z(
        (1, 3, 1, 10, Decimal(10), 10, 2, 1),
        (2, 1, 1, 20, Decimal(20), 20, 0, 1),
        (None, 1, 1, 30, Decimal(30), 30, 0, 0),
    )
    empty = ir.Aggregate(ir.Filter(T, e("FALSE")), (), (("n", e("COUNT(*)")), ("s", e("SUM(a)"))))
    assert evaluate(empty, ENV) == z((0, None))


def test_non_linear_operators_read_net_weights() -> None:
    env = {"public.t": Table(("a", "b"), Counter({(1, 1): 2, (2, 2): -1}))}
    assert evaluate(ir.Distinct(T), env) == z((1, 1))
    assert evaluate(ir.Aggregate(T, (), (("n", e("COUNT(*)")),)), env) == z((2,))


def test_set_operations() -> None:
    a = ir.Project(T, (("x", e("a")),))
    c = ir.Project(U, (("y", e("c")),))

    def op(kind: ir.SetOpKind, all_: bool) -> Counter:
        return evaluate(ir.SetOp(kind, all_, a, c, ("x",)), ENV)

    assert op(ir.SetOpKind.INTERSECT, True) == Counter({(1,): 2, (None,): 1})
    assert op(ir.SetOpKind.INTERSECT, False) == z((1,), (None,))
    assert op(ir.SetOpKind.EXCEPT, True) == z((1,), (2,))
    assert op(ir.SetOpKind.EXCEPT, False) == z((2,))


def test_window_functions_default_frame() -> None:
    env = {"public.t": Table(("a", "b"), Counter({(1, 10): 1, (1, 20): 2, (2, 5): 1, (1, None): 1}))}
    w = ir.Window(
        T,
        (
            ("rn", e("ROW_NUMBER() OVER (PARTITION BY a ORDER BY b)")),
            ("rk", e("RANK() OVER (PARTITION BY a ORDER BY b)")),
            ("dr", e("DENSE_RANK() OVER (PARTITION BY a ORDER BY b)")),
            ("rs", e("SUM(b) OVER (PARTITION BY a ORDER BY b)")),
            ("tot", e("COUNT(*) OVER (PARTITION BY a)")),
        ),
    )
    # ORDER BY b ascending puts NULLs last; peers (b = 20 twice) share RANK and the running sum.
    assert evaluate(w, env) == z(
        (1, 10, 1, 1, 1, 10, 4),
        (1, 20, 2, 2, 2, 50, 4),
        (1, 20, 3, 2, 2, 50, 4),
        (1, None, 4, 4, 3, 50, 4),
        (2, 5, 1, 1, 1, 5, 1),
    )
    with pytest.raises(UnsupportedQueryError, match="window function"):
        evaluate(ir.Window(T, (("x", e("SUM(b) OVER (ROWS 1 PRECEDING)")),)), env)


def test_top_k_orders_with_postgres_null_placement_and_offset() -> None:
    top = ir.TopK(T, order("b DESC"), limit=2, offset=1)
    # DESC puts NULLs first: (1,NULL),(1,NULL),(None,30),(2,20),(1,10) → skip one, take two.
    assert evaluate(top, ENV) == z((1, None), (None, 30))
    assert evaluate(ir.TopK(T, order("a"), limit=None), ENV) == evaluate(T, ENV)


def test_delta_materialized_and_pre() -> None:
    env = {
        "public.t": Table(("a", "b"), Counter({(1, 10): 1, (3, 30): 1}), Counter({(3, 30): 1, (2, 20): -1})),
    }
    assert evaluate(ir.Delta(T), env) == Counter({(3, 30): 1, (2, 20): -1})
    assert at_pre(env)["public.t"].post == z((1, 10), (2, 20))
    agg = ir.Aggregate(T, (), (("s", e("SUM(a)")),))
    assert evaluate(ir.Materialized(agg, pre=True), env) == z((3,))
    assert evaluate(ir.Materialized(agg), env) == z((4,))
    assert evaluate(ir.Values(((e("1"), e("NULL")),), ("x", "y")), env) == z((1, None))


def test_missing_relation_is_named() -> None:
    with pytest.raises(UnsupportedQueryError, match=r"public\.nope"):
        evaluate(ir.Scan("public.nope", ("a",), ("a",)), ENV)
