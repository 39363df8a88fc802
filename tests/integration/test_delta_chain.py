"""The compositional delta engine end to end against the real PostgreSQL (issue 17).

For each defining query (joins, outer / semi / anti joins, NOT IN, DISTINCT, set operations, a
window, ORDER BY LIMIT, aggregates under joins and over aggregates, TPC-H Q3/Q4/Q13/Q16/Q17/Q18/
Q22-like queries over a small TPC-H-shaped schema with NULLs), hypothesis draws the sources'
rows "as of pre" and a change (inserts, deletes, updates on a random subset of the sources).
PostgreSQL holds three copies of the sources: schema ``pre``, schema ``d`` (the change: source
columns + ``__pgt_w``) and schema ``post`` (pre ⊎ Δ). The plan of
:func:`pgtrickle.dvm.pipeline.plan_delta` (PostgreSQL dialect) reads ``post.*`` and ``d.*``; a
hidden stream table it reads (``Materialized``) is a table of schema ``m`` holding the node's
value at pre / post, computed by compiling the node itself over ``pre.*`` / ``post.*``. Its
consolidated result must equal ``query(post) − query(pre)`` as PostgreSQL computes it from the
original SQL (results weighted +1 / −1, weights summed per row). A subset runs through the
Spark dialect in the real SparkSession (the same tables JDBC-read into temporary views) and
must give the PostgreSQL plan's Z-set.
"""

from __future__ import annotations

import datetime
import os
from collections import Counter
from decimal import Decimal

import pytest
import sqlglot
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from pgtrickle.db.connection import jdbc_target
from pgtrickle.dvm import ir, materialize
from pgtrickle.dvm.compile import compile_ir
from pgtrickle.dvm.lower import lower
from pgtrickle.dvm.pipeline import DeltaPlan, plan_delta
from pgtrickle.sql.translate import parse_query
from tests.conftest import Database

pytestmark = pytest.mark.integration

# --------------------------------------------------------------------------- schema and data

TABLES: dict[str, dict[str, str]] = {
    "nation": {"n_nationkey": "integer", "n_name": "text"},
    "customer": {
        "c_custkey": "integer",
        "c_name": "text",
        "c_nationkey": "integer",
        "c_mktsegment": "text",
        "c_acctbal": "numeric(8,2)",
        "c_phone": "text",
    },
    "orders": {
        "o_orderkey": "integer",
        "o_custkey": "integer",
        "o_orderdate": "date",
        "o_totalprice": "numeric(10,2)",
        "o_orderpriority": "text",
        "o_comment": "text",
    },
    "lineitem": {
        "l_orderkey": "integer",
        "l_partkey": "integer",
        "l_quantity": "numeric(6,2)",
        "l_extendedprice": "numeric(10,2)",
        "l_discount": "numeric(4,2)",
        "l_commitdate": "date",
        "l_receiptdate": "date",
    },
    "part": {"p_partkey": "integer", "p_brand": "text", "p_size": "integer"},
    "partsupp": {"ps_partkey": "integer", "ps_suppkey": "integer"},
    "supplier": {"s_suppkey": "integer", "s_comment": "text"},
}
SCHEMA = {f"tp.{name}": list(cols) for name, cols in TABLES.items()}
TYPES = {f"tp.{name}": cols for name, cols in TABLES.items()}


def in_schema(sql: str, schema: str) -> str:
    """``sql`` with every source table qualified by ``schema`` (the lowering reads
    ``pg_get_viewdef``'s schema-qualified names; PostgreSQL runs the query on pre.* / post.*)."""
    tree = sqlglot.parse_one(sql, read="postgres")
    for table in tree.find_all(exp.Table):
        if table.name in TABLES and not table.db:
            table.set("db", exp.to_identifier(schema))
    return tree.sql(dialect="postgres")


