"""The delta rules, proved against the reference evaluator (pure: no JVM, no database).

For every operator kind, and then for random trees of operators, hypothesis draws small
relations (int columns, NULLs, duplicates) and a random change per relation (inserts, deletes
of existing rows, updates), and checks

    evaluate(delta(node)) == evaluate(node at post) − evaluate(node at pre)

on consolidated Z-sets (zero weights dropped).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.materialize import decide
from pgtrickle.dvm.reference import Table, add, at_pre, evaluate
from pgtrickle.dvm.rules import aggregate as aggregate_rule
from pgtrickle.dvm.rules import delta, pre
from pgtrickle.errors import UnsupportedQueryError

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
RELATIONS = {"r1": ("a", "b"), "r2": ("c", "d"), "r3": ("e", "f"), "r4": ("g", "h")}
R1, R2, R3, R4 = (ir.Scan(name, cols, cols) for name, cols in RELATIONS.items())


def e(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="postgres")


def order(sql: str) -> tuple[exp.Ordered, ...]:
    return tuple(sqlglot.parse_one(f"SELECT 1 ORDER BY {sql}", read="postgres").args["order"].expressions)


# --- relations and changes ----------------------------------------------------------------------

VALUE = st.sampled_from([0, 1, 2, None])
ROW = st.tuples(VALUE, VALUE)


@st.composite
def table(draw: st.DrawFn, columns: tuple[str, ...]) -> tuple[Table, bool]:
    """A relation at the window's start and a random change: ``(Table(post, delta), changed)``."""
    before = draw(st.lists(ROW, min_size=2, max_size=6))
    change: Counter = Counter()
    remaining = list(before)
    is_changed = draw(st.integers(0, 3)) > 0
    ops = (
        st.lists(st.sampled_from(["insert", "delete", "update"]), min_size=1, max_size=3)
        if is_changed
        else st.just([])
    )
    for op in draw(ops):
        if op == "insert":
            change[draw(ROW)] += 1
            continue
        if not remaining:
            continue
        old = remaining.pop(draw(st.integers(0, len(remaining) - 1)))
        change[old] -= 1
        if op == "update":
            change[draw(ROW)] += 1
    post = add(Counter(before), change)
    return Table(columns, post, add(change, Counter())), is_changed


@st.composite
def envs(
    draw: st.DrawFn, names: tuple[str, ...] = tuple(RELATIONS)
) -> tuple[dict[str, Table], frozenset[str]]:
    """Tables ``names`` (the others empty and unchanged) and the set of changed ones."""
    env = {name: Table(columns, Counter()) for name, columns in RELATIONS.items()}
    changed: set[str] = set()
    for name in names:
        env[name], is_changed = draw(table(RELATIONS[name]))
        if is_changed:
            changed.add(name)
    return env, frozenset(changed)


def expected_change(node: ir.Node, env: dict[str, Table]) -> Counter:
    return add(evaluate(node, env), evaluate(node, at_pre(env)), -1)


def check(node: ir.Node, env: dict[str, Table], changed: frozenset[str], **options: object) -> None:
    plan = delta(node, changed, **options)  # type: ignore[arg-type]
    got = Counter() if plan is None else evaluate(plan, env)
    assert got == expected_change(node, env)
    assert evaluate(pre(node, changed), env) == evaluate(node, at_pre(env))


# --- one operator at a time ---------------------------------------------------------------------

AGGS = (
    ("n", e("COUNT(*)")),
    ("nb", e("COUNT(b)")),
    ("s", e("SUM(b)")),
    ("av", e("AVG(b)")),
    ("fs", e("SUM(b) FILTER (WHERE b > 0)")),
    ("fn", e("COUNT(*) FILTER (WHERE b IS NULL)")),
)
NON_INVERTIBLE = (("mn", e("MIN(b)")), ("mx", e("MAX(b)")), ("dn", e("COUNT(DISTINCT b)")))
P1 = ir.Project(R1, (("x", e("a")), ("y", e("b"))))
P2 = ir.Project(R2, (("x2", e("c")), ("y2", e("d"))))

