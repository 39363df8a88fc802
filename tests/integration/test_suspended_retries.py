"""A SUSPENDED stream table is not retried automatically (queued requests included) until it is
resumed; an explicit refresh by its owner still runs, once, and says so."""

from __future__ import annotations

import pytest

from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]


def counts(db: Database) -> tuple[int, int, int, int]:
    """(history rows, refresh_failed alerts, auto_suspended alerts, queued requests) of 'nums'."""
    return (
        int(db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history")),
        int(db.scalar("SELECT count(*) FROM pgtrickle.alerts WHERE event = 'refresh_failed'")),
        int(db.scalar("SELECT count(*) FROM pgtrickle.alerts WHERE event = 'auto_suspended'")),
        int(db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_requests")),
    )


def test_a_suspended_initialization_is_not_retried_until_resumed(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, s text)")
    db.sql("INSERT INTO src VALUES (1, '1'), (2, 'not a number')")
    create_st(db, "nums", "SELECT id, s::int AS n FROM src", schedule="1h", refresh_mode="FULL")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        for _ in range(3):  # the queued initialization fails three times
            assert len(scheduler.tick().failed) == 1
        assert db.sql("SELECT status, consecutive_errors FROM pgtrickle.pgt_stream_tables") == [
            ("SUSPENDED", 3)
        ]
        assert counts(db) == (3, 3, 1, 0), "suspending drops the queued initialization"

        for _ in range(4):  # suspended: nothing is attempted, no Spark job, no history, no alert
            report = scheduler.tick()
            assert report.refreshed == [] and report.failed == []
        assert counts(db) == (3, 3, 1, 0)

        # The owner asks explicitly: it runs once (and fails again: the data is still bad), and is told so.
        notices: list[str] = []
        db.conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        db.sql("SELECT pgtrickle.refresh_stream_table('nums')")
        assert any("SUSPENDED" in n and "resume_stream_table" in n for n in notices), notices
        assert len(scheduler.tick().failed) == 1
        assert counts(db) == (4, 4, 1, 0)
        for _ in range(3):
            assert scheduler.tick().failed == []
        assert counts(db) == (4, 4, 1, 0)
        assert db.sql("SELECT status FROM pgtrickle.pgt_stream_tables") == [("SUSPENDED",)]

        # Fixed and resumed: it initializes at once.
        db.sql("UPDATE src SET s = '2' WHERE id = 2")
        db.sql("SELECT pgtrickle.resume_stream_table('nums')")
        report = scheduler.tick()
        assert [(o.st.name, o.action) for o in report.refreshed] == [("nums", Action.FULL)]
        assert db.sql("SELECT status, consecutive_errors FROM pgtrickle.pgt_stream_tables") == [("ACTIVE", 0)]
    finally:
        scheduler.close()
    assert_oracle(db, "nums")


def test_a_queued_initialization_of_a_table_in_error_is_not_run(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, s text)")
    db.sql("INSERT INTO src VALUES (1, 'x')")
    create_st(db, "nums", "SELECT id, s::int AS n FROM src", schedule="1h", refresh_mode="FULL")
    db.sql("UPDATE pgtrickle.pgt_stream_tables SET status = 'ERROR'")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        for _ in range(3):
            assert scheduler.tick().failed == []
        assert int(db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history")) == 0
    finally:
        scheduler.close()
