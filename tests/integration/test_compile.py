"""The IR compiler against the real engines: every node type, compiled to PostgreSQL and run
there against an equivalent hand-written query (two-way EXCEPT ALL of the expanded rows, or of
the consolidated Z-sets for delta plans), then compiled to Spark SQL and run in the real
SparkSession over the same tables (JDBC-read temporary views), compared with PostgreSQL.

Output column names are hostile on purpose (quotes, backticks, dots, spaces) in every tree.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from pgtrickle.db.connection import jdbc_target
from pgtrickle.dvm.compile import Compiled, compile_ir
from pgtrickle.dvm.ir import (
    Aggregate,
    Delta,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Materialized,
    Negate,
    Node,
    Project,
    Scan,
    SetOp,
    SetOpKind,
    TopK,
    UnionAll,
    Values,
    Window,
)
from tests.conftest import Database

pytestmark = pytest.mark.integration

A_COLS = ("k", "x", "s")
B_COLS = ("k", "y", "t")
TYPES = {
    "a": {"k": "integer", "x": "integer", "s": "text"},
    "b": {"k": "integer", "y": "numeric(8,2)", "t": "text"},
    "a0": {"k": "integer", "x": "integer", "s": "text"},
    "b0": {"k": "integer", "y": "numeric(8,2)", "t": "text"},
}
AK, AX, AS_ = 'a"k', "a`x", "a.s"
BK, BY, BT = "b k", "b`y", 'b."t'


def e(text: str) -> exp.Expr:
    """A PostgreSQL expression (IR expressions have PostgreSQL semantics)."""
    return sqlglot.parse_one(text, read="postgres")


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def scan_a(relation: str = "a") -> Scan:
    return Scan(relation, A_COLS, (AK, AX, AS_))


def scan_b(relation: str = "b") -> Scan:
    return Scan(relation, B_COLS, (BK, BY, BT))


class Views:
    """Each relation is read as the table (PostgreSQL) / temporary view (Spark) of its name."""

    def post(self, scan: Scan) -> str:
        return scan.relation

    def delta(self, scan: Scan) -> str:
        return "d_" + scan.relation

    def materialized(self, node: Materialized) -> str:
        return node.name


# --------------------------------------------------------------------------- data


def _rows_a(rng: random.Random, n: int) -> list[tuple]:
    return [
        (
            rng.choice([1, 2, 3, 4, None]),
            rng.choice([-2, 0, 1, 3, 5, None]),
            rng.choice(["p", "q", "r", None]),
        )
        for _ in range(n)
    ]


def _rows_b(rng: random.Random, n: int) -> list[tuple]:
    return [
        (
            rng.choice([1, 2, 3, 5, None]),
            rng.choice(["0.50", "1.25", "-3.00", "7.10", None]),
            rng.choice(["p", "q", "z", None]),
        )
        for _ in range(n)
    ]


def load(db: Database, seed: int) -> None:
    """a0, b0: the state at the window's start; d_a, d_b: the change (deletes of existing rows,
    inserts, duplicates); a, b: the state at its end (a0 ⊎ d_a, b0 ⊎ d_b)."""
    rng = random.Random(seed)
    for rel, cols, maker in (
        ("a", "k int, x int, s text", _rows_a),
        ("b", "k int, y numeric(8,2), t text", _rows_b),
    ):
        db.sql(f"CREATE TABLE {rel}0 ({cols})")
        db.sql(f"CREATE TABLE d_{rel} ({cols}, __pgt_w bigint NOT NULL)")
        db.sql(f"CREATE TABLE {rel} ({cols})")
        before = maker(rng, 30)
        before += rng.sample(before, 6)  # duplicates
        deleted = rng.sample(before, 7)
        inserted = maker(rng, 6)
        inserted += inserted[:2]
        after = list(before)
        for row in deleted:
            after.remove(row)
        after += inserted
        with db.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {rel}0 VALUES (%s, %s, %s)", before)
            cur.executemany(f"INSERT INTO {rel} VALUES (%s, %s, %s)", after)
            cur.executemany(f"INSERT INTO d_{rel} VALUES (%s, %s, %s, -1)", deleted)
            cur.executemany(f"INSERT INTO d_{rel} VALUES (%s, %s, %s, 1)", inserted)


@pytest.fixture
def data(db: Database, spark):  # type: ignore[no-untyped-def]
    load(db, seed=17)
    target = jdbc_target(db.dsn)
    for name in ("a", "b", "a0", "b0", "d_a", "d_b"):
        (
            spark.read.format("jdbc")
            .options(**target.options())
            .option("dbtable", name)
            .load()
            .createOrReplaceTempView(name)
        )
    return db


# --------------------------------------------------------------------------- oracles


def zset_pg(db: Database, compiled: Compiled) -> Counter:
    rows = db.sql(compiled.consolidated().sql())
    return Counter({tuple(r[:-1]): r[-1] for r in rows})


def zset_spark(spark, compiled: Compiled) -> Counter:  # type: ignore[no-untyped-def]
    from pgtrickle.spark.numeric import ensure_functions

    text = compiled.consolidated().sql()
    ensure_functions(spark, text)  # numeric quotients call pgtrickle's row function
    rows = spark.sql(text).collect()
    return Counter({tuple(r[:-1]): r[-1] for r in rows})


def assert_same_as_query(db: Database, node: Node, expected_sql: str) -> Compiled:
    """The compiled tree (PostgreSQL), weights expanded, equals ``expected_sql`` both ways."""
    compiled = compile_ir(node, Views(), dialect="postgres", column_types=TYPES)
    cols = ", ".join(f"c.{q(n)}" for n in node.columns)
    inner = compiled.consolidated().sql()
    assert db.scalar(f"SELECT count(*) FROM ({inner}) c WHERE c.__pgt_w < 0") == 0
    expanded = f"SELECT {cols} FROM ({inner}) c CROSS JOIN LATERAL generate_series(1, c.__pgt_w)"
    missing = db.scalar(f"SELECT count(*) FROM (({expected_sql}) EXCEPT ALL ({expanded})) d")
    extra = db.scalar(f"SELECT count(*) FROM (({expanded}) EXCEPT ALL ({expected_sql})) d")
    assert (missing, extra) == (0, 0), f"{missing} rows missing, {extra} extra:\n{compiled.sql(pretty=True)}"
    return compiled


def assert_same_zset(db: Database, node: Node, expected_sql: str) -> Compiled:
    """The compiled tree (PostgreSQL) equals ``expected_sql`` (columns then a weight) as Z-sets."""
    compiled = compile_ir(node, Views(), dialect="postgres", column_types=TYPES)
    got = zset_pg(db, compiled)
    cols = ", ".join(f"c{i}" for i in range(len(node.columns)))
    rows = db.sql(
        f"SELECT {cols}, sum(w)::bigint FROM ({expected_sql}) AS e({cols}, w) GROUP BY {cols} "
        "HAVING sum(w) <> 0"
    )
    assert got == Counter({tuple(r[:-1]): r[-1] for r in rows})
    return compiled


def assert_spark_agrees(db: Database, spark, node: Node) -> None:  # type: ignore[no-untyped-def]
    """The tree compiled to Spark SQL gives the Z-set the PostgreSQL compilation gives."""
    pg = zset_pg(db, compile_ir(node, Views(), dialect="postgres", column_types=TYPES))
    on_spark = compile_ir(node, Views(), dialect="spark", column_types=TYPES)
    assert zset_spark(spark, on_spark) == pg, on_spark.sql(pretty=True)


def check(db: Database, spark, node: Node, expected_sql: str, zset: bool = False) -> None:  # type: ignore[no-untyped-def]
    (assert_same_zset if zset else assert_same_as_query)(db, node, expected_sql)
    assert_spark_agrees(db, spark, node)


# --------------------------------------------------------------------------- linear nodes


def test_scan_filter_project_union_values(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a, b = scan_a(), scan_b()
    check(data, spark, a, "SELECT k, x, s FROM a")
    check(
        data,
        spark,
        Filter(a, e(f"{q(AX)} > 0 AND {q(AS_)} IS DISTINCT FROM 'q'")),
        "SELECT k, x, s FROM a WHERE x > 0 AND s IS DISTINCT FROM 'q'",
    )
    projected = Project(
        a,
        (
            ("ratio", e(f"{q(AX)} / 2")),
            ("label", e(f"coalesce({q(AS_)}, '-') || 'x'")),
            ("c.case", e(f"CASE WHEN {q(AK)} > 2 THEN 'big' ELSE 'small' END")),
            ("cast", e(f"({q(AX)} * 3)::numeric / 4")),
        ),
    )
    check(
        data,
        spark,
        projected,
        "SELECT x / 2, coalesce(s, '-') || 'x', CASE WHEN k > 2 THEN 'big' ELSE 'small' END, (x * 3)::numeric / 4"
        " FROM a",
    )
    union = UnionAll(
        (
            Project(a, (("u1", e(q(AK))), ("u2", e(q(AS_))))),
            Project(b, (("v1", e(q(BK))), ("v2", e(q(BT))))),
            Values(((e("7"), e("'lit'")), (e("NULL"), e("'o''k'"))), ("w1", "w2")),
        ),
        ("o k", 'o"s'),
    )
    check(
        data,
        spark,
        union,
        "SELECT k, s FROM a UNION ALL SELECT k, t FROM b UNION ALL VALUES (7, 'lit'), (NULL, 'o''k')",
    )
    check(data, spark, Values((), ("none",)), "SELECT NULL::text WHERE false")


def test_inner_and_cross_joins(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a, b = scan_a(), scan_b()
    check(
        data,
        spark,
        Join(JoinKind.INNER, a, b, e(f"{q(AK)} = {q(BK)}")),
        "SELECT a.*, b.* FROM a JOIN b ON a.k = b.k",
    )
    check(
        data,
        spark,
        Join(JoinKind.INNER, a, b, e(f"{q(AK)} < {q(BK)} AND {q(AS_)} <> {q(BT)}")),
        "SELECT a.*, b.* FROM a JOIN b ON a.k < b.k AND a.s <> b.t",
    )
    check(
        data,
        spark,
        Join(JoinKind.INNER, Filter(a, e(f"{q(AK)} = 1")), b),
        "SELECT a.*, b.* FROM a CROSS JOIN b WHERE a.k = 1",
    )


def test_delta_plan_telescoping_join(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    """Δ(A ⋈ B) = ΔA ⋈ pre(B) ⊎ post(A) ⋈ ΔB with pre(B) = post(B) ⊎ −ΔB, equal to
    (A ⋈ B) − (A0 ⋈ B0) computed from the tables before and after; ΔB is read once, twice used."""
    a, b = scan_a(), scan_b()
    cond = e(f"{q(AK)} = {q(BK)}")
    pre_b = UnionAll((b, Negate(Delta(b))), (BK, BY, BT))
    plan = UnionAll(
        (Join(JoinKind.INNER, Delta(a), pre_b, cond), Join(JoinKind.INNER, a, Delta(b), cond)),
        (AK, AX, AS_, BK, BY, BT),
    )
    compiled = check_zset_and_spark(
        data,
        spark,
        plan,
        "SELECT a.*, b.*, 1 FROM a JOIN b ON a.k = b.k "
        "UNION ALL SELECT a0.*, b0.*, -1 FROM a0 JOIN b0 ON a0.k = b0.k",
    )
    uses = {(r.kind.value, r.name): r.uses for r in compiled.reads}
    assert uses == {("delta", "d_a"): 1, ("post", "b"): 1, ("delta", "d_b"): 2, ("post", "a"): 1}


def check_zset_and_spark(db: Database, spark, node: Node, expected_sql: str) -> Compiled:  # type: ignore[no-untyped-def]
    compiled = assert_same_zset(db, node, expected_sql)
    assert_spark_agrees(db, spark, node)
    return compiled


def test_negate_and_delta_reads(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    check(data, spark, Negate(Delta(scan_a())), "SELECT k, x, s, -__pgt_w FROM d_a", zset=True)
    pre_a = UnionAll((scan_a(), Negate(Delta(scan_a()))), (AK, AX, AS_))
    check(data, spark, pre_a, "SELECT k, x, s, 1 FROM a0", zset=True)


# --------------------------------------------------------------------------- semi / anti / outer


def test_semi_and_anti_joins_read_net_weights(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a, b = scan_a(), scan_b()
    check(
        data,
        spark,
        Join(JoinKind.SEMI, a, b, e(f"{q(AK)} = {q(BK)}")),
        "SELECT * FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    )
    check(
        data,
        spark,
        Join(JoinKind.ANTI, a, b, e(f"{q(AK)} = {q(BK)}")),
        "SELECT * FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    )
    not_in = Join(JoinKind.ANTI, a, Filter(b, e(f"{q(BT)} = 'q'")), e(f"({q(AK)} = {q(BK)}) IS NOT FALSE"))
    check(data, spark, not_in, "SELECT * FROM a WHERE a.k NOT IN (SELECT k FROM b WHERE t = 'q')")
    not_in_no_nulls = Join(
        JoinKind.ANTI, a, Filter(b, e(f"{q(BK)} IS NOT NULL")), e(f"({q(AK)} = {q(BK)}) IS NOT FALSE")
    )
    check(
        data, spark, not_in_no_nulls, "SELECT * FROM a WHERE a.k NOT IN (SELECT k FROM b WHERE k IS NOT NULL)"
    )
    # the right input's net weights: b minus its rows with t = 'p' (a Z-set with negative parts)
    net = UnionAll((b, Negate(Filter(b, e(f"{q(BT)} = 'p'")))), (BK, BY, BT))
    check(
        data,
        spark,
        Join(JoinKind.SEMI, a, net, e(f"{q(AK)} = {q(BK)}")),
        "SELECT * FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND t IS DISTINCT FROM 'p')",
    )
    check(
        data,
        spark,
        Join(JoinKind.ANTI, Delta(a), net, e(f"{q(AK)} = {q(BK)}")),
        "SELECT k, x, s, __pgt_w FROM d_a WHERE NOT EXISTS "
        "(SELECT 1 FROM b WHERE b.k = d_a.k AND t IS DISTINCT FROM 'p')",
        zset=True,
    )


@pytest.mark.parametrize("kind", [JoinKind.LEFT, JoinKind.RIGHT, JoinKind.FULL])
def test_outer_joins_with_null_keys_and_net_inputs(data: Database, spark, kind: JoinKind) -> None:  # type: ignore[no-untyped-def]
    a, b = scan_a(), scan_b()
    sql_kind = kind.value.upper()
    check(
        data,
        spark,
        Join(kind, a, b, e(f"{q(AK)} = {q(BK)}")),
        f"SELECT a.*, b.* FROM a {sql_kind} JOIN b ON a.k = b.k",
    )
    check(
        data,
        spark,
        Join(kind, a, b, e(f"{q(AK)} = {q(BK)} AND {q(AS_)} = {q(BT)}")),
        f"SELECT a.*, b.* FROM a {sql_kind} JOIN b ON a.k = b.k AND a.s = b.t",
    )
    # pre(A) = A ⊎ −ΔA is A0 as a multiset: the outer join reads its consolidated positive weights
    pre_a = UnionAll((a, Negate(Delta(a))), (AK, AX, AS_))
    check(
        data,
        spark,
        Join(kind, pre_a, b, e(f"{q(AK)} = {q(BK)}")),
        f"SELECT a0.*, b.* FROM a0 {sql_kind} JOIN b ON a0.k = b.k",
    )


# --------------------------------------------------------------------------- aggregates


def test_aggregates_weighted_and_expanded(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a, b = scan_a(), scan_b()
    keys = (("g.k", e(q(AK))),)
    weighted = Aggregate(
        a,
        keys,
        (
            ("n", e("count(*)")),
            ("nx", e(f"count({q(AX)})")),
            ("sx", e(f"sum({q(AX)})")),
            ("pos", e(f"count(*) FILTER (WHERE {q(AX)} > 0)")),
            ("spos", e(f"sum({q(AX)}) FILTER (WHERE {q(AX)} > 0)")),
            ("dx", e(f"count(DISTINCT {q(AX)})")),
            ("mn", e(f"min({q(AS_)})")),
            ("mx", e(f"max({q(AX)})")),
            ("all", e(f"bool_and({q(AX)} > -1)")),
        ),
    )
    check(
        data,
        spark,
        weighted,
        "SELECT k, count(*), count(x), sum(x), count(*) FILTER (WHERE x > 0), sum(x) FILTER (WHERE x > 0),"
        " count(DISTINCT x), min(s), max(x), bool_and(x > -1) FROM a GROUP BY k",
    )
    numeric = Aggregate(
        b, ((BT, e(q(BT))),), (("sy", e(f"sum({q(BY)})")), ("sd", e(f"sum(DISTINCT {q(BY)})")))
    )
    check(data, spark, numeric, "SELECT t, sum(y), sum(DISTINCT y) FROM b GROUP BY t")
    expanded = Aggregate(
        a, keys, (("agg", e(f"string_agg({q(AS_)}, ',' ORDER BY {q(AS_)})")), ("n", e("count(*)")))
    )
    check(data, spark, expanded, "SELECT k, string_agg(s, ',' ORDER BY s), count(*) FROM a GROUP BY k")
    # averages are exact on PostgreSQL (weighted) and compared there only: Spark's avg is a double
    assert_same_as_query(
        data, Aggregate(a, keys, (("av", e(f"avg({q(AX)})")),)), "SELECT k, avg(x) FROM a GROUP BY k"
    )
    assert_same_as_query(data, Aggregate(b, (), (("av", e(f"avg({q(BY)})")),)), "SELECT avg(y) FROM b")


def test_aggregates_over_net_weights_and_empty_input(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a = scan_a()
    pre_a = UnionAll((a, Negate(Delta(a))), (AK, AX, AS_))
    calls = (("n", e("count(*)")), ("sx", e(f"sum({q(AX)})")), ("mx", e(f"max({q(AX)})")))
    check(
        data,
        spark,
        Aggregate(pre_a, ((AK, e(q(AK))),), calls),
        "SELECT k, count(*), sum(x), max(x) FROM a0 GROUP BY k",
    )
    check(
        data,
        spark,
        Aggregate(Filter(a, e("false")), (), calls),
        "SELECT count(*), sum(x), max(x) FROM a WHERE false",
    )
    # an aggregate of a join, under a projection (HAVING as a Filter above it)
    joined = Join(JoinKind.INNER, a, scan_b(), e(f"{q(AK)} = {q(BK)}"))
    agg = Aggregate(
        joined, ((AS_, e(q(AS_))),), (("tot", e(f"sum({q(BY)} * {q(AX)})")), ("n", e("count(*)")))
    )
    having = Project(Filter(agg, e('"n" > 1')), (("s", e(q(AS_))), ("avg", e('round("tot" / "n", 2)'))))
    check(
        data,
        spark,
        having,
        "SELECT a.s, round(sum(b.y * a.x) / count(*), 2) FROM a JOIN b ON a.k = b.k GROUP BY a.s"
        " HAVING count(*) > 1",
    )


# --------------------------------------------------------------------------- distinct / set operations


def test_distinct_and_set_operations(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a, b = scan_a(), scan_b()
    left = Project(a, (("l k", e(q(AK))), ("l`s", e(q(AS_)))))
    right = Project(b, (("r k", e(q(BK))), ("r.t", e(q(BT)))))
    check(data, spark, Distinct(left), "SELECT DISTINCT k, s FROM a")
    check(
        data,
        spark,
        Distinct(UnionAll((left, right), ("u.k", "u s"))),
        "SELECT k, s FROM a UNION SELECT k, t FROM b",
    )
    for kind in SetOpKind:
        for all_ in (True, False):
            sql_op = f"{kind.value.upper()}{' ALL' if all_ else ''}"
            check(
                data,
                spark,
                SetOp(kind, all_, left, right, ("o k", "o`s")),
                f"SELECT k, s FROM a {sql_op} SELECT k, t FROM b",
            )
    # set operations over net weights: pre(A) = A0
    pre_left = Project(
        UnionAll((a, Negate(Delta(a))), (AK, AX, AS_)), (("l k", e(q(AK))), ("l`s", e(q(AS_))))
    )
    check(
        data,
        spark,
        SetOp(SetOpKind.EXCEPT, True, pre_left, right, ("o k", "o`s")),
        "SELECT k, s FROM a0 EXCEPT ALL SELECT k, t FROM b",
    )
    check(data, spark, Distinct(pre_left), "SELECT DISTINCT k, s FROM a0")


# --------------------------------------------------------------------------- window / top-k


def test_window_functions(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a = scan_a()
    functions = (
        ("rn", e(f"row_number() OVER (PARTITION BY {q(AK)} ORDER BY {q(AX)}, {q(AS_)})")),
        ("rk", e(f"rank() OVER (PARTITION BY {q(AK)} ORDER BY {q(AX)} DESC)")),
        ("run", e(f"sum({q(AX)}) OVER (PARTITION BY {q(AS_)} ORDER BY {q(AX)} NULLS FIRST)")),
        ("cnt", e("count(*) OVER ()")),
    )
    check(
        data,
        spark,
        Window(a, functions),
        "SELECT k, x, s, row_number() OVER (PARTITION BY k ORDER BY x, s), rank() OVER (PARTITION BY k ORDER BY"
        " x DESC), sum(x) OVER (PARTITION BY s ORDER BY x NULLS FIRST), count(*) OVER () FROM a",
    )
    pre_a = UnionAll((a, Negate(Delta(a))), (AK, AX, AS_))
    check(
        data,
        spark,
        Window(pre_a, functions[1:2]),
        "SELECT k, x, s, rank() OVER (PARTITION BY k ORDER BY x DESC) FROM a0",
    )


def _ordered(text: str) -> tuple[exp.Ordered, ...]:
    parsed = sqlglot.parse_one(f"SELECT 1 ORDER BY {text}", read="postgres")
    return tuple(parsed.args["order"].expressions)


@pytest.mark.parametrize(
    ("order", "limit", "offset"),
    [
        (f"{q(AX)} DESC", 5, 0),
        (f"{q(AK)}", 4, 3),
        (f"{q(AS_)} DESC NULLS LAST, {q(AK)}", None, 6),
        (f"{q(AX)}", 0, 2),
        (f"{q(AK)} NULLS FIRST", 100, 0),
    ],
)
def test_top_k_with_ties_broken_by_the_whole_row(
    data: Database,
    spark,
    order: str,
    limit: int | None,  # type: ignore[no-untyped-def]
    offset: int,
) -> None:
    a = scan_a()
    pg_order = order.replace(q(AX), "x").replace(q(AK), "k").replace(q(AS_), "s")
    window = f"LIMIT {limit} " if limit is not None else ""
    expected = f"SELECT k, x, s FROM a ORDER BY {pg_order}, k, x, s {window}OFFSET {offset}"
    check(data, spark, TopK(a, _ordered(order), limit, offset), expected)
    pre_a = UnionAll((a, Negate(Delta(a))), (AK, AX, AS_))
    check(data, spark, TopK(pre_a, _ordered(order), limit, offset), expected.replace("FROM a ", "FROM a0 "))


# --------------------------------------------------------------------------- materialized / shared


def test_materialized_and_shared_subtrees(data: Database, spark) -> None:  # type: ignore[no-untyped-def]
    a = scan_a()
    agg = Aggregate(a, ((AK, e(q(AK))),), (("n", e("count(*)")),))
    data.sql('CREATE TABLE mat_agg AS SELECT k AS "a""k", count(*) AS n FROM a GROUP BY k')
    (
        spark.read.format("jdbc")
        .options(**jdbc_target(data.dsn).options())
        .option("dbtable", "mat_agg")
        .load()
        .createOrReplaceTempView("mat_agg")
    )
    mat = Materialized(agg, name="mat_agg")
    check(
        data,
        spark,
        Join(JoinKind.INNER, a, Project(mat, (("mk", e(q(AK))), ("mn", e('"n"')))), e(f'{q(AK)} = "mk"')),
        'SELECT a.*, m."a""k", m.n FROM a JOIN mat_agg m ON a.k = m."a""k"',
    )
    # one subtree object used by two consumers: one CTE; two scans of one relation: one read
    shared = Filter(a, e(f"{q(AX)} > 0"))
    self_join = Join(
        JoinKind.INNER,
        shared,
        Project(Filter(scan_a(), e(f"{q(AX)} > 0")), (("k2", e(q(AK))), ("x2", e(q(AX))))),
        e(f'{q(AK)} = "k2"'),
    )
    tree = UnionAll((Project(self_join, ((AK, e(q(AK))),)), Project(shared, ((AK, e(q(AK))),))), ("k",))
    compiled = assert_same_as_query(
        data,
        tree,
        "SELECT a.k FROM a JOIN a b ON a.k = b.k WHERE a.x > 0 AND b.x > 0 UNION ALL "
        "SELECT k FROM a WHERE x > 0",
    )
    assert [(r.name, r.uses) for r in compiled.reads] == [("a", 3)]  # the shared filter is read twice
    assert_spark_agrees(data, spark, tree)


# --------------------------------------------------------------------------- random data (hypothesis)


_small = st.lists(st.tuples(st.sampled_from([1, 2, None]), st.sampled_from([0, 1, None])), max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(left=_small, right=_small, weights=st.lists(st.sampled_from([-2, -1, 1, 2]), min_size=6, max_size=6))
def test_random_relations_through_non_linear_nodes(
    db: Database, left: Sequence[tuple], right: Sequence[tuple], weights: Sequence[int]
) -> None:
    """Random small relations (NULLs, duplicates) and a random Z-set change: outer joins, set
    operations, ANTI (NOT IN) and aggregates over the net weights agree with PostgreSQL itself."""
    db.sql("DROP TABLE IF EXISTS l, r, d_l")
    db.sql("CREATE TABLE l (k int, v int)")
    db.sql("CREATE TABLE r (k int, v int)")
    db.sql("CREATE TABLE d_l (k int, v int, __pgt_w bigint)")
    with db.conn.cursor() as cur:
        cur.executemany("INSERT INTO l VALUES (%s, %s)", list(left))
        cur.executemany("INSERT INTO r VALUES (%s, %s)", list(right))
        cur.executemany("INSERT INTO d_l VALUES (%s, %s, %s)", [(*row, w) for row, w in zip(right, weights)])
    lscan, rscan = Scan("l", ("k", "v"), ("lk", "lv")), Scan("r", ("k", "v"), ("rk", "rv"))
    net_l = UnionAll((lscan, Delta(lscan)), ("lk", "lv"))  # l ⊎ d_l, possibly with negative rows
    net_sql = (
        "SELECT k, v FROM (SELECT k, v, sum(w) AS w FROM (SELECT k, v, 1 AS w FROM l UNION ALL "
        "SELECT k, v, __pgt_w FROM d_l) u GROUP BY k, v HAVING sum(w) > 0) p, generate_series(1, p.w)"
    )
    cond = e('"lk" = "rk"')
    cases = [
        (Join(JoinKind.FULL, net_l, rscan, cond), f"SELECT * FROM ({net_sql}) x FULL JOIN r ON x.k = r.k"),
        (
            SetOp(SetOpKind.INTERSECT, True, net_l, rscan, ("a", "b")),
            f"{net_sql} INTERSECT ALL SELECT * FROM r",
        ),
        (SetOp(SetOpKind.EXCEPT, False, net_l, rscan, ("a", "b")), f"{net_sql} EXCEPT SELECT * FROM r"),
        (
            Join(JoinKind.ANTI, lscan, rscan, e('("lv" = "rv") IS NOT FALSE')),
            "SELECT * FROM l WHERE v NOT IN (SELECT v FROM r)",
        ),
        (
            Aggregate(net_l, (("lk", e('"lk"')),), (("n", e('count("lv")')), ("s", e('sum("lv")')))),
            f"SELECT k, count(v), sum(v) FROM ({net_sql}) x GROUP BY k",
        ),
        (TopK(net_l, _ordered('"lv" DESC'), 2, 1), f"{net_sql} ORDER BY v DESC, k, v LIMIT 2 OFFSET 1"),
    ]
    for node, expected in cases:
        compiled = compile_ir(node, Views(), dialect="postgres")
        inner = compiled.consolidated().sql()
        cols = ", ".join(f"c.{q(n)}" for n in node.columns)
        expanded = f"SELECT {cols} FROM ({inner}) c, generate_series(1, c.__pgt_w)"
        assert db.scalar(f"SELECT count(*) FROM (({expected}) EXCEPT ALL ({expanded})) d") == 0, expected
        assert db.scalar(f"SELECT count(*) FROM (({expanded}) EXCEPT ALL ({expected})) d") == 0, expected
