"""Watermark gating end to end: advance_watermark, groups, gate and hold_back, the seed's §1 and §8 scenarios.

Every refreshed stream table is checked with the two-way EXCEPT ALL oracle:
against its defining query when it reflects the sources as they are, and
for a held-back one against its defining query evaluated over copies of the
sources taken right when the watermark it is held back to was advanced.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgtrickle.catalog.store import load_stream_tables
from pgtrickle.errors import PgTrickleError
from pgtrickle.gates import watermark_gate
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, catalog_fingerprint, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

NOON = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def t(minutes: float) -> datetime:
    return NOON + timedelta(minutes=minutes)


def actions(outcomes) -> dict[str, Action]:  # type: ignore[no-untyped-def]
    return {o.st.name: o.action for o in outcomes}


def reasons(outcomes) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {o.st.name: o.reason for o in outcomes}


def load(
    db: Database, statements: list[str], source: str | None = None, watermark: datetime | None = None
) -> None:
    """One loader transaction: the statements, then advance_watermark (committed together)."""
    with psycopg.connect(db.dsn) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
        if source is not None:
            conn.execute("SELECT pgtrickle.advance_watermark(%s, %s)", (source, watermark))


def add_orders(first: int, last: int, minute: float) -> str:
    return (
        f"INSERT INTO orders SELECT g, 'c' || (g % 5), g, TIMESTAMPTZ '{t(minute).isoformat()}' "
        f"FROM generate_series({first}, {last}) g"
    )


def add_lines(first: int, last: int) -> str:
    return (
        f"INSERT INTO order_lines SELECT g, 'p' || (g % 3), 1 + g % 4 FROM generate_series({first}, {last}) g"
    )


def copy_table(db: Database, table: str, name: str) -> None:
    db.sql(f"DROP TABLE IF EXISTS {name}")
    db.sql(f"CREATE TABLE {name} AS SELECT * FROM {table}")


def assert_equals_query(db: Database, st_name: str, query: str) -> None:
    """Two-way EXCEPT ALL between a stream table (visible columns) and any query."""
    cols = [
        r[0]
        for r in db.sql(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
            " AND attname NOT LIKE '\\_\\_pgt\\_%%' ORDER BY attnum",
            (st_name,),
        )
    ]
    col_list = ", ".join(f'"{c}"' for c in cols)
    st_rows = f"SELECT {col_list} FROM {st_name}"
    missing = db.scalar(f"SELECT count(*) FROM (({query}) EXCEPT ALL {st_rows}) d")
    extra = db.scalar(f"SELECT count(*) FROM ({st_rows} EXCEPT ALL ({query})) d")
    assert (missing, extra) == (0, 0), f"{st_name}: {missing} rows missing, {extra} rows extra vs {query}"


def info(db: Database, name: str) -> tuple:
    return db.sql(
        "SELECT watermark_gating, watermark_gating_origin, effective_watermark, watermark_groups "
        "FROM pgtrickle.stream_tables_info WHERE table_name = %s",
        (name,),
    )[0]


def alerts(listener: psycopg.Connection) -> list[dict]:
    return [json.loads(n.payload) for n in listener.notifies(timeout=1)]


ORDER_SUMMARY = "SELECT id, customer, amount FROM orders WHERE amount > 0"
LINE_SUMMARY = "SELECT order_id, sum(qty) AS qty, count(*) AS lines FROM order_lines GROUP BY order_id"
ORDER_REPORT = (
    "SELECT os.customer, count(*) AS orders, sum(ls.qty) AS qty, count(ls.order_id) AS with_lines "
    "FROM order_summary os LEFT JOIN line_summary ls ON ls.order_id = os.id GROUP BY os.customer"
)


@pytest.fixture
def shop(db: Database) -> Database:
    """The seed's §1 pipeline, loaded and aligned at 11:55."""
    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2), placed_at timestamptz)"
    )
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("SELECT pgtrickle.create_watermark_group('order_pipeline', ARRAY['orders', 'order_lines'])")
    load(db, [add_orders(1, 100, -10)], "orders", t(-5))
    load(db, [add_lines(1, 100)], "order_lines", t(-5))
    create_st(db, "order_summary", ORDER_SUMMARY, schedule="1h")
    create_st(db, "line_summary", LINE_SUMMARY, schedule="1h")
    create_st(db, "order_report", ORDER_REPORT, schedule="1h")
    refresh(db)
    assert_oracle(db)
    return db


# ------------------------------------------------------------- advance_watermark


def test_advance_watermark_monotonic_idempotent_and_recorded(shop: Database) -> None:
    with psycopg.connect(shop.dsn, autocommit=True) as conn:
        conn.execute("SET application_name = 'orders-loader'")
        conn.execute("SELECT pgtrickle.advance_watermark('orders', %s)", (t(5),))
        conn.execute("SELECT pgtrickle.advance_watermark('public.orders'::regclass, %s)", (t(5),))  # no-op
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            conn.execute("SELECT pgtrickle.advance_watermark('orders', %s)", (t(0),))
    message = str(err.value)
    assert "cannot go backwards" in message and "12:00:00" in message and "12:05:00" in message
    rows = shop.sql(
        "SELECT watermark, advanced_by, application_name, advancements FROM pgtrickle.watermarks() "
        "WHERE source = 'public.orders'"
    )
    assert rows == [(t(5), "postgres", "orders-loader", 2)]
    history = shop.sql(
        "SELECT watermark, previous_watermark, xid IS NOT NULL, snapshot IS NOT NULL "
        "FROM pgtrickle.watermark_history('orders')"
    )
    assert history == [(t(5), t(-5), True, True), (t(-5), None, True, True)]


