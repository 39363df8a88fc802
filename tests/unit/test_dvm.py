"""Delta rules and mode analysis (pure: sqlglot trees, no database)."""

from __future__ import annotations

import pytest
from sqlglot import exp

from pgtrickle.dvm import aggregate as agg_rules
from pgtrickle.dvm.analysis import ALGEBRAIC, RESCAN, AggregateShape, LinearShape, RecomputeShape, analyze
from pgtrickle.dvm.apply import linear_statements
from pgtrickle.dvm.linear import (
    WEIGHT,
    NotDifferentiable,
    equi_links,
    inline_ctes,
    term_query,
    terms,
    weighted,
)
from pgtrickle.refresh.differential import should_push_down
from pgtrickle.refresh.plan import fallback_needed
from pgtrickle.sql.translate import parse_query

VIEWS = {(i, d): ("d" if d else "p") + str(i) for i in range(8) for d in (False, True)}


def _weighted(sql: str):  # type: ignore[no-untyped-def]
    return weighted(inline_ctes(parse_query(sql)))


# --------------------------------------------------------------------------- linear


def test_every_select_gets_the_product_of_its_relation_weights() -> None:
    w = _weighted("SELECT o.id, c.name FROM public.orders o JOIN public.customers c ON o.cust = c.id")
    assert [o.table for o in w.occurrences] == ["orders", "customers"]
    last = w.query.expressions[-1]
    assert last.alias == WEIGHT
    assert isinstance(last.this, exp.Mul)


def test_inclusion_exclusion_terms_and_signs() -> None:
    w = _weighted("SELECT a.x FROM public.t a JOIN public.t b ON a.x = b.x")
    assert sorted((sorted(s), sign) for s, sign in terms(w, {0, 1})) == [([0], 1), ([0, 1], -1), ([1], 1)]
    assert terms(w, {1}) == [(frozenset({1}), 1)]


def test_a_term_reads_deltas_and_states_after() -> None:
    w = _weighted("SELECT a.x FROM public.t a JOIN public.u b ON a.x = b.y")
    sql = term_query(w, frozenset({1}), VIEWS).sql("postgres")
    assert "pgt_dvm.p0" in sql and "pgt_dvm.d1" in sql and "d0" not in sql


def test_union_all_term_keeps_only_the_branch_with_the_change() -> None:
    w = _weighted("SELECT a.x FROM public.t a UNION ALL SELECT b.y FROM public.u b UNION ALL SELECT 1")
    sql = term_query(w, frozenset({1}), VIEWS).sql("postgres")
    assert "d1" in sql and "p0" not in sql and "SELECT 1" not in sql


def test_changes_in_two_union_branches_make_an_empty_cross_term() -> None:
    w = _weighted("SELECT s.x FROM (SELECT a.x FROM public.t a UNION ALL SELECT b.y FROM public.u b) s")
    assert term_query(w, frozenset({0, 1}), VIEWS) is None
    kept = term_query(w, frozenset({0}), VIEWS).sql("postgres")
    assert "d0" in kept and "u" not in kept.replace("UNION", "")


def test_cte_references_become_separate_occurrences() -> None:
    w = _weighted("WITH c AS (SELECT t.x FROM public.t) SELECT a.x FROM c a JOIN c b ON a.x = b.x")
    assert len(w.occurrences) == 2 and {o.table for o in w.occurrences} == {"t"}


def test_derived_table_column_aliases_get_the_weight() -> None:
    w = _weighted("SELECT s.k FROM (SELECT t.x FROM public.t) s(k)")
    assert "__pgt_w" in w.query.sql("postgres").split("s(")[1] or "AS s(k, __pgt_w)" in w.query.sql("postgres")


def test_equi_links_pair_columns_of_two_occurrences() -> None:
    w = _weighted("SELECT e.id FROM public.events e JOIN public.dims d ON d.id = e.dim_id WHERE e.v > 1")
    links = equi_links(w)
    assert links[0][0].column == "dim_id" and links[0][0].other == 1 and links[0][0].other_column == "id"
    assert links[1][0].column == "id"


