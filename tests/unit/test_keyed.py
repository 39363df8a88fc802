"""Key-bounded reads (dvm/keyed.py), proved against the reference evaluator (pure: no JVM, no database).

A restriction says a read matters only for the rows whose column holds a value of some change
columns. The property: reading only those rows gives the same change as reading the whole
relation — for the stream table's plan and every hidden state table's change, which share their
reads — on random trees of operators with and without hidden (kept) nodes, and on the kept
shapes of ``tests/integration/test_hidden_state.py`` (where it must also find the bounds).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.dvm import ir, ir_rewrite, keyed
from pgtrickle.dvm.integrate import integrate
from pgtrickle.dvm.keyed import KeySource, Restriction
from pgtrickle.dvm.materialize import decide
from pgtrickle.dvm.reference import Table, evaluate
from tests.unit.test_delta_rules import (
    R1,
    R2,
    R3,
    RELATIONS,
    TREE_KINDS,
    e,
    envs,
    expected_change,
    order,
    trees,
)
from tests.unit.test_integrate import _prove_over_r1_r2

RESTRICTED = "#restricted"


def _key_values(restriction: Restriction, env: dict[str, Table]) -> set[object]:
    """The values the restriction's keys hold: a change column's in the window's changes (old
    and new rows), a derived source's in the rows the read of its relation keeps (its table in
    ``env`` under ``relation + RESTRICTED``, which :func:`_restricted` computes first) or, with
    ``via``, in the rows of the relation meeting those bounds."""
    values: set[object] = set()
    for source in restriction.keys:
        if source.via:  # the rows of the relation meeting every bound, whatever its own read
            table = env[source.relation]
            bounds = [
                (table.columns.index(c), _key_values(Restriction(c, keys), env)) for c, keys in source.via
            ]
            rows = Counter({row: w for row, w in table.post.items() if all(row[i] in v for i, v in bounds)})
        elif source.derived:
            table = env[source.relation + RESTRICTED]
            rows = table.post
        else:
            table = env[source.relation]
            rows = table.delta
        position = _position(table, source.column)
        values |= {_value(row, position) for row, w in rows.items() if w != 0}
    # A composite key's tuples holding a NULL bound nothing: no row is read by them (the SQL's
    # ``(a, b) IN (...)`` is never true for them).
    return {v for v in values if not (isinstance(v, tuple) and None in v)}


def _position(table: Table, column: keyed.Column) -> int | tuple[int, ...]:
    if isinstance(column, str):
        return table.columns.index(column)
    return tuple(table.columns.index(c) for c in column)


def _value(row: tuple[object, ...], position: int | tuple[int, ...]) -> object:
    return row[position] if isinstance(position, int) else tuple(row[i] for i in position)


def _member(column: str, values: set[object]) -> ir.Node | object:
    terms = [f"{column} = {v}" for v in sorted(v for v in values if v is not None)]
    if None in values:
        terms.append(f"{column} IS NULL")
    return e(" OR ".join(terms) if terms else "FALSE")


def _depends(restriction: Restriction) -> set[str]:
    """The relations whose restricted reads a restriction's derived sources take values from."""
    return {k.relation for _, keys in restriction.parts() for k in keys if k.waits}


