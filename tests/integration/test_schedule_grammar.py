"""One schedule grammar for the SQL API and the daemon (docs/SQL_API.md, "Schedules").

Random schedule strings (valid, near-valid and garbage) go to both halves: the SQL API's
pgtrickle._validate_schedule and the daemon's parse_schedule. Each is accepted by SQL exactly
when the daemon accepts it, SQL stores the daemon's canonical form, and that stored form means
the same schedule (the same next due time) as what the user wrote. A schedule already stored that
the daemon cannot parse puts that stream table in ERROR and stops nothing else.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import ScheduleError
from pgtrickle.daemon.loop import Scheduler
from pgtrickle.scheduler.schedule import CalculatedSchedule, next_due, parse_schedule
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import assert_oracle

pytestmark = pytest.mark.integration

WS = [" ", "  ", "\t", "\n", "\r", "\f", "\v", ""]
UNITS = ["w", "d", "h", "m", "s", "ms", "W", "MS", "x", "sec", "y"]
CRON_ATOMS = ["*", "0", "1", "5", "7", "12", "13", "23", "24", "29", "30", "31", "32", "59", "60", "007",
              "jan", "FEB", "apr", "dec", "sun", "Mon", "sat", "L", "?", "#", "H", "", "99999999999"]


@st.composite
def durations(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.tuples(st.integers(0, 10**6).map(str) | st.sampled_from(["0", "007", "1" * 12]),
                                    st.sampled_from(WS), st.sampled_from(UNITS), st.sampled_from(WS)),
                          min_size=1, max_size=4))
    return draw(st.sampled_from(WS)) + "".join("".join(p) for p in parts)


@st.composite
def cron_items(draw: st.DrawFn) -> str:
    item = draw(st.sampled_from(CRON_ATOMS))
    if draw(st.booleans()):
        item += "-" + draw(st.sampled_from(CRON_ATOMS))
    if draw(st.booleans()):
        item += "/" + draw(st.sampled_from(["0", "1", "2", "5", "7", "15", "31", "59", "60", ""]))
    return item


@st.composite
def crons(draw: st.DrawFn) -> str:
    fields = draw(st.lists(st.lists(cron_items(), min_size=1, max_size=3).map(",".join), min_size=4, max_size=6))
    seps = [draw(st.sampled_from(WS[:-1])) for _ in fields]
    return "".join(f + s for f, s in zip(fields, seps, strict=True)).rstrip(draw(st.sampled_from(["", " "])))


@st.composite
def day_crons(draw: st.DrawFn) -> str:
    """Valid-looking expressions around the day-of-month / month edge (never-firing ones among them)."""
    day = draw(st.sampled_from(["28", "29", "30", "31", "30,31", "29-31", "*/30", "31/1", "*"]))
    month = draw(st.sampled_from(["2", "4", "feb", "2,4", "4,6,9,11", "*", "1-2", "2/2", "jan-feb"]))
    dow = draw(st.sampled_from(["*", "0", "mon-fri", "*/1", "7"]))
    return f"0 0 {day} {month} {dow}"


schedules = st.one_of(
    durations(), crons(), day_crons(),
    st.sampled_from(["calculated", " CALCULATED ", "@hourly", "@DAILY", "@weekly", "@monthly", "@yearly",
                     "@annually", "@reboot", "@", "30 s", "1 d", "0 0 31 4 *", "0 0 29 2 *", "1h 30m", "90m"]),
    st.text(alphabet="0123456789smhdwSMHDW@*/,- \t;'", max_size=30),
    st.text(max_size=20).filter(lambda t: "\x00" not in t),
)
TIMES = [datetime(2024, 2, 28, 23, 59, 30, tzinfo=UTC), datetime(2025, 6, 30, 12, 0, tzinfo=UTC),
         datetime(2027, 12, 31, 23, 0, tzinfo=UTC)]


def _sql(conn: psycopg.Connection, text: str) -> str | None:
    try:
        with conn.transaction():
            row = conn.execute("SELECT pgtrickle._validate_schedule(%s)", (text,)).fetchone()
    except psycopg.errors.InvalidParameterValue:
        return None
    assert row is not None
    return str(row[0])


@pytest.mark.stress
@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=schedules)
@example("30 s")
@example("1 d")
@example("0 0 31 4 *")
@example("0 0 31 2 *")
@example("0 0 30,31 2 *")
@example("0 0 31 4 mon")
@example("0000000001s")
@example("0 0 * * 7")
def test_sql_and_daemon_accept_the_same_schedules_with_the_same_meaning(db: Database, text: str) -> None:
    stored = _sql(db.conn, text)
    try:
        parsed = parse_schedule(text)
    except ScheduleError:
        assert stored is None, f"SQL accepted {text!r} as {stored!r}, the daemon refuses it"
        return
    assert stored is not None, f"the daemon accepts {text!r}, SQL refuses it"
    assert stored == parsed.canonical()
    again = parse_schedule(stored)
    assert again == parsed
    if isinstance(parsed, CalculatedSchedule):
        return
    for last in TIMES:
        assert next_due(again, last, last) == next_due(parsed, last, last)


def test_stored_schedules_are_canonical(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("SELECT pgtrickle.create_stream_table('a', 'SELECT id, v FROM src', schedule => '90 m', initialize => false)")
    db.sql("SELECT pgtrickle.create_stream_table('b', 'SELECT id FROM src', schedule => ' 0 0 * *   MON-fri ', initialize => false)")
    db.sql("SELECT pgtrickle.alter_stream_table('a', schedule => '1 d 12 h')")
    assert db.sql("SELECT pgt_name, schedule FROM pgtrickle.pgt_stream_tables ORDER BY 1") == [
        ("a", "1d12h"), ("b", "0 0 * * mon-fri")]
    for bad, reason in (("0 0 31 4 *", "never fires"), ("30 x", "invalid schedule"), ("61 * * * *", "not a valid cron")):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=reason):
            db.sql("SELECT pgtrickle.alter_stream_table('a', schedule => %s)", (bad,))
    assert db.scalar("SELECT schedule FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'a'") == "1d12h"


def test_a_stored_schedule_the_daemon_cannot_parse_stops_only_its_table(db: Database, spark) -> None:  # type: ignore[no-untyped-def]
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 20) g")
    db.sql("SELECT pgtrickle.create_stream_table('good', 'SELECT id, v FROM src', schedule => '1s')")
    db.sql("SELECT pgtrickle.create_stream_table('bad', 'SELECT id FROM src', schedule => '1s')")
    # Written by an older version (or by hand): not in the grammar.
    db.sql("UPDATE pgtrickle.pgt_stream_tables SET schedule = '0 0 31 4 *' WHERE pgt_name = 'bad'")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        report = scheduler.tick()
        assert [o.st.name for o in report.refreshed] == ["good"]
        status, error = db.sql("SELECT status, last_error FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'bad'")[0]
        assert status == "ERROR"
        assert "invalid schedule '0 0 31 4 *'" in error and "never fires" in error
        assert_oracle(db, "good")
        db.sql("INSERT INTO src VALUES (100, 100)")
        db.sql("UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '1 hour', "
               "last_attempt_at = last_attempt_at - interval '1 hour'")
        assert [o.st.name for o in scheduler.tick().refreshed] == ["good"]
        assert_oracle(db, "good")
        # Fixed through the API: refreshed again.
        db.sql("SELECT pgtrickle.alter_stream_table('bad', schedule => '1s', status => 'ACTIVE')")
        assert "bad" in [o.st.name for o in scheduler.tick().refreshed]
        assert_oracle(db, "good", "bad")
    finally:
        scheduler.close()
