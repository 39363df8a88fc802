"""Batched refresh (issue 18, item 1): stream tables ready together share one snapshot and one Spark
job; each applies in its own transaction. Real PostgreSQL and Spark, the oracle on every table."""

from __future__ import annotations

import random
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from pgtrickle.daemon.loop import Scheduler, TickReport
from pgtrickle.refresh.plan import Action
from tests.conftest import FAST_JVM_CONF, Database
from tests.hypothesis_profiles import examples
from tests.integration.faultkit import DaemonProcess, assert_windows_consumed_once, wait_caught_up
from tests.integration.helpers import DML_ROUNDS, assert_oracle, compilations, create_st, without_broadcasts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

LEVEL1 = {
    "b1_sum": "SELECT grp, sum(v) AS total, count(*) AS n FROM src GROUP BY grp",
    "b1_rows": "SELECT id, v * 2 AS v2, note FROM src WHERE v > 0",
    "b1_avg": "SELECT grp, avg(amount) AS a, sum(amount) AS s FROM src GROUP BY grp",
    "b1_time": "SELECT id, ts, ts + interval '1 day' AS later FROM src WHERE id % 2 = 0",
    "b1_max": "SELECT grp, max(v) AS top, min(note) AS first_note FROM src GROUP BY grp",
    "b1_join": "SELECT s.id, s.v, d.label FROM src s JOIN dim d ON d.grp = s.grp",
}
LEVEL2 = {
    "b2_sum": "SELECT grp, total * 2 AS t2 FROM b1_sum WHERE n > 0",
    "b2_rows": "SELECT id, v2 + 1 AS v3, note FROM b1_rows",
    "b2_avg": "SELECT grp, s FROM b1_avg",
    "b2_time": "SELECT id, later FROM b1_time",
    "b2_max": "SELECT grp, top FROM b1_max",
    "b2_join": "SELECT label, v FROM b1_join WHERE v > 0",
}


def build(db: Database) -> None:
    # Keep the DIFFERENTIAL stream tables differential under these small tables' churn (no adaptive
    # FULL, which refreshes a member on its own: tested by the batching decision's unit tests).
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE dim (grp int PRIMARY KEY, label text NOT NULL)")
    db.sql("INSERT INTO dim SELECT g, 'group ' || g FROM generate_series(0, 6) g")
    db.sql(
        "CREATE TABLE src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL, amount numeric(12,3),"
        " note text, ts timestamptz NOT NULL)"
    )
    db.sql(
        "INSERT INTO src SELECT g, g % 5, g - 100, g / 7.0, 'n' || (g % 11), "
        "timestamptz '2026-01-01 00:00:00.123456+00' + g * interval '1 hour 1 second'"
        " FROM generate_series(1, 300) g"
    )
    for name, query in {**LEVEL1, **LEVEL2}.items():
        create_st(db, name, query, schedule="1h", refresh_mode="DIFFERENTIAL")


def time_passes(db: Database) -> None:
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '2 hours', "
        "last_attempt_at = last_attempt_at - interval '2 hours'"
    )


def history(db: Database, after: int) -> list[tuple]:
    """(name, action, status, batch_id, spark_jobs) of the refreshes after refresh_id ``after``;
    the jobs other than broadcasts of small tables (refresh/delta_reads.broadcasts)."""
    rows = db.sql(
        "SELECT s.pgt_name, h.action, h.status, h.batch_id, h.spark_jobs, h.spark_jobs_why"
        " FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " WHERE h.refresh_id > %s ORDER BY h.refresh_id",
        (after,),
    )
    return [(*row[:4], without_broadcasts(row[4], row[5])) for row in rows]


def last_refresh_id(db: Database) -> int:
    return int(db.scalar("SELECT coalesce(max(refresh_id), 0) FROM pgtrickle.pgt_refresh_history"))


def assert_one_shared_job_per_batch(rows: list[tuple], slots: int) -> None:
    """The refreshes (those with something pending) ran DIFFERENTIAL, in batches spread over the
    refresh slots (scheduler.batches.spread_size): each batch one Spark job - its chained level-2
    members included (refresh/chained.py) - a member refreshed alone its own job, and the fan of
    twelve in fewer jobs than refreshes."""
    assert all(r[1] == "DIFFERENTIAL" and r[2] == "COMPLETED" for r in rows), f"{rows}"
    batches = {r[3] for r in rows if r[3] is not None}
    alone = sum(1 for r in rows if r[3] is None)
    jobs = sum(r[4] for r in rows)
    assert jobs == len(batches) + alone, f"one Spark job per batch and per lone refresh: {rows}"
    if len(rows) >= 4:
        assert batches and jobs < len(rows), f"the fan was batched ({slots} slots): {rows}"
    level1 = {r[3] for r in rows if r[0] in LEVEL1}
    chained = [r for r in rows if r[0] in LEVEL2 and r[3] in level1]
    assert chained, f"level-2 members were computed by their upstream members' batches: {rows}"