def test_watermark_transactional_commit_and_rollback(shop: Database) -> None:
    listener = psycopg.connect(shop.dsn, autocommit=True)
    listener.execute("LISTEN pgtrickle_refresh")
    loader = psycopg.connect(shop.dsn)
    loader.execute(add_orders(101, 110, 0))
    loader.execute("SELECT pgtrickle.advance_watermark('orders', %s)", (t(5),))
    assert shop.scalar("SELECT watermark FROM pgtrickle.watermarks() WHERE source = 'public.orders'") == t(
        -5
    ), "not visible before the load commits"
    assert not list(listener.notifies(timeout=0.3)), "no wake-up before commit"
    loader.rollback()
    assert shop.scalar("SELECT watermark FROM pgtrickle.watermarks() WHERE source = 'public.orders'") == t(-5)
    assert shop.scalar("SELECT count(*) FROM pgtrickle.watermark_history('orders')") == 1
    assert shop.scalar("SELECT state FROM pgtrickle.watermark_status()") == "aligned"
    loader.execute(add_orders(101, 110, 0))
    loader.execute("SELECT pgtrickle.advance_watermark('orders', %s)", (t(5),))
    loader.commit()
    assert shop.scalar("SELECT watermark FROM pgtrickle.watermarks() WHERE source = 'public.orders'") == t(5)
    assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["watermark"]
    loader.close()
    listener.close()


# ------------------------------------------------------------------- §1 and gate


def test_seed_scenario_order_report_gated_until_lines_catch_up(shop: Database) -> None:
    assert info(shop, "order_report")[:3] == ("gate", "inferred", t(-5))
    assert info(shop, "order_summary")[:2] == ("none", "inferred")
    copy_table(shop, "order_report", "report_aligned")
    # 12:10: orders loaded to 12:05, order lines still at 11:55.
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes) == {
        "order_summary": Action.FULL,
        "line_summary": Action.NO_DATA,
        "order_report": Action.SKIP,
    }
    assert "order_pipeline is misaligned" in reasons(outcomes)["order_report"]
    assert_oracle(shop, "order_summary", "line_summary")
    assert_equals_query(shop, "order_report", "SELECT customer, orders, qty, with_lines FROM report_aligned")
    assert not assert_fails_oracle(shop, "order_report"), "the live query already differs"
    history = shop.sql("SELECT action, skip_reason FROM pgtrickle.get_refresh_history('order_report', 1)")
    assert history[0][0] == "SKIP" and "lag 00:10:00 > tolerance 00:00:00" in history[0][1]
    status = shop.sql(
        "SELECT state, aligned, lag, effective_watermark, lagging_sources, stream_tables "
        "FROM pgtrickle.watermark_status()"
    )
    assert status == [
        (
            "misaligned",
            False,
            timedelta(minutes=10),
            t(-5),
            ["public.order_lines"],
            ["public.order_summary (none)", "public.line_summary (none)", "public.order_report (gate)"],
        )
    ]
    # A manual refresh is refused unless forced.
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="watermark"):
        shop.sql("SELECT pgtrickle.refresh_stream_table('order_report')")
    with pytest.raises(PgTrickleError, match="--force"):
        refresh(shop, "order_report")
    # order_lines reach 12:05: the report refreshes and equals its query.
    load(shop, [add_lines(101, 150)], "order_lines", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["order_report"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop)
    assert info(shop, "order_report")[2] == t(5)
    shop.sql("SELECT pgtrickle.refresh_stream_table('order_report')")  # aligned: accepted


def assert_fails_oracle(db: Database, name: str) -> bool:
    try:
        assert_oracle(db, name)
    except AssertionError:
        return False
    return True


def test_forced_refresh_passes_the_gate(shop: Database) -> None:
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    shop.sql("SELECT pgtrickle.refresh_stream_table('order_report', force => true)")
    outcomes = refresh(shop)  # the forced request is honoured
    assert actions(outcomes)["order_report"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop)
    assert info(shop, "order_report")[2] is None, "a forced refresh reflects no aligned point"


def test_watermark_intermediate_refreshes_freely_and_scheduler_skips(shop: Database) -> None:
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    scheduler = Scheduler(shop.settings, shop.dsn)
    try:
        shop.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = now() - interval '2h', "
            "last_attempt_at = now() - interval '2h'"
        )
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert actions(report.refreshed) == {
        "order_summary": Action.FULL,
        "line_summary": Action.NO_DATA,
        "order_report": Action.SKIP,
    }
    assert_oracle(shop, "order_summary", "line_summary")


