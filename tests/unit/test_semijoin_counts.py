"""A semi/anti join's right side counted per join key and kept (pure: no JVM, no database).

:func:`pgtrickle.dvm.semijoin_counts.rewrite` replaces the right side of a SEMI/ANTI join on
column equalities, when it holds a join or when the left side's change cannot bound its keys (a
cross or theta join under the left side), by its rows' count per join key; that aggregate is kept
in a hidden table with its state (:mod:`pgtrickle.dvm.kept_state`). Proved over random trees and
changes with the reference evaluator: the same value, and the integrated plan gives the change
of the root and of every hidden table.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.dvm import ir, kept_state, semijoin_counts
from pgtrickle.dvm.materialize import SEMI_JOIN_COUNTS, decide
from pgtrickle.dvm.reference import Table, at_pre, evaluate
from pgtrickle.dvm.rules import aggregate as aggregate_rule
from tests.unit.test_delta_rules import R1, R2, R3, TREE_KINDS, e, envs, trees
from tests.unit.test_integrate import _check


def _both(tree: ir.Node) -> ir.Node:
    counted = semijoin_counts.rewrite(tree)
    return kept_state.rewrite(counted, decide(counted), lambda _: True)


def _counted(tree: ir.Node) -> list[ir.Node]:
    return [n for n in ir.walk(tree) if semijoin_counts.is_count(n)]


def _named(node: ir.Node, prefix: str) -> ir.Node:
    """``node``'s two columns as ``<prefix>0``, ``<prefix>1``: random trees drawn apart name their
    columns alike (``x0``, ...), and a join's two sides must not share a name."""
    return ir.Project(node, tuple((f"{prefix}{i}", e(c)) for i, c in enumerate(node.columns)))


@st.composite
def semi_joins(draw: st.DrawFn) -> ir.Node:
    """A SEMI or ANTI join of a random subtree with a random join (on one or two keys)."""
    left = _named(draw(trees(draw(st.sampled_from(TREE_KINDS)), depth=2)), "l")
    joins = [k for k in TREE_KINDS if k.startswith("join.")]
    inner = _named(draw(trees(draw(st.sampled_from(joins)), depth=2)), "r")
    a, b = left.columns
    p, q = inner.columns
    kind = draw(st.sampled_from([ir.JoinKind.SEMI, ir.JoinKind.ANTI]))
    condition = draw(st.sampled_from([f"{a} = {p}", f"{p} = {a} AND {b} = {q}"]))
    return ir.Join(kind, left, inner, e(condition))


@st.composite
def semi_joins_after_theta_joins(draw: st.DrawFn) -> ir.Node:
    """A SEMI or ANTI join of one relation (maybe filtered) with a left side that holds a cross or
    theta join (TPC-H Q22: customers above an average balance, without orders)."""
    x = _named(draw(trees(draw(st.sampled_from(TREE_KINDS)), depth=1)), "x")
    y = _named(draw(trees(draw(st.sampled_from(["aggregate_all", "aggregate", "filter"])), depth=1)), "y")
    (a, b), (p, q) = x.columns, y.columns
    condition = draw(st.sampled_from([f"{b} < {q}", f"{a} > {p} AND {b} <= {q}", "true"]))
    left = ir.Project(ir.Join(ir.JoinKind.INNER, x, y, e(condition)), (("l0", e(a)), ("l1", e(q))))
    relation = draw(st.sampled_from([R3, ir.Filter(R3, e("f > 0"))]))
    kind = draw(st.sampled_from([ir.JoinKind.SEMI, ir.JoinKind.ANTI]))
    return ir.Join(kind, left, relation, e(draw(st.sampled_from(["l0 = e", "e = l0 AND l1 = f"]))))


@pytest.mark.parametrize(
    ("joins", "always"),
    [(semi_joins, False), (semi_joins_after_theta_joins, True)],
    ids=["over_joins", "after_theta_joins"],
)
def test_random_semi_joins(joins: Callable[[], st.SearchStrategy[ir.Node]], always: bool) -> None:
    made: list[int] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(joins(), envs())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        rewritten = _both(node)
        assert evaluate(rewritten, env) == evaluate(node, env)
        assert evaluate(rewritten, at_pre(env)) == evaluate(node, at_pre(env))
        kept = decide(rewritten)
        counted = _counted(rewritten)
        assert counted or not always, "the right side of one relation is counted"
        made.append(len(counted))
        for node_counted in counted:
            assert kept.get(node_counted) == SEMI_JOIN_COUNTS
            assert aggregate_rule.original_of(node_counted) is not None
        _check(rewritten, env, changed, list(kept))

    prove()
    assert sum(made) >= 30, made


@pytest.mark.parametrize("root", TREE_KINDS)
def test_random_trees(root: str) -> None:
    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(trees(root), envs())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        rewritten = _both(node)
        assert evaluate(rewritten, env) == evaluate(node, env)
        _check(rewritten, env, changed, list(decide(rewritten)))

    prove()


def test_only_equalities_over_a_join_are_counted() -> None:
    joined = ir.Join(ir.JoinKind.INNER, R2, R3, e("c = e"))
    semi = ir.Join(ir.JoinKind.SEMI, R1, joined, e("a = c AND b = f"))
    counted = semijoin_counts.rewrite(semi)
    assert isinstance(counted, ir.Join) and semijoin_counts.is_count(counted.right)
    assert counted.right.columns == ("c", "f", semijoin_counts.SEMI_COUNT)
    # A non-equality (TPC-H Q21's l2.l_suppkey <> l1.l_suppkey), a right side of one relation,
    # an OR, a null-safe equality: left as they are.
    for kept in (
        ir.Join(ir.JoinKind.SEMI, R1, joined, e("a = c AND b <> f")),
        ir.Join(ir.JoinKind.ANTI, R1, ir.Filter(R2, e("d > 0")), e("a = c")),
        ir.Join(ir.JoinKind.SEMI, R1, joined, e("a = c OR b = f")),
        ir.Join(ir.JoinKind.SEMI, R1, joined, e("a IS NOT DISTINCT FROM c")),
    ):
        assert semijoin_counts.rewrite(kept) is kept


def test_a_one_relation_right_side_is_counted_when_the_left_change_has_no_keys() -> None:
    average = ir.Aggregate(ir.Filter(R2, e("c > 0")), (), (("avg_c", e("AVG(c)")),))
    above = ir.Project(ir.Join(ir.JoinKind.INNER, R1, average, e("b > avg_c")), (("a2", e("a")),))
    anti = ir.Join(ir.JoinKind.ANTI, above, R3, e("e = a2"))  # TPC-H Q22's shape
    counted = semijoin_counts.rewrite(anti)
    assert isinstance(counted, ir.Join) and semijoin_counts.is_count(counted.right)
    assert counted.right.columns == ("e", semijoin_counts.SEMI_COUNT)
    # Joined on a key, the left change's keys bound the right side's read: left as it is.
    keyed = ir.Join(
        ir.JoinKind.INNER, R1, ir.Aggregate(R2, (("c", e("c")),), (("n", e("COUNT(*)")),)), e("a = c")
    )
    for kept in (
        ir.Join(ir.JoinKind.ANTI, ir.Project(keyed, (("a2", e("a")),)), R3, e("e = a2")),
        ir.Join(ir.JoinKind.ANTI, ir.Project(keyed, (("a2", e("a")),)), R3, e("e < a2")),
    ):
        assert semijoin_counts.rewrite(kept) is kept