@pytest.mark.parametrize("sql,construct", [
    ("SELECT a.x FROM public.t a LEFT JOIN public.u b ON a.x = b.y", "LEFT OUTER JOIN"),
    ("SELECT a.x FROM public.t a WHERE EXISTS (SELECT 1 FROM public.u b WHERE b.y = a.x)", "EXISTS"),
    ("SELECT a.x FROM public.t a, LATERAL (SELECT a.x + 1 AS y) s", "LATERAL"),
    ("SELECT s.x FROM (SELECT DISTINCT t.x FROM public.t) s", "DISTINCT below"),
])
def test_non_linear_constructs_are_named(sql: str, construct: str) -> None:
    with pytest.raises(NotDifferentiable, match=construct):
        _weighted(sql)


def test_too_many_changed_occurrences_refuse() -> None:
    w = _weighted("SELECT a.x FROM " + ", ".join(f"public.t{i} a{i}" for i in range(7)).replace("a0", "a"))
    with pytest.raises(NotDifferentiable, match="changed table occurrences"):
        terms(w, set(range(7)))


# --------------------------------------------------------------------------- analysis


@pytest.mark.parametrize("sql,shape", [
    ("SELECT t.x FROM public.t WHERE t.x > 1", LinearShape),
    ("SELECT t.x FROM public.t UNION ALL SELECT u.y FROM public.u", LinearShape),
    ("SELECT t.g, sum(t.v) AS s FROM public.t GROUP BY t.g", AggregateShape),
    ("SELECT DISTINCT t.g FROM public.t", AggregateShape),
    ("SELECT t.x FROM public.t UNION SELECT u.y FROM public.u", AggregateShape),
])
def test_supported_shapes(sql: str, shape: type) -> None:
    analysis = analyze(sql)
    assert analysis.differential, analysis.reason
    assert isinstance(analysis.shape, shape)


@pytest.mark.parametrize("sql,source,many", [
    ("SELECT t.x FROM public.t INTERSECT SELECT u.y FROM public.u", "INTERSECT", False),
    ("SELECT t.x FROM public.t EXCEPT ALL SELECT u.y FROM public.u", "EXCEPT ALL", True),
    ("SELECT t.x FROM public.t INTERSECT SELECT u.y FROM public.u EXCEPT SELECT v.z FROM public.v", "EXCEPT", False),
])
def test_intersect_except_recompute_the_touched_rows(sql: str, source: str, many: bool) -> None:
    from pgtrickle.dvm import aggregate as agg_rules

    analysis = analyze(sql)
    shape = analysis.shape
    assert isinstance(shape, AggregateShape) and shape.strategy == RESCAN, analysis.reason
    assert shape.distinct_source == source and shape.many_rows_per_key is many
    # the touched rows come from the delta of every branch, made UNION ALL ...
    core = agg_rules.core_query(shape).sql("postgres")
    assert "INTERSECT" not in core and "EXCEPT" not in core and core.count("UNION ALL") == sql.count("SELECT") - 1
    # ... and are recomputed from the set operation itself, restricted to them
    rescan = agg_rules.rescan_query(shape, "pgt_dvm.keys").sql("postgres")
    assert source.split()[0] in rescan and "IS NOT DISTINCT FROM __pgt_k.__pgt_g0" in rescan


@pytest.mark.parametrize("sql,construct", [
    ("SELECT t.x FROM public.t ORDER BY t.x LIMIT 3", "LIMIT"),
    ("SELECT t.x FROM public.t ORDER BY t.x OFFSET 2", "LIMIT"),
    ("SELECT t.x, row_number() OVER (ORDER BY t.x) AS r FROM public.t", "without PARTITION BY"),
    ("SELECT t.x, rank() OVER (PARTITION BY t.g ORDER BY t.x) AS r, "
     "sum(t.x) OVER (PARTITION BY t.x) AS s FROM public.t", "different PARTITION BY"),
    ("SELECT t.x FROM public.t EXCEPT ALL SELECT count(*) AS count FROM public.u", "EXCEPT ALL over aggregate"),
    ("SELECT t.x FROM public.t WHERE (t.x <> ALL (SELECT u.y FROM public.u))", "ANY / ALL"),
    ("SELECT t.x FROM public.t WHERE NOT (t.x IN (SELECT u.y FROM public.u WHERE u.z = t.g))", "correlated"),
    ("SELECT t.x, (SELECT max(u.y) AS max FROM public.u) AS m FROM public.t", "scalar subquery"),
    ("SELECT t.x FROM public.t WHERE t.x > (SELECT avg(u.y) AS avg FROM public.u)", "scalar subquery"),
])
def test_recomputed_constructs_are_differential_and_say_why(sql: str, construct: str) -> None:
    analysis = analyze(sql)
    assert analysis.differential, analysis.reason
    assert isinstance(analysis.shape, RecomputeShape)
    assert construct in analysis.reason
    assert "recomputed in Spark" in analysis.reason