def test_watermark_tolerance(shop: Database) -> None:
    shop.sql("SELECT pgtrickle.alter_watermark_group('order_pipeline', tolerance => '5 minutes')")
    load(shop, [add_orders(101, 120, -2)], "orders", t(0))  # 5 minutes ahead: within tolerance
    assert actions(refresh(shop))["order_report"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop)
    load(shop, [add_orders(121, 140, 3)], "orders", t(5))  # 10 minutes ahead: beyond
    assert actions(refresh(shop))["order_report"] is Action.SKIP
    shop.sql("SELECT pgtrickle.alter_watermark_group('order_pipeline', tolerance => '10 minutes')")
    assert actions(refresh(shop))["order_report"] in (Action.FULL, Action.DIFFERENTIAL), (
        "a wider tolerance applies from the next tick"
    )
    assert_oracle(shop)


def test_transitive_gating_through_two_levels_and_sql_agrees_with_python(shop: Database) -> None:
    create_st(shop, "report_top", "SELECT customer, orders FROM order_report WHERE orders > 0", schedule="1h")
    refresh(shop)
    assert_oracle(shop)
    assert info(shop, "report_top")[:2] == ("gate", "inferred")
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["order_report"] is Action.SKIP
    assert actions(outcomes)["report_top"] is Action.NO_DATA, "nothing reached it"
    shop.sql("SELECT pgtrickle.alter_stream_table('report_top', watermark_gating => 'none')")
    shop.sql("SELECT pgtrickle.alter_stream_table('line_summary', watermark_gating => 'gate')")
    sts = load_stream_tables(shop.conn)
    for st in sts.values():
        check = watermark_gate.evaluate(shop.conn, st)
        assert check is not None
        sql_mode = info(shop, st.name)[:2]
        assert (check.mode, check.origin) == sql_mode, st.name
        sql_gate = shop.scalar(
            "SELECT watermark_gate FROM pgtrickle.stream_tables_info WHERE table_name = %s", (st.name,)
        )
        assert (sql_gate is not None) == (check.blocked is not None), st.name
    assert info(shop, "line_summary")[:2] == ("gate", "set")
    shop.sql("SELECT pgtrickle.alter_stream_table('line_summary', watermark_gating => 'inferred')")
    assert info(shop, "line_summary")[:2] == ("none", "inferred")


# -------------------------------------------------------------------- hold_back