def _restricted(
    plans: list[ir.Node], found: dict[keyed.ReadKey, Restriction], env: dict[str, Table]
) -> tuple[list[ir.Node], dict[str, Table]]:
    """``plans`` reading only the rows each restriction keeps: a restricted base relation is read
    from a copy of its table holding only them, a hidden table through a filter. A read bounded
    by derived sources is computed after the reads it takes values from (the restrictions
    promise no cycle: one would fail here)."""
    env = dict(env)
    posts = {what: r for (kind, what), r in found.items() if kind == "post"}
    while posts:
        ready = [what for what, r in posts.items() if all(d + RESTRICTED in env for d in _depends(r))]
        assert ready, f"derived bounds form a cycle: {posts}"
        for what in sorted(ready, key=str):
            restriction = posts.pop(what)
            assert isinstance(what, str)
            table = env[what]
            # A row is read when any part's column holds one of its keys (the parts are OR-ed).
            bounds = [
                (_position(table, column), _key_values(Restriction(column, keys), env))
                for column, keys in restriction.parts()
            ]
            rows = Counter(
                {
                    row: w
                    for row, w in table.post.items()
                    if any(_value(row, i) in values for i, values in bounds)
                }
            )
            env[what + RESTRICTED] = Table(table.columns, rows)
    out = []
    for plan in plans:
        replace: dict[int, ir.Node] = {}
        for node in ir.walk(plan):
            if isinstance(node, ir.Scan) and ("post", node.relation) in found:
                replace[id(node)] = ir.Scan(node.relation + RESTRICTED, node.source_columns, node.output)
            elif isinstance(node, ir.Materialized) and ("materialized", node.node) in found:
                restriction = found[("materialized", node.node)]
                predicate = _member(restriction.column, _key_values(restriction, env))
                replace[id(node)] = ir.Filter(node, predicate)  # type: ignore[arg-type]
        out.append(ir_rewrite.replace_nodes(plan, replace) if replace else plan)
    return out, env


def _check(root: ir.Node, env: dict[str, Table], changed: frozenset[str], hidden: list[ir.Node]) -> int:
    """Restricted reads give every plan's exact value; returns how many reads were restricted."""
    result = integrate(root, changed, hidden)
    plans = [p for p in (result.plan, *(c for _, c in result.changes)) if p is not None]
    wanted = [expected_change(root, env)] if result.plan is not None else []
    wanted += [expected_change(m, env) for m, c in result.changes if c is not None]
    found = keyed.restrictions(result.plan, *(c for _, c in result.changes))
    # Any of a read's bounding columns (the first, or its last alternative) keeps what it needs.
    for pick in (0, -1):
        chosen = {key: r.candidates()[pick] for key, r in found.items()}
        bounded, bounded_env = _restricted(plans, chosen, env)
        assert [evaluate(p, bounded_env) for p in bounded] == wanted
    return len(found)


@pytest.mark.parametrize("root", TREE_KINDS)
def test_restricted_reads_give_the_same_change_on_random_trees(root: str) -> None:
    restricted = []

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(trees(root), envs(), st.booleans())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]], keep: bool) -> None:
        env, changed = drawn
        restricted.append(_check(node, env, changed, list(decide(node)) if keep else []))

    prove()
    # Set operations over random subtrees deep enough to read nothing by key (derandomized draws).
    assert sum(restricted) > 0 or root == "setop", "some reads are bounded"


PER_CUSTOMER = ir.Aggregate(
    ir.Join(ir.JoinKind.LEFT, R1, R2, e("a = c")), (("k", e("a")),), (("n", e("COUNT(d)")),)
)
KEPT_SHAPES = {
    # TPC-H Q13's: customers per count of their orders, over a LEFT JOIN.
    "aggregate_of_aggregate": ir.Aggregate(PER_CUSTOMER, (("n2", e("n")),), (("customers", e("COUNT(*)")),)),
    # The best spenders: a TopK over an aggregate of an inner join.
    "topk_of_aggregate": ir.TopK(
        ir.Aggregate(ir.Join(ir.JoinKind.INNER, R1, R2, e("c = a")), (("k", e("a")),), (("s", e("SUM(d)")),)),
        order("s DESC, k"),
        limit=2,
    ),
}