@pytest.mark.parametrize("sql,construct", [
    ("SELECT t.x FROM public.t JOIN public.u ON t.x < u.y JOIN public.v ON v.z = u.y "
     "LEFT JOIN public.w ON w.q = t.g", "not all joined on one key"),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT r.n + 1 FROM r WHERE r.n < 3) SELECT r.n FROM r",
     "RECURSIVE"),
    ("SELECT t.x, now() AS ts FROM public.t", "volatile"),
    ("SELECT DISTINCT ON (t.g) t.g, t.x FROM public.t", "DISTINCT ON"),
    ("SELECT t.g, count(*) AS n FROM public.t GROUP BY ROLLUP (t.g)", "ROLLUP"),
])
def test_unsupported_constructs_refresh_in_full_and_say_why(sql: str, construct: str) -> None:
    analysis = analyze(sql)
    assert not analysis.differential
    assert construct in analysis.reason


def test_aggregate_strategies() -> None:
    algebraic = analyze("SELECT t.g, count(*) AS n, sum(t.v) AS s, avg(t.v) AS a FROM public.t GROUP BY t.g").shape
    assert algebraic.strategy == ALGEBRAIC
    assert algebraic.hidden_columns()[0] == "__pgt_count"
    for sql, why in [
        ("SELECT t.g, max(t.v) AS m FROM public.t GROUP BY t.g", "MAX"),
        ("SELECT t.g, count(DISTINCT t.v) AS m FROM public.t GROUP BY t.g", "DISTINCT"),
        ("SELECT t.g, sum(t.v) AS s FROM public.t GROUP BY t.g HAVING sum(t.v) > 3", "HAVING"),
        ("SELECT t.g, string_agg(t.s, ',') AS m FROM public.t GROUP BY t.g", ""),
    ]:
        shape = analyze(sql).shape
        assert shape.strategy == RESCAN and why in shape.strategy_reason, sql


def test_group_key_not_in_the_output_is_kept_hidden() -> None:
    shape = analyze("SELECT sum(t.v) AS s FROM public.t GROUP BY t.g").shape
    assert shape.keys[0].hidden and shape.keys[0].column == "__pgt_g0"
    assert "__pgt_g0" in shape.hidden_columns()


def test_ungrouped_column_is_refused() -> None:
    analysis = analyze("SELECT t.id, t.name, count(*) AS n FROM public.t GROUP BY t.id")
    assert not analysis.differential and "outside an aggregate" in analysis.reason


def test_state_query_appends_hidden_columns_in_order() -> None:
    shape = analyze("SELECT t.g, avg(t.v) AS a, count(t.w) FILTER (WHERE t.w > 0) AS c "
                    "FROM public.t GROUP BY t.g").shape
    sql = agg_rules.state_query(shape).sql("postgres")
    names = [e.alias_or_name for e in agg_rules.state_query(shape).expressions]
    assert names[3:] == list(shape.hidden_columns())
    assert "FILTER(WHERE t.w > 0)" in sql.replace(" (", "(")


def test_merge_statements_inline_merged_state_into_outputs() -> None:
    shape = analyze("SELECT t.g, avg(t.v) AS a FROM public.t GROUP BY t.g").shape
    merge = agg_rules.merge_statements(shape, '"s"."st"', ["g", "a"])
    assert "DELETE FROM" in merge.delete and "__pgt_count + d.__pgt_count = 0" in merge.delete
    assert '"a" = ' in merge.update and "NULLIF" in merge.update
    assert "NOT EXISTS" in merge.insert and "d.__pgt_count > 0" in merge.insert