def test_watermark_hold_back_reflects_only_orders_up_to_the_effective_watermark(shop: Database) -> None:
    shop.sql("SELECT pgtrickle.alter_stream_table('order_summary', watermark_gating => 'hold_back')")
    copy_table(shop, "orders", "orders_at_1155")
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    copy_table(shop, "orders", "orders_at_1205")
    outcomes = refresh(shop)
    assert actions(outcomes)["order_summary"] is Action.NO_DATA, "nothing new up to the aligned point"
    assert reasons(outcomes)["order_summary"] == "no pending changes up to the watermark"
    assert_equals_query(shop, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1155"))
    assert not assert_fails_oracle(shop, "order_summary"), "the live query already has the 12:05 orders"
    assert info(shop, "order_summary")[:3] == ("hold_back", "set", t(-5))
    assert actions(outcomes)["order_report"] is Action.NO_DATA, "nothing reached the report"
    # A load in progress for 12:15 (not advanced yet), and order lines reaching 12:05.
    load(
        shop,
        [
            add_orders(151, 170, 8),
            "UPDATE orders SET amount = amount + 1000 WHERE id <= 10",
            "DELETE FROM orders WHERE id BETWEEN 101 AND 105",
        ],
    )
    assert actions(refresh(shop))["order_summary"] is Action.NO_DATA, "nothing new up to the watermark"
    assert_equals_query(shop, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1155"))
    load(shop, [add_lines(101, 150)], "order_lines", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["order_summary"] is Action.FULL
    assert_equals_query(shop, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1205"))
    assert info(shop, "order_summary")[2] == t(5)
    assert actions(outcomes)["order_report"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop, "order_report", "line_summary")
    # Leaving hold_back: the next refresh catches up with everything.
    shop.sql("SELECT pgtrickle.alter_stream_table('order_summary', watermark_gating => 'none')")
    assert actions(refresh(shop))["order_summary"] is Action.FULL
    assert_oracle(shop, "order_summary")
    assert info(shop, "order_summary")[2] is None


def test_hold_back_at_every_level_reflects_one_point_in_time(shop: Database) -> None:
    for name in ("order_summary", "line_summary", "order_report"):
        shop.sql("SELECT pgtrickle.alter_stream_table(%s, watermark_gating => 'hold_back')", (name,))
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    load(shop, [add_lines(101, 130)])  # order lines for 12:05 partly loaded, not advanced
    copy_table(shop, "orders", "orders_at_1205")
    outcomes = refresh(shop)
    assert actions(outcomes) == {
        "order_summary": Action.NO_DATA,
        "line_summary": Action.NO_DATA,
        "order_report": Action.NO_DATA,
    }, "all of them are at 11:55 already"
    copy_table(shop, "order_lines", "lines_at_1155")
    shop.sql("DELETE FROM lines_at_1155 WHERE order_id > 100")
    aligned_report = ORDER_REPORT.replace(
        "order_summary os", f"({ORDER_SUMMARY.replace('orders', 'orders_at_1155')}) os"
    ).replace("line_summary ls", f"({LINE_SUMMARY.replace('order_lines', 'lines_at_1155')}) ls")
    copy_table(shop, "orders", "orders_at_1155")
    shop.sql("DELETE FROM orders_at_1155 WHERE id > 100")
    assert_equals_query(shop, "order_report", aligned_report)
    assert_oracle(shop, "order_report")  # its own query over the held-back stream tables
    assert {info(shop, n)[2] for n in ("order_summary", "line_summary", "order_report")} == {t(-5)}
    load(shop, [add_lines(131, 150)], "order_lines", t(5))
    copy_table(shop, "order_lines", "lines_at_1205")
    load(shop, [add_orders(151, 160, 7)])  # beyond the watermark
    refresh(shop)
    assert_equals_query(
        shop,
        "order_report",
        ORDER_REPORT.replace(
            "order_summary os", f"({ORDER_SUMMARY.replace('orders', 'orders_at_1205')}) os"
        ).replace("line_summary ls", f"({LINE_SUMMARY.replace('order_lines', 'lines_at_1205')}) ls"),
    )
    assert {info(shop, n)[2] for n in ("order_summary", "line_summary", "order_report")} == {t(5)}


def test_hold_back_needs_held_back_upstream(shop: Database) -> None:
    shop.sql("SELECT pgtrickle.alter_stream_table('order_report', watermark_gating => 'hold_back')")
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["order_report"] is Action.SKIP
    why = reasons(outcomes)["order_report"]
    assert "does not reflect watermark group order_pipeline" in why and "set it to 'hold_back' too" in why


def test_hold_back_goes_back_to_the_aligned_point(db: Database) -> None:
    """A stream table that refreshed past the cap while the group bootstrapped is taken back to it."""
    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2), placed_at timestamptz)"
    )
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("SELECT pgtrickle.create_watermark_group('order_pipeline', ARRAY['orders', 'order_lines'])")
    create_st(db, "order_summary", ORDER_SUMMARY, schedule="1h")
    db.sql("SELECT pgtrickle.alter_stream_table('order_summary', watermark_gating => 'hold_back')")
    load(db, [add_orders(1, 50, -10)], "orders", t(-5))
    copy_table(db, "orders", "orders_at_1155")
    load(
        db,
        [
            add_orders(51, 80, 0),
            "UPDATE orders SET customer = 'moved' WHERE id <= 5",
            "DELETE FROM orders WHERE id BETWEEN 6 AND 8",
        ],
    )
    refresh(db)  # bootstrapping (order_lines has no watermark): reads orders as they are
    assert_oracle(db)
    assert db.scalar("SELECT state FROM pgtrickle.watermark_status()") == "bootstrapping"
    load(db, [add_lines(1, 50)], "order_lines", t(-5))  # aligned at 11:55
    outcomes = refresh(db)
    assert actions(outcomes)["order_summary"] is Action.FULL
    assert_equals_query(db, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1155"))


def test_hold_back_refuses_what_it_cannot_rebuild(db: Database) -> None:
    from pgtrickle.cdc.buffers import cleanup_buffers

    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2), placed_at timestamptz)"
    )
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("SELECT pgtrickle.create_watermark_group('order_pipeline', ARRAY['orders', 'order_lines'])")
    create_st(db, "order_summary", ORDER_SUMMARY, schedule="1h")
    create_st(db, "orders_copy", "SELECT id, amount FROM orders", schedule="1h")
    db.sql("SELECT pgtrickle.alter_stream_table('order_summary', watermark_gating => 'hold_back')")
    load(db, [add_orders(1, 50, -10)], "orders", t(-5))
    load(db, [add_orders(51, 80, 0)])
    refresh(db)
    assert cleanup_buffers(db.conn) > 0, "every consumer passed the rows after the cap"
    load(db, [add_lines(1, 50)], "order_lines", t(-5))
    outcomes = refresh(db)
    assert actions(outcomes)["order_summary"] is Action.SKIP
    assert "already cleaned up" in reasons(outcomes)["order_summary"]
    assert_oracle(db)  # unchanged, still equal to the sources as they are
    # With the group aligned from now on, the changes after each aligned point are kept.
    load(db, [add_orders(81, 90, 4)], "orders", t(5))
    load(db, [add_lines(51, 90)], "order_lines", t(5))
    copy_table(db, "orders", "orders_at_1205")
    load(db, [add_orders(91, 95, 7)])
    refresh(db)
    assert cleanup_buffers(db.conn) >= 0
    load(db, [add_orders(96, 99, 8)])
    outcomes = refresh(db)
    assert_equals_query(db, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1205"))
    # A TRUNCATE after the cap cannot be undone: refused; force reads the source as it is.
    load(db, ["TRUNCATE orders", add_orders(1, 10, 9)])
    outcomes = refresh(db)
    assert (
        actions(outcomes)["order_summary"] is Action.SKIP
        and "truncated" in reasons(outcomes)["order_summary"]
    )
    from pgtrickle.daemon.manual import refresh_sync

    [forced] = refresh_sync(db.settings, db.dsn, ["order_summary"], force=True)
    assert forced.action is Action.FULL
    assert_oracle(db)


def test_watermark_multiple_groups_and_a_source_in_two_groups(shop: Database) -> None:
    shop.sql("CREATE TABLE audit_log (order_id int, checked boolean)")
    load(shop, ["INSERT INTO audit_log SELECT g, true FROM generate_series(1, 100) g"], "audit_log", t(-5))
    shop.sql("SELECT pgtrickle.create_watermark_group('audit_pipeline', ARRAY['orders', 'audit_log'])")
    create_st(
        shop,
        "audited",
        "SELECT o.customer, count(*) AS n FROM orders o JOIN audit_log a "
        "ON a.order_id = o.id GROUP BY o.customer",
        schedule="1h",
    )
    shop.sql("SELECT pgtrickle.alter_stream_table('order_summary', watermark_gating => 'hold_back')")
    refresh(shop)
    assert_oracle(shop)
    assert info(shop, "audited")[:2] == ("gate", "inferred")
    assert info(shop, "audited")[3] == ["audit_pipeline", "order_pipeline"], "orders is in both"
    assert info(shop, "order_summary")[3] == ["audit_pipeline", "order_pipeline"]
    copy_table(shop, "orders", "orders_at_1155")
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    load(shop, [add_lines(101, 150)], "order_lines", t(5))
    outcomes = refresh(shop)
    # order_pipeline is aligned at 12:05, audit_pipeline is not. orders is in both, so every stream
    # table reading it must satisfy both: the gates stay closed, and order_summary is held at the
    # earlier of the two aligned points, 11:55.
    assert actions(outcomes)["audited"] is Action.SKIP and "audit_pipeline" in reasons(outcomes)["audited"]
    assert actions(outcomes)["order_report"] is Action.SKIP
    assert "audit_pipeline" in reasons(outcomes)["order_report"]
    assert "order_pipeline" not in reasons(outcomes)["order_report"], "that one is aligned"
    assert_equals_query(shop, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1155"))
    assert info(shop, "order_summary")[2] == t(-5)
    assert_oracle(shop, "line_summary")
    copy_table(shop, "orders", "orders_at_1205")
    load(shop, ["INSERT INTO audit_log SELECT g, true FROM generate_series(101, 150) g"], "audit_log", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["audited"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop, "audited", "order_report")
    assert_equals_query(shop, "order_summary", ORDER_SUMMARY.replace("orders", "orders_at_1205"))


# ------------------------------------------------------------ §8 use cases A-D


def test_use_case_a_nightly_batch(db: Database) -> None:
    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2), placed_at timestamptz)"
    )
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("SELECT pgtrickle.create_watermark_group('order_pipeline', ARRAY['orders', 'order_lines'])")
    create_st(
        db,
        "order_report",
        "SELECT o.customer, sum(l.qty) AS qty, count(*) AS lines FROM orders o "
        "JOIN order_lines l ON l.order_id = o.id GROUP BY o.customer",
        schedule="1h",
    )
    refresh(db)
    assert_oracle(db)

    def nightly(table: str, rows: list[tuple], day: str) -> None:
        with psycopg.connect(db.dsn) as conn:  # BEGIN; COPY ...; advance_watermark; COMMIT
            with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            conn.execute("SELECT pgtrickle.advance_watermark(%s, %s::timestamptz)", (table, day))

    for day, first in (("2026-03-01", 1), ("2026-03-02", 1001)):
        nightly("orders", [(i, f"c{i % 4}", i, day) for i in range(first, first + 200)], day)
        if day == "2026-03-01":  # order_lines has no watermark yet: the group does not gate
            assert db.scalar("SELECT state FROM pgtrickle.watermark_status()") == "bootstrapping"
            assert actions(refresh(db))["order_report"] in (Action.FULL, Action.DIFFERENTIAL, Action.NO_DATA)
            assert_oracle(db)
        else:
            assert actions(refresh(db))["order_report"] is Action.SKIP, "lines of the night not loaded yet"
        nightly("order_lines", [(i, "p", 1 + i % 3) for i in range(first, first + 200)], day)
        assert actions(refresh(db))["order_report"] in (Action.FULL, Action.DIFFERENTIAL)
        assert_oracle(db)
        assert info(db, "order_report")[2] == datetime.fromisoformat(day + "T00:00:00+00:00")


