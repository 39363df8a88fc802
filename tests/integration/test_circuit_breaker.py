"""The circuit breaker end to end: trip, hold, inspect, reset, alerts, the seed's §7 scenario."""

from __future__ import annotations

import json
import random

import psycopg
import pytest

from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, catalog_fingerprint, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2))")
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 7), g FROM generate_series(1, 200) g")
    db.sql("INSERT INTO order_lines SELECT g, 'p' || (g % 5), 1 + g % 3 FROM generate_series(1, 200) g")
    create_st(
        db,
        "order_summary",
        "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer",
        schedule="1h",
    )
    create_st(
        db,
        "line_summary",
        "SELECT product, sum(qty) AS total_qty FROM order_lines GROUP BY product",
        schedule="1h",
    )
    create_st(
        db,
        "order_report",
        "SELECT os.customer, os.total, ls.total_qty FROM order_summary os "
        "JOIN line_summary ls ON ls.product = 'p' || right(os.customer, 1)",
        schedule="1h",
    )
    refresh(db)
    assert_oracle(db)
    return db


def contents(db: Database, table: str) -> list[tuple]:
    return db.sql(f"SELECT * FROM {table} ORDER BY 1")


def alerts(listener: psycopg.Connection) -> list[dict]:
    return [json.loads(n.payload) for n in listener.notifies(timeout=1)]


def test_fixed_breaker_trips_holds_and_alerts(shop: Database) -> None:
    shop.sql(
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker => 'fixed', "
        "circuit_breaker_ceiling => 50)"
    )
    listener = psycopg.connect(shop.dsn, autocommit=True)
    listener.execute("LISTEN pg_trickle_alert")
    before, report_before = contents(shop, "order_summary"), contents(shop, "order_report")
    shop.sql("DELETE FROM orders WHERE id <= 80")
    outcomes = refresh(shop)
    by_name = {o.st.name: o for o in outcomes}
    assert by_name["order_summary"].action is Action.SKIP
    assert "exceeds the ceiling 50" in by_name["order_summary"].reason
    assert by_name["order_report"].action is Action.NO_DATA, "downstream sees no change"
    assert contents(shop, "order_summary") == before and contents(shop, "order_report") == report_before
    [alert] = [a for a in alerts(listener) if a["event"] == "circuit_breaker_tripped"]
    assert alert["st_name"] == "order_summary" and alert["schema"] == "public"
    assert alert["delta_row_count"] == 80 and alert["delete_count"] == 80 and alert["ceiling"] == 50
    assert alert["computed_threshold"] == 50 and "ceiling" in alert["trip_reason"]
    status = shop.sql(
        "SELECT state, last_delta, quarantined_changes FROM pgtrickle.circuit_breaker_status() "
        "WHERE st_name = 'public.order_summary'"
    )
    assert status == [("open", 80, 80)]
    inspect = shop.sql(
        "SELECT source, action, changes, jsonb_array_length(sample) "
        "FROM pgtrickle.inspect_circuit_breaker('order_summary')"
    )
    assert inspect == [("public.orders", "DELETE", 80, 5)]
    history = shop.sql(
        "SELECT action, status, skip_reason FROM pgtrickle.get_refresh_history('order_summary', 1)"
    )
    assert history[0][:2] == ("SKIP", "SKIPPED") and "tripped" in history[0][2]

    # Open: every later refresh is skipped, buffers keep everything, manual refresh needs force.
    assert [o.action for o in refresh(shop, "line_summary")] == [Action.NO_DATA]
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="circuit breaker"):
        shop.sql("SELECT pgtrickle.refresh_stream_table('order_summary')")
    with pytest.raises(PgTrickleError, match="--force"):
        refresh(shop, "order_summary")
    scheduler = Scheduler(shop.settings, shop.dsn)
    try:
        shop.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = now() - interval '2h', "
            "last_attempt_at = now() - interval '2h'"
        )
        report = scheduler.tick()
        assert {o.st.name: o.action for o in report.refreshed}["order_summary"] is Action.SKIP
    finally:
        scheduler.close()
    assert contents(shop, "order_summary") == before
    listener.close()


def test_reset_apply_applies_the_held_back_changes(shop: Database) -> None:
    shop.sql(
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker => 'fixed', "
        "circuit_breaker_ceiling => 10)"
    )
    listener = psycopg.connect(shop.dsn, autocommit=True)
    listener.execute("LISTEN pg_trickle_alert")
    shop.sql("INSERT INTO orders SELECT g, 'new', 1 FROM generate_series(1000, 1050) g")
    assert refresh(shop, "order_summary")[0].action is Action.SKIP
    shop.sql("SELECT pgtrickle.reset_circuit_breaker('order_summary')")
    reset = [a for a in alerts(listener) if a["event"] == "circuit_breaker_reset"]
    assert reset and reset[-1]["action"] == "apply"
    outcomes = refresh(shop)  # the queued forced request applies the 51 changes without re-tripping
    assert {o.st.name: o.action for o in outcomes}["order_summary"] in (Action.FULL, Action.DIFFERENTIAL)
    assert_oracle(shop)
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_quarantine") == 0
    listener.close()


