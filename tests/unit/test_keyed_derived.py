"""Derived key bounds (dvm/keyed.py, dvm/keyed_sources.py): a read bounded by the values another
bounded read holds, proved against the reference evaluator (pure: no JVM, no database).

TPC-H Q10's changed customers reach their orders by key, and the orders' lines only through the
orders read: the lines are bounded by the order keys of the orders read
(``l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_custkey = ANY(keys))``). Here r1 plays
the customers, r2 the orders, r3 the lines, r4 a fourth table down the chain.
"""

from __future__ import annotations

import pytest
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.dvm import ir, keyed
from pgtrickle.dvm.integrate import integrate
from pgtrickle.dvm.keyed import KeySource, Restriction
from pgtrickle.dvm.materialize import decide
from pgtrickle.dvm.reference import Table, add
from tests.unit.test_delta_rules import R1, R2, R3, R4, RELATIONS, e, envs
from tests.unit.test_keyed import _check

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

#: customers ⋈ orders ⋈ lines, revenue per customer (Q10 without its TopK).
CHAIN = ir.Aggregate(
    ir.Join(ir.JoinKind.INNER, ir.Join(ir.JoinKind.INNER, R1, R2, e("a = c")), R3, e("d = e")),
    (("k", e("a")),),
    (("revenue", e("SUM(f)")),),
)
#: One more hop: lines ⋈ r4 on f = g.
LONG_CHAIN = ir.Project(
    ir.Join(
        ir.JoinKind.INNER,
        ir.Join(ir.JoinKind.INNER, ir.Join(ir.JoinKind.INNER, R1, R2, e("a = c")), R3, e("d = e")),
        R4,
        e("f = g"),
    ),
    (("k", e("b")), ("v", e("h"))),
)


#: Each join of the chains over values of its own (a = c in 0-2, d = e in 10-12, f = g in 20-22):
#: a bound taken from the wrong column of the read it derives from keeps the wrong rows.
DOMAINS = {"a": 0, "c": 0, "d": 10, "e": 10, "f": 20, "g": 20, "b": 0, "h": 0}


@st.composite
def chain_envs(draw: st.DrawFn) -> tuple[dict[str, Table], frozenset[str]]:
    """Tables r1-r4 whose join columns hold values of their own domain, random changes."""
    env: dict[str, Table] = {}
    changed: set[str] = set()
    for name, columns in RELATIONS.items():
        row = st.tuples(
            *(st.sampled_from([DOMAINS[c], DOMAINS[c] + 1, DOMAINS[c] + 2, None]) for c in columns)
        )
        before = Counter(draw(st.lists(row, min_size=2, max_size=6)))
        change: Counter = Counter()
        for _ in range(draw(st.integers(0, 3))):
            change[draw(row)] += 1
            gone = draw(st.sampled_from(sorted(before.elements(), key=repr) + [None]))
            if gone is not None and before[gone] + change[gone] > 0:
                change[gone] -= 1
        if change:
            changed.add(name)
        env[name] = Table(columns, add(before, change), add(change, Counter()))
    return env, frozenset(changed)


def test_a_read_reached_only_through_another_read_is_bounded_by_its_rows() -> None:
    found = keyed.restrictions(integrate(CHAIN, frozenset({"r1"}), []).plan)
    # The orders by the changed customers' keys; the lines by the order keys of the orders of the
    # changed customers (``via``: their own bound, not waiting for the orders' read).
    changed_customers = (("c", (KeySource("r1", "a"),)),)
    assert found[("post", "r2")] == Restriction("c", (KeySource("r1", "a"),))
    assert found[("post", "r3")] == Restriction(
        "e", (KeySource("r2", "d", derived=True, via=changed_customers),)
    )
    # One more hop: the r4 rows by the f values of the lines read (a bound on a bound: it waits).
    four = keyed.restrictions(integrate(LONG_CHAIN, frozenset({"r1"}), []).plan)
    assert four[("post", "r4")] == Restriction("g", (KeySource("r3", "f", derived=True),))


def test_a_bound_by_a_change_is_preferred_to_a_derived_one() -> None:
    """With the orders changed too, the lines of the changed orders are bounded by the change's
    own keys in that term, and by the orders read in the customers' term: both sources, one
    column."""
    found = keyed.restrictions(integrate(CHAIN, frozenset({"r1", "r2"}), []).plan)
    r3 = found[("post", "r3")]
    assert r3.column == "e"
    assert KeySource("r2", "d") in r3.keys
    assert all(k == KeySource("r2", "d") or (k.derived and k.via) for k in r3.keys)
    # The orders themselves are bounded by change keys only (never by the lines read).
    assert not any(k.derived for _, keys in found[("post", "r2")].parts() for k in keys)


def test_reads_bounded_only_by_each_other_are_read_whole() -> None:
    """r2 ⋈ r3 with no change reaching either: each would be bounded by the other's rows, a
    cycle with nothing to start from: both read whole. A self-join likewise."""
    assert keyed.restrictions(ir.Join(ir.JoinKind.INNER, R2, R3, e("d = e"))) == {}
    again = ir.Scan("r2", ("c", "d"), ("c2", "d2"))
    assert keyed.restrictions(ir.Join(ir.JoinKind.INNER, R2, again, e("d = c2"))) == {}


def test_a_derived_bound_on_an_unbounded_read_is_dropped() -> None:
    """The orders joined to the changed customers by a non-equality (read whole): the lines,
    bounded only by the orders read (no change key bounds the orders that reach them), are read
    whole too."""
    lines = ir.Join(ir.JoinKind.INNER, ir.Join(ir.JoinKind.INNER, R1, R2, e("b < c")), R3, e("d = e"))
    other = ir.Join(ir.JoinKind.INNER, R1, R2, e("b < d"))
    root = ir.UnionAll(
        (
            ir.Project(lines, (("k", e("a")), ("v", e("f")))),
            ir.Project(other, (("k", e("a")), ("v", e("d")))),
        ),
        ("k", "v"),
    )
    found = keyed.restrictions(integrate(root, frozenset({"r1"}), []).plan)
    assert ("post", "r2") not in found
    assert ("post", "r3") not in found


@pytest.mark.parametrize("shape", ["chain", "long_chain"])
def test_derived_bounds_give_the_exact_change_under_random_changes(shape: str) -> None:
    """Every combination of changed tables (drawn), the chain with and without a kept aggregate:
    the restricted reads (derived ones computed from the restricted reads they name) give the
    exact change of the plan and of every hidden table."""
    root = {"chain": CHAIN, "long_chain": LONG_CHAIN}[shape]
    derived_seen = []

    @SETTINGS
    @given(st.one_of(envs(("r1", "r2", "r3", "r4")), chain_envs()))
    def prove(drawn: tuple[dict[str, Table], frozenset[str]]) -> None:
        env, changed = drawn
        found = keyed.restrictions(integrate(root, changed, []).plan)
        derived_seen.append(any(k.derived for r in found.values() for _, ks in r.parts() for k in ks))
        _check(root, env, changed, [])
        _check(root, env, changed, list(decide(root)))

    prove()
    assert sum(derived_seen) >= 10, "the draws exercise derived bounds"
