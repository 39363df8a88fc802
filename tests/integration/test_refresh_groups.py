"""Atomic refresh groups: diamonds and explicit groups refresh at one snapshot, all or none."""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler, effective_groups
from pgtrickle.catalog.store import load_stream_tables
from pgtrickle.errors import PgTrickleError

from tests.conftest import Database
from tests.integration.helpers import assert_oracle, catalog_fingerprint, create_st, refresh

DIAMOND = ("by_region", "by_region_n", "report")


@pytest.fixture
def diamond(db: Database) -> Database:
    """orders → by_region (sum), by_region_n (count) → report (their join): a diamond at report."""
    db.sql("CREATE TABLE orders (id bigint PRIMARY KEY, region text NOT NULL, amount int NOT NULL)")
    db.sql("INSERT INTO orders SELECT g, 'r' || (g % 4), g FROM generate_series(1, 200) g")
    create_st(
        db,
        "by_region",
        "SELECT region, sum(amount) AS total FROM orders GROUP BY region",
        refresh_mode="DIFFERENTIAL",
    )
    create_st(
        db,
        "by_region_n",
        "SELECT region, count(*) AS n FROM orders GROUP BY region",
        refresh_mode="DIFFERENTIAL",
    )
    create_st(
        db, "report", "SELECT a.region, a.total, b.n FROM by_region a JOIN by_region_n b USING (region)"
    )
    refresh(db)
    assert_oracle(db, *DIAMOND)
    return db


def contents(db: Database, name: str) -> list[tuple]:
    return db.sql(f"SELECT * FROM {name} ORDER BY 1")


def last_history(db: Database, name: str) -> tuple:
    return db.sql(
        "SELECT h.action, h.status, coalesce(h.skip_reason, h.error_message, h.mode_reason)"
        " FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " WHERE s.pgt_name = %s ORDER BY refresh_id DESC LIMIT 1",
        (name,),
    )[0]


def test_a_diamond_is_detected_and_refreshes_as_one_group(diamond: Database) -> None:
    db = diamond
    groups = effective_groups(db.conn, load_stream_tables(db.conn))
    assert len(groups) == 1 and len(groups[0].members) == 3
    assert groups[0].name == "diamond at public.report"
    db.sql("INSERT INTO orders VALUES (1001, 'r1', 5), (1002, 'r9', 7)")
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id <= 10")
    db.sql("DELETE FROM orders WHERE id BETWEEN 50 AND 60")
    outcomes = refresh(db, "report")  # one member asked for: the whole group runs
    assert {o.st.name: o.action for o in outcomes} == {
        "by_region": Action.DIFFERENTIAL,
        "by_region_n": Action.DIFFERENTIAL,
        "report": Action.DIFFERENTIAL,
    }
    assert_oracle(db, *DIAMOND)
    frontiers = db.sql("SELECT DISTINCT split_part(frontier::text, ':', 1) FROM pgtrickle.pgt_stream_tables")
    assert len(frontiers) == 1, "the members read one snapshot"
    assert "atomic group diamond at public.report" in last_history(db, "report")[2]


def test_status_shows_the_groups(diamond: Database) -> None:
    from rich.console import Console

    from pgtrickle.cli.main import status_view

    console = Console(width=200, record=True)
    console.print(status_view(diamond.dsn))
    text = console.export_text()
    assert "refresh groups" in text and "public.by_region, public.by_region_n, public.report" in text


def test_nothing_to_do_moves_no_data(diamond: Database) -> None:
    outcomes = refresh(diamond, "by_region")
    assert {o.action for o in outcomes} == {Action.NO_DATA}


def test_a_failing_member_leaves_all_three_at_the_previous_point(diamond: Database) -> None:
    db = diamond
    before = {n: contents(db, n) for n in DIAMOND}
    frontiers = db.sql("SELECT pgt_name, frontier::text FROM pgtrickle.pgt_stream_tables ORDER BY 1")
    db.sql("ALTER TABLE report ADD CONSTRAINT small CHECK (total < 10000)")
    db.sql("INSERT INTO orders SELECT g, 'r2', 100 FROM generate_series(2001, 2100) g")
    with pytest.raises(PgTrickleError, match="atomic group .*report.*no member was changed"):
        refresh(db, "report")
    assert {n: contents(db, n) for n in DIAMOND} == before
    assert db.sql("SELECT pgt_name, frontier::text FROM pgtrickle.pgt_stream_tables ORDER BY 1") == frontiers
    assert last_history(db, "report")[:2] == ("FULL", "FAILED")  # by_region: the adaptive fallback
    for name in ("by_region", "by_region_n"):
        action, status, why = last_history(db, name)
        assert (action, status) == ("SKIP", "SKIPPED") and "report failed" in why
    assert (
        db.scalar("SELECT consecutive_errors FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'report'") == 1
    )
    db.sql("ALTER TABLE report DROP CONSTRAINT small")
    refresh(db, "by_region")
    assert_oracle(db, *DIAMOND)


