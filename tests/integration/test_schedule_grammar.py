"""One schedule grammar (docs/SQL_API.md, "Schedules: one grammar").

pgtrickle._parse_schedule in the catalog is the only parser. These tests hold it to the grammar
(what it accepts, the parsed form it gives, what it refuses and why), and check that every way
in — create_stream_table, alter_stream_table, a direct write of the catalog, the default_schedule
setting — goes through it, and that the daemon's view of a stream table's schedule is the parsed
form the catalog stored (the daemon decodes it, pgtrickle.scheduler.schedule.schedule_from_parsed,
and never parses text). A stored schedule the grammar refuses puts that stream table in ERROR and
stops nothing else.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgtrickle.catalog.install import install
from pgtrickle.catalog.store import load_stream_tables
from pgtrickle.daemon.loop import Scheduler
from pgtrickle.scheduler.cron import CronSpec
from pgtrickle.scheduler.schedule import (
    CalculatedSchedule,
    CronSchedule,
    IntervalSchedule,
    Schedule,
    next_due,
    schedule_from_parsed,
)
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import assert_oracle, catalog_fingerprint, create_st, store_unparsed_schedule

pytestmark = pytest.mark.integration

HINT = "Use a duration such as '30s'"


def cron(**fields: Any) -> CronSchedule:
    return CronSchedule(CronSpec.of(**fields))


# (text, canonical text, the schedule it means)
ACCEPTED: list[tuple[str, str, Schedule]] = [
    ("30s", "30s", IntervalSchedule(30)),
    ("5m", "5m", IntervalSchedule(300)),
    ("1h", "1h", IntervalSchedule(3600)),
    ("1h30m", "1h30m", IntervalSchedule(5400)),
    ("1h 30m", "1h30m", IntervalSchedule(5400)),
    ("1h\t30m ", "1h30m", IntervalSchedule(5400)),
    ("90m", "1h30m", IntervalSchedule(5400)),
    ("1H30M", "1h30m", IntervalSchedule(5400)),
    ("  30s  ", "30s", IntervalSchedule(30)),
    ("30 s", "30s", IntervalSchedule(30)),
    ("1 d", "1d", IntervalSchedule(86400)),
    ("1 h 30 m", "1h30m", IntervalSchedule(5400)),
    ("1s 5 MS", "1s5ms", IntervalSchedule(1.005)),
    ("2d", "2d", IntervalSchedule(172800)),
    ("7d", "1w", IntervalSchedule(604800)),
    ("1w2d3h4m5s6ms", "1w2d3h4m5s6ms", IntervalSchedule(604800 + 2 * 86400 + 3 * 3600 + 4 * 60 + 5.006)),
    ("1s500ms", "1s500ms", IntervalSchedule(1.5)),
    ("1000ms", "1s", IntervalSchedule(1)),
    ("3600s", "1h", IntervalSchedule(3600)),
    ("0h1s", "1s", IntervalSchedule(1)),
    ("007s", "7s", IntervalSchedule(7)),
    ("0000000001s", "1s", IntervalSchedule(1)),
    ("1s", "1s", IntervalSchedule(1)),
    ("366d", "52w2d", IntervalSchedule(366 * 86400)),
    ("8784h", "52w2d", IntervalSchedule(366 * 86400)),
    ("31622400s", "52w2d", IntervalSchedule(366 * 86400)),
    ("calculated", "calculated", CalculatedSchedule()),
    (" CALCULATED ", "calculated", CalculatedSchedule()),
    ("*/5 * * * *", "*/5 * * * *", cron(minute=range(0, 60, 5))),
    ("  */5   *  * * *  ", "*/5 * * * *", cron(minute=range(0, 60, 5))),
    ("* * * * *", "* * * * *", cron()),
    ("0 0 * * MON-FRI", "0 0 * * mon-fri", cron(minute=[0], hour=[0], day_of_week=range(1, 6))),
    ("0 12 1 JAN *", "0 12 1 jan *", cron(minute=[0], hour=[12], day_of_month=[1], month=[1])),
    (
        "0,30 9-17 * * 1-5",
        "0,30 9-17 * * 1-5",
        cron(minute=[0, 30], hour=range(9, 18), day_of_week=range(1, 6)),
    ),
    ("5/20 * * * *", "5/20 * * * *", cron(minute=[5, 25, 45])),
    ("0 9-17/4 * * *", "0 9-17/4 * * *", cron(minute=[0], hour=[9, 13, 17])),
    ("0 0 * * 7", "0 0 * * 7", cron(minute=[0], hour=[0], day_of_week=[0])),
    ("0 0 * * 0,7,sun", "0 0 * * 0,7,sun", cron(minute=[0], hour=[0], day_of_week=[0])),
    ("0 0 * * FRI-sat", "0 0 * * fri-sat", cron(minute=[0], hour=[0], day_of_week=[5, 6])),
    ("59,1,1 * * * *", "59,1,1 * * * *", cron(minute=[1, 59])),
    ("0 0 29 2 *", "0 0 29 2 *", cron(minute=[0], hour=[0], day_of_month=[29], month=[2])),
    (
        "0 0 31 4 mon",
        "0 0 31 4 mon",
        cron(minute=[0], hour=[0], day_of_month=[31], month=[4], day_of_week=[1], day_or=True),
    ),
    (
        "0 0 13 * fri",
        "0 0 13 * fri",
        cron(minute=[0], hour=[0], day_of_month=[13], day_of_week=[5], day_or=True),
    ),
    ("0 0 30 2 */1", "0 0 30 2 */1", cron(minute=[0], hour=[0], day_of_month=[30], month=[2], day_or=True)),
    ("@hourly", "@hourly", cron(minute=[0])),
    ("@daily", "@daily", cron(minute=[0], hour=[0])),
    (" @DAILY ", "@daily", cron(minute=[0], hour=[0])),
    ("@weekly", "@weekly", cron(minute=[0], hour=[0], day_of_week=[0])),
    ("@monthly", "@monthly", cron(minute=[0], hour=[0], day_of_month=[1])),
    ("@yearly", "@yearly", cron(minute=[0], hour=[0], day_of_month=[1], month=[1])),
]

# (text, what the error says)
REJECTED: list[tuple[str, str]] = [
    ("0s", r"out of range \(1s to 366d\)"),
    ("999ms", r"out of range \(1s to 366d\)"),
    ("5MS", r"out of range \(1s to 366d\)"),
    ("366d1ms", r"out of range \(1s to 366d\)"),
    ("53w", r"out of range \(1s to 366d\)"),
    ("1" * 150 + "s", r"out of range \(1s to 366d\)"),
    ("5x", "largest first"),
    ("1m1h", "largest first"),
    ("1h1h", "largest first"),
    ("1ms1s", "largest first"),
    ("5sec", "largest first"),
    ("1 m 1 h", "largest first"),
    ("5 minutes", "largest first"),
    ("* * *", "exactly 5 fields"),
    ("* * * * * *", "exactly 5 fields"),
    ("0 * * * * * 2024", "exactly 5 fields"),
    ("61 * * * *", "the minute field '61' is not valid"),
    ("* 24 * * *", "the hour field '24' is not valid"),
    ("*/0 * * * *", r"the minute field '\*/0' is not valid"),
    ("*/60 * * * *", r"the minute field '\*/60' is not valid"),
    ("* * 0 * *", "the day of month field '0' is not valid"),
    ("* * * 13 *", "the month field '13' is not valid"),
    ("* * * * 8", "the day of week field '8' is not valid"),
    ("5-1 * * * *", "the minute field '5-1' is not valid"),
    ("1,,2 * * * *", "the minute field '1,,2' is not valid"),
    ("H * * * *", "the minute field 'h' is not valid"),
    ("0 0 L * *", "the day of month field 'l' is not valid"),
    ("0 0 ? * *", r"the day of month field '\?' is not valid"),
    ("0 0 * * 1#2", "the day of week field '1#2' is not valid"),
    ("0 0 * mon *", "the month field 'mon' is not valid"),
    ("* * * * jan", "the day of week field 'jan' is not valid"),
    ("1.5 * * * *", r"the minute field '1\.5' is not valid"),
    ("0 0 31 2 *", "never fires"),
    ("0 0 31 4 *", "never fires"),
    ("0 0 30,31 2 *", "never fires"),
    ("0 0 31 4,6,9,11 *", "never fires"),
    ("0 0 31/1 4 *", "never fires"),
    ("@reboot", "not a supported cron alias"),
    ("@annually", "not a supported cron alias"),
    ("@", "not a supported cron alias"),
    ("nope", "not a duration, a cron expression or 'calculated'"),
    ("1.5h", "not a duration, a cron expression or 'calculated'"),
    ("-5m", "not a duration, a cron expression or 'calculated'"),
    ("", "must not be NULL or empty"),
    (" \t\n", "must not be NULL or empty"),
]

# Hostile text: quotes, SQL, control characters, long strings, non-ASCII.
HOSTILE = [
    "'",
    '"',
    ";",
    "\\",
    "1m; DROP TABLE x",
    "'; DROP TABLE pgtrickle.pgt_stream_tables; --",
    "5m' OR '1'='1",
    "* * * * *; SELECT 1",
    "* * * * ;",
    "interval '5 minutes'",
    "calculated; DROP TABLE x",
    "$$ 5m $$",
    "\x01",
    "\u0663\u0660s",
    "３０s",
    "30s\u00a0",
    "5m\u200b",
    "\U0001f600",
    "x" * 300,
    "é" * 5000,
]


def parse(conn: psycopg.Connection, text: str) -> dict[str, Any]:
    row = conn.execute("SELECT pgtrickle._parse_schedule(%s)", (text,)).fetchone()
    assert row is not None
    return dict(row[0])


def refusal(conn: psycopg.Connection, text: str | None) -> psycopg.errors.InvalidParameterValue:
    """The error refusing ``text``: invalid_parameter_value (22023), always."""
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute("SELECT pgtrickle._parse_schedule(%s)", (text,))
    assert caught.value.sqlstate == "22023"
    return caught.value


def test_accepted_forms_parse_to_their_canonical_text_and_meaning(db: Database) -> None:
    for text, canonical, meaning in ACCEPTED:
        parsed = parse(db.conn, text)
        assert parsed["schedule"] == canonical, text
        assert schedule_from_parsed(parsed) == meaning, text
        assert parse(db.conn, canonical) == parsed, text  # the canonical text parses to the same form
        assert db.scalar("SELECT pgtrickle._validate_schedule(%s)", (text,)) == canonical


def test_refused_forms_name_the_problem(db: Database) -> None:
    for text, reason in REJECTED:
        error = refusal(db.conn, text)
        message = error.diag.message_primary or ""
        assert re.search(reason, message), (text, message)
        if text.strip():
            shown = text if len(text) <= 80 else text[:77] + "..."
            assert message.startswith(f"invalid schedule '{shown}': "), (text, message)
        assert (error.diag.message_hint or "").startswith(HINT), text


def test_hostile_text_is_refused_clearly(db: Database) -> None:
    for text in HOSTILE:
        error = refusal(db.conn, text)
        message = error.diag.message_primary or ""
        shown = (text if len(text) <= 80 else text[:77] + "...").replace("'", "''")
        assert message.startswith(f"invalid schedule '{shown}'"), (text, message)
        assert len(message) < 300, "the error quotes at most 80 characters of the input"
        assert (error.diag.message_hint or "").startswith(HINT)


def test_null_is_refused(db: Database) -> None:
    assert "must not be NULL" in (refusal(db.conn, None).diag.message_primary or "")


# --- every way in goes through the one parser, and the daemon sees what it stored ---------------


def _daemon_view(db: Database, name: str) -> Schedule:
    sts = load_stream_tables(db.conn)
    (st,) = [s for s in sts.values() if s.name == name]
    return schedule_from_parsed(st.schedule_parsed)


def test_create_alter_and_the_daemon_agree_on_every_accepted_form(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    for i, (text, canonical, meaning) in enumerate(ACCEPTED[::4]):
        create_st(db, f"c{i}", "SELECT id, v FROM src", schedule=text, initialize=False)
        stored, parsed = db.sql(
            "SELECT schedule, schedule_parsed FROM pgtrickle.pgt_stream_tables WHERE pgt_name = %s",
            (f"c{i}",),
        )[0]
        assert (stored, parsed) == (canonical, parse(db.conn, text))
        assert _daemon_view(db, f"c{i}") == meaning
    create_st(db, "a", "SELECT id, v FROM src", schedule="1m", initialize=False)
    for text, canonical, meaning in ACCEPTED:
        db.sql("SELECT pgtrickle.alter_stream_table('a', schedule => %s)", (text,))
        assert db.sql(
            "SELECT schedule, schedule_parsed FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'a'"
        ) == [(canonical, parse(db.conn, text))], text
        assert _daemon_view(db, "a") == meaning, text


def test_every_refused_form_changes_nothing_through_any_way_in(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    create_st(db, "a", "SELECT id, v FROM src", schedule="90 m", initialize=False)
    before = catalog_fingerprint(db)
    setting = db.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'default_schedule'")
    for text in [t for t, _ in REJECTED] + HOSTILE:
        expected = refusal(db.conn, text).diag.message_primary
        with pytest.raises(psycopg.errors.InvalidParameterValue) as created:
            create_st(db, "b", "SELECT id FROM src", schedule=text, initialize=False)
        assert created.value.diag.message_primary == expected
        with pytest.raises(psycopg.errors.InvalidParameterValue) as altered:
            db.sql("SELECT pgtrickle.alter_stream_table('a', schedule => %s)", (text,))
        assert altered.value.diag.message_primary == expected
        # Written into the catalog directly: refused by its trigger, with the same message.
        with pytest.raises(psycopg.errors.InvalidParameterValue) as written:
            db.sql("UPDATE pgtrickle.pgt_stream_tables SET schedule = %s WHERE pgt_name = 'a'", (text,))
        assert written.value.diag.message_primary == expected
        with pytest.raises(psycopg.errors.InvalidParameterValue) as configured:
            db.sql("UPDATE pgtrickle.pgt_settings SET value = %s WHERE name = 'default_schedule'", (text,))
        assert expected in (configured.value.diag.message_primary or "")
    assert catalog_fingerprint(db) == before
    assert db.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'default_schedule'") == setting
    assert _daemon_view(db, "a") == IntervalSchedule(5400)


def test_a_direct_write_of_the_catalog_is_parsed_like_the_api(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    create_st(db, "a", "SELECT id, v FROM src", schedule="1m", initialize=False)
    db.sql("UPDATE pgtrickle.pgt_stream_tables SET schedule = ' 0 0 * *   MON-fri ' WHERE pgt_name = 'a'")
    assert db.scalar("SELECT schedule FROM pgtrickle.pgt_stream_tables") == "0 0 * * mon-fri"
    assert _daemon_view(db, "a") == cron(minute=[0], hour=[0], day_of_week=range(1, 6))
    # Only a write of the schedule parses it: a refresh's catalog updates do not pay for it.
    db.sql("UPDATE pgtrickle.pgt_stream_tables SET last_error = 'x' WHERE pgt_name = 'a'")
    assert (
        db.scalar("SELECT schedule_parsed ->> 'schedule' FROM pgtrickle.pgt_stream_tables")
        == "0 0 * * mon-fri"
    )


def test_the_default_schedule_setting_is_what_the_daemon_uses(db: Database) -> None:
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        assert scheduler.default_schedule() == IntervalSchedule(60)
        db.sql("UPDATE pgtrickle.pgt_settings SET value = ' @HOURLY ' WHERE name = 'default_schedule'")
        assert (
            db.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'default_schedule'") == "@hourly"
        )
        assert scheduler.default_schedule() == cron(minute=[0])
        # 'calculated' cannot resolve a calculated stream table: 1m stands in for it.
        db.sql("UPDATE pgtrickle.pgt_settings SET value = 'calculated' WHERE name = 'default_schedule'")
        assert scheduler.default_schedule() == IntervalSchedule(60)
        db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
        create_st(db, "a", "SELECT id, v FROM src", initialize=False)
        assert _daemon_view(db, "a") == CalculatedSchedule()
        assert scheduler.tick().refreshed == []  # resolved to 1m; created just now, so not due yet
    finally:
        scheduler.close()


# --- property tests ------------------------------------------------------------------------------

WS = [" ", "  ", "\t", "\n", "\r", "\f", "\v", ""]
UNITS = ["w", "d", "h", "m", "s", "ms", "W", "MS", "x", "sec", "y"]
CRON_ATOMS = [
    "*",
    "0",
    "1",
    "5",
    "7",
    "12",
    "13",
    "23",
    "24",
    "29",
    "30",
    "31",
    "32",
    "59",
    "60",
    "007",
    "jan",
    "FEB",
    "apr",
    "dec",
    "sun",
    "Mon",
    "sat",
    "L",
    "?",
    "#",
    "H",
    "",
    "99999999999",
]


@st.composite
def durations(draw: st.DrawFn) -> str:
    parts = draw(
        st.lists(
            st.tuples(
                st.integers(0, 10**6).map(str) | st.sampled_from(["0", "007", "1" * 12]),
                st.sampled_from(WS),
                st.sampled_from(UNITS),
                st.sampled_from(WS),
            ),
            min_size=1,
            max_size=4,
        )
    )
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
    fields = draw(
        st.lists(st.lists(cron_items(), min_size=1, max_size=3).map(",".join), min_size=4, max_size=6)
    )
    seps = [draw(st.sampled_from(WS[:-1])) for _ in fields]
    return "".join(f + s for f, s in zip(fields, seps, strict=True)).rstrip(draw(st.sampled_from(["", " "])))


schedules = st.one_of(
    durations(),
    crons(),
    st.sampled_from([t for t, _, _ in ACCEPTED] + [t for t, _ in REJECTED] + HOSTILE),
    st.text(alphabet="0123456789smhdwSMHDW@*/,- \t;'", max_size=30),
    st.text(max_size=20).filter(lambda t: "\x00" not in t),
)
TIMES = [datetime(2024, 2, 28, 23, 59, 30, tzinfo=UTC), datetime(2027, 12, 31, 23, 0, tzinfo=UTC)]


# 300 examples in `make test` (each is a round trip to the server's parser: ~0.1 s under load); the
# thorough profile (`make stress`) tries 3,000.
@pytest.mark.stress
@settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=schedules)
@example("0 0 30 2 *")
@example("1" * 250 + "s")
def test_any_text_is_refused_with_22023_or_parsed_to_a_form_the_daemon_reads(db: Database, text: str) -> None:
    try:
        with db.conn.transaction():
            parsed = parse(db.conn, text)
    except psycopg.errors.InvalidParameterValue as error:
        assert (error.diag.message_primary or "").startswith(("invalid schedule '", "schedule must not be"))
        assert (error.diag.message_hint or "").startswith(HINT)
        return
    schedule = schedule_from_parsed(parsed)
    canonical = parsed["schedule"]
    assert canonical == " ".join(canonical.split()) and canonical == canonical.lower()
    assert parse(db.conn, canonical) == parsed
    if not isinstance(schedule, CalculatedSchedule):
        for last in TIMES:
            assert next_due(schedule, last, last) > last


# A cron field built from items whose values are known: (low, high, step) ranges, shown as text in
# the ways the grammar allows ('*', 'n', 'a-b', with '/step', names, any case).
FIELDS = [
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day_of_month", 1, 31, None),
    ("month", 1, 12, ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
    ("day_of_week", 0, 7, ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
]


@st.composite
def cron_field(draw: st.DrawFn, low: int, high: int, names: list[str] | None) -> tuple[str, set[int]]:
    def show(value: int) -> str:
        if names and value - low < len(names) and draw(st.booleans()):
            name = names[value - low]
            return draw(st.sampled_from([name, name.upper(), name.title()]))
        return str(value)

    items, values = [], set()
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.sampled_from(["star", "one", "range"]))
        step = draw(st.sampled_from([None, 1, 2, 3, 5, high]))
        if shape == "star":
            text, first, last = "*", low, high
        else:
            first = draw(st.integers(low, high))
            last = draw(st.integers(first, high)) if shape == "range" else (first if step is None else high)
            text = show(first) + (f"-{show(last)}" if shape == "range" else "")
        items.append(text + (f"/{step}" if step else ""))
        values |= set(range(first, last + 1, step or 1))
    return ",".join(items), values


@st.composite
def cron_expressions(draw: st.DrawFn) -> tuple[str, dict[str, set[int]]]:
    texts, sets = [], {}
    for name, low, high, names in FIELDS:
        text, values = draw(cron_field(low, high, names))
        texts.append(text)
        sets[name] = {v % 7 for v in values} if name == "day_of_week" else values
    return " ".join(texts), sets


@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cron_expressions())
def test_each_cron_field_means_the_values_its_items_name(
    db: Database, case: tuple[str, dict[str, set[int]]]
) -> None:
    text, sets = case
    try:
        with db.conn.transaction():
            parsed = parse(db.conn, text)
    except psycopg.errors.InvalidParameterValue as error:
        assert "never fires" in (error.diag.message_primary or "")
        return
    assert {name: set(parsed[name]) for name in sets} == sets
    fields = text.split(" ")
    assert parsed["day_or"] is (fields[2] != "*" and fields[4] != "*")
    assert parsed["schedule"] == text.lower()


# --- stored schedules the grammar refuses ---------------------------------------------------------


def test_install_stores_the_parsed_form_of_every_stored_schedule(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    for name in ("a", "b", "c"):
        create_st(db, name, "SELECT id, v FROM src", schedule="1m", initialize=False)
    store_unparsed_schedule(db, "90m", "a")
    store_unparsed_schedule(db, "0 0 31 4 *", "b")
    with db.conn.transaction():  # a stale form (an older version's parser): derived again
        db.sql("ALTER TABLE pgtrickle.pgt_stream_tables DISABLE TRIGGER parse_schedule")
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET schedule_parsed = '{\"kind\": \"old\"}' WHERE pgt_name = 'c'"
        )
        db.sql("ALTER TABLE pgtrickle.pgt_stream_tables ENABLE TRIGGER parse_schedule")
    install(db.conn)
    rows = db.sql("SELECT pgt_name, schedule, schedule_parsed FROM pgtrickle.pgt_stream_tables ORDER BY 1")
    assert rows == [
        ("a", "90m", parse(db.conn, "90m")),
        ("b", "0 0 31 4 *", None),
        ("c", "1m", parse(db.conn, "1m")),
    ]
    sts = {st.name: st for st in load_stream_tables(db.conn).values()}
    assert schedule_from_parsed(sts["a"].schedule_parsed) == IntervalSchedule(5400)
    assert sts["b"].schedule_parsed is not None and sts["b"].schedule_parsed["kind"] == "invalid"


def test_a_stored_schedule_the_grammar_refuses_stops_only_its_table(db: Database, spark) -> None:  # type: ignore[no-untyped-def]
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 20) g")
    db.sql("SELECT pgtrickle.create_stream_table('good', 'SELECT id, v FROM src', schedule => '1s')")
    db.sql("SELECT pgtrickle.create_stream_table('bad', 'SELECT id FROM src', schedule => '1s')")
    store_unparsed_schedule(db, "0 0 31 4 *", "bad")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        report = scheduler.tick()
        assert [o.st.name for o in report.refreshed] == ["good"]
        status, error = db.sql(
            "SELECT status, last_error FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'bad'"
        )[0]
        assert status == "ERROR"
        assert "invalid schedule '0 0 31 4 *'" in error and "never fires" in error
        assert_oracle(db, "good")
        db.sql("INSERT INTO src VALUES (100, 100)")
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '1 hour', "
            "last_attempt_at = last_attempt_at - interval '1 hour'"
        )
        assert [o.st.name for o in scheduler.tick().refreshed] == ["good"]
        assert_oracle(db, "good")
        # Fixed through the API: refreshed again.
        db.sql("SELECT pgtrickle.alter_stream_table('bad', schedule => '1s', status => 'ACTIVE')")
        assert "bad" in [o.st.name for o in scheduler.tick().refreshed]
        assert_oracle(db, "good", "bad")
    finally:
        scheduler.close()