def test_use_case_b_streaming_micro_batches_with_tolerance(db: Database) -> None:
    db.sql("CREATE TABLE trades (id int PRIMARY KEY, sym text, qty int)")
    db.sql("CREATE TABLE quotes (sym text, bid numeric(10,2), at int)")
    db.sql(
        "SELECT pgtrickle.create_watermark_group('realtime_pipeline', ARRAY['trades', 'quotes'], "
        "tolerance => '5 seconds')"
    )
    create_st(
        db,
        "positions",
        "SELECT t.sym, sum(t.qty) AS qty, max(q.bid) AS best_bid FROM trades t "
        "JOIN quotes q ON q.sym = t.sym GROUP BY t.sym",
        schedule="1h",
    )
    second = NOON.replace(second=0)
    batch = 0
    for trades_at, quotes_at, expect in ((5, 2, "refresh"), (9, 2, "skip"), (12, 10, "refresh")):
        batch += 1
        load(
            db,
            [f"INSERT INTO trades SELECT {batch} * 100 + g, 's' || (g % 3), g FROM generate_series(1, 20) g"],
            "trades",
            second + timedelta(seconds=trades_at),
        )
        load(
            db,
            [f"INSERT INTO quotes SELECT 's' || (g % 3), g, {batch} FROM generate_series(1, 6) g"],
            "quotes",
            second + timedelta(seconds=quotes_at),
        )
        action = actions(refresh(db))["positions"]
        if expect == "refresh":
            assert action in (Action.FULL, Action.DIFFERENTIAL), (trades_at, quotes_at)
            assert_oracle(db)
        else:
            assert action is Action.SKIP, (trades_at, quotes_at)


