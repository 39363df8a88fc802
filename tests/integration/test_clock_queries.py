"""Stream tables whose query reads the clock (now(), current_date, ...): refreshed on schedule
without source changes, with the clock pinned to the refresh's snapshot, and honest staleness."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

WINDOW = "SELECT id, ts FROM ev WHERE ts > now() - interval '3 seconds'"


def rows_in_window(db: Database, name: str) -> list[int]:
    """The rows the time window implies at the stream table's data_timestamp (computed independently)."""
    return [
        r[0]
        for r in db.sql(
            "SELECT id FROM ev, pgtrickle.pgt_stream_tables s WHERE s.pgt_name = %s"
            " AND ev.ts > s.data_timestamp - interval '3 seconds' ORDER BY id",
            (name,),
        )
    ]


def contents(db: Database, name: str) -> list[int]:
    return [r[0] for r in db.sql(f"SELECT id FROM {name} ORDER BY id")]


def test_a_time_window_is_refreshed_on_schedule_while_its_sources_are_idle(db: Database) -> None:
    db.sql("CREATE TABLE ev (id int PRIMARY KEY, ts timestamptz NOT NULL)")
    db.sql("INSERT INTO ev VALUES (1, now()), (2, now() - interval '1 hour'), (3, now() + interval '1 hour')")
    create_st(db, "recent", WINDOW, schedule="1s", refresh_mode="FULL")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        scheduler.tick()  # the initialization
        assert contents(db, "recent") == [1, 3]
        assert contents(db, "recent") == rows_in_window(db, "recent")
        assert_oracle(db, "recent")
        first = db.scalar("SELECT data_timestamp FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'recent'")

        time.sleep(3.5)  # row 1 leaves the window; nothing changes in ev
        report = scheduler.tick()
        assert [(o.st.name, o.action) for o in report.refreshed] == [("recent", Action.FULL)]
        assert contents(db, "recent") == [3], "the window moved: row 1 must be gone"
        assert contents(db, "recent") == rows_in_window(db, "recent")
        assert_oracle(db, "recent")
        second = db.scalar("SELECT data_timestamp FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'recent'")
        assert second - first >= timedelta(seconds=3.5)
        history = db.sql(
            "SELECT action, status, initiated_by FROM pgtrickle.get_refresh_history('recent', 1)"
        )
        assert history == [("FULL", "COMPLETED", "SCHEDULER")]
    finally:
        scheduler.close()
    assert db.scalar("SELECT reads_clock FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'recent'") is True
    explain = db.sql("SELECT effective_mode, reason FROM pgtrickle.explain_refresh_mode('recent')")[0]
    assert explain[0] == "FULL" and "reads the clock" in explain[1]


def test_staleness_is_the_age_of_the_last_recompute(db: Database) -> None:
    db.sql("CREATE TABLE ev (id int PRIMARY KEY, ts timestamptz NOT NULL)")
    db.sql("INSERT INTO ev VALUES (1, now())")
    create_st(db, "recent", WINDOW, schedule="1h", refresh_mode="FULL")
    refresh_and_check(db, "recent")
    before = db.scalar("SELECT data_timestamp FROM pgtrickle.pgt_stream_tables")
    # data_timestamp is the time the clock was read at (the refresh's snapshot), so the rows
    # the window implies at data_timestamp are exactly the contents.
    assert contents(db, "recent") == rows_in_window(db, "recent") == [1]
    time.sleep(1.2)
    staleness = db.scalar("SELECT pgtrickle.get_staleness('recent')")
    assert staleness >= timedelta(seconds=1.2)
    info = db.scalar("SELECT staleness FROM pgtrickle.stream_tables_info WHERE name = 'public.recent'")
    assert info >= timedelta(seconds=1.2)
    # Another refresh with no source change still recomputes (it is not NO_DATA) and resets the age.
    [outcome] = refresh_and_check(db, "recent")
    assert outcome.action is Action.FULL and "reads the clock" in outcome.reason
    after = db.scalar("SELECT data_timestamp FROM pgtrickle.pgt_stream_tables")
    assert after - before >= timedelta(seconds=1.2)


def test_current_date_and_localtimestamp_are_pinned_too(db: Database) -> None:
    db.sql("CREATE TABLE ev (id int PRIMARY KEY, ts timestamptz NOT NULL, d date NOT NULL)")
    db.sql(
        "INSERT INTO ev VALUES (1, now() - interval '1 second', current_date),"
        " (2, now() + interval '1 day', current_date - 3), (3, now() - interval '1 day', current_date + 1)"
    )
    create_st(
        db,
        "today",
        "SELECT id, d = current_date AS today, ts < localtimestamp::timestamptz AS past,"
        " ts <= clock_timestamp() AS before_clock, ts < current_timestamp AS before_now FROM ev",
        schedule="1h",
    )
    refresh_and_check(db, "today")
    assert db.sql("SELECT id, today, past, before_clock, before_now FROM today ORDER BY id") == [
        (1, True, True, True, True),
        (2, False, False, False, False),
        (3, False, True, True, True),
    ]


def test_a_query_that_only_names_now_does_not_read_the_clock(db: Database) -> None:
    db.sql('CREATE TABLE ev (id int PRIMARY KEY, "now" int)')
    db.sql("INSERT INTO ev VALUES (1, 5)")
    create_st(db, "plain", "SELECT id, \"now\", 'now()' AS label FROM ev", schedule="1h")
    assert db.scalar("SELECT reads_clock FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'plain'") is False
    refresh_and_check(db, "plain")
    [outcome] = refresh_and_check(db, "plain")
    assert outcome.action is Action.NO_DATA