KEY = st.sampled_from([1, 2, 3, None])
DAY = st.sampled_from(
    [datetime.date(1994, 12, 1), datetime.date(1995, 3, 1), datetime.date(1995, 6, 1), None]
)
MONEY = st.sampled_from([Decimal("0.50"), Decimal("10.00"), Decimal("-2.25"), Decimal("99.99"), None])
QTY = st.sampled_from([Decimal("1"), Decimal("3"), Decimal("7"), None])
ROW = {
    "nation": st.tuples(KEY, st.sampled_from(["FRANCE", "PERU", None])),
    "customer": st.tuples(
        KEY,
        st.sampled_from(["ann", "bob", None]),
        KEY,
        st.sampled_from(["BUILDING", "AUTO", None]),
        MONEY,
        st.sampled_from(["13-555", "31-000", "99-1", None]),
    ),
    "orders": st.tuples(
        KEY,
        KEY,
        DAY,
        MONEY,
        st.sampled_from(["HIGH", "LOW", None]),
        st.sampled_from(["ok", "special requests", None]),
    ),
    "lineitem": st.tuples(
        KEY, KEY, QTY, MONEY, st.sampled_from([Decimal("0.05"), Decimal("0"), None]), DAY, DAY
    ),
    "part": st.tuples(KEY, st.sampled_from(["B23", "B45", None]), st.sampled_from([1, 5, None])),
    "partsupp": st.tuples(KEY, KEY),
    "supplier": st.tuples(KEY, st.sampled_from(["fine", "Complaints here", None])),
}

# --------------------------------------------------------------------------- the queries

QUERIES: dict[str, str] = {
    "join3_agg": "SELECT n.n_name, count(*) AS cnt, sum(o.o_totalprice) AS total FROM customer c"
    " JOIN orders o ON c.c_custkey = o.o_custkey JOIN nation n ON n.n_nationkey = c.c_nationkey"
    " GROUP BY n.n_name",
    "left_join": "SELECT c.c_custkey, c.c_name, o.o_orderkey FROM customer c"
    " LEFT JOIN orders o ON o.o_custkey = c.c_custkey AND o.o_orderpriority = 'HIGH'",
    "exists": "SELECT c_custkey, c_name FROM customer c WHERE EXISTS"
    " (SELECT 1 FROM orders o WHERE o.o_custkey = c.c_custkey)",
    "not_exists": "SELECT c_custkey, c_name FROM customer c WHERE NOT EXISTS"
    " (SELECT 1 FROM orders o WHERE o.o_custkey = c.c_custkey AND o.o_totalprice > 0)",
    "not_in": "SELECT c_custkey, c_name FROM customer WHERE c_nationkey NOT IN"
    " (SELECT n_nationkey FROM nation WHERE n_name <> 'PERU')",
    "distinct": "SELECT DISTINCT c_nationkey, c_mktsegment FROM customer",
    "union": "SELECT c_nationkey AS k FROM customer UNION SELECT n_nationkey FROM nation",
    "intersect": "SELECT o_custkey FROM orders INTERSECT SELECT c_custkey FROM customer",
    "except_all": "SELECT o_custkey FROM orders EXCEPT ALL SELECT c_custkey FROM customer",
    "window": "SELECT o_orderkey, o_custkey, sum(o_totalprice) OVER (PARTITION BY o_custkey) AS cust_total,"
    " rank() OVER (PARTITION BY o_custkey ORDER BY o_totalprice) AS rnk FROM orders",
    "order_limit": "SELECT o_orderkey, o_totalprice FROM orders ORDER BY o_totalprice DESC, o_orderkey LIMIT 3",
    "agg_under_join": "SELECT c.c_custkey, c.c_name, t.total FROM customer c JOIN"
    " (SELECT o_custkey, sum(o_totalprice) AS total FROM orders GROUP BY o_custkey) t"
    " ON t.o_custkey = c.c_custkey",
    "nested_agg": "SELECT cnt, count(*) AS n FROM (SELECT o_custkey, count(*) AS cnt FROM orders"
    " GROUP BY o_custkey) x GROUP BY cnt",
    # Three levels: the per-customer counts kept inside the kept counts of counts, each a state.
    "nested_agg3": "SELECT n, count(*) AS k FROM (SELECT cnt, count(*) AS n FROM (SELECT o_custkey,"
    " count(*) AS cnt FROM orders GROUP BY o_custkey) x GROUP BY cnt) y GROUP BY n",
    "q3": "SELECT l.l_orderkey, sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue, o.o_orderdate"
    " FROM customer c, orders o, lineitem l WHERE c.c_mktsegment = 'BUILDING' AND c.c_custkey = o.o_custkey"
    " AND l.l_orderkey = o.o_orderkey AND o.o_orderdate < date '1995-03-15'"
    " GROUP BY l.l_orderkey, o.o_orderdate ORDER BY revenue DESC, o.o_orderdate, l.l_orderkey LIMIT 5",
    "q4": "SELECT o_orderpriority, count(*) AS order_count FROM orders WHERE o_orderdate >= date '1995-01-01'"
    " AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND l_commitdate < l_receiptdate)"
    " GROUP BY o_orderpriority",
    "q13": "SELECT c_count, count(*) AS custdist FROM (SELECT c_custkey, count(o_orderkey) AS c_count"
    " FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%'"
    " GROUP BY c_custkey) AS c_orders GROUP BY c_count",
    "q16": "SELECT p_brand, p_size, count(DISTINCT ps_suppkey) AS supplier_cnt FROM partsupp, part"
    " WHERE p_partkey = ps_partkey AND p_brand <> 'B45' AND ps_suppkey NOT IN"
    " (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Complaints%') GROUP BY p_brand, p_size",
    "q17": "SELECT sum(l_extendedprice) / 7.0 AS avg_yearly FROM lineitem, part WHERE p_partkey = l_partkey"
    " AND p_brand = 'B23' AND l_quantity < (SELECT 1.2 * avg(l_quantity) FROM lineitem l2"
    " WHERE l2.l_partkey = p_partkey)",
    "q18": "SELECT c.c_name, o.o_orderkey, o.o_totalprice, sum(l.l_quantity) AS qty FROM customer c, orders o,"
    " lineitem l WHERE o.o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey"
    " HAVING sum(l_quantity) > 5) AND c.c_custkey = o.o_custkey AND o.o_orderkey = l.l_orderkey"
    " GROUP BY c.c_name, o.o_orderkey, o.o_totalprice"
    " ORDER BY o.o_totalprice DESC, o.o_orderkey, c.c_name LIMIT 4",
    "q22": "SELECT cntrycode, count(*) AS numcust, sum(c_acctbal) AS totacctbal FROM"
    " (SELECT substring(c_phone from 1 for 2) AS cntrycode, c_acctbal FROM customer"
    " WHERE substring(c_phone from 1 for 2) IN ('13', '31', '23')"
    " AND c_acctbal > (SELECT avg(c_acctbal) FROM customer WHERE c_acctbal > 0.00)"
    " AND NOT EXISTS (SELECT * FROM orders WHERE o_custkey = c_custkey)) AS custsale GROUP BY cntrycode",
}
EXAMPLES = int(os.environ.get("PGT_CHAIN_EXAMPLES", "10"))
"""Examples per query (raise it to hunt for mismatches: ``PGT_CHAIN_EXAMPLES=200``)."""
SPARK_QUERIES = (
    "join3_agg",
    "left_join",
    "not_in",
    "except_all",
    "window",
    "nested_agg",
    "nested_agg3",
    "q3",
    "q13",
    "q22",
)


