"""Hidden state tables integrated into the plan (pure: no JVM, no database).

For random trees with random sets of hidden (materialized) nodes, nested or not, and random
changes, :func:`integrate` must give a plan that reads every hidden table only as stored
(``Materialized(m, pre=True)``) and as its change buffer (``Materialized(m, change=True)``,
computed first), and whose value is the root's change, and, per hidden node, a change that
brings its table from its stored value to its value at the snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.dvm import ir
from pgtrickle.dvm.integrate import integrate, substitute_post
from pgtrickle.dvm.materialize import decide
from pgtrickle.dvm.reference import Table, evaluate
from pgtrickle.dvm.rules.aggregate import KeptAggregate, kept_aggregate
from tests.unit.test_delta_rules import R1, R2, TREE_KINDS, e, envs, expected_change, trees


def _reads_post_of_hidden(plan: ir.Node | None, hidden: set[ir.Node]) -> bool:
    if plan is None:
        return False
    return any(
        isinstance(n, ir.Materialized) and not n.pre and not n.change and n.node in hidden
        for n in ir.walk(plan)
    )


def _check(root: ir.Node, env: dict[str, Table], changed: frozenset[str], hidden: list[ir.Node]) -> None:
    result = integrate(root, changed, hidden)
    kept = {m for m, _ in result.changes}
    assert kept == {m for m in hidden if m is not root}
    assert not _reads_post_of_hidden(result.plan, kept)
    got = Counter() if result.plan is None else evaluate(result.plan, env)
    assert got == expected_change(root, env)
    for m, change in result.changes:
        assert not _reads_post_of_hidden(change, kept)
        assert (Counter() if change is None else evaluate(change, env)) == expected_change(m, env)


def _prove_over_r1_r2(
    root: ir.Node, hidden: list[ir.Node], check: Callable[..., object] | None = None, examples: int = 25
) -> None:
    """``check(root, env, changed, hidden)`` (default: :func:`_check`) on random r1, r2 and changes."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(envs(("r1", "r2")))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        (check or _check)(root, env, changed, hidden)

    prove()


def _inner_nodes(root: ir.Node) -> list[ir.Node]:
    return [n for n in ir.walk(root) if n is not root and not isinstance(n, (ir.Scan, ir.Values))]


@pytest.mark.parametrize("root", TREE_KINDS)
def test_random_trees_with_random_hidden_nodes(root: str) -> None:
    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(trees(root), envs(), st.data())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]], data: st.DataObject) -> None:
        env, changed = drawn
        inner = _inner_nodes(node)
        chosen = data.draw(st.lists(st.sampled_from(inner), unique_by=id)) if inner else []
        _check(node, env, changed, chosen)
        _check(node, env, changed, list(decide(node)))

    prove()


def test_aggregate_of_aggregate_keeps_the_inner_one() -> None:
    """TPC-H Q13's shape: a count of customers per count of their orders."""
    per_customer = ir.Aggregate(
        ir.Join(ir.JoinKind.LEFT, R1, R2, e("a = c")), (("k", e("a")),), (("n", e("COUNT(d)")),)
    )
    root = ir.Aggregate(per_customer, (("n2", e("n")),), (("customers", e("COUNT(*)")),))
    assert list(decide(root)) == [per_customer]

    _prove_over_r1_r2(root, [per_customer])


def test_unchanged_hidden_node_is_read_as_stored() -> None:
    inner = ir.Aggregate(R2, (("c", e("c")),), (("n", e("COUNT(*)")),))
    root = ir.Join(ir.JoinKind.INNER, R1, inner, e("b = n"))
    result = integrate(root, frozenset({"r1"}), [inner])
    assert result.changes == ((inner, None),)
    assert result.plan is not None
    stored = [n for n in ir.walk(result.plan) if isinstance(n, ir.Materialized)]
    assert stored and all(n.pre and n.node is inner for n in stored)