def test_use_case_c_independent_pipelines(shop: Database) -> None:
    shop.sql("CREATE TABLE stock_levels (product text, qty int)")
    shop.sql("CREATE TABLE warehouses (product text, site text)")
    shop.sql(
        "SELECT pgtrickle.create_watermark_group('inventory_pipeline', ARRAY['stock_levels', 'warehouses'])"
    )
    load(
        shop,
        ["INSERT INTO stock_levels SELECT 'p' || g, 10 * g FROM generate_series(0, 2) g"],
        "stock_levels",
        t(-5),
    )
    load(
        shop,
        ["INSERT INTO warehouses SELECT 'p' || g, 'w' || g FROM generate_series(0, 2) g"],
        "warehouses",
        t(-30),
    )
    create_st(
        shop,
        "fulfilment",
        "SELECT l.product, sum(l.qty) AS ordered, max(s.qty) AS stock, max(w.site) AS site "
        "FROM order_lines l JOIN orders o ON o.id = l.order_id "
        "JOIN stock_levels s ON s.product = l.product "
        "JOIN warehouses w ON w.product = l.product GROUP BY l.product",
        schedule="1h",
    )
    outcomes = refresh(shop)
    assert actions(outcomes)["fulfilment"] is Action.SKIP, "inventory misaligned from the start"
    assert "inventory_pipeline" in reasons(outcomes)["fulfilment"]
    assert actions(outcomes)["order_report"] is Action.NO_DATA, "the order pipeline alone is unaffected"
    load(shop, [], "warehouses", t(-5))
    assert actions(refresh(shop))["fulfilment"] is Action.FULL
    assert_oracle(shop)
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    outcomes = refresh(shop)
    assert (
        actions(outcomes)["fulfilment"] is Action.SKIP and "order_pipeline" in reasons(outcomes)["fulfilment"]
    )
    load(shop, [add_lines(101, 150)], "order_lines", t(5))
    assert actions(refresh(shop))["fulfilment"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop)
    assert info(shop, "fulfilment")[2] == t(-5), "the minimum of its groups: inventory at 11:55"


def test_use_case_d_mixed_internal_and_external_sources(db: Database) -> None:
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, currency text, amount numeric(10,2))")
    db.sql("CREATE TABLE fx_rates (currency text PRIMARY KEY, rate numeric(10,4))")
    db.sql("CREATE TABLE fx_holidays (currency text, day date)")
    db.sql("SELECT pgtrickle.create_watermark_group('fx_feed', ARRAY['fx_rates', 'fx_holidays'])")
    db.sql(
        "INSERT INTO orders SELECT g, (ARRAY['EUR','GBP','JPY'])[1 + g % 3], g FROM generate_series(1, 60) g"
    )
    load(db, ["INSERT INTO fx_rates VALUES ('EUR', 1.08), ('GBP', 1.27), ('JPY', 0.0067)"], "fx_rates", t(0))
    load(db, ["INSERT INTO fx_holidays VALUES ('JPY', '2026-03-03')"], "fx_holidays", t(0))
    query = (
        "SELECT o.id, o.amount * fx.rate AS amount_usd FROM orders o "
        "JOIN fx_rates fx ON o.currency = fx.currency"
    )
    create_st(db, "order_totals_usd", query, schedule="1h")
    assert info(db, "order_totals_usd")[:2] == ("none", "inferred"), "one member of the group only"
    db.sql("SELECT pgtrickle.alter_stream_table('order_totals_usd', watermark_gating => 'hold_back')")
    refresh(db)
    assert_oracle(db)
    copy_table(db, "fx_rates", "fx_at_1200")
    # The FX loader updates rates for 12:05 but the holidays feed is still at 12:00; orders keep coming.
    load(db, ["UPDATE fx_rates SET rate = rate * 2"], "fx_rates", t(5))
    load(
        db,
        [
            "INSERT INTO orders SELECT g, 'EUR', g FROM generate_series(61, 80) g",
            "DELETE FROM orders WHERE id <= 5",
        ],
    )
    outcomes = refresh(db)
    assert actions(outcomes)["order_totals_usd"] is Action.FULL
    assert_equals_query(db, "order_totals_usd", query.replace("fx_rates fx", "fx_at_1200 fx"))
    assert info(db, "order_totals_usd")[2] == t(0)
    load(db, [], "fx_holidays", t(5))
    refresh(db)
    assert_oracle(db)
    assert info(db, "order_totals_usd")[2] == t(5)