class At:
    """Resolves a plan's reads to schema-qualified PostgreSQL tables (``post``: ``state``)."""

    def __init__(self, state: str, hidden: dict[ir.Node, int] | None = None) -> None:
        self.state = state
        self.hidden = {} if hidden is None else hidden

    def post(self, scan: ir.Scan) -> tuple[str, str]:
        return (self.state, scan.relation.split(".")[1])

    def delta(self, scan: ir.Scan) -> tuple[str, str]:
        return ("d", scan.relation.split(".")[1])

    def materialized(self, node: ir.Materialized) -> tuple[str, str]:
        number = self.hidden.setdefault(node.node, len(self.hidden))
        return ("m", f"h{number}_{'pre' if node.pre else 'change' if node.change else 'post'}")


class SparkViews(At):
    """The same reads as Spark temporary views ``<schema>_<table>``."""

    def post(self, scan: ir.Scan) -> str:  # type: ignore[override]
        return "_".join(super().post(scan))

    def delta(self, scan: ir.Scan) -> str:  # type: ignore[override]
        return "_".join(super().delta(scan))

    def materialized(self, node: ir.Materialized) -> str:  # type: ignore[override]
        return "_".join(super().materialized(node))


@st.composite
def states(draw: st.DrawFn) -> dict[str, tuple[list[tuple], list[tuple], list[tuple]]]:
    """Per table: (rows as of pre, deleted rows, inserted rows); an update is a delete of a
    pre row and an insert of it with one column redrawn. Some tables do not change."""
    out = {}
    for name, row in ROW.items():
        pre = draw(st.lists(row, max_size=6))
        deleted: list[tuple] = []
        inserted: list[tuple] = []
        if draw(st.booleans()):
            chosen = draw(st.lists(st.sampled_from(range(len(pre))), unique=True)) if pre else []
            for index in chosen:
                deleted.append(pre[index])
                if draw(st.booleans()):  # an update
                    fresh = draw(row)
                    column = draw(st.integers(0, len(pre[index]) - 1))
                    inserted.append(pre[index][:column] + (fresh[column],) + pre[index][column + 1 :])
            inserted += draw(st.lists(row, max_size=3))
        out[name] = (pre, deleted, inserted)
    return out