def test_reset_reinitialize_and_skip_changes(shop: Database) -> None:
    shop.sql(
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker => 'fixed', "
        "circuit_breaker_max_ratio => 0.25)"
    )
    shop.sql("DELETE FROM orders WHERE id <= 100")  # half the table
    assert refresh(shop, "order_summary")[0].action is Action.SKIP
    shop.sql("INSERT INTO orders SELECT g, 'c' || (g % 7), g FROM generate_series(1, 100) g")  # the reload
    shop.sql("SELECT pgtrickle.reset_circuit_breaker('order_summary', action => 'reinitialize')")
    [outcome] = [o for o in refresh(shop) if o.st.name == "order_summary"]
    assert outcome.action is Action.FULL and "reinitialization" in outcome.reason
    assert_oracle(shop)

    before = contents(shop, "order_summary")
    shop.sql("DELETE FROM orders WHERE id <= 100")
    assert refresh(shop, "order_summary")[0].action is Action.SKIP
    shop.sql(
        "INSERT INTO orders SELECT g, 'c' || (g % 7), g FROM generate_series(1, 100) g"
    )  # undone at source
    shop.sql("SELECT pgtrickle.reset_circuit_breaker('order_summary', action => 'skip_changes')")
    assert contents(shop, "order_summary") == before
    assert refresh(shop, "order_summary")[0].action is Action.NO_DATA, "the skipped changes are forgotten"
    history = shop.sql("SELECT action, skip_reason FROM pgtrickle.get_refresh_history('order_summary', 2)")
    assert any(a == "SKIP" and "skipped by reset_circuit_breaker" in (r or "") for a, r in history)
    assert_oracle(shop)


def test_resetting_a_closed_breaker_is_a_notice(shop: Database) -> None:
    notices: list[str] = []
    shop.conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    shop.sql("SELECT pgtrickle.reset_circuit_breaker('order_summary')")
    assert any("not open" in n for n in notices)


@pytest.mark.parametrize(
    "call",
    [
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker => 'sometimes')",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker => 'fixed')",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_ceiling => 0)",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_ceiling => -5)",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_max_ratio => 0)",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_max_ratio => 'NaN')",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_sensitivity => -1)",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_sensitivity => 1e9)",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_window => 1)",
        "SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker_baseline => 'median')",
        "SELECT pgtrickle.reset_circuit_breaker('order_summary', action => 'undo')",
        "SELECT pgtrickle.reset_circuit_breaker('order_summary', action => NULL)",
        "SELECT pgtrickle.reset_circuit_breaker('nope')",
        "SELECT * FROM pgtrickle.inspect_circuit_breaker('order_summary', -1)",
        "SELECT pgtrickle.refresh_stream_table('order_summary', force => NULL)",
    ],
)
def test_bad_breaker_input_is_refused_and_changes_nothing(shop: Database, call: str) -> None:
    before = catalog_fingerprint(shop)
    with pytest.raises(psycopg.Error) as info:
        shop.sql(call)
    assert info.value.sqlstate and info.value.sqlstate[:2] in ("22", "42")
    assert catalog_fingerprint(shop) == before


def test_global_default_mode_and_per_table_override(shop: Database) -> None:
    shop.sql("UPDATE pgtrickle.pgt_settings SET value = 'fixed' WHERE name = 'circuit_breaker_default'")
    modes = dict(shop.sql("SELECT st_name, mode FROM pgtrickle.circuit_breaker_status()"))
    assert modes["public.order_summary"] == "fixed"
    shop.sql("SELECT pgtrickle.alter_stream_table('line_summary', circuit_breaker => 'none')")
    modes = dict(shop.sql("SELECT st_name, mode FROM pgtrickle.circuit_breaker_status()"))
    assert modes["public.line_summary"] == "none" and modes["public.order_report"] == "fixed"


def test_seed_scenario_mass_delete_trips_adaptive_and_reinitialize_recovers(db: Database) -> None:
    """Seed 000 §7: ~100 normal cycles, then DELETE FROM orders (50,000 rows)."""
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2))")
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 50), (g % 500) FROM generate_series(1, 50000) g")
    db.sql("INSERT INTO order_lines SELECT g, 'c' || (g % 50), 1 + g % 4 FROM generate_series(1, 2000) g")
    create_st(
        db,
        "order_summary",
        "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer",
        schedule="1h",
    )
    create_st(
        db,
        "line_summary",
        "SELECT product, sum(qty) AS total_qty FROM order_lines GROUP BY product",
        schedule="1h",
    )
    create_st(
        db,
        "order_report",
        "SELECT os.customer, os.total, ls.total_qty FROM order_summary os "
        "JOIN line_summary ls ON os.customer = ls.product",
        schedule="1h",
    )
    db.sql("SELECT pgtrickle.alter_stream_table('order_summary', circuit_breaker => 'adaptive')")
    refresh(db)
    rng = random.Random(12)
    next_id = 100_000
    for _ in range(100):
        n = rng.randint(50, 200)
        db.sql(
            "INSERT INTO orders SELECT g, 'c' || (g %% 50), (g %% 500) FROM generate_series(%s::int, %s::int) g",
            (next_id, next_id + n - 1),
        )
        next_id += n
        [o] = refresh(db, "order_summary")
        assert o.action in (Action.FULL, Action.DIFFERENTIAL), o.reason
    refresh(db)
    assert_oracle(db)
    report_before = contents(db, "order_report")
    summary_before = contents(db, "order_summary")
    db.sql("DELETE FROM orders WHERE id <= 50000")
    outcomes = {o.st.name: o for o in refresh(db)}
    assert outcomes["order_summary"].action is Action.SKIP
    assert "adaptive threshold" in outcomes["order_summary"].reason
    assert contents(db, "order_summary") == summary_before
    assert contents(db, "order_report") == report_before
    status = db.sql(
        "SELECT baseline_mean, computed_threshold FROM pgtrickle.circuit_breaker_status() "
        "WHERE st_name = 'public.order_summary'"
    )[0]
    assert 50 <= status[0] <= 200 and status[1] < 1000
    # the ETL team reloads, then reinitializes
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 50), (g % 500) FROM generate_series(1, 50000) g")
    db.sql("SELECT pgtrickle.reset_circuit_breaker('order_summary', action => 'reinitialize')")
    refresh(db)
    assert_oracle(db)
