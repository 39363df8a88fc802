"""Sub-plans computed first (dvm/shared.py): which nodes, and the queries a plan splits into (pure).

Whether the split queries compute the same change is proved on Spark against PostgreSQL by the
integration tests of kept shapes (tests/integration/test_hidden_state.py, test_state_tables.py);
here: the choice (bounded by the change, read along several paths, saving operators) and the
shape of the queries (each defines every CTE it reads, none reads a chosen node's CTE body).
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm import ir, shared
from pgtrickle.dvm.pipeline import ViewNames, plan_delta
from tests.unit.test_delta_rules import R1, R2, e

SCHEMA = {"hs.customers": ["id", "region", "balance"], "hs.orders": ["id", "customer", "amount"]}
Q13 = (
    "SELECT n, count(*) AS customers FROM (SELECT c.id, count(o.id) AS n FROM hs.customers c"
    " LEFT JOIN hs.orders o ON o.customer = c.id GROUP BY c.id) per_customer GROUP BY n"
)


def test_bounded_by_the_change() -> None:
    delta = ir.Delta(R1)
    assert shared.bounded(delta) and not shared.bounded(R1)
    assert shared.bounded(ir.Join(ir.JoinKind.INNER, R2, delta, e("a = c")))
    assert shared.bounded(ir.Join(ir.JoinKind.SEMI, R2, delta, e("a = c")))
    assert not shared.bounded(ir.Join(ir.JoinKind.ANTI, R2, delta, e("a = c")))
    assert not shared.bounded(ir.Join(ir.JoinKind.LEFT, R2, delta, e("a = c")))
    assert shared.bounded(ir.Aggregate(R1, (), (("n", e("COUNT(*)")),)))
    assert not shared.bounded(ir.Aggregate(R1, (("a", e("a")),), (("n", e("COUNT(*)")),)))
    assert not shared.bounded(ir.UnionAll((R1, ir.Negate(delta)), R1.columns))
    assert shared.bounded(ir.Materialized(R1, change=True)) and not shared.bounded(
        ir.Materialized(R1, pre=True)
    )


def test_inlined_size_counts_every_path() -> None:
    delta = ir.Delta(R1)
    both = ir.UnionAll((ir.Filter(delta, e("a > 0")), ir.Filter(delta, e("a > 1"))), R1.columns)
    assert shared.inlined_size(both) == 5
    assert shared.inlined_size(both, [delta]) == 5
    assert shared.inlined_size(delta, [delta]) == 1


def _compiled_kept_change():
    plan = plan_delta(
        Q13, SCHEMA, None, {"hs.customers", "hs.orders"}, "spark", reads=ViewNames(), keep_state=True
    )
    ((_, change),) = plan.state_changes
    assert change is not None
    return change


def test_the_q13_kept_change_computes_its_shared_change_first() -> None:
    change = _compiled_kept_change()
    root = change.nodes[-1]
    chosen = shared.choose(root)
    assert chosen and all(shared.bounded(n) for n in chosen)
    before = shared.inlined_size(root)
    after = sum(shared.inlined_size(r, chosen) for r in (root, *chosen))
    assert after <= before // 2, (before, after)
    order = [id(n) for n in ir.walk(root)]
    assert [order.index(id(n)) for n in chosen] == sorted(order.index(id(n)) for n in chosen)


def _defined_and_read(query: exp.Expr) -> tuple[set[str], set[str]]:
    defined = {cte.alias for cte in query.find_all(exp.CTE)}
    read = {t.name for t in query.find_all(exp.Table)}
    return defined, read


def test_split_queries_read_chosen_nodes_as_views() -> None:
    change = _compiled_kept_change()
    chosen = shared.choose(change.nodes[-1])
    split = shared.split(change, chosen, lambda i: f"first_{i}")
    assert split.whole is change
    assert [view for view, _ in split.first] == [f"first_{i}" for i in range(len(chosen))]
    views = {f"first_{i}" for i in range(len(chosen))}
    chosen_ctes = {f"__pgt_n{change.nodes.index(n)}" for n in chosen}
    for i, (_, part) in enumerate(split.first):
        defined, read = _defined_and_read(part.query)
        ctes = {name for name in read if name.startswith("__pgt_n")}
        assert ctes <= defined, "a query defines every CTE it reads"
        assert read - ctes <= views | {r.name for r in change.reads}
        assert not (read & {f"first_{j}" for j in range(i, len(chosen))}), "computed before it is read"
        part.sql()
    defined, read = _defined_and_read(split.main.query)
    assert {name for name in read if name.startswith("__pgt_n")} <= defined
    assert views <= read
    for cte in split.main.query.find_all(exp.CTE):
        if cte.alias in chosen_ctes:
            assert {t.name for t in cte.this.find_all(exp.Table)} <= views
    split.main.sql()
    assert shared.split(change, (), lambda i: "x").main is change


def test_nothing_worth_splitting_in_a_small_plan() -> None:
    delta = ir.Delta(R1)
    plan = ir.UnionAll((ir.Filter(delta, e("a > 0")), ir.Filter(delta, e("a > 1"))), R1.columns)
    assert shared.choose(plan) == ()


TPCH_SCHEMA = {
    "tpch.lineitem": ["l_orderkey", "l_partkey", "l_suppkey", "l_extendedprice", "l_discount"],
    "tpch.orders": ["o_orderkey", "o_custkey", "o_orderdate"],
    "tpch.customer": ["c_custkey", "c_nationkey"],
    "tpch.supplier": ["s_suppkey", "s_nationkey"],
    "tpch.nation": ["n_nationkey", "n_name", "n_regionkey"],
    "tpch.region": ["r_regionkey", "r_name"],
}
Q5 = (
    "SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue FROM tpch.customer, tpch.orders,"
    " tpch.lineitem, tpch.supplier, tpch.nation, tpch.region WHERE c_custkey = o_custkey"
    " AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey AND c_nationkey = s_nationkey"
    " AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'ASIA' GROUP BY n_name"
)


def test_a_stream_tables_own_plan_is_split_where_a_sub_plan_is_worth_computing_first() -> None:
    """shared.root_split: a plan without hidden tables is split only where
    dvm/shared.py chooses a sub-plan (TPC-H Q5's telescoping terms when four tables change: the
    inlined plan shrinks by more than half); a small plan stays one query; with hidden tables the
    plan is always split (computed in parts anyway)."""
    changed = {"tpch.lineitem", "tpch.orders", "tpch.customer", "tpch.supplier"}
    big = plan_delta(Q5, TPCH_SCHEMA, None, changed, "spark", reads=ViewNames()).compiled
    assert big is not None
    found = shared.root_split(big, "first_", kept=False)
    assert found is not None and found.first
    whole = shared.inlined_size(big.nodes[-1])
    chosen = shared.choose(big.nodes[-1])
    assert sum(shared.inlined_size(r, chosen) for r in (big.nodes[-1], *chosen)) < whole / 2
    one_table = "SELECT n_regionkey, count(*) AS n FROM tpch.nation GROUP BY n_regionkey"
    small = plan_delta(one_table, TPCH_SCHEMA, None, {"tpch.nation"}, "spark", reads=ViewNames()).compiled
    assert small is not None and not shared.choose(small.nodes[-1])
    assert shared.root_split(small, "first_", kept=False) is None
    kept = shared.root_split(small, "first_", kept=True)
    assert kept is not None and not kept.first
