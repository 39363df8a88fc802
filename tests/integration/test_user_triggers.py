"""User triggers on stream tables end to end (setting user_triggers = auto | on | off).

A row-level AFTER trigger on the stream tables logs TG_OP / OLD / NEW into a
table; a LISTENing client receives pg_trickle_refresh.
"""

from __future__ import annotations

import json
from collections import Counter

import psycopg
import pytest

from tests.conftest import Database
from tests.integration.helpers import assert_oracle, catalog_fingerprint, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

LINEAR = "SELECT id, grp, v FROM src WHERE v > 0"
AGG = "SELECT grp, sum(v) AS total, count(*) AS n FROM src GROUP BY grp"
DOWN = "SELECT grp, total FROM agg WHERE total > 5"


@pytest.fixture
def sts(db: Database) -> Database:
    """Stream tables lin (linear), agg (aggregate) and down (reads agg), each with an audit trigger."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp text, v int)")
    db.sql("INSERT INTO src SELECT g, 'g' || (g % 4), g FROM generate_series(1, 20) g")
    create_st(db, "lin", LINEAR, schedule="1h")
    create_st(db, "agg", AGG, schedule="1h")
    create_st(db, "down", DOWN, schedule="1h")
    refresh(db)
    assert_oracle(db)
    db.sql("CREATE TABLE audit (seq bigserial, tbl text, op text, old jsonb, new jsonb)")
    db.sql("""CREATE FUNCTION audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN
                INSERT INTO audit (tbl, op, old, new)
                VALUES (TG_TABLE_NAME, TG_OP,
                        CASE WHEN TG_OP IN ('UPDATE', 'DELETE') THEN to_jsonb(OLD) END,
                        CASE WHEN TG_OP IN ('UPDATE', 'INSERT') THEN to_jsonb(NEW) END);
                RETURN NULL;
              END $$""")
    for name in ("lin", "agg"):
        db.sql(
            f"CREATE TRIGGER audit_{name} AFTER INSERT OR UPDATE OR DELETE ON {name}"
            " FOR EACH ROW EXECUTE FUNCTION audit_fn()"
        )
    return db


@pytest.fixture
def listener(db: Database):  # type: ignore[no-untyped-def]
    conn = psycopg.connect(db.dsn, autocommit=True)
    conn.execute("LISTEN pg_trickle_refresh")
    yield conn
    conn.close()


def received(listener: psycopg.Connection, timeout: float = 1.0) -> list[dict]:
    return [
        json.loads(n.payload) for n in listener.notifies(timeout=timeout) if n.channel == "pg_trickle_refresh"
    ]


def _visible(row: dict | None) -> dict | None:
    return None if row is None else {k: v for k, v in row.items() if not k.startswith("__pgt_")}


def audit(db: Database, table: str | None = None) -> list[tuple]:
    """(table, op, OLD, NEW) logged since the last call (visible columns only), then clears the log."""
    rows = db.sql(
        "SELECT tbl, op, old, new FROM audit WHERE %(t)s::text IS NULL OR tbl = %(t)s ORDER BY seq",
        {"t": table},
    )
    db.sql("TRUNCATE audit")
    return [(t, op, _visible(old), _visible(new)) for t, op, old, new in rows]


def enabled(db: Database, trigger: str) -> str:
    return str(db.scalar("SELECT tgenabled::text FROM pg_trigger WHERE tgname = %s", (trigger,)))


def set_mode(db: Database, mode: str) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = %s WHERE name = 'user_triggers'", (mode,))


def actions(outcomes) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {o.st.name: o.action.value for o in outcomes}


def test_differential_refresh_fires_with_correct_old_and_new(sts: Database, listener) -> None:  # type: ignore[no-untyped-def]
    db = sts
    before = {g: (t, n) for g, t, n in db.sql("SELECT grp, total, n FROM agg")}
    db.sql("UPDATE src SET v = 100 WHERE id = 4")  # g0: total +96, lin row 4 changes
    db.sql("DELETE FROM src WHERE id = 5")  # g1: total -5, n -1, lin row 5 goes
    db.sql("INSERT INTO src VALUES (21, 'new', 7)")  # a new group, a new lin row
    db.sql("DELETE FROM src WHERE grp = 'g3'")  # group g3 vanishes, 5 lin rows go
    outcomes = refresh(db)
    assert actions(outcomes) == {"lin": "DIFFERENTIAL", "agg": "DIFFERENTIAL", "down": "DIFFERENTIAL"}
    assert_oracle(db)
    agg = audit(db, "agg")
    assert Counter(op for _, op, _, _ in agg) == {"UPDATE": 2, "INSERT": 1, "DELETE": 1}
    assert (
        "agg",
        "UPDATE",
        {"grp": "g0", "total": before["g0"][0], "n": before["g0"][1]},
        {"grp": "g0", "total": before["g0"][0] + 96, "n": before["g0"][1]},
    ) in agg
    assert (
        "agg",
        "UPDATE",
        {"grp": "g1", "total": before["g1"][0], "n": before["g1"][1]},
        {"grp": "g1", "total": before["g1"][0] - 5, "n": before["g1"][1] - 1},
    ) in agg
    assert ("agg", "INSERT", None, {"grp": "new", "total": 7, "n": 1}) in agg
    assert ("agg", "DELETE", {"grp": "g3", "total": before["g3"][0], "n": before["g3"][1]}, None) in agg
    db.sql("TRUNCATE audit")
    db.sql("UPDATE src SET v = 200 WHERE id = 8")
    refresh(db)
    assert_oracle(db)
    lin = audit(db, "lin")
    # A changed row of a linear stream table is its old row deleted and its new row inserted.
    assert sorted(lin, key=lambda r: r[1]) == [
        ("lin", "DELETE", {"id": 8, "grp": "g0", "v": 8}, None),
        ("lin", "INSERT", None, {"id": 8, "grp": "g0", "v": 200}),
    ]
    assert received(listener, 0.5) == []  # auto: DIFFERENTIAL refreshes send no pg_trickle_refresh


def test_auto_full_refresh_does_not_fire_and_notifies(sts: Database, listener) -> None:  # type: ignore[no-untyped-def]
    db = sts
    db.sql("ALTER TABLE agg DISABLE TRIGGER audit_agg")  # disabled by its owner: must stay disabled
    for name in ("lin", "agg", "down"):
        db.sql("SELECT pgtrickle.alter_stream_table(%s, refresh_mode => 'FULL')", (name,))
    db.sql("UPDATE src SET v = v + 1 WHERE id <= 10")
    outcomes = refresh(db)
    assert actions(outcomes) == {"lin": "FULL", "agg": "FULL", "down": "FULL"}
    assert_oracle(db)
    assert audit(db) == []
    assert enabled(db, "audit_lin") == "O" and enabled(db, "audit_agg") == "D"
    notes = {n["st_name"]: n for n in received(listener)}
    assert set(notes) == {"lin", "agg", "down"}
    lin_rows = db.scalar("SELECT count(*) FROM lin")
    assert notes["lin"]["schema"] == "public" and notes["lin"]["action"] == "FULL"
    assert notes["lin"]["rows"] == lin_rows == notes["lin"]["rows_inserted"] == notes["lin"]["rows_deleted"]
    assert notes["lin"]["triggers_suppressed"] == ["audit_lin"]
    assert notes["agg"]["triggers_suppressed"] == [] and notes["down"]["triggers_suppressed"] == []
    history = db.scalar(
        "SELECT max(refresh_id) FROM pgtrickle.pgt_refresh_history h"
        " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id) WHERE s.pgt_name = 'lin'"
    )
    assert notes["lin"]["refresh_id"] == history
    # The user's own ENABLE ALWAYS mode is restored as it was.
    db.sql("ALTER TABLE lin ENABLE ALWAYS TRIGGER audit_lin")
    db.sql("UPDATE src SET v = v + 1 WHERE id = 1")
    refresh(db, "lin")
    assert_oracle(db, "lin")
    assert audit(db) == [] and enabled(db, "audit_lin") == "A"


def test_on_full_refresh_fires_triggers(sts: Database, listener) -> None:  # type: ignore[no-untyped-def]
    db = sts
    set_mode(db, "on")
    db.sql("SELECT pgtrickle.alter_stream_table('agg', refresh_mode => 'FULL')")
    db.sql("UPDATE src SET v = v + 1 WHERE id = 1")
    [outcome] = refresh(db, "agg")
    assert outcome.action.value == "FULL"
    assert_oracle(db, "agg")
    rows = audit(db)
    # Row-level triggers see the rewrite as one INSERT per row (the TRUNCATE fires only TRUNCATE triggers).
    assert sorted(r[3]["grp"] for r in rows) == sorted(g for (g,) in db.sql("SELECT grp FROM agg"))
    assert {(t, op) for t, op, _, _ in rows} == {("agg", "INSERT")}
    assert received(listener, 0.5) == []
    # DIFFERENTIAL under on fires as under auto.
    db.sql("UPDATE src SET v = v + 1 WHERE id = 2")
    [outcome] = refresh(db, "lin")
    assert outcome.action.value == "DIFFERENTIAL"
    assert_oracle(db, "lin")
    # lin picks up ids 1 (changed before the FULL refresh of agg) and 2.
    assert sorted((op, (old or new)["id"]) for _, op, old, new in audit(db)) == [
        ("DELETE", 1),
        ("DELETE", 2),
        ("INSERT", 1),
        ("INSERT", 2),
    ]


def test_off_never_fires_and_every_refresh_notifies(sts: Database, listener) -> None:  # type: ignore[no-untyped-def]
    db = sts
    set_mode(db, "off")
    db.sql("UPDATE src SET v = v + 1 WHERE id IN (1, 2)")
    db.sql("INSERT INTO src VALUES (30, 'zz', 3)")
    outcomes = refresh(db)
    assert actions(outcomes) == {"lin": "DIFFERENTIAL", "agg": "DIFFERENTIAL", "down": "DIFFERENTIAL"}
    assert_oracle(db)
    assert audit(db) == []
    assert enabled(db, "audit_lin") == "O" and enabled(db, "audit_agg") == "O"
    notes = {n["st_name"]: n for n in received(listener)}
    assert notes["lin"]["action"] == "DIFFERENTIAL" and notes["lin"]["rows_inserted"] == 3
    assert notes["lin"]["rows_deleted"] == 2
    assert notes["agg"]["action"] == "DIFFERENTIAL" and notes["agg"]["triggers_suppressed"] == ["audit_agg"]
    db.sql("SELECT pgtrickle.alter_stream_table('agg', refresh_mode => 'FULL')")
    db.sql("UPDATE src SET v = v + 1 WHERE id = 3")
    [outcome] = refresh(db, "agg")
    assert outcome.action.value == "FULL"
    assert_oracle(db, "agg")
    assert audit(db) == []
    assert [n["action"] for n in received(listener)] == ["FULL"]


def test_per_table_override(sts: Database, listener) -> None:  # type: ignore[no-untyped-def]
    db = sts
    db.sql("SELECT pgtrickle.set_user_triggers('lin', 'off')")
    db.sql("UPDATE src SET v = v + 1 WHERE id = 1")
    refresh(db)
    assert_oracle(db)
    assert {t for t, *_ in audit(db)} == {"agg"}
    assert [n["st_name"] for n in received(listener)] == ["lin"]
    db.sql("SELECT pgtrickle.set_user_triggers('lin', 'default')")
    assert db.scalar("SELECT user_triggers FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'lin'") is None
    db.sql("UPDATE src SET v = v + 1 WHERE id = 1")
    refresh(db)
    assert_oracle(db)
    assert {t for t, *_ in audit(db)} == {"agg", "lin"}


def test_bad_values_are_refused_and_change_nothing(sts: Database) -> None:
    db = sts
    before = catalog_fingerprint(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid user_triggers 'sometimes'"):
        set_mode(db, "sometimes")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid user_triggers 'never'"):
        db.sql("SELECT pgtrickle.set_user_triggers('lin', 'never')")
    with pytest.raises(psycopg.errors.UndefinedObject):
        db.sql("SELECT pgtrickle.set_user_triggers('nope', 'on')")
    assert db.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'user_triggers'") == "auto"
    assert catalog_fingerprint(db) == before
    set_mode(db, " OFF ")  # normalised
    assert db.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'user_triggers'") == "off"


def test_trigger_enabled_again_after_a_failed_full_refresh(sts: Database, listener) -> None:  # type: ignore[no-untyped-def]
    db = sts
    db.sql("SELECT pgtrickle.alter_stream_table('lin', refresh_mode => 'FULL')")
    # A constraint the new contents violate: the FULL refresh fails after the triggers were disabled.
    db.sql("ALTER TABLE lin ADD CONSTRAINT small CHECK (v < 1000) NOT VALID")
    db.sql("UPDATE src SET v = 5000 WHERE id = 1")
    old = db.sql("SELECT id, grp, v FROM lin ORDER BY id")
    with pytest.raises(Exception, match="small"):
        refresh(db, "lin")
    assert enabled(db, "audit_lin") == "O"
    assert db.sql("SELECT id, grp, v FROM lin ORDER BY id") == old
    assert audit(db) == [] and received(listener, 0.5) == []
    db.sql("ALTER TABLE lin DROP CONSTRAINT small")
    [outcome] = refresh(db, "lin")
    assert outcome.action.value == "FULL"
    assert_oracle(db, "lin")
    assert audit(db) == [] and enabled(db, "audit_lin") == "O"
    assert [n["st_name"] for n in received(listener)] == ["lin"]