@pytest.mark.parametrize("shape", sorted(KEPT_SHAPES))
def test_kept_shapes_read_their_sources_by_the_touched_keys(shape: str) -> None:
    root = KEPT_SHAPES[shape]
    hidden = list(decide(root))
    assert hidden
    both = frozenset({"r1", "r2"})
    result = integrate(root, both, hidden)
    found = keyed.restrictions(result.plan, *(c for _, c in result.changes))
    # Both sources by the join key, bounded by the keys of both changes (the LEFT JOIN's
    # preserved side by its own key, the other side across the equality).
    keys = (KeySource("r1", "a"), KeySource("r2", "c"))
    assert found[("post", "r1")] == Restriction("a", keys)
    assert found[("post", "r2")] == Restriction("c", keys)
    # The kept change alone also reads the old groups of its table by key; the stream table's
    # plan reads the whole table (a count per count, a top k), so the shared read is whole.
    ((kept, change),) = result.changes
    assert ("materialized", kept) in keyed.restrictions(change)
    assert ("materialized", kept) not in found

    _prove_over_r1_r2(root, hidden, _check, examples=40)


def test_an_outer_join_pads_nothing_it_is_bounded_by() -> None:
    """A demand on the column a LEFT JOIN pads is dropped (a padded row holds NULL there whatever
    the keys); on the preserved side's column it reaches both sides; a FULL join drops both."""
    for kind, bounded in ((ir.JoinKind.LEFT, {"r1", "r2"}), (ir.JoinKind.FULL, set())):
        joined = ir.Join(kind, R1, R2, e("a = c"))
        root = ir.Aggregate(joined, (("k", e("a")),), (("n", e("COUNT(d)")),))
        plan = integrate(root, frozenset({"r1"}), []).plan
        found = keyed.restrictions(plan)
        assert {k[1] for k in found if k[0] == "post"} == bounded, kind
        padded = ir.Aggregate(joined, (("k", e("c")),), (("n", e("COUNT(b)")),))
        assert keyed.restrictions(integrate(padded, frozenset({"r2"}), []).plan) == {}, kind


def test_an_anti_join_reads_the_other_side_by_the_change_keys() -> None:
    """NOT EXISTS: a changed left row looks only at right rows matching it."""
    root = ir.Join(ir.JoinKind.ANTI, R1, R2, e("a = c"))
    found = keyed.restrictions(integrate(root, frozenset({"r1"}), []).plan)
    assert found == {("post", "r2"): Restriction("c", (KeySource("r1", "a"),))}


def test_a_window_passes_its_common_partition() -> None:
    partitioned = ir.Window(R1, (("rn", e("ROW_NUMBER() OVER (PARTITION BY a ORDER BY b)")),))
    whole = ir.Window(R1, (("rn", e("ROW_NUMBER() OVER (ORDER BY b)")),))
    for window, bounded in ((partitioned, True), (whole, False)):
        root = ir.Join(ir.JoinKind.INNER, window, R2, e("a = c"))
        found = keyed.restrictions(integrate(root, frozenset({"r2"}), []).plan)
        assert (("post", "r1") in found) is bounded


def test_a_read_bounded_by_two_columns_offers_their_pairs_and_each() -> None:
    """Lines joined to a change on (part, supplier): the pairs the change holds bound the read
    first (a composite key), each column alone is an alternative (the reader picks by
    statistics: refresh/key_bounds.narrowest); the fewest key sources first among those."""
    sums = ir.Aggregate(R2, (("c", e("c")), ("d", e("d"))), (("n", e("COUNT(*)")),))
    root = ir.Join(ir.JoinKind.INNER, R1, sums, e("a = c AND b = d"))
    plan = integrate(root, frozenset({"r1"}), []).plan
    found = keyed.restrictions(plan)
    restriction = found[("post", "r2")]
    assert restriction == Restriction(("c", "d"), (KeySource("r1", ("a", "b")),))
    assert restriction.alternatives == (("c", (KeySource("r1", "a"),)), ("d", (KeySource("r1", "b"),)))
    assert [r.column for r in restriction.candidates()] == [("c", "d"), "c", "d"]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(envs(("r1", "r2")))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        _check(root, env, changed, [])  # the pairs (first candidate) and a column (last) both exact

    prove()