def load(db: Database, data: dict[str, tuple[list[tuple], list[tuple], list[tuple]]]) -> frozenset[str]:
    """Create schemas pre / d / post (and an empty m) holding the drawn state; the changed tables."""
    db.sql("DROP SCHEMA IF EXISTS pre, d, post, m CASCADE")
    db.sql("CREATE SCHEMA pre; CREATE SCHEMA d; CREATE SCHEMA post; CREATE SCHEMA m")
    changed = set()
    with db.conn.cursor() as cur:
        for name, (pre, deleted, inserted) in data.items():
            cols = ", ".join(f"{c} {t}" for c, t in TABLES[name].items())
            marks = ", ".join(["%s"] * len(TABLES[name]))
            post = list(pre)
            for row in deleted:
                post.remove(row)
            post += inserted
            for schema, rows in (("pre", pre), ("post", post)):
                cur.execute(f"CREATE TABLE {schema}.{name} ({cols})")
                cur.executemany(f"INSERT INTO {schema}.{name} VALUES ({marks})", rows)
            cur.execute(f"CREATE TABLE d.{name} ({cols}, __pgt_w bigint NOT NULL)")
            cur.executemany(f"INSERT INTO d.{name} VALUES ({marks}, -1)", deleted)
            cur.executemany(f"INSERT INTO d.{name} VALUES ({marks}, 1)", inserted)
            if deleted or inserted:
                changed.add(name)
    return frozenset(changed)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def build_hidden(db: Database, result: DeltaPlan, reads: At) -> None:
    """Every hidden table the plans read (the root's and, with ``keep_state``, each kept node's
    change plan), at pre and post: the node compiled over pre.* / post.*; and its change (a
    kept node's change buffer, ``Materialized(change=True)``): post − pre with ``__pgt_w``."""
    plans = [p for p in (result.plan, *result.state_plans) if p is not None]
    nodes = {n.node for p in plans for n in ir.walk(p) if isinstance(n, ir.Materialized)}
    for node in nodes:
        cols = ", ".join(f"c.{_q(n)}" for n in node.columns)
        values = {}
        for pre in (True, False):
            target = reads.materialized(ir.Materialized(node, pre=pre))
            value = compile_ir(node, At("pre" if pre else "post"), dialect="postgres", column_types=TYPES)
            inner = values[pre] = value.consolidated().sql()
            assert db.scalar(f"SELECT count(*) FROM ({inner}) c WHERE c.__pgt_w < 0") == 0
            db.sql(
                f"CREATE TABLE {target[0]}.{target[1]} AS SELECT {cols} FROM ({inner}) c"
                " CROSS JOIN LATERAL generate_series(1, c.__pgt_w)"
            )
        target = reads.materialized(ir.Materialized(node, change=True))
        both = (
            f"SELECT c.*, c.__pgt_w AS __pgt_d FROM ({values[False]}) c"
            f" UNION ALL SELECT c.*, -c.__pgt_w FROM ({values[True]}) c"
        )
        db.sql(
            f"CREATE TABLE {target[0]}.{target[1]} AS SELECT {cols}, sum(c.__pgt_d)::bigint AS __pgt_w"
            f" FROM ({both}) c GROUP BY {cols} HAVING sum(c.__pgt_d) <> 0"
        )


def expected_change(db: Database, sql: str) -> Counter:
    """``query(post) − query(pre)`` by PostgreSQL from the original SQL, as a Z-set."""
    for state in ("pre", "post"):
        db.sql(f"CREATE TABLE m.result_{state} AS {in_schema(sql, state)}")
    width = len(db.conn.execute("SELECT * FROM m.result_pre LIMIT 0").description or [])
    cols = ", ".join(f"c{i}" for i in range(width))
    rows = db.sql(
        f"SELECT {cols}, sum(w)::bigint FROM (SELECT r.*, 1 FROM m.result_post r UNION ALL"
        f" SELECT r.*, -1 FROM m.result_pre r) z({cols}, w) GROUP BY {cols} HAVING sum(w) <> 0"
    )
    return Counter({tuple(r[:width]): r[-1] for r in rows})


def plan_change(db: Database, result: DeltaPlan) -> Counter:
    if result.compiled is None:
        return Counter()
    return Counter({tuple(r[:-1]): r[-1] for r in db.sql(result.compiled.sql())})