# ------------------------------------------------------------------- bad input


def fingerprint(db: Database) -> tuple:
    watermark_tables = tuple(
        tuple(map(str, db.sql(f"SELECT * FROM pgtrickle.{t} ORDER BY 1")))
        for t in (
            "pgt_watermarks",
            "pgt_watermark_history",
            "pgt_watermark_groups",
            "pgt_watermark_group_sources",
        )
    )
    return catalog_fingerprint(db), watermark_tables


BAD_CALLS = [
    ("SELECT pgtrickle.advance_watermark('no_such_table', now())", "does not exist"),
    ("SELECT pgtrickle.advance_watermark('orders\"; DROP TABLE orders; --', now())", "does not exist"),
    ("SELECT pgtrickle.advance_watermark('orders; DROP TABLE orders', now())", "does not exist"),
    ("SELECT pgtrickle.advance_watermark(NULL::text, now())", "must not be NULL"),
    ("SELECT pgtrickle.advance_watermark('orders', NULL)", "must not be NULL"),
    ("SELECT pgtrickle.advance_watermark('orders', 'infinity')", "finite"),
    (
        "SELECT pgtrickle.advance_watermark('orders', '2026-03-01 11:00+00')",
        "cannot go backwards: 2026-03-01 11:00:00+00 is before its current watermark 2026-03-01 11:55:00+00",
    ),
    ("SELECT pgtrickle.advance_watermark('order_summary', now())", "is a stream table"),
    ("SELECT pgtrickle.advance_watermark('pg_class', now())", "not a table an external process loads"),
    ("SELECT pgtrickle.create_watermark_group('g', ARRAY['orders'])", "at least two sources"),
    ("SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', 'orders'])", "listed twice"),
    ("SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', 'nope'])", "does not exist"),
    (
        "SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', 'x''); DROP TABLE orders; --'])",
        "does not exist",
    ),
    ("SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', NULL])", "must not contain NULL"),
    ("SELECT pgtrickle.create_watermark_group('g', NULL)", "needs its sources"),
    (
        "SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', 'order_lines'], tolerance => '-1 second')",
        "must be between 0 and 366 days",
    ),
    (
        "SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', 'order_lines'], tolerance => NULL)",
        "must not be NULL",
    ),
    (
        "SELECT pgtrickle.create_watermark_group('g', ARRAY['orders', 'order_lines'], stale_after => '-5 min')",
        "must be between 0 and 366 days",
    ),
    ("SELECT pgtrickle.create_watermark_group(NULL, ARRAY['orders', 'order_lines'])", "must not be NULL"),
    (
        "SELECT pgtrickle.create_watermark_group(' ', ARRAY['orders', 'order_lines'])",
        "must not be NULL or empty",
    ),
    ("SELECT pgtrickle.create_watermark_group(repeat('x', 64), ARRAY['orders', 'order_lines'])", "too long"),
    (
        "SELECT pgtrickle.create_watermark_group('order_pipeline', ARRAY['orders', 'order_lines'])",
        "already exists",
    ),
    ("SELECT pgtrickle.alter_watermark_group('nope', tolerance => '1 min')", "does not exist"),
    (
        "SELECT pgtrickle.alter_watermark_group('x''; DROP TABLE orders; --', tolerance => '1 min')",
        "does not exist",
    ),
    ("SELECT pgtrickle.alter_watermark_group('order_pipeline', sources => ARRAY['orders'])", "at least two"),
    (
        "SELECT pgtrickle.alter_watermark_group('order_pipeline', tolerance => '-1 min')",
        "must be between 0 and 366 days",
    ),
    ("SELECT pgtrickle.drop_watermark_group('nope')", "does not exist"),
    ("SELECT pgtrickle.drop_watermark_group(NULL)", "must not be NULL"),
    (
        "SELECT pgtrickle.alter_stream_table('order_report', watermark_gating => 'sometimes')",
        "invalid watermark_gating",
    ),
    (
        "SELECT pgtrickle.alter_stream_table('order_report', watermark_gating => 'gate''; DROP TABLE orders; --')",
        "invalid watermark_gating",
    ),
    ("SELECT pgtrickle.watermark_history('nope')", "does not exist"),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS, ids=[c[0][17:60] for c in BAD_CALLS])