def test_a_tripped_breaker_on_one_member_skips_the_group(diamond: Database) -> None:
    db = diamond
    db.sql(
        "SELECT pgtrickle.alter_stream_table('by_region_n', circuit_breaker => 'fixed',"
        " circuit_breaker_ceiling => 5)"
    )
    before = {n: contents(db, n) for n in DIAMOND}
    db.sql("INSERT INTO orders SELECT g, 'r3', 1 FROM generate_series(3001, 3020) g")
    outcomes = refresh(db)
    assert {o.action for o in outcomes} == {Action.SKIP}
    assert {n: contents(db, n) for n in DIAMOND} == before
    assert "by_region_n skipped" in last_history(db, "by_region")[2]
    db.sql("SELECT pgtrickle.reset_circuit_breaker('by_region_n')")
    db.sql("SELECT pgtrickle.alter_stream_table('by_region_n', circuit_breaker => 'none')")
    refresh(db)
    assert_oracle(db, *DIAMOND)


def test_leaving_the_group_then_refreshing_differentially_applies_nothing_twice(diamond: Database) -> None:
    """The group's frontier includes its own writes: a downstream member that goes back to
    differential refresh must not take its upstream members' last group changes again."""
    db = diamond
    for i in range(3):
        db.sql("INSERT INTO orders VALUES (%s, 'r0', 3)", (5000 + i,))
        refresh(db)
        assert_oracle(db, *DIAMOND)
    db.sql(
        "SELECT pgtrickle.alter_stream_table('report', diamond_consistency => 'none',"
        " differential_fallback_ratio => 1)"
    )
    assert effective_groups(db.conn, load_stream_tables(db.conn)) == []
    db.sql("UPDATE orders SET amount = amount * 2 WHERE id IN (5, 6)")
    outcomes = refresh(db)
    assert {o.st.name: o.action for o in outcomes}["report"] is Action.DIFFERENTIAL, [
        o.reason for o in outcomes
    ]
    assert_oracle(db, *DIAMOND)
    db.sql("SELECT pgtrickle.alter_stream_table('report', diamond_consistency => 'atomic')")
    db.sql("DELETE FROM orders WHERE region = 'r2'")
    refresh(db)
    assert_oracle(db, *DIAMOND)


def test_the_daemon_refreshes_the_group(diamond: Database) -> None:
    db = diamond
    db.sql("INSERT INTO orders VALUES (7001, 'r0', 11), (7002, 'r5', 12)")
    for name in DIAMOND:
        db.sql("SELECT pgtrickle.refresh_stream_table(%s)", (name,))
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert not report.failed
    assert sorted(o.st.name for o in report.refreshed) == sorted(DIAMOND)
    assert_oracle(db, *DIAMOND)


def test_a_chain_inside_the_diamond_refreshes_differentially(db: Database) -> None:
    """orders → big → big_totals, and report joins big_totals with orders directly."""
    db.sql("CREATE TABLE orders (id bigint PRIMARY KEY, region text NOT NULL, amount int NOT NULL)")
    db.sql("INSERT INTO orders SELECT g, 'r' || (g % 3), g FROM generate_series(1, 60) g")
    create_st(
        db, "big", "SELECT id, region, amount FROM orders WHERE amount > 10", refresh_mode="DIFFERENTIAL"
    )
    create_st(db, "big_totals", "SELECT region, sum(amount) AS total FROM big GROUP BY region")
    create_st(
        db,
        "mix",
        "SELECT o.region, count(*) AS n, max(t.total) AS total FROM orders o"
        " JOIN big_totals t USING (region) GROUP BY o.region",
    )
    refresh(db)
    groups = effective_groups(db.conn, load_stream_tables(db.conn))
    assert [len(g.members) for g in groups] == [3]
    db.sql("INSERT INTO orders VALUES (100, 'r1', 50), (101, 'r7', 70)")
    db.sql("DELETE FROM orders WHERE id = 20")
    outcomes = refresh(db)
    assert {o.st.name: o.action for o in outcomes} == {
        "big": Action.DIFFERENTIAL,
        "big_totals": Action.DIFFERENTIAL,
        "mix": Action.DIFFERENTIAL,
    }
    assert_oracle(db, "big", "big_totals", "mix")


