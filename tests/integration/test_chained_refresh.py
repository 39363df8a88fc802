"""Chained members of a batch (issue 18): a downstream stream table due with its upstream one is
computed from the upstream's delta in the same Spark job (refresh/chained.py), applied after it
with a frontier that sees the upstream's apply. Real PostgreSQL and Spark, the oracle on every table."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from pgtrickle.daemon.loop import Scheduler
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import DML_ROUNDS, assert_oracle, create_st, refresh
from tests.integration.test_batched_refresh import history, last_refresh_id, time_passes

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

CHAIN = {
    "c1": "SELECT id, v, note FROM src",
    "c2": "SELECT id, v + 1 AS v, note FROM c1",
    "c3": "SELECT id, v, note FROM c2 WHERE v > 0",
    "c4": "SELECT note, count(*) AS n, sum(v) AS total FROM c3 GROUP BY note",
}


def build(db: Database, queries: dict[str, str]) -> None:
    # Differential under these small tables' churn (no adaptive FULL, which runs on its own).
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL, note text, amount numeric(12,3))")
    db.sql("INSERT INTO src SELECT g, g - 50, 'n' || (g % 7), g / 7.0 FROM generate_series(1, 200) g")
    db.sql("CREATE TABLE dim (note text PRIMARY KEY, label text NOT NULL)")
    db.sql("INSERT INTO dim SELECT 'n' || g, 'label ' || g FROM generate_series(0, 6) g")
    for name, query in queries.items():
        create_st(db, name, query, schedule="1h", refresh_mode="DIFFERENTIAL")


def scheduler_for(db: Database) -> Scheduler:
    return Scheduler(db.settings.with_overrides(max_parallel_refreshes=1, max_batch_size=32), db.dsn)


def change_src(db: Database, round_: int) -> None:
    db.sql("INSERT INTO src VALUES (%s, 7, 'new', 1.5)", (1000 + round_,))
    db.sql("UPDATE src SET v = v + 3 WHERE id %% 10 = %s", (round_,))
    db.sql("DELETE FROM src WHERE id = %s", (20 + round_,))
    db.sql("UPDATE src SET v = v WHERE id BETWEEN 30 AND 35")  # old = new: cancels everywhere


def test_a_chain_is_refreshed_by_one_spark_job(db: Database) -> None:
    build(db, CHAIN)
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed  # the initial FULL refreshes
        for round_ in range(3):
            change_src(db, round_)
            time_passes(db)
            before = last_refresh_id(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert {o.st.name: o.action for o in report.refreshed} == dict.fromkeys(
                CHAIN, Action.DIFFERENTIAL
            )
            assert_oracle(db)
            rows = history(db, before)
            assert [r[0] for r in rows] == list(CHAIN), "applied upstream first"
            assert {r[3] for r in rows} == {rows[0][3]} and rows[0][3] is not None, f"one batch: {rows}"
            assert sum(r[4] for r in rows) == 1, f"one Spark job for the chain: {rows}"
        # A downstream frontier sees its upstream's apply and nothing after the batch's snapshot: a
        # tick with nothing changed finds nothing pending anywhere.
        time_passes(db)
        report = scheduler.tick()
        assert {o.action for o in report.refreshed} <= {Action.NO_DATA}, report.refreshed
        assert_oracle(db)
    finally:
        scheduler.close()


def test_every_type_that_crosses_in_the_job_does_so_exactly(db: Database) -> None:
    """Each type of refresh/chained.py's IN_PLAN_TYPES, computed by the job and read back by the
    next level (with and without rows of its own pending in the upstream's buffer): one Spark job,
    exact - and so its Spark type is the one a JDBC read of the buffer gives."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql(
        "CREATE TABLE typed (id int PRIMARY KEY, s smallint, i int, b bigint, flag boolean, t text,"
        " vc varchar, f8 double precision, f4 real, d date)"
    )
    db.sql(
        "INSERT INTO typed SELECT g, g, g * 10, g * 1000000000::bigint, g % 2 = 0, 't' || g, 'v' || g, g / 3.0,"
        " g / 7.0, date '2026-01-01' + g FROM generate_series(1, 50) g"
    )
    columns = "id, s, i, b, flag, t, vc, f8, f4, d"
    create_st(db, "t1", f"SELECT {columns} FROM typed", schedule="1h", refresh_mode="DIFFERENTIAL")
    create_st(
        db, "t2", f"SELECT {columns} FROM t1 WHERE flag OR s > 3", schedule="1h", refresh_mode="DIFFERENTIAL"
    )
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed
        for round_ in range(2):
            db.sql(
                "INSERT INTO typed VALUES (%s, -3, 7, -9000000000, true, 'ü', 'x', -0.25, 1.5, '2030-02-28')",
                (100 + round_,),
            )
            db.sql("UPDATE typed SET f8 = f8 * 3, f4 = f4 + 1, d = d + 1 WHERE id %% 5 = %s", (round_,))
            if round_:  # t1 alone first: t2 then reads t1's buffer rows and t1's delta in the job
                refresh(db, "t1")
                db.sql("UPDATE typed SET t = t || '!', s = s + 1 WHERE id % 7 = 1")
            time_passes(db)
            before = last_refresh_id(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert_oracle(db)
            rows = history(db, before)
            assert [r[0] for r in rows] == ["t1", "t2"] and sum(r[4] for r in rows) == 1, rows
    finally:
        scheduler.close()


def test_a_change_committed_during_the_batch_is_taken_by_the_next_refresh(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source change committed after the batch's snapshot, before a chained member's apply, is
    not in that member's frontier: the next refresh takes it, once."""
    build(db, CHAIN)
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed
        change_src(db, 0)
        time_passes(db)
        from pgtrickle import faults

        fired = []
        point = faults.point

        def write_meanwhile(name: str) -> None:
            point(name)
            if name == "refresh.after_commit" and not fired:  # c1 committed; c2.. not yet
                fired.append(True)
                db.sql("INSERT INTO src VALUES (5000, 9, 'meanwhile', 2.5)")

        monkeypatch.setattr(faults, "point", write_meanwhile)
        report = scheduler.tick()
        monkeypatch.undo()
        assert fired and not report.failed, report.failed
        assert db.scalar("SELECT count(*) FROM c1 WHERE id = 5000") == 0
        time_passes(db)
        assert not scheduler.tick().failed
        assert_oracle(db)
        assert db.scalar("SELECT count(*) FROM c3 WHERE id = 5000") == 1
    finally:
        scheduler.close()


def test_a_member_chained_to_a_failed_apply_is_left_untouched_then_catches_up(db: Database) -> None:
    build(db, CHAIN)
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed
        db.sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'c2 refuses new rows'; END $$"
        )
        db.sql("CREATE TRIGGER refuse BEFORE INSERT ON c2 FOR EACH ROW EXECUTE FUNCTION refuse()")
        kept = {n: db.sql(f"SELECT * FROM {n} ORDER BY 1") for n in ("c2", "c3", "c4")}
        change_src(db, 1)
        time_passes(db)
        report = scheduler.tick()
        assert [f[0].name for f in report.failed] == ["c2"]
        assert_oracle(db, "c1")
        for name, rows in kept.items():
            assert db.sql(f"SELECT * FROM {name} ORDER BY 1") == rows, f"{name} untouched"
        db.sql("DROP TRIGGER refuse ON c2")
        time_passes(db)
        assert not scheduler.tick().failed
        assert_oracle(db)
    finally:
        scheduler.close()


def test_a_column_that_may_not_cross_exactly_refreshes_the_reader_on_its_own(db: Database) -> None:
    """numeric(12,3) may be rounded by PostgreSQL on write: the reader is refreshed after the
    upstream member committed, from its change buffer (its own Spark job), and stays exact."""
    queries = {
        "m1": "SELECT id, amount * 1.0001 AS amount, note FROM src",
        "m2": "SELECT note, sum(amount) AS total FROM m1 GROUP BY note",
    }
    build(db, queries)
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed
        change_src(db, 2)
        time_passes(db)
        before = last_refresh_id(db)
        report = scheduler.tick()
        assert not report.failed, report.failed
        assert {o.st.name: o.action for o in report.refreshed} == dict.fromkeys(queries, Action.DIFFERENTIAL)
        assert_oracle(db)
        rows = {r[0]: r for r in history(db, before)}
        assert rows["m2"][3] is None and rows["m2"][4] >= 1, f"m2 refreshed on its own: {rows}"
    finally:
        scheduler.close()


def test_a_chained_members_breaker_sees_its_upstreams_change(db: Database) -> None:
    build(db, CHAIN)
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed
        db.sql(
            "SELECT pgtrickle.alter_stream_table('c2', circuit_breaker => 'fixed', circuit_breaker_ceiling => 5)"
        )
        kept = db.sql("SELECT * FROM c2 ORDER BY id")
        db.sql("INSERT INTO src SELECT g, 1, 'bulk', 1 FROM generate_series(3000, 3019) g")
        time_passes(db)
        report = scheduler.tick()
        actions = {o.st.name: o.action for o in report.refreshed}
        assert actions["c1"] is Action.DIFFERENTIAL and actions["c2"] is Action.SKIP, actions
        assert db.sql("SELECT * FROM c2 ORDER BY id") == kept
        assert_oracle(db, "c1", "c3", "c4")
    finally:
        scheduler.close()


DAG = {
    **CHAIN,
    "f1": "SELECT id, v * 2 AS v2 FROM src WHERE v > -20",
    "f2": "SELECT id, v2 FROM f1 WHERE v2 % 3 <> 0",
    "j1": "SELECT c1.id, c1.v, d.label FROM c1 JOIN dim d ON d.note = c1.note",
    "j2": "SELECT label, count(*) AS n FROM j1 GROUP BY label",
}


def test_a_dag_refreshed_with_chained_members_stays_exact_under_random_dml(db: Database) -> None:
    build(db, DAG)
    scheduler = scheduler_for(db)
    try:
        assert not scheduler.tick().failed
        next_id = [10_000]

        @settings(
            max_examples=examples(4),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        @given(DML_ROUNDS, DML_ROUNDS)
        def round_of(dml: list[tuple[str, int, int]], dim_dml: list[tuple[str, int, int]]) -> None:
            for kind, key, value in dml:
                if kind == "insert":
                    next_id[0] += 1
                    db.sql(
                        "INSERT INTO src VALUES (%s, %s, %s, %s)",
                        (next_id[0], value, f"n{key % 8}", value / 3),
                    )
                elif kind == "update":
                    db.sql(
                        "UPDATE src SET v = v + %s, note = 'n' || (id %% 8) WHERE id %% 37 = %s",
                        (value, key % 37),
                    )
                else:
                    db.sql("DELETE FROM src WHERE id %% 53 = %s", (key % 53,))
            for kind, key, _ in dim_dml[:2]:  # the join's other side changes too, at times
                if kind == "update":
                    db.sql("UPDATE dim SET label = label || '+' WHERE note = %s", (f"n{key % 7}",))
            time_passes(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert_oracle(db)

        round_of()
    finally:
        scheduler.close()
