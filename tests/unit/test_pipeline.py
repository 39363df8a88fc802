"""The delta engine composed (dvm/pipeline.py) and its explain text (dvm/describe.py), on the
recorded PostgreSQL view definitions (lower_viewdefs.json), TPC-H Q3/Q5/Q13/Q18 among them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlglot import exp, parse_one

from pgtrickle.dvm import ir, materialize, rules
from pgtrickle.dvm.describe import describe, describe_plan, facts
from pgtrickle.dvm.lower import lower
from pgtrickle.dvm.pipeline import (
    ALGEBRAIC,
    CHANGE_BUFFER,
    KEPT_GROUPS,
    RECOMPUTE_GROUPS,
    STORED_STATE,
    UNCHANGED,
    DeltaPlan,
    ViewNames,
    plan_delta,
    rule_of,
    steps_of,
)
from pgtrickle.errors import NoDeltaRuleError
from pgtrickle.sql.translate import parse_query

DATA = json.loads((Path(__file__).parent / "lower_viewdefs.json").read_text())
CASES: dict[str, dict] = DATA["cases"]
RELATIONS: dict[str, list[str]] = DATA["relations"]
TPCH = frozenset(r for r in RELATIONS if r.startswith("tpch."))


def tree(name: str) -> ir.Node:
    return lower(parse_query(CASES[name]["viewdef"]), RELATIONS)


def plan(name: str, changed: frozenset[str] = TPCH, dialect: str = "postgres", **kw: object):  # type: ignore[no-untyped-def]
    return plan_delta(CASES[name]["viewdef"], RELATIONS, None, changed, dialect, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if n.startswith("tpch.")])
@pytest.mark.parametrize("dialect", ["postgres", "spark"])
def test_every_tpch_query_plans_and_compiles(name: str, dialect: str) -> None:
    result = plan(name, dialect=dialect)
    assert result.compiled is not None and result.compiled.sql()
    assert result.compiled.columns == tuple(CASES[name]["columns"])
    assert {s.node for s in result.steps} == set(ir.walk(result.tree))
    kinds = {r.kind.value for r in result.compiled.reads}
    assert (kinds <= {"post", "delta", "materialized"} and "delta" in kinds) or "materialized" in kinds


def test_a_plan_reading_hidden_tables_asks_for_a_full_refresh_with_the_reason() -> None:
    result = plan("tpch.q13")
    assert list(result.materialized.values()) == [materialize.AGGREGATE_OF_AGGREGATE]
    assert result.full_refresh_reason is not None
    assert materialize.AGGREGATE_OF_AGGREGATE in result.full_refresh_reason
    assert any(r.kind.value == "materialized" for r in result.compiled.reads)
    (hidden,) = result.materialized
    assert result.step(hidden).materialized == materialize.AGGREGATE_OF_AGGREGATE


def test_a_plan_without_hidden_tables_runs_and_names_its_reads() -> None:
    result = plan("tpch.q05", changed=frozenset({"tpch.lineitem"}))
    assert result.full_refresh_reason is None and not result.materialized
    reads = {
        (r.kind.value, r.node.relation if isinstance(r.node, ir.Scan) else None)
        for r in result.compiled.reads
    }
    assert ("delta", "tpch.lineitem") in reads
    assert all(kind != "delta" or relation == "tpch.lineitem" for kind, relation in reads)
    # one changed relation of six: one telescoping term at the top join
    assert result.step(result.tree.input.input).rule == "telescoping join: 1 terms"  # type: ignore[attr-defined]


def test_nothing_changed_under_the_query_is_no_plan() -> None:
    result = plan("tpch.q05", changed=frozenset({"tpch.part"}))
    assert result.plan is None and result.compiled is None and result.full_refresh_reason is None
    assert {s.rule for s in result.steps if isinstance(s.node, ir.Scan)} == {UNCHANGED}


def test_stored_state_takes_the_algebraic_rule_for_an_invertible_aggregate_root() -> None:
    scan = ir.Scan("t", ("k", "v"), ("k", "v"))
    summed = ir.Aggregate(scan, (("g", exp.column("k")),), (("s", parse_one("sum(v)")),))
    assert rule_of(summed, is_root=True, stored_state=True) == ALGEBRAIC
    assert rule_of(summed, is_root=True) == RECOMPUTE_GROUPS
    maxed = ir.Aggregate(scan, (("g", exp.column("k")),), (("m", parse_one("max(v)")),))
    assert rule_of(maxed, is_root=True, stored_state=True) == RECOMPUTE_GROUPS
    # the algebraic plan reads the state's hidden table, which nothing builds yet
    algebraic = rules.delta(summed, frozenset({"t"}), stored_state=True)
    result = DeltaPlan(summed, steps_of(summed, {}, stored_state=True), {}, algebraic, None)
    assert result.full_refresh_reason is not None and STORED_STATE in result.full_refresh_reason
    # a lowered query's root is the Project naming its output, so the algebraic rule (root
    # Aggregate only) does not apply through plan_delta yet
    lowered = plan_delta(
        "SELECT k, sum(v) AS s FROM props.a GROUP BY k",
        RELATIONS,
        None,
        {"props.a"},
        "postgres",
        stored_state=True,
    )
    assert isinstance(lowered.tree, ir.Project) and lowered.full_refresh_reason is None


def test_bad_input_names_the_construct() -> None:
    with pytest.raises(NoDeltaRuleError, match="LIMIT"):
        plan("props.limit_only", changed=frozenset({"props.a"}))


def test_view_names_are_stable_identifiers() -> None:
    names = ViewNames()
    a = ir.Scan("weird schema.t-1", ("x",), ("x",))
    assert names.post(a) == names.post(ir.Scan("weird schema.t-1", ("x",), ("y",)))
    assert names.delta(a).startswith("__pgt_delta_0_") and names.delta(a).isidentifier()
    m = ir.Materialized(a)
    assert names.materialized(m) == "__pgt_mat_0"
    assert names.materialized(ir.Materialized(a, pre=True)) == "__pgt_mat_0_pre"


# --------------------------------------------------------------------------- describe


def test_describe_q5_six_way_join_under_an_aggregate() -> None:
    text = describe(tree("tpch.q05"))
    lines = text.splitlines()
    assert lines[0].startswith("Project n_name = ")
    assert lines[1].startswith("  Aggregate group by n_name_1 = n_name; sum = SUM(")
    assert f"[delta: {RECOMPUTE_GROUPS}]" in lines[1]
    assert "Join INNER on n_regionkey = r_regionkey  [delta: telescoping join: 6 terms]" in lines[2]
    assert "Join INNER on c_custkey = o_custkey  [delta: telescoping join: 2 terms]" in text
    assert f"Scan tpch.customer (c_custkey, c_nationkey)  [delta: {CHANGE_BUFFER}]" in text
    assert "materialized" not in text
    assert len(lines) == len(list(ir.walk(tree("tpch.q05"))))


def test_describe_q13_left_join_and_the_materialized_inner_aggregate() -> None:
    lines = describe(tree("tpch.q13")).splitlines()
    assert "Aggregate group by c_count_1 = c_count; count_1 = COUNT(*)" in lines[1]
    inner = next(line for line in lines if "COUNT(o_orderkey)" in line)
    assert inner.startswith("      Aggregate group by c_custkey_1 = c_custkey")
    assert f"delta: {KEPT_GROUPS} (in its hidden table" in inner
    assert f"materialized: {materialize.AGGREGATE_OF_AGGREGATE}" in inner
    left = next(line for line in lines if "Join LEFT" in line)
    assert "on c_custkey = o_custkey AND" in left and "outer join" in left


def test_describe_q18_top_k_semi_join_and_changes_of_one_relation() -> None:
    text = describe(tree("tpch.q18"), changed={"tpch.customer"})
    lines = text.splitlines()
    assert lines[0].startswith("TopK order by o_totalprice DESC, o_orderdate ASC, o_orderkey ASC limit 100")
    assert f"materialized: {materialize.TOPK_INPUT}" in lines[1]
    semi = next(line for line in lines if "Join SEMI" in line)
    assert "on o_orderkey = l_orderkey_2" in semi and "semi join" in semi
    assert all(UNCHANGED in line for line in lines if "tpch.lineitem" in line)
    assert "telescoping join: 1 terms" in text


def test_describe_plan_and_shared_subtrees() -> None:
    result = plan("props.cte_twice", changed=frozenset({"props.a"}))
    text = describe_plan(result)
    assert text.splitlines()[-1].endswith("(shared: see above)")
    assert facts(ir.Values((), ("a",))) == "Values 0 row(s) (a)"
