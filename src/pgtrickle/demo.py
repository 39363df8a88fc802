"""``pgtrickle demo``: the seeds' orders example, end to end.

Creates schema ``pgtrickle_demo`` with ``orders`` and ``order_lines``, three
stream tables (``order_summary`` and ``line_summary`` over the tables,
``order_report`` over those two), then runs rounds of writes followed by a
scheduler tick, checking every stream table against its defining query.
"""

from __future__ import annotations

import random
import time

from rich.console import Console
from rich.table import Table

from pgtrickle.catalog.install import install
from pgtrickle.config import Settings
from pgtrickle.daemon.loop import Scheduler
from pgtrickle.db.connection import connect, redact
from pgtrickle.refresh.verify import verify

SCHEMA = "pgtrickle_demo"
STREAM_TABLES = {
    f"{SCHEMA}.order_summary": f"SELECT customer, count(*) AS orders, sum(amount) AS total "
    f"FROM {SCHEMA}.orders GROUP BY customer",
    f"{SCHEMA}.line_summary": f"SELECT o.customer, sum(l.qty) AS total_qty, count(DISTINCT l.product) AS products "
    f"FROM {SCHEMA}.order_lines l JOIN {SCHEMA}.orders o ON o.id = l.order_id GROUP BY o.customer",
    f"{SCHEMA}.order_report": f"SELECT os.customer, os.orders, os.total, ls.total_qty, ls.products "
    f"FROM {SCHEMA}.order_summary os JOIN {SCHEMA}.line_summary ls ON ls.customer = os.customer",
}
CUSTOMERS = [f"customer_{i:02d}" for i in range(20)]
PRODUCTS = ["apple", "bread", "cheese", "dates", "eggs", "flour", "grapes", "honey"]


def _setup(conn, console: Console, orders: int) -> None:
    for name in reversed(list(STREAM_TABLES)):
        if conn.execute(
            "SELECT 1 FROM pgtrickle.pgt_stream_tables WHERE pgt_schema || '.' || pgt_name = %s", (name,)
        ).fetchone():
            conn.execute("SELECT pgtrickle.drop_stream_table(%s, cascade => true)", (name,))
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}")
    conn.execute(
        f"CREATE TABLE {SCHEMA}.orders (id int PRIMARY KEY, customer text NOT NULL, "
        "amount numeric(12,2) NOT NULL)"
    )
    conn.execute(
        f"CREATE TABLE {SCHEMA}.order_lines (order_id int NOT NULL, product text NOT NULL, qty int NOT NULL)"
    )
    conn.execute(
        f"INSERT INTO {SCHEMA}.orders SELECT g, 'customer_' || lpad((g %% 20)::text, 2, '0'), "
        "round((10 + (g * 7919) %% 490)::numeric, 2) FROM generate_series(1, %s) g",
        (orders,),
    )
    conn.execute(
        f"INSERT INTO {SCHEMA}.order_lines SELECT o.id, (ARRAY{PRODUCTS!r})[1 + (o.id * k) % 8], 1 + (o.id + k) % 5 "
        f"FROM {SCHEMA}.orders o, generate_series(1, 3) k"
    )
    console.print(f"  loaded {orders:,} orders and {orders * 3:,} order lines")


def _write_round(conn, rng: random.Random, next_id: int) -> tuple[int, str]:
    new = rng.randint(50, 150)
    for i in range(new):
        oid = next_id + i
        conn.execute(
            f"INSERT INTO {SCHEMA}.orders VALUES (%s, %s, %s)",
            (oid, rng.choice(CUSTOMERS), round(rng.uniform(5, 500), 2)),
        )
        conn.execute(
            f"INSERT INTO {SCHEMA}.order_lines VALUES (%s, %s, %s)",
            (oid, rng.choice(PRODUCTS), rng.randint(1, 5)),
        )
    updated = conn.execute(
        f"UPDATE {SCHEMA}.orders SET amount = amount + 1 WHERE id %% 97 = %s", (rng.randint(0, 96),)
    ).rowcount
    deleted = conn.execute(
        f"DELETE FROM {SCHEMA}.order_lines WHERE order_id %% 211 = %s", (rng.randint(0, 210),)
    ).rowcount
    return next_id + new, f"+{new} orders/lines, {updated} orders updated, {deleted} lines deleted"