def test_a_fan_refreshed_in_batches_stays_exact_under_random_dml(db: Database) -> None:
    build(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=2), db.dsn)
    try:
        assert not scheduler.tick().failed
        assert_oracle(db)
        next_id = [1000]

        @settings(
            max_examples=examples(4),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],  # a shrink re-runs whole ticks: minutes
        )
        @given(DML_ROUNDS)
        def round_of(dml: list[tuple[str, int, int]]) -> None:
            for kind, key, value in dml:
                if kind == "insert":
                    next_id[0] += 1
                    db.sql(
                        "INSERT INTO src VALUES (%s, %s, %s, %s, %s, now())",
                        (next_id[0], key % 7, value, value / 3, None if key % 3 else f"x{key}"),
                    )
                elif kind == "update":
                    db.sql(
                        "UPDATE src SET v = v + %s, grp = (grp + 1) %% 7, amount = amount + 0.001"
                        " WHERE id %% 37 = %s",
                        (value, key % 37),
                    )
                else:
                    db.sql("DELETE FROM src WHERE id %% 53 = %s", (key % 53,))
            time_passes(db)
            before = last_refresh_id(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert sorted(o.st.name for o in report.refreshed) == sorted([*LEVEL1, *LEVEL2])
            assert_oracle(db)
            assert_one_shared_job_per_batch(history(db, before), slots=2)

        round_of()
    finally:
        scheduler.close()


def test_a_failed_apply_leaves_the_other_members_refreshed(db: Database) -> None:
    build(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed
        # A user trigger on one member raises: its apply fails, after the shared job computed its rows.
        db.sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'b1_rows refuses new rows'; END $$"
        )
        db.sql("CREATE TRIGGER refuse BEFORE INSERT ON b1_rows FOR EACH ROW EXECUTE FUNCTION refuse()")
        kept = db.sql("SELECT * FROM b1_rows ORDER BY id")
        frontier = db.scalar(
            "SELECT frontier::text FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'b1_rows'"
        )
        db.sql("INSERT INTO src VALUES (5000, 1, 77, 1.5, 'new', now())")
        time_passes(db)
        before = last_refresh_id(db)
        report = scheduler.tick()
        assert [f[0].name for f in report.failed] == ["b1_rows"]
        others = sorted(set(LEVEL1) - {"b1_rows"})
        assert sorted(o.st.name for o in report.refreshed if o.st.name in LEVEL1) == others
        assert all(o.action is Action.DIFFERENTIAL for o in report.refreshed if o.st.name in LEVEL1)
        assert_oracle(db, *others, *(n for n in LEVEL2 if n != "b2_rows"))
        assert db.sql("SELECT * FROM b1_rows ORDER BY id") == kept, "the failed member is untouched"
        assert (
            db.scalar("SELECT frontier::text FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'b1_rows'")
            == frontier
        )
        rows = {r[0]: r for r in history(db, before)}
        assert rows["b1_rows"][2] == "FAILED"
        # The trigger's message is withheld from the catalog (it may quote data); its SQLSTATE is kept.
        assert "P0001" in db.scalar(
            "SELECT last_error FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'b1_rows'"
        )
        assert len({rows[n][3] for n in LEVEL1}) == 1, "the failed member was in the batch"
        assert sum(rows[n][4] for n in LEVEL1) == 1
        # Without the trigger the member catches up, exactly.
        db.sql("DROP TRIGGER refuse ON b1_rows")
        time_passes(db)
        assert not scheduler.tick().failed
        assert_oracle(db)
    finally:
        scheduler.close()


def test_a_tripped_breaker_skips_one_member_not_the_batch(db: Database) -> None:
    build(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed
        db.sql(
            "SELECT pgtrickle.alter_stream_table('b1_sum', circuit_breaker => 'fixed', "
            "circuit_breaker_ceiling => 5)"
        )
        db.sql("INSERT INTO src SELECT g, 1, 77, 1.5, 'new', now() FROM generate_series(5000, 5009) g")
        report, before = tick_after_changes(db, scheduler)
        actions = {o.st.name: o.action for o in report.refreshed}
        assert actions["b1_sum"] is Action.SKIP
        assert all(actions[n] is Action.DIFFERENTIAL for n in LEVEL1 if n != "b1_sum")
        assert_oracle(db, *(n for n in [*LEVEL1, *LEVEL2] if n not in ("b1_sum", "b2_sum")))
        rows = history(db, before)
        batched = [r for r in rows if r[0] in LEVEL1 and r[1] == "DIFFERENTIAL"]
        assert len(batched) == 5 and len({r[3] for r in batched}) == 1
        assert sum(r[4] for r in batched) == 1
    finally:
        scheduler.close()


def tick_after_changes(db: Database, scheduler: Scheduler) -> tuple[TickReport, int]:
    """One tick once the stream tables are due again; its report (no failure) and the last
    refresh_id before it."""
    time_passes(db)
    before = last_refresh_id(db)
    report = scheduler.tick()
    assert not report.failed, report.failed
    return report, before


def lead_rows(db: Database, after: int) -> list[tuple]:
    """(spark_jobs, spark_stages, spark_jobs_why) of the batches' first members after ``after``."""
    return db.sql(
        "SELECT spark_jobs, spark_stages, spark_jobs_why FROM pgtrickle.pgt_refresh_history"
        " WHERE refresh_id > %s AND batch_id = refresh_id ORDER BY refresh_id",
        (after,),
    )


def test_a_batch_reads_a_change_buffer_once_and_consolidates_every_member_at_once(db: Database) -> None:
    build(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed  # the initial refreshes: each member at a frontier of its own
        for round_ in range(2):  # then one batch at different frontiers, then one at the same
            db.sql("INSERT INTO src VALUES (%s, 1, 77, 1.5, 'new', now())", (5000 + round_,))
            db.sql("UPDATE src SET v = v WHERE id BETWEEN 10 AND 20")  # old = new: cancels in every member
            db.sql("UPDATE src SET amount = amount + 1 WHERE id = 30")  # seen by b1_avg alone
            time_passes(db)
            before = last_refresh_id(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert all(o.action is Action.DIFFERENTIAL for o in report.refreshed if o.st.name in LEVEL1)
            assert_oracle(db)
            level1 = lead_rows(db, before)[0]
            assert without_broadcasts(level1[0], level1[2]) == 1, level1
            served = re.search(r"(\d+) reads of its members served by (\d+) JDBC reads", level1[2] or "")
            # Six members read src's change buffer (one read, persisted); b1_join reads dim and b1_max
            # the rows of src with the changed groups (its own reads): eight reads, three made. The four
            # level-2 members chained to theirs (b2_avg and b2_time read numeric and timestamptz
            # columns, which do not cross in the job: refresh/chained.py) read nothing: their
            # upstream's buffer holds nothing in their window, its change is its delta in the job.
            assert "(10 stream tables)" in (level1[2] or ""), level1
            assert served is not None and (int(served[1]), int(served[2])) == (8, 3), level1
    finally:
        scheduler.close()


def test_a_batch_of_projections_runs_in_one_stage(db: Database, spark: Any) -> None:
    """Linear members of a batch: their deltas are consolidated together, in one task - not one
    shuffle per member - over one read of their source's change buffer; a small batch runs its
    operators interpreted, compiling nothing (refresh/spark_job.code_generation)."""
    salt = random.randrange(10**6, 10**9)  # literals no earlier job of this JVM compiled
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL, note text)")
    db.sql("INSERT INTO src SELECT g, g, 'n' || g FROM generate_series(1, 200) g")
    names = [f"p{j}" for j in range(5)]
    for j, name in enumerate(names):
        query = (
            f"SELECT id, v + {j + salt} AS v FROM src"
            if j % 2
            else f"SELECT id, note, v FROM src WHERE v > {j - salt}"
        )
        create_st(db, name, query, schedule="1h", refresh_mode="DIFFERENTIAL")
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed
        db.sql("INSERT INTO src VALUES (5000, 5, 'new')")
        db.sql("UPDATE src SET v = v + 1 WHERE id % 10 = 0")
        db.sql("UPDATE src SET note = note WHERE id % 7 = 0")
        db.sql("DELETE FROM src WHERE id % 11 = 0")
        compiled = compilations(spark)
        report, before = tick_after_changes(db, scheduler)
        # Spark compiles the column accessors of the persisted read of src's buffer (it has no
        # interpreted version of those; once per column types in a JVM), nothing else.
        assert compilations(spark) - compiled <= 2, "the batch compiled its operators for its few rows"
        assert sorted(o.st.name for o in report.refreshed) == names
        assert all(o.action is Action.DIFFERENTIAL for o in report.refreshed)
        assert_oracle(db, *names)
        assert lead_rows(db, before)[0][:2] == (1, 1), lead_rows(db, before)
    finally:
        scheduler.close()


def test_a_large_batch_goes_through_one_staging_table(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    build(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed
        monkeypatch.setattr("pgtrickle.refresh.batch.COPY_MAX_ROWS", 5)  # any union is "large"
        db.sql("INSERT INTO src SELECT g, g % 7, g, g / 3.0, 'k', now() FROM generate_series(6000, 6040) g")
        db.sql("DELETE FROM src WHERE id % 13 = 0")
        db.sql("UPDATE src SET ts = ts + interval '1 microsecond', note = NULL WHERE id % 17 = 0")
        report, before = tick_after_changes(db, scheduler)
        assert all(o.action is Action.DIFFERENTIAL for o in report.refreshed if o.st.name in LEVEL1)
        assert_oracle(db)
        rows = [r for r in history(db, before) if r[0] in LEVEL1]
        assert len({r[3] for r in rows}) == 1 and sum(r[4] or 0 for r in rows) >= 1, rows
        assert not db.sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'pgtrickle_changes'"
            " AND (tablename LIKE 'batch\\_%%' OR tablename LIKE 'delta\\_%%')"
        ), "staging tables are dropped"
    finally:
        scheduler.close()


def test_when_the_shared_job_fails_the_members_refresh_one_by_one(db: Database) -> None:
    build(db)
    # ANSI arithmetic: integer overflow is an error in PostgreSQL and on Spark alike.
    create_st(
        db,
        "b1_bad",
        "SELECT id, CASE WHEN v > 1000000 THEN v * 100000 ELSE v END AS big FROM src",
        schedule="1h",
        refresh_mode="DIFFERENTIAL",
    )
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed
        db.sql("INSERT INTO src VALUES (5000, 1, 2000000, 1.5, 'huge', now())")
        time_passes(db)
        before = last_refresh_id(db)
        report = scheduler.tick()
        assert [f[0].name for f in report.failed] == ["b1_bad"]
        assert all(o.action is Action.DIFFERENTIAL for o in report.refreshed if o.st.name in LEVEL1)
        assert_oracle(db, *LEVEL1, *LEVEL2)
        why = " ".join(r[2] or "" for r in lead_rows(db, before))
        assert "failed; its members were refreshed one by one" in why, why
        # Without the value the member catches up, exactly: its window still holds the row (inserted,
        # then deleted), whose overflow the FULL refresh it falls back to never meets.
        db.sql("DELETE FROM src WHERE id = 5000")
        time_passes(db)
        before = last_refresh_id(db)
        assert not scheduler.tick().failed
        assert_oracle(db)
        action, reason = db.sql(
            "SELECT h.action, h.mode_reason FROM pgtrickle.pgt_refresh_history h"
            " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id) WHERE s.pgt_name = 'b1_bad' AND h.refresh_id > %s",
            (before,),
        )[0]
        assert action == "FULL" and "data error" in reason and "22003" in reason, (action, reason)
    finally:
        scheduler.close()


def test_batching_off_refreshes_each_on_its_own(db: Database) -> None:
    build(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1, max_batch_size=1), db.dsn)
    try:
        assert not scheduler.tick().failed
        db.sql("INSERT INTO src VALUES (5000, 1, 77, 1.5, 'new', now())")
        time_passes(db)
        before = last_refresh_id(db)
        assert not scheduler.tick().failed
        assert_oracle(db)
        rows = history(db, before)
        assert len(rows) >= len(LEVEL1) and all(r[3] is None for r in rows), f"{rows}"
        assert all(r[4] == 1 for r in rows if r[1] == "DIFFERENTIAL"), rows
    finally:
        scheduler.close()


@pytest.mark.timeout(900)
def test_a_sigkill_during_a_batch_loses_and_doubles_nothing(db: Database, tmp_path: Path) -> None:
    """Killed at the third member's commit: two members of the batch committed, the rest did not."""
    build(db)
    names = [*LEVEL1, *LEVEL2]
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed
    finally:
        scheduler.close()
    db.sql("INSERT INTO src SELECT g, g % 7, g, g / 3.0, 'k', now() FROM generate_series(6000, 6040) g")
    db.sql("DELETE FROM src WHERE id % 13 = 0")
    time_passes(db)
    before = last_refresh_id(db)
    daemon = DaemonProcess(
        db.dsn,
        tmp_path,
        PGTRICKLE_SPARK_CONF=f"{FAST_JVM_CONF},spark.driver.memory=1g",
        PGTRICKLE_MAX_PARALLEL_REFRESHES="1",  # one slot: the level is one batch of six
    )
    daemon.start("refresh.before_commit:3")
    code = daemon.wait_exit(timeout=300)
    assert code == -signal.SIGKILL, f"exit {code}\n{daemon.output()}"
    rows = history(db, before)
    committed = [r for r in rows if r[2] == "COMPLETED"]
    assert len(committed) == 2 and len({r[3] for r in rows if r[3] is not None}) == 1, rows
    # A new daemon start: what the killed one left RUNNING is abandoned, the rest catches up once.
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        assert scheduler.abandon_stale_history() == len(rows) - 2

        def step() -> None:
            time_passes(db)
            scheduler.tick()

        wait_caught_up(db, names, 300, step=step)
    finally:
        scheduler.close()
    assert_oracle(db, *names)
    assert_windows_consumed_once(db)
