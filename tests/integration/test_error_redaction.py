"""A failed refresh leaves no source row value in what other roles read: last_error, the
refresh history, pgtrickle.alerts and the NOTIFY payloads (the daemon's log has the full text)."""

from __future__ import annotations

import json
import logging

import psycopg
import pytest

from pgtrickle.errors import PgTrickleError
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

SECRET = "ssn-7731"
SECRET_NUMBER = "918273"


@pytest.fixture
def listener(db: Database):  # type: ignore[no-untyped-def]
    conn = psycopg.connect(db.dsn, autocommit=True)
    conn.execute("LISTEN pg_trickle_alert")
    yield conn
    conn.close()


def everything_readable(db: Database, listener: psycopg.Connection) -> str:
    """All that a pgtrickle_user can read about failures, as one text."""
    notified = [n.payload for n in listener.notifies(timeout=1.0)]
    assert notified, "the failure was alerted"
    parts = [str(r) for r in db.sql("SELECT last_error FROM pgtrickle.stream_tables_info")]
    parts += [str(r) for r in db.sql("SELECT error_message, skip_reason FROM pgtrickle.pgt_refresh_history")]
    parts += [json.dumps(r[0]) for r in db.sql("SELECT payload FROM pgtrickle.alerts")]
    return "\n".join(parts + notified)


def fail_refresh(db: Database, name: str) -> str:
    with pytest.raises(PgTrickleError) as failure:
        refresh(db, name)
    return str(failure.value)


def test_a_failed_cast_shows_no_value(
    db: Database, listener: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    db.sql("CREATE TABLE people (id int PRIMARY KEY, ssn text)")
    db.sql("INSERT INTO people VALUES (1, '12'), (2, %s)", (SECRET,))
    create_st(db, "ids", "SELECT id, ssn::int AS n FROM people", schedule="1h", initialize=False)
    with caplog.at_level(logging.WARNING, logger="pgtrickle"):
        raised = fail_refresh(db, "ids")
    readable = everything_readable(db, listener)
    assert SECRET not in readable and SECRET not in raised
    last_error = db.scalar("SELECT last_error FROM pgtrickle.pgt_stream_tables")
    assert "CAST_INVALID_INPUT" in last_error and "22018" in last_error and '"INT"' in last_error
    assert SECRET in caplog.text, "the daemon's log keeps the full text for the operator"


def test_a_unique_violation_shows_the_constraint_but_not_the_key(
    db: Database, listener: psycopg.Connection
) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, n int)")
    db.sql("INSERT INTO src VALUES (1, 1)")
    create_st(db, "uniq", "SELECT id, n FROM src", schedule="1h", refresh_mode="FULL")
    refresh(db, "uniq")
    assert_oracle(db, "uniq")
    db.sql("CREATE UNIQUE INDEX uniq_n ON uniq (n)")
    db.sql(f"INSERT INTO src VALUES (2, {SECRET_NUMBER}), (3, {SECRET_NUMBER})")
    fail_refresh(db, "uniq")
    readable = everything_readable(db, listener)
    assert SECRET_NUMBER not in readable
    last_error = db.scalar("SELECT last_error FROM pgtrickle.pgt_stream_tables")
    assert '"uniq_n"' in last_error and "23505" in last_error and "Key (n)=(***)" in last_error


def test_a_trigger_message_quoting_a_row_is_withheld(db: Database, listener: psycopg.Connection) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, n int)")
    db.sql("INSERT INTO src VALUES (1, 1)")
    create_st(db, "checked", "SELECT id, n FROM src", schedule="1h", refresh_mode="FULL")
    refresh(db, "checked")
    db.sql("SELECT pgtrickle.set_user_triggers('checked', 'on')")
    db.sql(
        "CREATE FUNCTION no_big() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.n > 1000 THEN RAISE EXCEPTION 'row % has n = %', NEW.id, NEW.n; END IF; RETURN NEW; END $$"
    )
    db.sql("CREATE TRIGGER no_big BEFORE INSERT ON checked FOR EACH ROW EXECUTE FUNCTION no_big()")
    db.sql(f"INSERT INTO src VALUES (2, {SECRET_NUMBER})")
    fail_refresh(db, "checked")
    readable = everything_readable(db, listener)
    assert SECRET_NUMBER not in readable
    assert "P0001" in db.scalar("SELECT last_error FROM pgtrickle.pgt_stream_tables")


def test_real_postgres_messages_redact(db: Database) -> None:
    """Real PostgreSQL error texts (with their DETAIL) lose their values, keep their names."""
    from pgtrickle.ops.error_redaction import redact_message

    db.sql("CREATE TABLE t (id int PRIMARY KEY, s text NOT NULL CHECK (s <> 'forbidden-x'), d date)")
    db.sql("INSERT INTO t VALUES (777001, 'a')")
    cases = [
        ("INSERT INTO t VALUES (777001, 'b')", "777001"),
        ("INSERT INTO t VALUES (777002, 'forbidden-x')", "forbidden-x"),
        ("INSERT INTO t VALUES (777003, NULL)", "777003"),
        ("SELECT 'ssn-4411'::int", "ssn-4411"),
        ("SELECT '99999999999'::int", "99999999999"),
        ("INSERT INTO t VALUES (5, 'a', 'not-a-date-55')", "not-a-date-55"),
    ]
    for statement, value in cases:
        with pytest.raises(psycopg.Error) as err:
            db.sql(statement)
        text = str(err.value)
        assert value in text, text  # the real message does quote it
        redacted = redact_message(" ".join(text.splitlines()))
        assert value not in redacted, (text, redacted)
    with pytest.raises(psycopg.Error) as err:
        db.sql("INSERT INTO t VALUES (777001, 'b')")
    assert redact_message(" ".join(str(err.value).splitlines())).startswith(
        'duplicate key value violates unique constraint "t_pkey" DETAIL:  Key (id)=(***) already exists'
    )
