"""Nested WITH: inlined for the delta engine, renamed apart for Spark. Pure."""

from __future__ import annotations

import pytest
from sqlglot import exp

from pgtrickle.dvm.analysis import analyze
from pgtrickle.dvm.linear import NotDifferentiable, inline_ctes
from pgtrickle.sql.ctes import rename_clashing_ctes
from pgtrickle.sql.translate import parse_query, translate_to_spark

NESTED = (" WITH b AS (SELECT base_b.i, base_b.j FROM public.base_b) SELECT i, j FROM ( WITH a AS "
          "(SELECT base_a.i, base_a.j FROM public.base_a) SELECT a.i, a.j FROM a, b WHERE a.i = b.i) v")
SHADOWED = (" WITH a AS (SELECT base_b.i, base_b.j FROM public.base_b) SELECT x.i, a.j FROM ( WITH a AS "
            "(SELECT base_a.i FROM public.base_a) SELECT a.i FROM a) x JOIN a ON a.i = x.i")


def _tables(query: exp.Expr) -> list[str]:
    return sorted(f"{t.text('db')}.{t.name}" for t in query.find_all(exp.Table))


def test_every_with_is_inlined() -> None:
    inlined = inline_ctes(parse_query(NESTED))
    assert not list(inlined.find_all(exp.With))
    assert _tables(inlined) == ["public.base_a", "public.base_b"]
    assert analyze(NESTED).differential


def test_inner_cte_shadows_outer_name() -> None:
    inlined = inline_ctes(parse_query(SHADOWED)).sql("postgres")
    # x reads base_a (the inner a); the join partner reads base_b (the outer a)
    assert inlined.index("public.base_a") < inlined.index(") AS x") < inlined.index("public.base_b")


def test_nested_recursive_is_not_differentiable() -> None:
    with pytest.raises(NotDifferentiable, match="RECURSIVE"):
        inline_ctes(parse_query("SELECT v.n FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                                "SELECT n FROM r) v"))


def test_clashing_names_are_renamed_apart_for_spark() -> None:
    renamed = rename_clashing_ctes(parse_query(SHADOWED))
    names = [cte.alias_or_name for cte in renamed.find_all(exp.CTE)]
    assert len(set(names)) == 2 and "a" not in names
    out = translate_to_spark(SHADOWED, {("public", "base_a"): "va", ("public", "base_b"): "vb"})
    assert "FROM __pgt_cte_a_1 AS a" in out and "JOIN __pgt_cte_a_2 AS a" in out  # innermost renamed first
    assert out.index("__pgt_cte_a_2 AS (") < out.index("FROM vb") < out.index("__pgt_cte_a_1 AS (")


def test_unique_names_are_left_alone() -> None:
    assert rename_clashing_ctes(parse_query(NESTED)).sql("postgres") == parse_query(NESTED).sql("postgres")