OPERATORS: dict[str, Callable[[], ir.Node]] = {
    "scan": lambda: R1,
    "values": lambda: ir.Values(((e("1"), e("NULL")),), ("a", "b")),
    "values_union": lambda: ir.UnionAll((R1, ir.Values(((e("1"), e("2")),), ("p", "q"))), ("a", "b")),
    "filter": lambda: ir.Filter(R1, e("a > 0 OR b IS NULL")),
    "project": lambda: ir.Project(
        R1,
        (
            ("s", e("a + b")),
            ("c", e("CASE WHEN a IS NULL THEN 'n' ELSE 'v' END")),
            ("k", e("COALESCE(b, 7)")),
        ),
    ),
    "union_all": lambda: ir.UnionAll((R1, R2, R1), ("a", "b")),
    "inner": lambda: ir.Join(ir.JoinKind.INNER, R1, R2, e("a = c")),
    "theta": lambda: ir.Join(ir.JoinKind.INNER, R1, R2, e("a < c AND b IS DISTINCT FROM d")),
    "cross": lambda: ir.Join(ir.JoinKind.INNER, R1, R2),
    "self_join": lambda: ir.Join(ir.JoinKind.INNER, R1, ir.Scan("r1", ("a", "b"), ("a2", "b2")), e("a = b2")),
    "semi": lambda: ir.Join(ir.JoinKind.SEMI, R1, R2, e("a = c")),
    "semi_theta": lambda: ir.Join(ir.JoinKind.SEMI, R1, R2, e("a < c OR d IS NULL")),
    "anti": lambda: ir.Join(ir.JoinKind.ANTI, R1, R2, e("a = c")),
    "not_in": lambda: ir.Join(ir.JoinKind.ANTI, R1, R2, e("(a = c) IS NOT FALSE")),
    "left": lambda: ir.Join(ir.JoinKind.LEFT, R1, R2, e("a = c")),
    "right": lambda: ir.Join(ir.JoinKind.RIGHT, R1, R2, e("a = c AND b <= d")),
    "full": lambda: ir.Join(ir.JoinKind.FULL, R1, R2, e("a = c")),
    "aggregate": lambda: ir.Aggregate(R1, (("a", e("a")),), AGGS + NON_INVERTIBLE),
    "aggregate_expr_key": lambda: ir.Aggregate(R1, (("k", e("COALESCE(a, b)")),), (("n", e("COUNT(*)")),)),
    "aggregate_two_keys": lambda: ir.Aggregate(R1, (("a", e("a")), ("b", e("b"))), (("n", e("COUNT(*)")),)),
    "aggregate_no_keys": lambda: ir.Aggregate(R1, (), AGGS + NON_INVERTIBLE),
    "distinct": lambda: ir.Distinct(R1),
    "union": lambda: ir.Distinct(ir.UnionAll((R1, R2), ("a", "b"))),
    "intersect": lambda: ir.SetOp(ir.SetOpKind.INTERSECT, False, R1, R2, ("a", "b")),
    "intersect_all": lambda: ir.SetOp(ir.SetOpKind.INTERSECT, True, R1, R2, ("a", "b")),
    "except": lambda: ir.SetOp(ir.SetOpKind.EXCEPT, False, R1, R2, ("a", "b")),
    "except_all": lambda: ir.SetOp(ir.SetOpKind.EXCEPT, True, R1, R2, ("a", "b")),
    "window": lambda: ir.Window(
        R1,
        (
            ("rn", e("ROW_NUMBER() OVER (PARTITION BY a ORDER BY b)")),
            ("rk", e("RANK() OVER (PARTITION BY a ORDER BY b DESC)")),
            ("dr", e("DENSE_RANK() OVER (PARTITION BY a, b ORDER BY b)")),
            ("rs", e("SUM(b) OVER (PARTITION BY a ORDER BY b)")),
            ("ct", e("COUNT(*) OVER (PARTITION BY a)")),
        ),
    ),
    "window_whole": lambda: ir.Window(
        R1,
        (("rn", e("ROW_NUMBER() OVER (ORDER BY a)")), ("rk", e("RANK() OVER (PARTITION BY b ORDER BY a)"))),
    ),
    "topk": lambda: ir.TopK(R1, order("a DESC, b"), limit=2),
    "topk_offset": lambda: ir.TopK(ir.Filter(R1, e("b IS NOT NULL")), order("b"), limit=3, offset=1),
}


