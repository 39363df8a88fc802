"""Kept aggregates that keep their additive state (pure: no JVM, no database).

:func:`pgtrickle.dvm.kept_state.rewrite` replaces a kept COUNT/SUM aggregate by the projection of
its state; the hidden table then keeps the state node, whose change is algebraic. Proved here over
random trees and changes with the reference evaluator: the rewritten tree has the same value, and
the integrated plan (every kept node read only as stored and as its change) gives the root's change
and each hidden table's change.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.dvm import ir, kept_state
from pgtrickle.dvm.integrate import integrate
from pgtrickle.dvm.layout import decide_mode
from pgtrickle.dvm.materialize import AGGREGATE_OF_AGGREGATE, ROOT_STATE, TOPK_INPUT, decide
from pgtrickle.dvm.reference import Table, at_pre, evaluate
from pgtrickle.dvm.rules import aggregate as aggregate_rule
from tests.unit.test_delta_mode import SCHEMA, TYPES
from tests.unit.test_delta_rules import R1, R2, TREE_KINDS, e, envs, order, trees
from tests.unit.test_integrate import _check, _prove_over_r1_r2


def _always(_: ir.Aggregate) -> bool:
    return True


def _never(_: ir.Aggregate) -> bool:
    return False


def _states(tree: ir.Node) -> list[ir.Aggregate]:
    return [n for n in ir.walk(tree) if aggregate_rule.original_of(n) is not None]


def _assert_every_additive_kept_aggregate_is_a_state(kept: Iterable[ir.Node]) -> None:
    """Every kept node that reaches an additive aggregate keeps that aggregate's state, one kept
    under another included (the inner one is a state inside the outer one's state too)."""
    for node in kept:
        found = aggregate_rule.kept_aggregate(node)
        assert found is None or not kept_state.keeps_state(found.aggregate, _always), node


@pytest.mark.parametrize("root", TREE_KINDS)
def test_random_trees_with_kept_states(root: str) -> None:
    """Same value before and after the rewrite, at the window's start and at the snapshot; the
    integrated plan of the rewritten tree gives its change and every hidden table's change."""

    made: list[int] = []

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(trees(root), envs())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        rewritten = kept_state.rewrite(node, decide(node), _always)
        made.append(len(_states(rewritten)))
        assert evaluate(rewritten, env) == evaluate(node, env)
        assert evaluate(rewritten, at_pre(env)) == evaluate(node, at_pre(env))
        kept = decide(rewritten)
        assert all(n in kept for n in _states(rewritten))
        _assert_every_additive_kept_aggregate_is_a_state(kept)
        _check(rewritten, env, changed, list(kept))

    prove()


CALLS = ["COUNT(*)", "SUM({b})", "COUNT({b})", "SUM({b}) FILTER (WHERE {a} > 0)"]


@st.composite
def kept_sums(draw: st.DrawFn) -> ir.Node:
    """A random subtree under an additive aggregate (random calls) read by a TopK, another
    aggregate, or a join on its values: the three ways a node is kept."""
    x = draw(trees(draw(st.sampled_from(TREE_KINDS)), depth=2))
    a, b = x.columns
    calls = draw(st.lists(st.sampled_from(CALLS), min_size=1, max_size=3, unique=True))
    named = tuple((f"v{i}", e(call.format(a=a, b=b))) for i, call in enumerate(calls))
    sums = ir.Aggregate(x, (("g", e(a)),), named)
    shown = ir.Project(sums, (("g2", e("g")), ("v", e("v0"))))
    consumer = draw(st.sampled_from(["topk", "aggregate", "join"]))
    if consumer == "topk":
        return ir.TopK(shown, order("v DESC, g2"), limit=draw(st.integers(1, 3)))
    if consumer == "aggregate":
        return ir.Aggregate(shown, (("v2", e("v")),), (("groups", e("COUNT(*)")),))
    return ir.Join(ir.JoinKind.INNER, R2, shown, e("c = v"))


def test_random_kept_sums() -> None:
    """Random additive aggregates, kept for each of the three reasons, over random subtrees."""

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(kept_sums(), envs())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        rewritten = kept_state.rewrite(node, decide(node), _always)
        states = _states(rewritten)
        # The kept sum's state; with "aggregate" as the consumer, the root COUNT(*)'s too; and
        # the state of any additive aggregate kept inside the random subtree.
        assert len(states) >= (2 if isinstance(node, ir.Aggregate) else 1)
        assert evaluate(rewritten, env) == evaluate(node, env)
        kept = decide(rewritten)
        assert all(state in kept for state in states)
        _assert_every_additive_kept_aggregate_is_a_state(kept)
        _check(rewritten, env, changed, list(kept))

    prove()


def _top_customers() -> tuple[ir.Node, ir.Aggregate]:
    """TPC-H Q3/Q10/Q21's shape: the top groups of a SUM and a COUNT, through a projection."""
    totals = ir.Aggregate(R1, (("k", e("a")),), (("total", e("SUM(b)")), ("n", e("COUNT(*)"))))
    shown = ir.Project(totals, (("customer", e("k")), ("revenue", e("total")), ("orders", e("n"))))
    return ir.TopK(shown, order("revenue DESC, customer"), limit=2), totals


def test_a_topk_over_a_sum_keeps_the_sum_state_and_reads_only_the_change() -> None:
    root, totals = _top_customers()
    assert decide(root) == {root.input: TOPK_INPUT}
    rewritten = kept_state.rewrite(root, decide(root), _always)
    [state] = _states(rewritten)
    assert aggregate_rule.original_of(state) is totals
    assert state.columns == ("k", "total", "__pgt_n_total", "n", "__pgt_count")
    assert decide(rewritten) == {state: TOPK_INPUT}
    result = integrate(rewritten, frozenset({"r1"}), [state])
    ((kept, change),) = result.changes
    assert kept is state and change is not None
    # The state's change reads the input's change and its own table, never the input itself.
    leaves = [n for n in ir.walk(change) if not n.inputs]
    assert leaves and all(isinstance(n, (ir.Delta, ir.Materialized)) for n in leaves)
    assert all(n.node is state and n.pre for n in leaves if isinstance(n, ir.Materialized))
    _prove_over_r1_r2(rewritten, [state])


def test_an_aggregate_of_a_kept_count_keeps_the_inner_state() -> None:
    """TPC-H Q13's shape: a count of customers per count of their orders (through an outer join)."""
    per_customer = ir.Aggregate(
        ir.Join(ir.JoinKind.LEFT, R1, R2, e("a = c")), (("k", e("a")),), (("n", e("COUNT(d)")),)
    )
    root = ir.Aggregate(per_customer, (("n2", e("n")),), (("customers", e("COUNT(*)")),))
    rewritten = kept_state.rewrite(root, decide(root), _always)
    inner, outer = sorted(_states(rewritten), key=lambda s: "customers" in s.columns)
    assert "customers" in outer.columns and "n" in inner.columns
    # The root's state too: the stream table stores none when the query keeps other nodes.
    assert decide(rewritten) == {inner: AGGREGATE_OF_AGGREGATE, outer: ROOT_STATE}
    result = integrate(rewritten, frozenset({"r1", "r2"}), [inner, outer])
    # The root's change is the root state's change, projected: nothing recomputed.
    assert result.plan is not None and not any(isinstance(n, ir.Scan) for n in ir.walk(result.plan))
    _prove_over_r1_r2(rewritten, [inner, outer])
    _prove_over_r1_r2(rewritten, [inner])  # the root state is a choice: without it, the same value


@pytest.mark.parametrize("call", ["MIN(b)", "MAX(b)", "COUNT(DISTINCT b)", "AVG(b)"])
def test_other_aggregates_keep_their_rows(call: str) -> None:
    kept = ir.Aggregate(R1, (("k", e("a")),), (("v", e(call)),))
    root = ir.TopK(ir.Project(kept, (("k2", e("k")), ("v2", e("v")))), order("v2"), limit=1)
    assert kept_state.rewrite(root, decide(root), _always) is root


def test_inexact_sums_keep_their_rows() -> None:
    root, _ = _top_customers()
    assert kept_state.rewrite(root, decide(root), _never) is root


def test_a_group_key_the_chain_drops_keeps_the_rows() -> None:
    """The state's old rows are found by group key: a projection that drops one keeps the rule
    that recomputes (kept_aggregate finds no aggregate there)."""
    totals = ir.Aggregate(R1, (("k", e("a")),), (("total", e("SUM(b)")),))
    root = ir.TopK(ir.Project(totals, (("revenue", e("total")),)), order("revenue"), limit=1)
    assert kept_state.rewrite(root, decide(root), _always) is root


def test_state_nodes_do_not_outlive_their_plan() -> None:
    """An aggregate and its state node refer to each other only weakly one way: planning many
    queries does not pile them up."""
    gc.collect()
    before = len(aggregate_rule._ORIGINALS)
    for _ in range(20):
        root, _ = _top_customers()
        kept_state.rewrite(root, decide(root), _always)
    del root
    gc.collect()
    assert len(aggregate_rule._ORIGINALS) == before


def test_the_query_keeps_the_state_of_exact_sums_only() -> None:
    """End to end from SQL: a SUM of a numeric keeps its state (the algebraic rule in its hidden
    table); a SUM of a float keeps the rows and recomputes its touched groups."""
    exact = decide_mode(
        "SELECT o.cust, sum(o.amount) AS s FROM public.orders o GROUP BY o.cust ORDER BY s DESC LIMIT 3",
        SCHEMA,
        TYPES,
        ["cust", "s"],
    )
    assert exact.differential
    assert "Aggregate: algebraic over stored state (in its hidden table" in exact.rules
    assert [n for n in exact.kept if aggregate_rule.original_of(n) is not None]
    floats = decide_mode(
        "SELECT o.cust, sum(o.amount::float8) AS s FROM public.orders o GROUP BY o.cust ORDER BY s DESC LIMIT 3",
        SCHEMA,
        TYPES,
        ["cust", "s"],
    )
    assert floats.differential and "algebraic" not in floats.rules
    assert "touched groups: old rows from its hidden table, new ones recomputed" in floats.rules
    assert Counter(type(n).__name__ for n in floats.kept) == Counter({"Project": 1})