def test_a_null_safe_equality_makes_no_composite_key() -> None:
    """``IS NOT DISTINCT FROM`` matches NULLs, which a tuple test never keeps: only ``=`` pairs."""
    root = ir.Join(ir.JoinKind.INNER, R1, R2, e("a = c AND b IS NOT DISTINCT FROM d"))
    restriction = keyed.restrictions(integrate(root, frozenset({"r1"}), []).plan)[("post", "r2")]
    assert all(isinstance(c, str) for c, _ in restriction.candidates()[0].parts())
    assert all(isinstance(r.column, str) for r in restriction.candidates())


def test_pairs_are_not_taken_across_rows_of_one_change() -> None:
    """A self-join of a change pairs two of its rows: the tuple of one row's ``a`` and another's
    ``b`` is no pair the change holds, so no composite bound comes from it (each column alone
    still bounds the read)."""
    r1_again = ir.Scan("r1", ("a", "b"), ("a2", "b2"))
    both = ir.Join(ir.JoinKind.INNER, R1, r1_again, e("b = a2"))
    pairs = ir.Project(both, (("x", e("a")), ("y", e("b2"))))
    root = ir.Join(ir.JoinKind.INNER, pairs, R2, e("x = c AND y = d"))
    found = keyed.restrictions(integrate(root, frozenset({"r1"}), []).plan)
    for restriction in found.values():
        assert all(isinstance(c, str) for c, _ in restriction.parts())
        assert all(isinstance(r.column, str) for r in restriction.candidates())

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(envs(("r1", "r2")))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        _check(root, env, changed, [])

    prove()


def test_a_read_each_use_bounds_by_its_own_column_is_bounded_by_their_or() -> None:
    """r2 read twice: joined to r1's change on c, and to r3's change on d (a self-join through
    two paths): no one column bounds both uses, their OR does."""
    r2_again = ir.Scan("r2", ("c", "d"), ("c2", "d2"))
    left = ir.Join(ir.JoinKind.INNER, R1, R2, e("a = c"))
    right = ir.Join(ir.JoinKind.INNER, R3, r2_again, e("e = d2"))
    root = ir.UnionAll(
        (
            ir.Project(left, (("x", e("c")), ("y", e("d")))),
            ir.Project(right, (("x", e("c2")), ("y", e("d2")))),
        ),
        ("x", "y"),
    )
    plan = integrate(root, frozenset({"r1", "r3"}), []).plan
    restriction = keyed.restrictions(plan)[("post", "r2")]
    assert restriction.parts() == (("c", (KeySource("r1", "a"),)), ("d", (KeySource("r3", "e"),)))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(envs(("r1", "r2", "r3")))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        _check(root, env, changed, [])  # the OR-bounded read gives the exact change

    prove()


def test_a_read_bounded_by_its_own_rows_under_a_change_key_is_bounded() -> None:
    """TPC-H Q2's shape: the cheapest supplier cost per part (an aggregate of part-suppliers joined
    to suppliers) joined back to the part-suppliers. A changed supplier touches the parts of its
    part-suppliers, and every read of part-suppliers is bounded by those parts: values of its own
    rows. Taken from the relation's own read that is a cycle (read whole); the rows of the
    part-suppliers *of the changed suppliers* (``KeySource.via``) are not."""
    r2_again = ir.Scan("r2", ("c", "d"), ("c2", "d2"))
    cheapest = ir.Aggregate(
        ir.Join(ir.JoinKind.INNER, r2_again, R3, e("d2 = e")), (("k", e("c2")),), (("m", e("MIN(f)")),)
    )
    root = ir.Join(ir.JoinKind.INNER, R2, cheapest, e("c = k"))
    plan = integrate(root, frozenset({"r3"}), []).plan
    restriction = keyed.restrictions(plan)[("post", "r2")]
    via = (("d", (KeySource("r3", "e"),)),)
    assert restriction.column == "c"
    assert KeySource("r2", "c", derived=True, via=via) in restriction.keys
    assert not any(k.waits for _, keys in restriction.parts() for k in keys)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(envs(("r2", "r3")))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        assert _check(root, env, changed, []) > 0 or not changed  # bounded, and the exact change

    prove()


