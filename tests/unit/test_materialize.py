"""Which nodes become hidden internal stream tables, and why (pure decision over the IR)."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.materialize import (
    AGGREGATE_JOINED_ON_VALUES,
    AGGREGATE_OF_AGGREGATE,
    TOPK_INPUT,
    decide,
    trace,
)


def e(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="postgres")


ORDERS = ir.Scan("public.orders", ("id", "cust", "amount"), ("id", "cust", "amount"))
CUSTOMERS = ir.Scan("public.customers", ("cid", "name"), ("cid", "name"))
TOTALS = ir.Aggregate(ORDERS, (("tc", e("cust")),), (("total", e("SUM(amount)")), ("n", e("COUNT(*)"))))


def test_aggregate_joined_on_its_group_column_is_not_materialized() -> None:
    node = ir.Join(ir.JoinKind.INNER, CUSTOMERS, TOTALS, e("cid = tc"))
    assert decide(node) == {}


def test_aggregate_joined_on_an_aggregate_value_is_materialized() -> None:
    node = ir.Join(ir.JoinKind.LEFT, CUSTOMERS, TOTALS, e("cid = tc AND total > 100"))
    assert decide(node) == {TOTALS: AGGREGATE_JOINED_ON_VALUES}


def test_aggregate_seen_through_project_and_filter() -> None:
    renamed = ir.Filter(ir.Project(TOTALS, (("who", e("tc")), ("big", e("total * 2")))), e("big > 0"))
    on_key = ir.Join(ir.JoinKind.SEMI, CUSTOMERS, renamed, e("cid = who"))
    on_value = ir.Join(ir.JoinKind.SEMI, CUSTOMERS, renamed, e("cid = big"))
    assert decide(on_key) == {}
    assert decide(on_value) == {TOTALS: AGGREGATE_JOINED_ON_VALUES}
    assert trace(renamed, {"big"}) == (TOTALS, {"total"})
    assert trace(CUSTOMERS, {"cid"}) is None


def test_cross_joined_aggregate_is_materialized() -> None:
    grand = ir.Aggregate(ORDERS, (), (("all_total", e("SUM(amount)")),))
    assert decide(ir.Join(ir.JoinKind.INNER, CUSTOMERS, grand)) == {grand: AGGREGATE_JOINED_ON_VALUES}


def test_nested_aggregate_is_materialized() -> None:
    outer = ir.Aggregate(TOTALS, (("n", e("n")),), (("groups", e("COUNT(*)")),))
    assert decide(outer) == {TOTALS: AGGREGATE_OF_AGGREGATE}


def test_topk_input_is_materialized_unless_a_base_relation() -> None:
    ordered = tuple(
        sqlglot.parse_one("SELECT 1 ORDER BY total DESC", read="postgres").args["order"].expressions
    )
    top = ir.TopK(TOTALS, ordered, limit=10)
    assert decide(top) == {TOTALS: TOPK_INPUT}
    by_amount = tuple(
        sqlglot.parse_one("SELECT 1 ORDER BY amount", read="postgres").args["order"].expressions
    )
    assert decide(ir.TopK(ORDERS, by_amount, limit=3)) == {}


def test_root_is_never_materialized() -> None:
    assert decide(TOTALS) == {}
    consumer = ir.Join(ir.JoinKind.INNER, CUSTOMERS, TOTALS, e("cid = tc AND n > 1"))
    assert TOTALS in decide(consumer) and consumer not in decide(consumer)
