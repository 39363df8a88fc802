"""The monitoring integration against a running daemon: every metric a dashboard panel or an alerting rule
reads is served by ``/metrics``, with the labels the query expects (integrations/monitoring)."""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from integrations.monitoring import dashboard, references
from prometheus_client.parser import text_string_to_metric_families

from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    """The samples a scrape of the daemon returns: (name, labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    families = text_string_to_metric_families(text)
    return [(s.name, s.labels, s.value) for family in families for s in family.samples]


def served(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, set[str]]:
    """Sample name -> the label names its samples carry."""
    out: dict[str, set[str]] = {}
    for name, labels, _ in samples:
        out.setdefault(name, set()).update(labels)
    return out


def advance(db: Database, source: str, at: datetime, statement: str | None = None) -> None:
    """A loader transaction: optionally load rows, then advance the source's watermark."""
    with psycopg.connect(db.dsn) as conn:
        if statement:
            conn.execute(statement)  # type: ignore[arg-type]
        conn.execute("SELECT pgtrickle.advance_watermark(%s, %s)", (source, at))


def test_every_metric_the_dashboard_and_alerts_use_is_served(db: Database) -> None:
    # A trigger-captured source whose stream table fails on a non-number and trips its breaker.
    db.sql("CREATE TABLE src (id int PRIMARY KEY, s text)")
    db.sql("INSERT INTO src SELECT g, g::text FROM generate_series(1, 50) g")
    create_st(db, "nums", "SELECT id, s::int AS n FROM src", schedule="1h", refresh_mode="FULL")
    # A WAL-captured source: a replication slot and its lag.
    db.sql("CREATE TABLE wsrc (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO wsrc SELECT g, g FROM generate_series(1, 20) g")
    create_st(db, "total", "SELECT sum(v) AS s FROM wsrc", schedule="1h")
    db.sql("SELECT pgtrickle.set_cdc_mode('wsrc', 'wal')")
    # A watermark group whose gate closes when one loader runs ahead of the other.
    db.sql("CREATE TABLE wa (id int)")
    db.sql("CREATE TABLE wb (id int)")
    db.sql("SELECT pgtrickle.create_watermark_group('loads', ARRAY['wa', 'wb'])")
    advance(db, "wa", T0, "INSERT INTO wa SELECT generate_series(1, 10)")
    advance(db, "wb", T0, "INSERT INTO wb SELECT generate_series(1, 10)")
    create_st(db, "joined", "SELECT wa.id FROM wa JOIN wb ON wa.id = wb.id", schedule="1h")

    scheduler = Scheduler(db.settings.with_overrides(metrics_port=0), db.dsn)
    try:
        thread = threading.Thread(
            target=scheduler.run, kwargs={"max_ticks": 1, "install_signal_handlers": False}
        )
        thread.start()
        thread.join(timeout=180)
        assert not thread.is_alive()
        port = scheduler.metrics.port
        assert port
        mode = db.scalar("SELECT cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_name = 'wsrc'")
        assert mode == "wal"
        assert_oracle(db)

        db.sql("INSERT INTO src VALUES (100, 'x')")  # a failed refresh
        db.sql("SELECT pgtrickle.refresh_stream_table('nums')")
        scheduler.tick()
        db.sql("DELETE FROM src WHERE id = 100")  # a circuit breaker skip
        db.sql(
            "SELECT pgtrickle.alter_stream_table('nums', circuit_breaker => 'fixed', "
            "circuit_breaker_ceiling => 1)"
        )
        db.sql("UPDATE src SET s = '8' WHERE id <= 5")
        db.sql("SELECT pgtrickle.refresh_stream_table('nums')")
        scheduler.tick()
        advance(db, "wa", T0 + timedelta(minutes=10), "INSERT INTO wa VALUES (11)")  # a watermark skip
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = now() - interval '2h', "
            "last_attempt_at = now() - interval '2h' WHERE pgt_name = 'joined'"
        )
        db.sql("INSERT INTO wsrc VALUES (21, 21)")  # WAL for the slot to retain
        scheduler.tick()
        scheduler._maintenance(force=True)  # refresh the state series now
        samples = scrape(port)
    finally:
        scheduler.close()

    got = served(samples)
    used_by_dashboard = references.dashboard_uses(json.loads(dashboard.JSON_PATH.read_text()))
    used_by_rules = references.rules_uses(references.RULES_PATH.read_text())
    assert references.missing(used_by_dashboard, got) == []
    assert references.missing(used_by_rules, got) == []
    # The series the watermark, breaker and slot lag alerts read carry the values they match on.
    value = {(name, tuple(sorted(labels.items()))): v for name, labels, v in samples}
    nums, joined = ("st", "public.nums"), ("st", "public.joined")
    assert value[("pgtrickle_refresh_skips_total", (("reason", "watermark"), joined))] == 1
    assert value[("pgtrickle_refresh_skips_total", (("reason", "circuit_breaker"), nums))] == 1
    assert value[("pgtrickle_circuit_breaker_open", (nums,))] == 1
    assert value[("pgtrickle_refresh_failures_total", (nums,))] == 1
    assert value[("pgtrickle_stream_table_status", (nums, ("status", "ACTIVE")))] == 1
    assert next(v for name, _, v in samples if name == "pgtrickle_slot_lag_bytes") >= 0

    # Bring every stream table back in line and check them against their queries.
    db.sql("SELECT pgtrickle.reset_circuit_breaker('nums')")
    advance(db, "wb", T0 + timedelta(minutes=10), "INSERT INTO wb VALUES (11)")
    refresh(db)
    assert_oracle(db)