@pytest.mark.parametrize("kind", sorted(OPERATORS))
def test_operator_rule(kind: str) -> None:
    node = OPERATORS[kind]()

    @SETTINGS
    @given(envs(("r1", "r2")))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        check(node, env, changed)
        check(node, env, changed, materialized=list(decide(node)))

    prove()


@pytest.mark.parametrize("keys", [(("a", e("a")),), ()])
def test_algebraic_aggregate_over_stored_state(keys: tuple) -> None:
    node = ir.Aggregate(R1, keys, AGGS)
    state = aggregate_rule.state_node(node)
    assert aggregate_rule.state_node(node) is state
    assert aggregate_rule.invertible(node)
    assert not aggregate_rule.invertible(ir.Aggregate(R1, keys, NON_INVERTIBLE[:1]))

    @SETTINGS
    @given(envs(("r1",)))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        plan = delta(node, changed, stored_state=True)
        got = Counter() if plan is None else evaluate(plan, env)
        assert got == expected_change(node, env)
        if plan is not None:
            assert any(isinstance(n, ir.Materialized) and n.pre and n.node is state for n in ir.walk(plan))
        fold_state = aggregate_rule.delta_state(node, _fold(node, changed))
        state_change = Counter() if fold_state is None else evaluate(fold_state, env)
        assert state_change == expected_change(state, env)

    prove()


def _fold(node: ir.Node, changed: frozenset[str]):  # type: ignore[no-untyped-def]
    from pgtrickle.dvm.rules import _Fold

    return _Fold(node, changed, ())


def test_unchanged_tree_has_no_change_and_pre_is_post() -> None:
    node = ir.Join(
        ir.JoinKind.LEFT, R1, ir.Aggregate(R2, (("c", e("c")),), (("n", e("COUNT(*)")),)), e("a = c")
    )
    assert delta(node, frozenset({"r3"})) is None
    assert pre(node, frozenset()) is node


def test_plan_only_nodes_are_refused() -> None:
    with pytest.raises(UnsupportedQueryError, match="Negate"):
        delta(ir.Negate(R1), frozenset({"r1"}))


# --- the join rule: one term per changed input ------------------------------------------------


def _positive_deltas(plan: ir.Node) -> list[ir.Delta]:
    """Delta leaves not under a Negate (a ``pre`` derivation's Δ is under one)."""
    if isinstance(plan, ir.Delta):
        return [plan]
    if isinstance(plan, ir.Negate):
        return []
    return [d for child in plan.inputs for d in _positive_deltas(child)]


def _chain(scans: list[ir.Scan]) -> ir.Node:
    node: ir.Node = scans[0]
    for left_col, right in zip(("a", "c", "e")[: len(scans) - 1], scans[1:], strict=True):
        node = ir.Join(ir.JoinKind.INNER, node, right, e(f"{left_col} = {right.columns[0]}"))
    return node


@pytest.mark.parametrize("size", [2, 3, 4])
def test_join_rule_has_one_term_per_changed_input(size: int) -> None:
    scans = [R1, R2, R3, R4][:size]
    node = _chain(scans)
    for k in range(1, size + 1):
        for subset in itertools.combinations(scans, k):
            changed = frozenset(s.relation for s in subset)
            plan = delta(node, changed)
            assert plan is not None
            terms = plan.branches if isinstance(plan, ir.UnionAll) else (plan,)
            assert len(terms) == k
            assert sorted(d.scan.relation for d in _positive_deltas(plan)) == sorted(changed)
            for term in terms:
                assert len(_positive_deltas(term)) == 1


