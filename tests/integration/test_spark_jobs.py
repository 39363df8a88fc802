"""The Spark jobs of every refresh, counted per refresh into the history (spark/jobs.py), against a
real PostgreSQL and a real SparkSession; and the operator tree of ``pgtrickle explain``."""

from __future__ import annotations

import json
import threading

import pytest
from typer.testing import CliRunner

from pgtrickle.catalog.store import load_stream_tables
from pgtrickle.cli.main import app
from pgtrickle.dvm import materialize
from pgtrickle.refresh.engine import Refresher
from pgtrickle.refresh.plan import Action
from pgtrickle.spark import jobs
from pgtrickle.spark.capabilities import tag_jobs
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh_and_check

pytestmark = pytest.mark.integration

runner = CliRunner(env={"COLUMNS": "250"})


def history(db: Database, name: str) -> list[dict]:
    cur = db.conn.execute("SELECT * FROM pgtrickle.get_refresh_history(%s, 50)", (name,))
    names = [c.name for c in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.fixture
def orders(db: Database) -> Database:
    db.sql("CREATE TABLE customers (id int PRIMARY KEY, region text)")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric(10,2))")
    db.sql("INSERT INTO customers SELECT g, 'r' || (g % 4) FROM generate_series(1, 40) g")
    db.sql("INSERT INTO orders SELECT g, 1 + g % 40, g * 1.5 FROM generate_series(1, 400) g")
    return db


def _check_figures(row: dict) -> None:
    assert row["spark_jobs"] >= 1, row
    assert row["spark_stages"] >= 1, row
    if row["spark_jobs"] > 1:  # a refresh that ran more than one job says why
        assert row["spark_jobs_why"].startswith(f"{row['spark_jobs']} jobs: "), row
    else:
        assert row["spark_jobs_why"] is None, row