def _show_report(conn, console: Console) -> None:
    rows = conn.execute(
        f"SELECT customer, orders, total, total_qty, products FROM {SCHEMA}.order_report "
        "ORDER BY total DESC LIMIT 5"
    ).fetchall()
    table = Table("customer", "orders", "total", "items", "products", title="order_report (top 5 by total)")
    for r in rows:
        table.add_row(r[0], f"{r[1]:,}", f"{r[2]:,.2f}", f"{r[3]:,}", str(r[4]))
    console.print(table)


def _check(conn, console: Console) -> bool:
    ok = True
    for name in STREAM_TABLES:
        result = verify(conn, name)
        mark = "[green]✓[/]" if result.ok else "[red]✗[/]"
        console.print(
            f"  {mark} {name} equals its defining query"
            + ("" if result.ok else f" — {result.missing} missing, {result.extra} extra rows")
        )
        ok = ok and result.ok
    return ok


def run_demo(settings: Settings, dsn: str, console: Console, rounds: int = 3, orders: int = 10_000) -> bool:
    """Run the demo; returns whether every check passed."""
    rng = random.Random(42)
    console.rule("[bold]pgtrickle demo")
    console.print(f"database: {redact(dsn)}   Spark master: {settings.spark_master}")
    with connect(dsn) as conn:
        result = install(conn)
        console.print(f"1. installed pgtrickle catalog v{result.current_version}")
        console.print("2. creating source tables")
        _setup(conn, console, orders)
        console.print("3. creating stream tables")
        for name, query in STREAM_TABLES.items():
            conn.execute("SELECT pgtrickle.create_stream_table(%s, %s, schedule => '2s')", (name, query))
            console.print(f"  {name}: {query}", highlight=False)

        scheduler = Scheduler(settings, dsn)
        try:
            console.print("4. first scheduler tick: initial population, in dependency order")
            with console.status("starting Spark (a local SparkSession takes ~5 s the first time)…"):
                t = time.monotonic()
                from pgtrickle.spark.session import get_spark

                get_spark(settings)
            console.print(f"  Spark started in {time.monotonic() - t:.1f}s")
            all_ok = _tick(scheduler, console)
            all_ok = _check(conn, console) and all_ok
            _show_report(conn, console)
            next_id = orders + 1
            for i in range(1, rounds + 1):
                next_id, what = _write_round(conn, rng, next_id)
                console.rule(f"round {i}: {what}")
                time.sleep(2.1)  # let the 2s schedules come due
                all_ok = _tick(scheduler, console) and all_ok
                all_ok = _check(conn, console) and all_ok
            _show_report(conn, console)
            console.print("5. an idle tick: no pending changes, so no Spark job runs")
            time.sleep(2.1)
            _tick(scheduler, console)
        finally:
            scheduler.close()
        console.rule("[bold green]demo finished" if all_ok else "[bold red]demo found differences")
        console.print(
            'Try: pgtrickle status   ·   psql "$(pgtrickle db dsn)" -c '
            f"'SELECT * FROM {SCHEMA}.order_report'"
        )
        return all_ok


def _tick(scheduler: Scheduler, console: Console) -> bool:
    started = time.monotonic()
    with console.status("scheduler tick…") as status:
        scheduler.progress = lambda msg: status.update(msg)
        scheduler.refresher.progress = scheduler.progress
        report = scheduler.tick()
    for o in report.refreshed:
        spark = f", Spark {o.spark_seconds:.2f}s" if o.spark_seconds else ", no Spark job"
        console.print(
            f"  {o.st.display}: {o.action.value} ({o.reason}) +{o.rows_inserted:,} "
            f"-{o.rows_deleted:,} rows in {o.seconds:.2f}s{spark}",
            highlight=False,
        )
    for st, error in report.failed:
        console.print(f"  [red]{st.display} failed:[/] {error}", highlight=False)
    console.print(f"  tick took {time.monotonic() - started:.2f}s")
    return not report.failed