def test_bad_watermark_input_is_refused_and_changes_nothing(shop: Database, call: str, message: str) -> None:
    before = fingerprint(shop)
    with pytest.raises(psycopg.Error, match=re.escape(message)):
        shop.sql(call)
    assert fingerprint(shop) == before
    assert shop.scalar("SELECT count(*) FROM orders") == 100


def test_group_names_are_data_not_sql(shop: Database) -> None:
    hostile = "x'); DROP TABLE orders; --"
    shop.sql("SELECT pgtrickle.create_watermark_group(%s, ARRAY['orders', 'order_lines'])", (hostile,))
    assert (
        shop.scalar("SELECT count(*) FROM pgtrickle.watermark_groups() WHERE group_name = %s", (hostile,))
        == 1
    )
    shop.sql("SELECT pgtrickle.drop_watermark_group(%s)", (hostile,))
    assert shop.scalar("SELECT count(*) FROM orders") == 100


# ---------------------------------------------------------------- composition


def test_gate_and_circuit_breaker_must_both_pass(shop: Database) -> None:
    create_st(
        shop,
        "lines_per_customer",
        "SELECT o.customer, sum(l.qty) AS qty FROM orders o "
        "JOIN order_lines l ON l.order_id = o.id GROUP BY o.customer",
        schedule="1h",
    )
    refresh(shop)
    assert_oracle(shop)
    shop.sql(
        "SELECT pgtrickle.alter_stream_table('lines_per_customer', circuit_breaker => 'fixed', "
        "circuit_breaker_ceiling => 30)"
    )
    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["lines_per_customer"] is Action.SKIP
    assert "watermark" in reasons(outcomes)["lines_per_customer"]
    breaker = (
        "SELECT state FROM pgtrickle.circuit_breaker_status() WHERE st_name = 'public.lines_per_customer'"
    )
    assert shop.scalar(breaker) == "closed", "the watermark gate skipped it before the breaker looked"
    load(shop, [add_lines(101, 150)], "order_lines", t(5))
    outcomes = refresh(shop)
    assert actions(outcomes)["lines_per_customer"] is Action.SKIP
    assert "circuit breaker tripped" in reasons(outcomes)["lines_per_customer"]
    assert shop.scalar(breaker) == "open"
    shop.sql("SELECT pgtrickle.reset_circuit_breaker('lines_per_customer')")
    assert actions(refresh(shop))["lines_per_customer"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop)


# ---------------------------------------------------------------- stale alerts


def test_stale_watermark_alerts_once_and_resumes(shop: Database) -> None:
    shop.sql("SELECT pgtrickle.alter_watermark_group('order_pipeline', stale_after => '1 second')")
    listener = psycopg.connect(shop.dsn, autocommit=True)
    listener.execute("LISTEN pg_trickle_alert")
    time.sleep(1.2)
    scheduler = Scheduler(shop.settings, shop.dsn)
    try:
        scheduler.tick()
        stuck = [a for a in alerts(listener) if a["event"] == "watermark_stuck"]
        assert sorted(a["source"] for a in stuck) == ["public.order_lines", "public.orders"]
        assert all(a["group"] == "order_pipeline" and a["stale_after"] == "0:00:01" for a in stuck)
        scheduler.tick()
        assert not [a for a in alerts(listener) if a["event"] == "watermark_stuck"], "once per stall"
        assert shop.sql("SELECT stuck_sources FROM pgtrickle.watermark_status()") == [
            (["public.order_lines", "public.orders"],)
        ]
        load(shop, [], "orders", t(0))
        resumed = [a for a in alerts(listener) if a["event"] == "watermark_resumed"]
        assert [(a["source"], a["group"]) for a in resumed] == [("public.orders", "order_pipeline")]
        assert shop.sql("SELECT stuck_in FROM pgtrickle.watermarks() ORDER BY source") == [
            (["order_pipeline"],),
            ([],),
        ]
        shop.sql("SELECT pgtrickle.alter_watermark_group('order_pipeline', stale_after => '0 seconds')")
        time.sleep(1.2)
        scheduler.tick()
        assert not [a for a in alerts(listener) if a["event"] == "watermark_stuck"], "alerts off"
    finally:
        scheduler.close()
        listener.close()


# ------------------------------------------------------------------------ CLI


def test_cli_watermarks_status_and_refusal(shop: Database) -> None:
    from typer.testing import CliRunner

    from pgtrickle.cli.main import app

    runner = CliRunner(env={"COLUMNS": "250"})

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, ["--dsn", shop.dsn, *args], catch_exceptions=False)

    load(shop, [add_orders(101, 150, 2)], "orders", t(5))
    result = invoke("watermarks")
    assert result.exit_code == 0, result.output
    assert "order_pipeline" in result.output and "misaligned" in result.output
    assert "public.order_lines" in result.output and "2026-03-01 12:05:00+0000" in result.output
    result = invoke("status")
    assert result.exit_code == 0 and "gate (inferred) closed" in result.output
    result = invoke("refresh", "order_report")
    assert result.exit_code == 1 and "watermark gating" in result.output and "--force" in result.output
    result = invoke("refresh", "--force", "order_report")
    assert result.exit_code == 0, result.output
    assert_oracle(shop, "order_report")
