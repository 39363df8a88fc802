"""Watermarks beyond what Python and Spark can hold (issue 16 item 7).

A watermark after year 9999 used to be accepted and then stopped the daemon
at every start ("timestamp too large"), and since watermarks only advance
the API could not undo it. Now advance_watermark refuses it (SQLSTATE 22023,
invalid_parameter_value), a value already in the catalog (written by an
older version, or by hand) can be replaced by any valid watermark, and the
daemon keeps scheduling every stream table whatever the catalog holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

NOON = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def time_passes(db: Database) -> None:
    """Move every stream table's last refresh into the past (deterministic schedules)."""
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '2 hours', "
        "last_attempt_at = last_attempt_at - interval '2 hours'"
    )


@pytest.fixture
def loaded(db: Database) -> Database:
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.sql("CREATE TABLE lines (order_id int, qty int)")
    db.sql("CREATE TABLE other (id int PRIMARY KEY)")
    db.sql("INSERT INTO orders VALUES (1, 10), (2, 20)")
    db.sql("INSERT INTO lines VALUES (1, 1)")
    db.sql("INSERT INTO other VALUES (1)")
    db.sql("SELECT pgtrickle.create_watermark_group('pipe', ARRAY['orders', 'lines'])")
    db.sql("SELECT pgtrickle.advance_watermark('orders', %s)", (NOON,))
    db.sql("SELECT pgtrickle.advance_watermark('lines', %s)", (NOON,))
    create_st(
        db,
        "report",
        "SELECT o.id, o.amount, l.qty FROM orders o LEFT JOIN lines l ON l.order_id = o.id",
        schedule="1h",
    )
    create_st(db, "plain", "SELECT id FROM other", schedule="1h")
    refresh(db)
    assert_oracle(db)
    return db


@pytest.mark.parametrize(
    "value",
    [
        "12000-01-01 00:00:00+00",
        "10000-01-01 00:00:00+00",
        "infinity",
        "-infinity",
        "0044-03-15 00:00:00+00 BC",
        "294276-01-01 00:00:00+00",
    ],
)
def test_advance_watermark_refuses_values_beyond_years_1_to_9999(loaded: Database, value: str) -> None:
    before = loaded.sql("SELECT * FROM pgtrickle.pgt_watermarks ORDER BY 1")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        loaded.sql("SELECT pgtrickle.advance_watermark('orders', %s::timestamptz)", (value,))
    assert "public.orders" in str(err.value)
    assert loaded.sql("SELECT * FROM pgtrickle.pgt_watermarks ORDER BY 1") == before


def test_the_last_days_of_9999_are_accepted(loaded: Database) -> None:
    loaded.sql("SELECT pgtrickle.advance_watermark('orders', '9999-12-30 23:59:59.999999+00')")
    loaded.sql("SELECT pgtrickle.advance_watermark('lines', '9999-12-30 23:59:59.999999+00')")
    loaded.sql("INSERT INTO orders VALUES (3, 30)")
    time_passes(loaded)
    scheduler = Scheduler(loaded.settings, loaded.dsn)
    try:
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert {o.st.name for o in report.refreshed} >= {"report"}, report
    assert_oracle(loaded)


@pytest.mark.parametrize(
    "value", ["12000-01-01 00:00:00+00", "infinity", "-infinity", "0044-03-15 00:00:00+00 BC"]
)
def test_daemon_survives_a_watermark_beyond_range_in_the_catalog_and_the_api_undoes_it(
    loaded: Database, value: str
) -> None:
    # As an older version (or a hand-written UPDATE) left it: bypass the API's check.
    loaded.sql(
        "UPDATE pgtrickle.pgt_watermarks SET watermark = %s::timestamptz"
        " WHERE source_relid = 'orders'::regclass",
        (value,),
    )
    loaded.sql(
        "UPDATE pgtrickle.pgt_watermark_history SET watermark = %s::timestamptz"
        " WHERE source_relid = 'orders'::regclass",
        (value,),
    )
    loaded.sql("UPDATE pgtrickle.pgt_watermark_groups SET effective_watermark = %s::timestamptz", (value,))
    loaded.sql("UPDATE pgtrickle.pgt_stream_tables SET effective_watermark = %s::timestamptz", (value,))
    loaded.sql("INSERT INTO other VALUES (2)")
    loaded.sql("INSERT INTO orders VALUES (3, 30)")
    time_passes(loaded)
    scheduler = Scheduler(loaded.settings, loaded.dsn)
    try:
        report = scheduler.tick()
        assert "plain" in {o.st.name for o in report.refreshed}, report
        assert_oracle(loaded, "plain")
        # The CLI shows it too (as the far past or future) instead of failing.
        from typer.testing import CliRunner

        from pgtrickle.cli.main import app

        runner = CliRunner(env={"COLUMNS": "250"})
        for command in ("watermarks", "status"):
            result = runner.invoke(app, ["--dsn", loaded.dsn, command], catch_exceptions=False)
            assert result.exit_code == 0, result.output
        # The API replaces the bad value, even with an earlier watermark.
        loaded.sql("SELECT pgtrickle.advance_watermark('orders', %s)", (NOON + timedelta(minutes=5),))
        loaded.sql("SELECT pgtrickle.advance_watermark('lines', %s)", (NOON + timedelta(minutes=5),))
        assert loaded.scalar(
            "SELECT watermark FROM pgtrickle.watermarks() WHERE source = 'public.orders'"
        ) == NOON + timedelta(minutes=5)
        loaded.sql("INSERT INTO other VALUES (3)")
        time_passes(loaded)
        report = scheduler.tick()
        assert {"plain", "report"} <= {o.st.name for o in report.refreshed}, report
    finally:
        scheduler.close()
    assert_oracle(loaded)