def test_explicit_group_of_unrelated_tables_is_atomic(db: Database) -> None:
    db.sql("CREATE TABLE t1 (k int PRIMARY KEY, v int)")
    db.sql("CREATE TABLE t2 (k int PRIMARY KEY, v int)")
    db.sql("INSERT INTO t1 SELECT g, g FROM generate_series(1, 10) g")
    db.sql("INSERT INTO t2 SELECT g, g FROM generate_series(1, 10) g")
    create_st(db, "s1", "SELECT k, v FROM t1")
    create_st(db, "s2", "SELECT sum(v) AS total FROM t2")
    assert db.scalar("SELECT pgtrickle.create_refresh_group('pair', ARRAY['s1', 'public.s2'])") is not None
    assert db.sql("SELECT group_name, members FROM pgtrickle.refresh_groups") == [
        ("pair", ["public.s1", "public.s2"])
    ]
    refresh(db, "s1")
    assert_oracle(db, "s1", "s2")
    db.sql("ALTER TABLE s2 ADD CONSTRAINT low CHECK (total < 100)")
    db.sql("INSERT INTO t1 VALUES (11, 11)")
    db.sql("INSERT INTO t2 VALUES (11, 1000)")
    s1_before = contents(db, "s1")
    with pytest.raises(PgTrickleError, match="atomic group pair"):
        refresh(db, "s1")
    assert contents(db, "s1") == s1_before, "s1 rolled back with s2"
    db.sql("SELECT pgtrickle.drop_refresh_group('pair')")
    outcomes = refresh(db, "s1")
    assert [o.action for o in outcomes] == [Action.DIFFERENTIAL]
    assert_oracle(db, "s1")


@pytest.mark.parametrize(
    "call, message",
    [
        ("SELECT pgtrickle.create_refresh_group('g', ARRAY['s1'])", "at least two"),
        ("SELECT pgtrickle.create_refresh_group('g', NULL)", "at least two"),
        ("SELECT pgtrickle.create_refresh_group('g', ARRAY['s1', 'nope'])", "does not exist"),
        ("SELECT pgtrickle.create_refresh_group('g', ARRAY['s1', 's1'])", "listed twice"),
        ("SELECT pgtrickle.create_refresh_group('g', ARRAY['s1', NULL])", "cannot be NULL"),
        ("SELECT pgtrickle.create_refresh_group(NULL, ARRAY['s1', 's2'])", "needs a name"),
        ("SELECT pgtrickle.create_refresh_group('  ', ARRAY['s1', 's2'])", "needs a name"),
        ("SELECT pgtrickle.create_refresh_group(repeat('x', 70), ARRAY['s1', 's2'])", "longer than 63"),
        ("SELECT pgtrickle.create_refresh_group('taken', ARRAY['s1', 's2'])", "already exists"),
        (
            "SELECT pgtrickle.create_refresh_group('g', ARRAY['s1', 'x''; DROP TABLE t1; --'])",
            "invalid stream table name",
        ),
        ("SELECT pgtrickle.drop_refresh_group('nope')", "does not exist"),
        ("SELECT pgtrickle.drop_refresh_group(NULL)", "does not exist"),
        (
            "SELECT pgtrickle.alter_stream_table('s1', diamond_consistency => 'sometimes')",
            "invalid diamond_consistency",
        ),
    ],
)
def test_bad_group_inputs_are_refused_and_change_nothing(db: Database, call: str, message: str) -> None:
    db.sql("CREATE TABLE t1 (k int PRIMARY KEY)")
    create_st(db, "s1", "SELECT k FROM t1", initialize=False)
    create_st(db, "s2", "SELECT count(*) AS n FROM t1", initialize=False)
    db.sql("SELECT pgtrickle.create_refresh_group('taken', ARRAY['s1', 's2'])")
    before = catalog_fingerprint(db), db.sql("SELECT * FROM pgtrickle.refresh_groups")
    with pytest.raises(psycopg.Error, match=message):
        db.sql(call)
    assert (catalog_fingerprint(db), db.sql("SELECT * FROM pgtrickle.refresh_groups")) == before


def test_a_closed_watermark_gate_on_one_member_skips_the_group(db: Database) -> None:
    from tests.integration.test_watermarks import (
        LINE_SUMMARY,
        ORDER_REPORT,
        ORDER_SUMMARY,
        add_lines,
        add_orders,
        load,
        t,
    )

    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2), placed_at timestamptz)"
    )
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("SELECT pgtrickle.create_watermark_group('order_pipeline', ARRAY['orders', 'order_lines'])")
    load(db, [add_orders(1, 50, -10)], "orders", t(-5))
    load(db, [add_lines(1, 50)], "order_lines", t(-5))
    create_st(db, "order_summary", ORDER_SUMMARY)
    create_st(db, "line_summary", LINE_SUMMARY)
    create_st(db, "order_report", ORDER_REPORT)
    db.sql(
        "SELECT pgtrickle.create_refresh_group('shop', ARRAY['order_summary', 'line_summary', 'order_report'])"
    )
    refresh(db)
    assert_oracle(db, "order_summary", "line_summary", "order_report")
    before = contents(db, "order_summary")
    load(db, [add_orders(51, 60, 1)], "orders", t(2))  # order_lines not yet loaded: the gate closes
    outcomes = refresh(db, "order_summary")
    assert {o.action for o in outcomes} == {Action.SKIP}
    assert contents(db, "order_summary") == before, "order_summary alone could refresh, but not its group"
    assert "order_report skipped" in last_history(db, "order_summary")[2]
    load(db, [add_lines(51, 60)], "order_lines", t(2))
    refresh(db)
    assert_oracle(db, "order_summary", "line_summary", "order_report")