@SETTINGS
@given(envs())
def test_four_way_join_chain(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
    env, changed = drawn
    check(_chain([R1, R2, R3, R4]), env, changed)


# --- random trees -------------------------------------------------------------------------------


TREE_KINDS = [
    "filter",
    "project",
    "aggregate",
    "aggregate_all",
    "distinct",
    "window",
    "topk",
    "union_all",
    "union",
    "setop",
    *(f"join.{k.value}" for k in ir.JoinKind),
]


@st.composite
def trees(draw: st.DrawFn, root: str, depth: int = 4) -> ir.Node:
    """A random tree of two-column nodes with unique column names (``x<n>``), whose root is a
    ``root`` node and whose subtrees are random."""
    counter = itertools.count()

    def names(n: int = 2) -> tuple[str, ...]:
        return tuple(f"x{next(counter)}" for _ in range(n))

    def rename(node: ir.Node, exprs: tuple[exp.Expr, exp.Expr]) -> ir.Node:
        return ir.Project(node, tuple(zip(names(), exprs, strict=True)))

    def c(name: str) -> exp.Column:
        return exp.column(name)

    def build(level: int, kind: str | None = None) -> ir.Node:
        if kind is None:
            if level == 0 or draw(st.integers(0, 3)) == 0:
                relation = draw(st.sampled_from(sorted(RELATIONS)))
                return ir.Scan(relation, RELATIONS[relation], names())
            kind = draw(st.sampled_from(TREE_KINDS))
        x = build(level - 1)
        a, b = x.columns
        if kind == "filter":
            return ir.Filter(x, e(f"{a} > 0 OR {b} IS NULL"))
        if kind == "project":
            return rename(x, (e(f"COALESCE({a}, {b})"), e(f"CASE WHEN {b} > 1 THEN {a} ELSE {b} END")))
        if kind == "aggregate":
            call = draw(
                st.sampled_from(["COUNT(*)", f"SUM({b})", f"MIN({b})", f"MAX({b})", f"COUNT(DISTINCT {b})"])
            )
            return ir.Aggregate(x, ((names(1)[0], c(a)),), ((names(1)[0], e(call)),))
        if kind == "aggregate_all":
            return ir.Aggregate(x, (), ((names(1)[0], e("COUNT(*)")), (names(1)[0], e(f"SUM({b})"))))
        if kind == "distinct":
            return ir.Distinct(x)
        if kind == "window":
            call = draw(st.sampled_from(["ROW_NUMBER()", "RANK()", f"SUM({b})", "COUNT(*)"]))
            partition = draw(st.sampled_from([f"PARTITION BY {a} ", ""]))
            w = ir.Window(x, ((names(1)[0], e(f"{call} OVER ({partition}ORDER BY {b})")),))
            return rename(w, (c(a), c(w.columns[2])))
        if kind == "topk":
            return ir.TopK(
                x, order(f"{b} DESC, {a}"), limit=draw(st.integers(1, 3)), offset=draw(st.integers(0, 1))
            )
        y = build(level - 1)
        p, q = y.columns
        if kind == "union_all":
            return ir.UnionAll((x, y), names())
        if kind == "union":
            return ir.Distinct(ir.UnionAll((x, y), names()))
        if kind == "setop":
            return ir.SetOp(draw(st.sampled_from(list(ir.SetOpKind))), draw(st.booleans()), x, y, names())
        join_kind = ir.JoinKind(kind.split(".")[1])
        condition = draw(
            st.sampled_from(
                [f"{a} = {p}", f"{a} = {p} AND {b} <= {q}", f"{b} < {q}", f"{a} = {p} AND {b} = {q}"]
            )
        )
        joined = ir.Join(join_kind, x, y, e(condition))
        if join_kind in (ir.JoinKind.SEMI, ir.JoinKind.ANTI):
            return joined
        return rename(joined, (c(draw(st.sampled_from([a, b]))), c(draw(st.sampled_from([p, q])))))

    return build(depth, root)


@pytest.mark.parametrize("root", TREE_KINDS)
def test_random_trees(root: str) -> None:
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(trees(root), envs(), st.booleans())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]], materialize: bool) -> None:
        env, changed = drawn
        # With materialization, the root also keeps its state: an invertible Aggregate root
        # then takes the algebraic rule.
        check(
            node,
            env,
            changed,
            materialized=list(decide(node)) if materialize else [],
            stored_state=materialize,
        )

    prove()
