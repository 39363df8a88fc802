"""The stored-state refresh: the aggregate of the weighted change, and its merge statements (pure)."""

from __future__ import annotations

import pytest
import sqlglot

from pgtrickle.dvm import materialize
from pgtrickle.dvm.compile import Compiled
from pgtrickle.dvm.ir import Materialized, Scan
from pgtrickle.dvm.pipeline import plan_delta
from pgtrickle.dvm.state_change import state_change
from pgtrickle.dvm.stored import StoredAggregate, stored_aggregate
from pgtrickle.refresh.state_merge import merge_statements

TYPES = {
    "public.orders": {"id": "integer", "cust": "integer", "amount": "numeric(10,2)", "qty": "integer"},
    "public.customers": {"cid": "integer", "region": "text"},
}
SCHEMA = {relation: list(cols) for relation, cols in TYPES.items()}
ALL = frozenset(SCHEMA)


class Views:
    def post(self, scan: Scan) -> str:
        return "v_" + scan.relation

    def delta(self, scan: Scan) -> str:
        return "d_" + scan.relation

    def materialized(self, node: Materialized) -> str:
        raise AssertionError("the stored-state change never reads the stored state")


def stored(sql: str, visible: list[str]) -> StoredAggregate:
    tree = plan_delta(sql, SCHEMA, TYPES, set(SCHEMA), "spark").tree
    found = stored_aggregate(tree, visible, TYPES)
    assert found is not None
    return found


def compiled(s: StoredAggregate, changed: frozenset[str] = ALL, dialect: str = "spark") -> Compiled | None:
    found = state_change(s, changed, tuple(materialize.decide(s.root)), Views(), TYPES, dialect)  # type: ignore[arg-type]
    return None if found is None else found.compiled


JOINED = (
    "SELECT c.region, sum(o.qty) AS q, count(o.amount) AS k FROM public.orders o"
    " JOIN public.customers c ON c.cid = o.cust GROUP BY c.region"
)


@pytest.mark.parametrize("dialect", ["spark", "postgres"])
def test_one_weighted_aggregation_of_the_inputs_change(dialect: str) -> None:
    s = stored(JOINED, ["region", "q", "k"])
    result = compiled(s, dialect=dialect)
    assert result is not None and result.columns == s.written == (
        "region",
        "q",
        "__pgt_n_q",
        "k",
        "__pgt_count",
    )
    text = result.sql()
    tree = sqlglot.parse_one(text, read=dialect)
    assert len(list(tree.find_all(sqlglot.exp.Group))) == 1  # one aggregation, no consolidation
    assert "d_public.orders" in text and "d_public.customers" in text  # the join's telescoped change
    assert "v_public.customers" in text and "hidden" not in text  # sources, never the stored state
    assert "explode" not in text.lower() and "generate_series" not in text.lower()  # integers: x * w
    # A group whose changes cancel is not sent: a filter over the aggregate's output columns,
    # not a HAVING repeating every aggregate (Spark analyses and plans that one longer).
    assert "HAVING" not in text
    where = tree.find(sqlglot.exp.Where)
    assert where is not None and not list(where.find_all(sqlglot.exp.Sum))
    assert {c.name for c in where.find_all(sqlglot.exp.Column)} >= {"__pgt_count", "count"}


def test_a_numeric_sum_repeats_rows_by_weight_instead_of_multiplying() -> None:
    s = stored("SELECT o.cust, sum(o.amount) AS t FROM public.orders o GROUP BY o.cust", ["cust", "t"])
    result = compiled(s)
    assert result is not None
    text = result.sql().upper()
    assert "EXPLODE(SEQUENCE(" in text and "ABS(" in text
    assert "`AMOUNT` * " not in text


def test_filter_and_scalar_aggregates() -> None:
    s = stored(
        "SELECT count(*) FILTER (WHERE o.qty > 1) AS n, avg(o.qty) AS a FROM public.orders o", ["n", "a"]
    )
    result = compiled(s, dialect="postgres")
    assert result is not None and "GROUP BY" not in result.sql()
    assert 'CASE WHEN "qty" > 1 THEN "__pgt_w" ELSE 0 END' in result.sql()


def test_no_change_under_the_aggregate_is_no_plan() -> None:
    s = stored("SELECT o.cust, count(*) AS n FROM public.orders o GROUP BY o.cust", ["cust", "n"])
    assert compiled(s, frozenset({"public.customers"})) is None


def test_merge_statements_for_groups() -> None:
    s = stored(
        "SELECT o.cust, count(*) AS n, sum(o.qty) AS q, avg(o.amount) AS a FROM public.orders o GROUP BY o.cust",
        ["cust", "n", "q", "a"],
    )
    m = merge_statements(s, '"public"."st"', {"a": "numeric"}, {"cust": "OPERATOR(public.=)"})
    assert "t.__pgt_row_id = d.__pgt_row_id" in m.match and "OPERATOR(public.=)" in m.match
    assert m.delete.endswith('t."__pgt_count" + d."__pgt_count" = 0')
    assert 'AND t."__pgt_count" + d."__pgt_count" > 0' in m.update
    # a sum over no non-NULL value left is NULL; the AVG divides the merged sum by the merged count
    assert (
        '"q" = CASE WHEN t."__pgt_n_q" + d."__pgt_n_q" > 0 THEN coalesce(t."q", 0) + coalesce(d."q", 0) END'
        in m.update
    )
    assert '"a" = CASE WHEN (t."__pgt_n_a" + d."__pgt_n_a") > 0 THEN ((CASE WHEN' in m.update
    assert "::numeric" in m.update
    assert 'WHERE d."__pgt_count" > 0 AND NOT EXISTS' in m.insert


def test_merge_statements_for_a_scalar_aggregate_only_update() -> None:
    s = stored("SELECT count(*) AS n, sum(o.qty) AS q FROM public.orders o", ["n", "q"])
    m = merge_statements(s, '"public"."st"', {}, {})
    assert m.match == "true" and m.delete == "" and m.insert == ""
    assert m.update.startswith('UPDATE "public"."st" AS t SET "n" = t."n" + d."n"')


@pytest.mark.parametrize("dialect", ["spark", "postgres"])
def test_a_sum_of_an_expression_is_multiplied_by_the_weight_whole(dialect: str) -> None:
    """sum(qty + 1) changes by Σ (qty + 1)·w, not Σ qty + 1·w (operator precedence)."""
    s = stored("SELECT cust, sum(qty + 1) AS q FROM public.orders GROUP BY cust", ["cust", "q"])
    result = compiled(s, dialect=dialect)
    assert result is not None
    tree = sqlglot.parse_one(result.sql(), read="spark" if dialect == "spark" else "postgres")
    products = [m for m in tree.find_all(sqlglot.exp.Mul) if "__pgt_w" in m.expression.sql()]
    assert products, result.sql()
    assert all(isinstance(m.this.unnest(), sqlglot.exp.Add) for m in products), result.sql()