@pytest.mark.usefixtures("spark")
def test_full_differential_and_no_change_refreshes_record_their_spark_jobs(orders: Database) -> None:
    db = orders
    create_st(
        db,
        "per_region",
        "SELECT c.region, sum(o.amount) AS total, count(*) AS n"
        " FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.region",
    )
    [initial] = refresh_and_check(db, "per_region")
    assert initial.action is Action.FULL and initial.spark_jobs is not None and initial.spark_jobs >= 1
    db.sql("INSERT INTO orders VALUES (1001, 3, 10), (1002, 7, 20)")
    db.sql("DELETE FROM orders WHERE id = 5")
    [diff] = refresh_and_check(db, "per_region")
    assert diff.action is Action.DIFFERENTIAL and diff.spark_jobs is not None and diff.spark_jobs >= 1
    [nothing] = refresh_and_check(db, "per_region")  # no change: no Spark job at all
    assert nothing.action is Action.NO_DATA and nothing.spark_jobs == 0
    rows = history(db, "per_region")
    assert [r["action"] for r in rows] == ["NO_DATA", "DIFFERENTIAL", "FULL"]
    no_data, differential, full = rows
    _check_figures(full)
    _check_figures(differential)
    # The 40 customers are read once: shuffled with the change, not broadcast (a job of its own).
    assert differential["spark_jobs"] == 1, differential
    assert (full["spark_jobs"], differential["spark_jobs"]) == (initial.spark_jobs, diff.spark_jobs)
    assert (no_data["spark_jobs"], no_data["spark_stages"], no_data["spark_jobs_why"]) == (0, 0, None)
    # pgtrickle history shows them, in text and JSON
    result = runner.invoke(app, ["--dsn", db.dsn, "history", "per_region"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "jobs" in result.output and "NO_DATA" in result.output and "DIFFERENTIAL" in result.output
    result = runner.invoke(
        app, ["--dsn", db.dsn, "history", "--json", "-n", "2", "per_region"], catch_exceptions=False
    )
    doc = json.loads(result.stdout)
    assert doc["name"] == "public.per_region" and len(doc["refreshes"]) == 2
    assert [(r["action"], r["spark_jobs"]) for r in doc["refreshes"]] == [
        ("NO_DATA", 0),
        ("DIFFERENTIAL", diff.spark_jobs),
    ]
    result = runner.invoke(app, ["--dsn", db.dsn, "history", "-n", "0", "per_region"])
    assert result.exit_code == 1 and "max_rows must be between 1 and 1000000" in result.output


PAIRS = (
    "SELECT c.region, r.region AS referrer, sum(o.amount) AS total, count(*) AS n"
    " FROM orders o JOIN customers c ON c.id = o.customer"
    " JOIN customers r ON r.id = 1 + (o.customer * 7) % 40 GROUP BY c.region, r.region"
)
"""customers joined twice (as the buyer and as a referrer): a change of orders meets it at two joins."""


@pytest.mark.usefixtures("spark")
def test_a_small_table_the_plan_reads_twice_is_broadcast_in_a_job_of_its_own(orders: Database) -> None:
    # Spark broadcasts customers (jobs it runs first, named so) instead of two shuffles of both
    # sides - the hint reaches the joins through the plan's CTEs (dvm/compile.py reads it inline).
    db = orders
    create_st(db, "per_region_pair", PAIRS)
    refresh_and_check(db, "per_region_pair")
    db.sql("INSERT INTO orders VALUES (1001, 3, 10), (1002, 7, 20)")
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id = 9")
    [diff] = refresh_and_check(db, "per_region_pair")
    assert diff.action is Action.DIFFERENTIAL, diff
    [differential, _full] = history(db, "per_region_pair")
    # one broadcast per join (the two reads differ), started side by side before the plan's job
    assert differential["spark_jobs"] == 3, differential
    assert differential["spark_jobs_why"].startswith(f"3 jobs: 2x {jobs.BROADCAST_SITE}, 1x collect at"), (
        differential
    )


@pytest.mark.usefixtures("spark")
def test_a_failed_refresh_records_the_jobs_it_ran(orders: Database) -> None:
    db = orders
    create_st(db, "ratio", "SELECT o.id, 100 / (o.id - 5000) AS r FROM orders o", refresh_mode="FULL")
    refresh_and_check(db, "ratio")
    db.sql("INSERT INTO orders VALUES (5000, 1, 3)")  # division by zero on Spark (ANSI mode)
    with pytest.raises(Exception):  # noqa: B017,PT011 - the error type is the refresh path's own business
        refresh_and_check(db, "ratio")
    failed = history(db, "ratio")[0]
    assert failed["status"] == "FAILED"
    assert failed["spark_jobs"] is not None and failed["spark_jobs"] >= 1
    db.sql("DELETE FROM orders WHERE id = 5000")
    refresh_and_check(db, "ratio")


def test_refreshes_in_parallel_threads_count_only_their_own_jobs(spark) -> None:  # type: ignore[no-untyped-def]
    """Two threads start together (a barrier) and run 3 and 1 jobs inside their own counts."""
    barrier = threading.Barrier(2, timeout=120)
    counted: dict[str, jobs.JobFigures] = {}

    def run(name: str, n: int) -> None:
        with jobs.counting(f"pgtrickle-test-{name}", name):
            tag_jobs(spark, "pgtrickle-test", name)
            barrier.wait()
            for _ in range(n):
                spark.range(20000, numPartitions=2).where("id % 1000 = 0").collect()  # no shuffle: 1 job
            counted[name] = jobs.figures()

    threads = [threading.Thread(target=run, args=(name, n)) for name, n in (("a", 3), ("b", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One job per action here (no shuffle): each thread counted exactly its own.
    assert (counted["a"].jobs, counted["b"].jobs) == (3, 1), counted
    # The call site in the description may be PySpark's own ("collectToPython at <unknown>:0"):
    # PySpark keeps one process-wide depth counter for call sites (SCCallSiteSync), so a thread's
    # action that starts while another thread's runs goes without its Python call site.
    assert counted["a"].why is not None and counted["a"].why.startswith("3 jobs: "), counted["a"].why
    assert counted["b"].why is None and counted["b"].stages == 1
    assert jobs.figures() == jobs.NOT_COUNTED  # outside a count


@pytest.mark.usefixtures("spark")
def test_two_refreshers_in_parallel_threads_record_their_own_counts(orders: Database) -> None:
    db = orders
    db.sql("CREATE TABLE other (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO other SELECT g, g % 7 FROM generate_series(1, 200) g")
    create_st(db, "big_orders", "SELECT id, amount FROM orders WHERE amount > 100", refresh_mode="FULL")
    create_st(db, "odd_other", "SELECT id, v FROM other WHERE v % 2 = 1", refresh_mode="FULL")
    # Alone first: what each refresh runs.
    refresh_and_check(db, "big_orders", "odd_other")
    alone = {name: history(db, name)[0]["spark_jobs"] for name in ("big_orders", "odd_other")}
    sts = {st.name: st for st in load_stream_tables(db.conn).values()}
    barrier = threading.Barrier(2, timeout=120)
    outcomes = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        refresher = Refresher(db.settings, db.dsn)
        try:
            fresh = load_stream_tables(refresher.conn, only=sts[name].pgt_id)[sts[name].pgt_id]
            barrier.wait()
            outcomes[name] = refresher.refresh(fresh, "MANUAL", force=True)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            refresher.close()

    db.sql("UPDATE pgtrickle.pgt_stream_tables SET needs_reinit = true")  # both recompute (FULL)
    threads = [threading.Thread(target=run, args=(name,)) for name in alone]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert_oracle(db, "big_orders", "odd_other")
    for name, jobs_alone in alone.items():
        row = history(db, name)[0]
        assert row["status"] == "COMPLETED" and row["action"] == "FULL"
        assert row["spark_jobs"] == jobs_alone == outcomes[name].spark_jobs, (name, row, alone)


@pytest.mark.usefixtures("spark")
def test_each_member_of_an_atomic_group_records_its_own_jobs(db: Database) -> None:
    """A diamond refreshes as one group; each member's history row counts the jobs of its own part."""
    db.sql("CREATE TABLE sales (id bigint PRIMARY KEY, region text NOT NULL, amount int NOT NULL)")
    db.sql("INSERT INTO sales SELECT g, 'r' || (g % 4), g FROM generate_series(1, 200) g")
    create_st(db, "by_region", "SELECT region, sum(amount) AS total FROM sales GROUP BY region")
    create_st(db, "by_region_n", "SELECT region, count(*) AS n FROM sales GROUP BY region")
    create_st(
        db, "report", "SELECT a.region, a.total, b.n FROM by_region a JOIN by_region_n b USING (region)"
    )
    refresh_and_check(db)
    db.sql("INSERT INTO sales VALUES (1001, 'r1', 5), (1002, 'r9', 7)")
    outcomes = refresh_and_check(db, "report")  # the whole group runs
    assert len(outcomes) == 3
    for name in ("by_region", "by_region_n", "report"):
        row = history(db, name)[0]
        assert row["status"] == "COMPLETED", row
        _check_figures(row)
    assert "atomic group" in history(db, "report")[0]["mode_reason"]
    assert {o.st.name: o.spark_jobs for o in outcomes} == {
        name: history(db, name)[0]["spark_jobs"] for name in ("by_region", "by_region_n", "report")
    }


# ------------------------------------------------------------------------------------------ explain


def explain(db: Database, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--dsn", db.dsn, "explain", *args], catch_exceptions=False)


def explain_json(db: Database, name: str) -> dict:
    result = explain(db, "--json", name)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def walk(node: dict) -> list[dict]:
    return [node] + [n for child in node["inputs"] for n in walk(child)]


def test_explain_shows_the_operator_tree_of_a_join_under_an_aggregate(orders: Database) -> None:
    db = orders
    create_st(
        db,
        "per_region",
        "SELECT c.region, sum(o.amount) AS total"
        " FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.region",
    )
    result = explain(db, "per_region")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "operator tree:" in text
    lines = text[text.index("operator tree:") :].splitlines()[1:]
    assert lines[0].startswith("  Project ") and "[delta: linear]" in lines[0]
    assert lines[1].startswith("    Aggregate group by ") and "touched groups" in lines[1]
    assert any(
        line.startswith("      Join INNER on ") and "telescoping join: 2 terms" in line for line in lines
    )
    assert any("Scan public.orders" in line and "change buffer" in line for line in lines)
    assert "materialized" not in text and "Traceback" not in text
    doc = explain_json(db, "per_region")
    tree = doc["operator_tree"]
    assert tree["error"] is None and tree["full_refresh_reason"] is None
    root = tree["root"]
    assert (
        root["operator"] == "Project" and root["rule"] == "linear" and root["columns"] == ["region", "total"]
    )
    operators = [n["operator"] for n in walk(root)]
    assert operators[:3] == ["Project", "Aggregate", "Join"] and operators.count("Scan") == 2
    assert all(n["materialized"] is None and n["shared"] is False for n in walk(root))
    assert doc["effective_mode"] == "DIFFERENTIAL"


def test_explain_left_join(orders: Database) -> None:
    db = orders
    create_st(
        db,
        "with_orders",
        "SELECT c.id, c.region, o.amount FROM customers c LEFT JOIN orders o ON o.customer = c.id",
    )
    result = explain(db, "with_orders")
    assert result.exit_code == 0, result.output
    join = next(line for line in result.output.splitlines() if "Join LEFT" in line)
    assert "outer join" in join
    doc = explain_json(db, "with_orders")
    [node] = [n for n in walk(doc["operator_tree"]["root"]) if n["operator"] == "Join"]
    assert node["facts"].startswith("Join LEFT on ") and node["rule"].startswith("outer join")
    assert len(node["inputs"]) == 2


def test_explain_names_a_kept_node_and_its_hidden_state_table(orders: Database) -> None:
    db = orders
    create_st(
        db,
        "spread",
        "SELECT x.n, count(*) AS customers FROM"
        " (SELECT customer, count(*) AS n FROM orders GROUP BY customer) x GROUP BY x.n",
        refresh_mode="DIFFERENTIAL",
    )
    before = explain(db, "spread")
    assert before.exit_code == 0, before.output
    assert "(not made yet: the next refresh makes and fills it): Aggregate" in before.output
    refresh_and_check(db, "spread")
    # The inner count per customer, and the root's count per count as its state (the stream
    # table stores no root state when the query keeps nodes).
    tables = dict(db.sql("SELECT reason, relid::regclass::text FROM pgtrickle.pgt_state_tables"))
    reasons = [materialize.AGGREGATE_OF_AGGREGATE, materialize.ROOT_STATE]
    assert sorted(tables) == sorted(reasons)
    result = explain(db, "spread")
    assert result.exit_code == 0, result.output
    hidden = [line for line in result.output.splitlines() if "materialized:" in line]
    assert len(hidden) == 2
    for reason in reasons:
        assert any(f"materialized: {reason}" in line for line in hidden), hidden
        assert f"{tables[reason]}: Aggregate, {reason}" in result.output
    assert "runs FULL for now" not in result.output
    doc = explain_json(db, "spread")
    assert doc["effective_mode"] == "DIFFERENTIAL"
    nodes = walk(doc["operator_tree"]["root"])
    kept = [n for n in nodes if n["materialized"] is not None]
    assert [(n["operator"], n["materialized"]) for n in kept] == [
        ("Aggregate", materialize.ROOT_STATE),
        ("Aggregate", materialize.AGGREGATE_OF_AGGREGATE),
    ]
    assert doc["operator_tree"]["full_refresh_reason"] is None
    assert doc["operator_tree"]["state_tables"] == [
        {"position": 0, "table": tables[reasons[0]], "operator": "Aggregate", "reason": reasons[0]},
        {"position": 1, "table": tables[reasons[1]], "operator": "Aggregate", "reason": reasons[1]},
    ]


def test_explain_of_a_query_without_a_delta_rule_says_why(orders: Database) -> None:
    db = orders
    create_st(db, "sampled", "SELECT id, random() AS r FROM orders", refresh_mode="FULL")
    result = explain(db, "sampled")
    assert result.exit_code == 0, result.output
    assert "no operator tree:" in result.output and "Traceback" not in result.output
    doc = explain_json(db, "sampled")
    tree = doc["operator_tree"]
    assert tree["root"] is None and tree["error"]["type"] == "NoDeltaRuleError"
    assert tree["error"]["construct"] and tree["error"]["construct"] in tree["error"]["message"]
    assert tree["error"]["construct"] in result.output
