"""`pgtrickle refresh A B C` / `--all`: one failing stream table does not block the others."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pgtrickle.cli.main import app
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

runner = CliRunner(env={"COLUMNS": "250"})


def invoke(db: Database, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--dsn", db.dsn, *args], catch_exceptions=False)


@pytest.fixture
def three(db: Database) -> Database:
    """``bad`` fails while a row of ``src`` is not a number; ``bad_down`` reads ``bad``; ``good`` is apart."""
    db.sql("CREATE TABLE src (id int PRIMARY KEY, s text)")
    db.sql("INSERT INTO src SELECT g, g::text FROM generate_series(1, 20) g")
    db.sql("CREATE TABLE other (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO other SELECT g, g FROM generate_series(1, 20) g")
    create_st(db, "bad", "SELECT id, s::int AS n FROM src", schedule="1h", refresh_mode="FULL")
    create_st(db, "bad_down", "SELECT count(*) AS c FROM bad", schedule="1h")
    create_st(db, "good", "SELECT v % 3 AS m, count(*) AS c FROM other GROUP BY v % 3", schedule="1h")
    refresh_and_check(db)
    return db


def _lines(output: str, name: str) -> str:
    return "\n".join(line for line in output.splitlines() if name in line)


def test_refresh_all_goes_on_past_a_failure(three: Database) -> None:
    db = three
    db.sql("UPDATE src SET s = 'x' WHERE id = 1")
    db.sql("INSERT INTO other VALUES (21, 21)")
    result = invoke(db, "refresh", "--all")
    assert result.exit_code == 1, result.output
    assert "FAILED" in _lines(result.output, "public.bad ") and "CAST_INVALID_INPUT" in result.output
    down = _lines(result.output, "public.bad_down")
    assert "SKIPPED" in down and "upstream public.bad failed" in down, result.output
    assert "DIFFERENTIAL" in _lines(result.output, "public.good"), result.output
    assert "1 refreshed, 1 failed, 1 skipped" in result.output
    assert_oracle(db, "good")
    assert db.scalar("SELECT consecutive_errors FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'bad'") == 1

    # Named stream tables: the same, in dependency order whatever the order given.
    db.sql("INSERT INTO other VALUES (22, 22)")
    result = invoke(db, "refresh", "good", "bad_down", "bad")
    assert result.exit_code == 1, result.output
    assert "SKIPPED" in _lines(result.output, "public.bad_down")
    assert "DIFFERENTIAL" in _lines(result.output, "public.good")
    assert_oracle(db, "good")

    # Fixed: everything refreshes, exit status 0.
    db.sql("UPDATE src SET s = '1' WHERE id = 1")
    result = invoke(db, "refresh", "--all")
    assert result.exit_code == 0, result.output
    assert "3 refreshed, 0 failed, 0 skipped" in result.output
    assert_oracle(db)