def run_chain(db: Database, name: str, data: dict) -> tuple[DeltaPlan, Counter, frozenset[str]]:  # type: ignore[type-arg]
    changed = load(db, data)
    reads = At("post")
    result = plan_delta(
        in_schema(QUERIES[name], "tp"), SCHEMA, TYPES, {f"tp.{t}" for t in changed}, "postgres", reads=reads
    )
    if result.plan is not None:
        build_hidden(db, result, reads)
    got = plan_change(db, result)
    expected = expected_change(db, QUERIES[name])
    assert got == expected, (
        f"{name}: plan {dict(got)} != PostgreSQL {dict(expected)}\n"
        f"data {data}\n{result.compiled.sql(pretty=True) if result.compiled else '(no plan)'}"
    )
    return result, got, changed


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_delta_plan_equals_postgres_difference(db: Database, name: str) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=states())
    def check(data: dict) -> None:  # type: ignore[type-arg]
        run_chain(db, name, data)

    check()


@pytest.mark.parametrize("name", SPARK_QUERIES)
def test_spark_dialect_agrees_with_postgres(db: Database, spark, name: str) -> None:  # type: ignore[no-untyped-def]
    target = jdbc_target(db.dsn)

    @settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=states())
    def check(data: dict) -> None:  # type: ignore[type-arg]
        result, on_postgres, changed = run_chain(db, name, data)
        assume(result.plan is not None)
        # a fresh lowering: hidden tables are numbered in the compiler's (deterministic) read order
        views = SparkViews("post")
        on_spark_plan = plan_delta(
            in_schema(QUERIES[name], "tp"), SCHEMA, TYPES, {f"tp.{t}" for t in changed}, "spark", reads=views
        )
        tables = [("pre", t) for t in TABLES] + [("post", t) for t in TABLES] + [("d", t) for t in TABLES]
        tables += [("m", r[0]) for r in db.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'm'")]
        for schema, table in tables:
            (
                spark.read.format("jdbc")
                .options(**target.options())
                .option("dbtable", f"{schema}.{table}")
                .load()
                .createOrReplaceTempView(f"{schema}_{table}")
            )
        assert on_spark_plan.compiled is not None
        from pgtrickle.spark.numeric import ensure_functions

        ensure_functions(
            spark, on_spark_plan.compiled.sql()
        )  # numeric quotients call pgtrickle's row function
        rows = spark.sql(on_spark_plan.compiled.sql()).collect()
        on_spark = Counter({tuple(r[:-1]): r[-1] for r in rows})
        assert on_spark == on_postgres, on_spark_plan.compiled.sql(pretty=True)
        compared.append(len(on_spark))

    compared: list[int] = []
    check()
    assert compared, "no example had a change under the query"


KEPT_QUERIES = tuple(
    name
    for name in sorted(QUERIES)
    if materialize.decide(lower(parse_query(in_schema(QUERIES[name], "tp")), SCHEMA))
)


def node_value(db: Database, node: ir.Node, state: str) -> Counter:
    value = compile_ir(node, At(state), dialect="postgres", column_types=TYPES).consolidated().sql()
    return Counter({tuple(r[:-1]): r[-1] for r in db.sql(value)})


@pytest.mark.parametrize("name", KEPT_QUERIES)
def test_kept_state_plan_reads_hidden_tables_as_stored(db: Database, name: str) -> None:
    """With hidden state tables (``keep_state``) the plan reads each as stored (at pre) and says
    what to apply to it: the node's own change; the root's change is still query(post) − query(pre)."""

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=states())
    def check(data: dict) -> None:  # type: ignore[type-arg]
        changed = load(db, data)
        reads = At("post")
        result = plan_delta(
            in_schema(QUERIES[name], "tp"),
            SCHEMA,
            TYPES,
            {f"tp.{t}" for t in changed},
            "postgres",
            reads=reads,
            keep_state=True,
        )
        assert result.full_refresh_reason is None
        assert {node for node, _ in result.state_changes} == set(result.materialized)
        if result.plan is not None:
            assert not any(
                isinstance(n, ir.Materialized) and not n.pre and not n.change for n in ir.walk(result.plan)
            )
            build_hidden(db, result, reads)
        assert plan_change(db, result) == expected_change(db, QUERIES[name])
        for node, change in result.state_changes:
            got = (
                Counter() if change is None else Counter({tuple(r[:-1]): r[-1] for r in db.sql(change.sql())})
            )
            post, pre = node_value(db, node, "post"), node_value(db, node, "pre")
            post.subtract(pre)
            assert got == Counter({k: v for k, v in post.items() if v}), name

    check()