COMPOSITE_SIDES = ("scan", "scan", "filter", "distinct", "union_all", "join.inner", "join.semi", "aggregate")


@st.composite
def composite_joins(draw: st.DrawFn) -> ir.Node:
    """A join on both columns of two random subtrees (``a = p AND b = q``), of a random kind,
    under an aggregate by one of its columns or not: reads bounded by the pairs a change holds."""

    def side(prefix: str) -> ir.Node:
        kind = draw(st.sampled_from(COMPOSITE_SIDES))
        if kind == "scan":
            relation = draw(st.sampled_from(sorted(RELATIONS)))
            node: ir.Node = ir.Scan(relation, RELATIONS[relation], RELATIONS[relation])
        else:
            node = draw(trees(kind, depth=1))
        return ir.Project(node, tuple((f"{prefix}{i}", e(c)) for i, c in enumerate(node.columns)))

    x, y = side("l"), side("r")
    kind = draw(st.sampled_from([k for k in ir.JoinKind if k is not ir.JoinKind.FULL]))
    joined = ir.Join(kind, x, y, e("l0 = r0 AND l1 = r1"))
    if draw(st.booleans()):
        return joined
    return ir.Aggregate(joined, (("k", e("l0")),), (("n", e("COUNT(*)")),))


def test_composite_keys_give_the_same_change_on_random_joins() -> None:
    composite = []

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(composite_joins(), envs(), st.booleans())
    def prove(node: ir.Node, drawn: tuple[dict[str, Table], frozenset[str]], keep: bool) -> None:
        env, changed = drawn
        _check(node, env, changed, list(decide(node)) if keep else [])
        result = integrate(node, changed, list(decide(node)) if keep else [])
        found = keyed.restrictions(result.plan, *(c for _, c in result.changes))
        composite.extend(r for r in found.values() if not isinstance(r.column, str))

    prove()
    assert composite, "some reads are bounded by a composite key"


def test_q9_part_suppliers_are_read_by_the_pairs_of_the_lines_read() -> None:
    """TPC-H Q9's shape: lines joined to their orders, and to part-suppliers on (part, supplier).
    The part-suppliers are read by the pairs of the changed lines and of the lines of the changed
    orders (a derived source with its own bound: ``SELECT pk, sk FROM lines WHERE ok =
    ANY(<changed orders>)``); the lines, which no one column bounds in every use, by an OR of
    single columns — a composite key under an OR would be a filter over every line."""
    lines = ir.Scan("lines", ("ok", "pk", "sk"), ("ok", "pk", "sk"))
    orders = ir.Scan("orders", ("o_k", "o_d"), ("o_k", "o_d"))
    partsupp = ir.Scan("partsupp", ("ps_p", "ps_s", "cost"), ("ps_p", "ps_s", "cost"))
    root = ir.Join(
        ir.JoinKind.INNER,
        ir.Join(ir.JoinKind.INNER, lines, orders, e("ok = o_k")),
        partsupp,
        e("ps_p = pk AND ps_s = sk"),
    )
    found = keyed.restrictions(integrate(root, frozenset({"lines", "orders", "partsupp"}), []).plan)
    by_pairs = found[("post", "partsupp")]
    assert by_pairs.column == ("ps_p", "ps_s")
    via = (("ok", (KeySource("orders", "o_k"),)),)
    assert set(by_pairs.keys) == {
        KeySource("lines", ("pk", "sk")),
        KeySource("lines", ("pk", "sk"), derived=True, via=via),
    }
    assert not any(k.waits for k in by_pairs.keys)
    by_lines = found[("post", "lines")]
    assert by_lines.others, "an OR of the uses' own columns"
    assert all(isinstance(c, str) for c, _ in by_lines.parts())