def test_nothing_changed_gives_no_plan() -> None:
    inner = ir.Aggregate(R2, (("c", e("c")),), (("n", e("COUNT(*)")),))
    root = ir.Join(ir.JoinKind.INNER, R1, inner, e("b = n"))
    result = integrate(root, frozenset(), [inner])
    assert result.plan is None and result.changes == ((inner, None),)


def test_substitution_keeps_shared_subtrees_shared() -> None:
    inner = ir.Aggregate(R2, (("c", e("c")),), (("n", e("COUNT(*)")),))
    post = ir.Materialized(inner)
    plan = ir.UnionAll((ir.Filter(post, e("n > 0")), ir.Filter(post, e("n > 1"))), ("c", "n"))
    replacement = ir.Materialized(inner, pre=True)
    out = substitute_post(plan, {inner: replacement})
    assert isinstance(out, ir.UnionAll)
    assert all(isinstance(b, ir.Filter) and b.input is replacement for b in out.branches)
    assert substitute_post(plan, {}) is plan


def test_a_hidden_change_is_read_as_a_leaf_not_inlined() -> None:
    """The plan above a hidden node reads its change as a change buffer: the Q13 shape's root
    plan reads nothing but the hidden table and its change (the plan computing that change is
    not repeated inside it, which made Spark's analysis blow up)."""
    per_customer = ir.Aggregate(
        ir.Join(ir.JoinKind.LEFT, R1, R2, e("a = c")), (("k", e("a")),), (("n", e("COUNT(d)")),)
    )
    root = ir.Aggregate(per_customer, (("n2", e("n")),), (("customers", e("COUNT(*)")),))
    result = integrate(root, frozenset({"r1", "r2"}), [per_customer])
    assert result.plan is not None
    leaves = [n for n in ir.walk(result.plan) if not n.inputs]
    assert leaves and all(isinstance(n, ir.Materialized) and n.node is per_customer for n in leaves)
    assert {(n.pre, n.change) for n in leaves} == {(True, False), (False, True)}
    ((kept, change),) = result.changes
    assert kept is per_customer and change is not None
    # The kept aggregate's change reads the old rows of its touched groups from its own table,
    # not from its input's value at the window's start (post ⊎ −Δ: the input's change again).
    hidden = [n for n in ir.walk(change) if isinstance(n, ir.Materialized)]
    assert hidden and all(n.node is per_customer and n.pre for n in hidden)


def test_a_kept_aggregate_reads_its_old_groups_from_its_table() -> None:
    """Δ M = −(stored(M) ⋉ K) ⊎ chain(Agg(post X ⋉ K)): through a HAVING filter and a renaming
    projection; the input's pre (post ⊎ −Δ) is never built; a projection that drops a group key
    keeps the ordinary rule."""
    aggregate = ir.Aggregate(R2, (("c", e("c")),), (("n", e("COUNT(*)")),))
    kept = ir.Project(ir.Filter(aggregate, e("n > 1")), (("cust", e("c")), ("orders", e("n"))))
    root = ir.Aggregate(kept, (("orders2", e("orders")),), (("customers", e("COUNT(*)")),))
    result = integrate(root, frozenset({"r2"}), [kept])
    ((_, change),) = result.changes
    assert change is not None
    assert any(isinstance(n, ir.Materialized) and n.node is kept and n.pre for n in ir.walk(change))
    # pre(r2) = r2 ⊎ −Δr2 is not built: no union reads the table itself.
    assert not any(isinstance(n, ir.UnionAll) and any(b is R2 for b in n.branches) for n in ir.walk(change))

    _prove_over_r1_r2(root, [kept])
    dropped = ir.Project(aggregate, (("orders", e("n")),))
    assert kept_aggregate(dropped) is None
    assert kept_aggregate(kept) == KeptAggregate(aggregate, (kept, kept.input), ("cust",))


def test_a_read_is_not_both_stored_and_change() -> None:
    with pytest.raises(ValueError, match="not both"):
        ir.Materialized(R1, pre=True, change=True)