def test_scalar_aggregate_only_updates_its_one_row() -> None:
    shape = analyze("SELECT count(*) AS n FROM public.t").shape
    merge = agg_rules.merge_statements(shape, '"s"."st"', ["n"])
    assert merge.delete == "" and merge.insert == "" and merge.update.startswith("UPDATE")


def test_linear_statements_delete_exact_copies_and_return_rows() -> None:
    stmts = linear_statements('"s"."st"', ["a", "b c"])
    assert 'IS NOT DISTINCT FROM d."b c"' in stmts.delete and "rn <= x.n" in stmts.delete
    assert "generate_series(1, d.__pgt_w)" in stmts.insert


# --------------------------------------------------------------------------- decisions


def test_adaptive_fallback_threshold() -> None:
    assert not fallback_needed(150, 1000, 0.15)
    assert fallback_needed(151, 1000, 0.15)
    assert fallback_needed(1, 0, 0.15)  # an empty source: recomputing is free


def test_pushdown_only_pays_on_large_tables_and_few_keys() -> None:
    assert should_push_down(1_000_000, 1000)
    assert not should_push_down(5_000, 10)
    assert not should_push_down(1_000_000, 500_000)


def test_float_sums_are_recomputed_not_accumulated() -> None:
    from pgtrickle.dvm.analysis import respect_sum_types

    analysis = analyze("SELECT t.g, sum(t.f) AS s, count(*) AS n FROM public.t GROUP BY t.g")
    exact = respect_sum_types(analysis, {"__pgt_a0_sum": "numeric"})
    assert exact.shape.strategy == ALGEBRAIC
    demoted = respect_sum_types(analysis, {"__pgt_a0_sum": "double precision"})
    assert demoted.shape.strategy == RESCAN and "floating-point" in demoted.reason


def test_a_chain_of_unions_is_one_distinct() -> None:
    analysis = analyze("SELECT a.x FROM public.a UNION SELECT b.x FROM public.b UNION ALL SELECT c.x FROM public.c"
                       " UNION SELECT 1")
    assert analysis.differential and isinstance(analysis.shape, AggregateShape)
    nested = analyze("SELECT a.x FROM public.a UNION SELECT s.x FROM (SELECT b.x FROM public.b UNION "
                     "SELECT c.x FROM public.c) s")
    assert not nested.differential and "UNION below" in nested.reason


def test_window_functions_recompute_touched_partitions() -> None:
    analysis = analyze("SELECT t.id, rank() OVER (PARTITION BY t.g ORDER BY t.x) AS r FROM public.t WHERE t.x > 0")
    assert analysis.differential and analysis.shape.strategy == RESCAN
    assert analysis.shape.keys[0].hidden and analysis.shape.distinct_source == "WINDOW"
    stmts = agg_rules.replace_statements(analysis.shape, '"s"."w"', ["id", "r", "__pgt_g0"])
    assert stmts.update == "" and "DELETE FROM" in stmts.delete and "INSERT INTO" in stmts.insert
    rescan = agg_rules.rescan_query(analysis.shape, "pgt_dvm.keys").sql("postgres")
    assert "EXISTS" in rescan and "t.x > 0" in rescan


def test_not_in_is_keyed_and_its_subquery_tables_are_null_sensitive() -> None:
    from pgtrickle.dvm.partitioned import PartitionedShape

    analysis = analyze("SELECT t.x FROM public.t WHERE NOT (t.x IN (SELECT u.y FROM public.u WHERE u.z > 1))")
    shape = analysis.shape
    assert isinstance(shape, PartitionedShape), analysis.reason
    [sub] = shape.not_in
    assert sub.sql == "SELECT u.y FROM public.u WHERE u.z > 1"  # real table names: "is it empty?" runs in PostgreSQL
    by_table = {k.occurrence.table: k for k in shape.occurrences}
    assert sub.occurrences == {by_table["u"].occurrence.index}
    assert by_table["u"].null_sensitive and not by_table["t"].null_sensitive
    assert (by_table["t"].key_column, by_table["u"].key_column) == ("x", "y")
