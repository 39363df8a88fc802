"""Partitions and inheritance children of a source are captured (issue 16, item 5).

A stream table over a partitioned table or an inheritance parent must see
every write any member of the hierarchy receives: through the parent or
directly on a leaf, at any depth, whatever the leaf's column order, exactly
once. Members created or attached later get capture at once; rows that come
or go with ATTACH / DETACH / INHERIT / NO INHERIT make the next refresh FULL,
saying why. Every refresh is checked against the defining query.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import create_st, refresh, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

EXAMPLES = examples(4, "PGTRICKLE_PROPERTY_EXAMPLES")


def _actions(outcomes) -> dict[str, tuple[Action, str]]:  # type: ignore[no-untyped-def]
    return {o.st.name: (o.action, o.reason) for o in outcomes}


def _pending(db: Database, table: str) -> int:
    buf = db.scalar(
        "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_relid = %s::regclass", (table,)
    )
    return int(db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buf}"))  # type: ignore[arg-type]


def _differential(db: Database, *names: str) -> None:
    outcomes = _actions(refresh_and_check(db, *names))
    for name in names:
        assert outcomes[name][0] is Action.DIFFERENTIAL, (name, outcomes[name])


@pytest.fixture
def partitioned(db: Database) -> Database:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE pt (id int, grp int, v int, PRIMARY KEY (id)) PARTITION BY RANGE (id)")
    db.sql("CREATE TABLE pt_1 PARTITION OF pt FOR VALUES FROM (0) TO (100)")
    db.sql("CREATE TABLE pt_2 PARTITION OF pt FOR VALUES FROM (100) TO (200)")
    db.sql("INSERT INTO pt SELECT g, g % 5, g FROM generate_series(0, 199) g")
    create_st(db, "agg", "SELECT grp, count(*) AS n, sum(v) AS s FROM pt GROUP BY grp", schedule="1h")
    create_st(db, "flat", "SELECT id, grp, v FROM pt WHERE v % 2 = 0", schedule="1h")
    refresh_and_check(db, "agg", "flat")
    return db


def test_writes_directly_on_a_partition_are_captured(partitioned: Database) -> None:
    db = partitioned
    db.sql("DELETE FROM pt_2 WHERE id < 130")
    db.sql("UPDATE pt_1 SET v = v + 1 WHERE id % 3 = 0")
    db.sql("INSERT INTO pt_2 VALUES (120, 1, 7), (121, 2, 8)")
    _differential(db, "agg", "flat")


def test_parent_writes_land_once_in_the_buffer(partitioned: Database) -> None:
    db = partitioned
    db.sql("DELETE FROM pt WHERE id IN (5, 6, 105)")
    before = _pending(db, "pt")
    db.sql("UPDATE pt SET v = v * 2 WHERE id % 10 = 0")  # 20 rows over both partitions
    db.sql("INSERT INTO pt VALUES (5, 0, 1), (105, 0, 1)")
    db.sql("DELETE FROM pt WHERE id IN (1, 101)")
    assert _pending(db, "pt") - before == 20 + 2 + 2
    _differential(db, "agg", "flat")


def test_sub_partitions_and_a_leaf_with_another_column_order(db: Database) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE pt (id int, grp int, v text, PRIMARY KEY (id, grp)) PARTITION BY RANGE (id)")
    db.sql("CREATE TABLE pt_lo PARTITION OF pt FOR VALUES FROM (0) TO (100)")
    db.sql("CREATE TABLE pt_hi PARTITION OF pt FOR VALUES FROM (100) TO (200) PARTITION BY LIST (grp)")
    db.sql("CREATE TABLE pt_hi_a PARTITION OF pt_hi FOR VALUES IN (0, 1)")
    # A leaf made on its own, columns in another order (and a dropped column), attached empty.
    db.sql("CREATE TABLE pt_hi_b (junk int, v text, grp int NOT NULL, id int NOT NULL)")
    db.sql("ALTER TABLE pt_hi_b DROP COLUMN junk")
    db.sql("ALTER TABLE pt_hi ATTACH PARTITION pt_hi_b FOR VALUES IN (2, 3, 4)")
    db.sql("INSERT INTO pt SELECT g, g % 5, 'v' || g FROM generate_series(0, 199) g")
    create_st(db, "agg", "SELECT grp, count(*) AS n, max(v) AS m FROM pt GROUP BY grp", schedule="1h")
    create_st(db, "flat", "SELECT id, grp, v FROM pt", schedule="1h")
    refresh_and_check(db, "agg", "flat")
    # A sub-partition created after the stream table.
    db.sql("CREATE TABLE pt_top PARTITION OF pt FOR VALUES FROM (200) TO (300) PARTITION BY LIST (grp)")
    db.sql("CREATE TABLE pt_top_all PARTITION OF pt_top DEFAULT")
    for stmt in [
        "UPDATE pt_hi_b SET v = v || '!' WHERE id % 2 = 0",
        "DELETE FROM pt_hi_a WHERE id < 150",
        "INSERT INTO pt_hi_b (id, grp, v) VALUES (1000 - 850, 3, 'new')",
        "UPDATE pt_hi SET v = 'via intermediate' WHERE id > 190",
        "INSERT INTO pt_top_all VALUES (250, 9, 'deep'), (251, 9, 'deeper')",
        "INSERT INTO pt VALUES (260, 1, 'through root')",
        "DELETE FROM pt_top WHERE id = 251",
    ]:
        db.sql(stmt)
        _differential(db, "agg", "flat")


def test_attach_with_rows_and_detach_reinitialize_and_detach_removes_capture(partitioned: Database) -> None:
    db = partitioned
    db.sql("CREATE TABLE pt_3 (LIKE pt)")
    db.sql("INSERT INTO pt_3 SELECT g, g % 5, g FROM generate_series(200, 249) g")
    db.sql("ALTER TABLE pt ATTACH PARTITION pt_3 FOR VALUES FROM (200) TO (300)")
    outcomes = _actions(refresh_and_check(db, "agg", "flat"))
    for name in ("agg", "flat"):
        action, reason = outcomes[name]
        assert action is Action.FULL and "pt_3" in reason and "attach" in reason.lower(), outcomes[name]
    alerts = db.sql(
        "SELECT payload->>'reason' FROM pgtrickle.alerts WHERE event = 'reinitialize_needed'"
        " AND payload->>'reason' LIKE '%%pt_3%%'"
    )
    assert len(alerts) == 2, alerts  # one per stream table
    db.sql("UPDATE pt_3 SET v = 0 WHERE id < 210")
    _differential(db, "agg", "flat")

    db.sql("ALTER TABLE pt DETACH PARTITION pt_1")
    outcomes = _actions(refresh_and_check(db, "agg", "flat"))
    for name in ("agg", "flat"):
        action, reason = outcomes[name]
        assert action is Action.FULL and "pt_1" in reason and "detach" in reason.lower(), outcomes[name]
    assert db.sql("SELECT tgname FROM pg_trigger WHERE tgrelid = 'pt_1'::regclass AND NOT tgisinternal") == []
    before = _pending(db, "pt")
    db.sql("DELETE FROM pt_1")  # no longer part of the source
    assert _pending(db, "pt") == before
    db.sql("DELETE FROM pt_2 WHERE id = 150")
    _differential(db, "agg", "flat")
    # An empty partition attached or detached changes nothing: no recompute.
    db.sql("CREATE TABLE pt_9 (LIKE pt)")
    db.sql("ALTER TABLE pt ATTACH PARTITION pt_9 FOR VALUES FROM (900) TO (1000)")
    db.sql("INSERT INTO pt_9 VALUES (901, 1, 1)")
    _differential(db, "agg", "flat")


@pytest.fixture
def inherited(db: Database) -> Database:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE animals (id int PRIMARY KEY, kind text, legs int)")
    db.sql("CREATE TABLE dogs (good boolean DEFAULT true) INHERITS (animals)")
    db.sql("INSERT INTO animals SELECT g, 'a' || (g % 3), g % 5 FROM generate_series(1, 50) g")
    db.sql("INSERT INTO dogs SELECT g, 'dog', 4 FROM generate_series(100, 120) g")
    create_st(
        db,
        "per_kind",
        "SELECT kind, count(*) AS n, sum(legs) AS legs FROM animals GROUP BY kind",
        schedule="1h",
    )
    create_st(db, "all_animals", "SELECT id, kind, legs FROM animals", schedule="1h")
    refresh_and_check(db, "per_kind", "all_animals")
    return db


def test_inheritance_child_insert_update_delete(inherited: Database) -> None:
    db = inherited
    db.sql("INSERT INTO dogs (id, kind, legs) VALUES (200, 'dog', 3)")
    _differential(db, "per_kind", "all_animals")
    db.sql("UPDATE dogs SET legs = 5 WHERE id < 105")
    db.sql("DELETE FROM dogs WHERE id > 115")
    _differential(db, "per_kind", "all_animals")
    before = _pending(db, "animals")
    db.sql("UPDATE animals SET legs = legs + 1 WHERE id % 10 = 0")  # 5 parent rows + dogs 100, 110
    assert _pending(db, "animals") - before == 5 + 2
    _differential(db, "per_kind", "all_animals")


def test_inheritance_children_joining_and_leaving(inherited: Database) -> None:
    db = inherited
    db.sql("CREATE TABLE cats () INHERITS (animals)")
    db.sql("INSERT INTO cats VALUES (300, 'cat', 4)")
    _differential(db, "per_kind", "all_animals")
    db.sql("CREATE TABLE birds (id int NOT NULL, kind text, legs int)")
    db.sql("INSERT INTO birds VALUES (400, 'bird', 2), (401, 'bird', 2)")
    db.sql("ALTER TABLE birds INHERIT animals")
    outcomes = _actions(refresh_and_check(db, "per_kind", "all_animals"))
    assert all(a is Action.FULL and "birds" in r for a, r in outcomes.values()), outcomes
    db.sql("DELETE FROM birds WHERE id = 401")
    _differential(db, "per_kind", "all_animals")
    db.sql("ALTER TABLE dogs NO INHERIT animals")
    outcomes = _actions(refresh_and_check(db, "per_kind", "all_animals"))
    assert all(a is Action.FULL and "dogs" in r for a, r in outcomes.values()), outcomes
    assert db.sql("SELECT tgname FROM pg_trigger WHERE tgrelid = 'dogs'::regclass AND NOT tgisinternal") == []


def test_check_cdc_health_reports_a_member_without_capture(partitioned: Database) -> None:
    db = partitioned
    assert db.sql("SELECT problems FROM pgtrickle.check_cdc_health() WHERE source = 'public.pt'") == [([],)]
    for (tgname,) in db.sql(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'pt_2'::regclass AND NOT tgisinternal"
    ):
        db.sql(f'DROP TRIGGER "{tgname}" ON pt_2')
    [(problems,)] = db.sql("SELECT problems FROM pgtrickle.check_cdc_health() WHERE source = 'public.pt'")
    assert any("pt_2" in p for p in problems), problems
    # A source that is a partition is captured through the table above it too.
    create_st(db, "one_part", "SELECT id, v FROM pt_1", schedule="1h", initialize=False)
    assert db.sql("SELECT problems FROM pgtrickle.check_cdc_health() WHERE source = 'public.pt_1'") == [([],)]
    db.sql("DROP TRIGGER pgt_ancestor_%s_upd ON pt" % db.scalar("SELECT 'pt_1'::regclass::oid"))
    [(problems,)] = db.sql("SELECT problems FROM pgtrickle.check_cdc_health() WHERE source = 'public.pt_1'")
    assert any("public.pt above it" in p for p in problems), problems


def test_a_source_that_is_a_partition_sees_writes_through_its_parents(partitioned: Database) -> None:
    db = partitioned
    create_st(db, "part_1", "SELECT id, grp, v FROM pt_1", schedule="1h")
    create_st(db, "part_1_agg", "SELECT grp, sum(v) AS s FROM pt_1 GROUP BY grp", schedule="1h")
    refresh_and_check(db, "part_1", "part_1_agg")
    names = ("agg", "flat", "part_1", "part_1_agg")
    before = _pending(db, "pt_1")
    db.sql("UPDATE pt SET v = v + 1 WHERE id % 10 = 0")  # 10 rows in pt_1, 10 in pt_2
    assert _pending(db, "pt_1") - before == 10
    db.sql("DELETE FROM pt WHERE id IN (3, 103)")
    db.sql("INSERT INTO pt VALUES (3, 1, 1), (103, 1, 1)")
    db.sql("DELETE FROM pt_2 WHERE id IN (104, 105)")
    db.sql("UPDATE pt SET id = id + 100 WHERE id IN (4, 5)")  # rows move from pt_1 to pt_2
    db.sql("UPDATE pt_1 SET v = 0 WHERE id = 6")
    _differential(db, *names)
    # DETACH of the source itself: it keeps its rows, and statements naming pt no longer reach it.
    db.sql("ALTER TABLE pt DETACH PARTITION pt_1")
    assert (
        db.sql("SELECT tgname FROM pg_trigger WHERE tgrelid = 'pt'::regclass AND tgname LIKE 'pgt_ancestor%'")
        == []
    )
    db.sql("UPDATE pt_1 SET v = 1 WHERE id = 6")
    outcomes = _actions(refresh_and_check(db, *names))
    assert outcomes["part_1"][0] is Action.DIFFERENTIAL and outcomes["agg"][0] is Action.FULL, outcomes
    db.sql("ALTER TABLE pt ATTACH PARTITION pt_1 FOR VALUES FROM (0) TO (100)")
    db.sql("DELETE FROM pt WHERE id = 8")
    outcomes = _actions(refresh_and_check(db, *names))
    assert outcomes["part_1"][0] is Action.DIFFERENTIAL, outcomes


def test_an_inheritance_child_source_is_reported_for_writes_through_its_parent(inherited: Database) -> None:
    db = inherited
    create_st(db, "just_dogs", "SELECT id, legs FROM dogs", schedule="1h", initialize=False)
    [(problems,)] = db.sql("SELECT problems FROM pgtrickle.check_cdc_health() WHERE source = 'public.dogs'")
    assert any("inheritance child of public.animals" in p for p in problems), problems


# ---------------------------------------------------------------- property test
# Random DML spread over a partitioned table (through the root, an intermediate
# sub-partitioned table, and each leaf; one leaf has its columns in another order)
# and an inheritance hierarchy two levels deep: every refresh is DIFFERENTIAL (or has
# nothing to do) and equals the query.

PART_TARGETS = ["ev", "ev_s", "ev_n", "ev_s_lo", "ev_s_hi", "ev_w"]
INH_TARGETS = ["zoo", "zoo_c", "zoo_cc"]
_op = st.one_of(
    st.tuples(st.just("insert"), st.sampled_from(PART_TARGETS + INH_TARGETS), st.integers(1, 4)),
    st.tuples(
        st.just("update"), st.sampled_from(PART_TARGETS + INH_TARGETS), st.integers(2, 4), st.integers(0, 3)
    ),
    st.tuples(
        st.just("delete"), st.sampled_from(PART_TARGETS + INH_TARGETS), st.integers(2, 5), st.integers(0, 4)
    ),
    st.tuples(st.just("move"), st.sampled_from(["n", "s", "w", "e"]), st.integers(2, 4), st.integers(0, 3)),
    st.tuples(st.just("rekey"), st.just("ev_s"), st.integers(2, 4), st.integers(0, 3)),
)
_batches = st.lists(st.lists(_op, min_size=1, max_size=5), min_size=1, max_size=3)


class _Ids:
    def __init__(self) -> None:
        self.lo = 0
        self.hi = 1000

    def next(self, lo: bool) -> int:
        if lo:
            self.lo += 1
            return self.lo
        self.hi += 1
        return self.hi


def _hierarchies(db: Database) -> None:
    db.sql(
        "CREATE TABLE ev (id int NOT NULL, region text NOT NULL, amt int, PRIMARY KEY (id, region))"
        " PARTITION BY LIST (region)"
    )
    db.sql("CREATE TABLE ev_n (amt int, id int NOT NULL, region text NOT NULL)")  # another column order
    db.sql("ALTER TABLE ev ATTACH PARTITION ev_n FOR VALUES IN ('n')")
    db.sql("CREATE TABLE ev_s PARTITION OF ev FOR VALUES IN ('s') PARTITION BY RANGE (id)")
    db.sql("CREATE TABLE ev_s_lo PARTITION OF ev_s FOR VALUES FROM (MINVALUE) TO (500)")
    db.sql("CREATE TABLE ev_s_hi PARTITION OF ev_s FOR VALUES FROM (500) TO (MAXVALUE)")
    db.sql("CREATE TABLE ev_w PARTITION OF ev DEFAULT")
    db.sql("CREATE TABLE zoo (id int PRIMARY KEY, region text, amt int)")
    db.sql("CREATE TABLE zoo_c (extra text DEFAULT 'x') INHERITS (zoo)")
    db.sql("CREATE TABLE zoo_cc (more int) INHERITS (zoo_c)")


def _insert(db: Database, target: str, n: int, ids: _Ids) -> None:
    region = {"ev_n": "n", "ev_s": "s", "ev_s_lo": "s", "ev_s_hi": "s", "ev_w": "w"}.get(target, "e")
    for _ in range(n):
        i = ids.next(lo=target == "ev_s_lo")
        db.sql(f"INSERT INTO {target} (id, region, amt) VALUES (%s, %s, %s)", (i, region, i % 7))


def _apply(db: Database, op: tuple, ids: _Ids) -> None:  # type: ignore[type-arg]
    kind, target = op[0], op[1]
    if kind == "insert":
        _insert(db, target, op[2], ids)
    elif kind == "update":
        db.sql(f"UPDATE {target} SET amt = coalesce(amt, 0) + 1 WHERE id %% %s = %s", (op[2], op[3] % op[2]))
    elif kind == "delete":
        db.sql(f"DELETE FROM {target} WHERE id %% %s = %s", (op[2], op[3] % op[2]))
    elif kind == "move":  # rows move between partitions through the root
        db.sql("UPDATE ev SET region = %s WHERE id %% %s = %s", (target, op[2], op[3] % op[2]))
    else:  # ids move between sub-partitions through the intermediate
        db.sql("UPDATE ev_s SET id = id + 100000 WHERE id %% %s = %s", (op[2], op[3] % op[2]))


@pytest.mark.stress
def test_random_dml_over_parents_and_leaves_stays_exact(db: Database) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    _hierarchies(db)
    queries = {
        "ev_agg": "SELECT region, count(*) AS n, sum(amt) AS s FROM ev GROUP BY region",
        "ev_flat": "SELECT id, region, amt FROM ev WHERE amt % 3 <> 0",
        "zoo_agg": "SELECT amt, count(*) AS n, min(id) AS first FROM zoo GROUP BY amt",
    }

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        initial=st.lists(
            st.tuples(st.sampled_from(PART_TARGETS + INH_TARGETS), st.integers(1, 4)), max_size=6
        ),
        changes=_batches,
    )
    def run(initial, changes) -> None:  # type: ignore[no-untyped-def]
        for name in queries:
            db.sql(
                "SELECT pgtrickle.drop_stream_table(%s) FROM pgtrickle.stream_tables_info"
                " WHERE table_name = %s",
                (name, name),
            )
        db.sql("DELETE FROM ev")
        db.sql("DELETE FROM zoo")
        ids = _Ids()
        for target, n in initial:
            _insert(db, target, n, ids)
        for name, query in queries.items():
            create_st(db, name, query, schedule="1h")
        refresh_and_check(db, *queries)
        for batch in changes:
            for op in batch:
                _apply(db, op, ids)
            outcomes = _actions(refresh_and_check(db, *queries))
            for name, (action, reason) in outcomes.items():
                assert action in (Action.DIFFERENTIAL, Action.NO_DATA), (name, reason, batch)

    run()


def test_wal_capture_is_refused_for_a_partitioned_source_and_auto_stays_on_triggers(
    partitioned: Database,
) -> None:
    from pgtrickle.cdc.modes import CaptureManager

    db = partitioned
    before = db.sql("SELECT cdc_mode, cdc_mode_setting, cdc_reason FROM pgtrickle.pgt_change_sources")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
        db.sql("SELECT pgtrickle.set_cdc_mode('pt', 'wal')")
    assert "partitions or inheritance children" in str(err.value)
    assert db.sql("SELECT cdc_mode, cdc_mode_setting, cdc_reason FROM pgtrickle.pgt_change_sources") == before
    # 'auto' (or a 'wal' default): the daemon keeps it on triggers and says why, without a slot.
    db.sql("SELECT pgtrickle.set_cdc_mode('pt', 'auto')")
    started: list[bool] = []
    CaptureManager(db.conn, lambda: started.append(True)).reconcile()
    [(mode, reason)] = db.sql(
        "SELECT cdc_mode, reason FROM pgtrickle.check_cdc_health() WHERE source = 'public.pt'"
    )
    assert mode == "trigger" and "partition" in reason and not started, (mode, reason, started)
    assert db.scalar("SELECT count(*) FROM pg_replication_slots") == 0
    db.sql("DELETE FROM pt_1 WHERE id < 10")
    _differential(db, "agg", "flat")


def test_dropping_a_partition_with_rows_reinitializes(partitioned: Database) -> None:
    db = partitioned
    db.sql("DROP TABLE pt_2")
    outcomes = _actions(refresh_and_check(db, "agg", "flat"))
    assert all(a is Action.FULL and "pt_2" in r and "dropped" in r for a, r in outcomes.values()), outcomes
    db.sql("INSERT INTO pt_1 VALUES (99, 1, 1) ON CONFLICT (id) DO UPDATE SET v = 0")
    _differential(db, "agg", "flat")
    assert db.sql("SELECT problems FROM pgtrickle.check_cdc_health() WHERE source = 'public.pt'") == [([],)]


def test_from_only_parent_never_shows_childrens_rows(inherited: Database) -> None:
    # Spark cannot read ONLY: the stream table is refused at its refresh, never filled with
    # the children's rows (which the parent's buffer now holds).
    db = inherited
    create_st(db, "only_parent", "SELECT id, kind FROM ONLY animals", schedule="1h")
    db.sql("INSERT INTO dogs (id, kind, legs) VALUES (500, 'dog', 4)")
    with pytest.raises(UnsupportedQueryError, match="FROM ONLY"):
        refresh(db, "only_parent")
    assert db.scalar("SELECT count(*) FROM only_parent") == 0
    assert db.scalar(
        "SELECT frontier IS NULL FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'only_parent'"
    )


def test_a_partition_attached_during_a_refresh_is_not_forgotten(partitioned: Database, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The ATTACH commits while a DIFFERENTIAL refresh that read the sources before it runs
    # its Spark job: that refresh must not clear the reinitialization the ATTACH asked for.
    from pgtrickle import faults

    db = partitioned
    db.sql("CREATE TABLE pt_3 (LIKE pt)")
    db.sql("INSERT INTO pt_3 SELECT g, g % 5, g FROM generate_series(200, 219) g")
    db.sql("UPDATE pt_1 SET v = v + 1 WHERE id = 1")
    real_point = faults.point
    attached: list[bool] = []

    # The refresh pins its sources while it reads (catalog.identity): the ATTACH waits for the
    # read to end, then commits while the refresh applies what it read before it.
    failed: list[BaseException] = []

    def attach() -> None:
        try:
            with psycopg.connect(db.dsn, autocommit=True) as other:
                other.execute("SET lock_timeout = '60s'")
                other.execute("ALTER TABLE pt ATTACH PARTITION pt_3 FOR VALUES FROM (200) TO (300)")
            attached.append(True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    worker = threading.Thread(target=attach)

    def point(name: str) -> None:
        if name == "refresh.spark_job" and not worker.is_alive() and not attached:
            worker.start()
            time.sleep(0.5)  # the ATTACH is queued behind the read
        real_point(name)

    monkeypatch.setattr(faults, "point", point)
    [outcome] = refresh(db, "agg")
    monkeypatch.setattr(faults, "point", real_point)
    worker.join(60)
    assert not failed, failed
    assert attached and outcome.action is Action.DIFFERENTIAL, (attached, outcome.action, outcome.reason)
    assert db.scalar("SELECT needs_reinit FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'agg'")
    outcomes = _actions(refresh_and_check(db, "agg", "flat"))
    assert all(a is Action.FULL and "pt_3" in r for a, r in outcomes.values()), outcomes
    db.sql("DELETE FROM pt_3 WHERE id = 200")
    _differential(db, "agg", "flat")


def test_a_wal_source_that_gains_a_child_goes_back_to_triggers(db: Database) -> None:
    from pgtrickle.cdc.modes import CaptureManager
    from pgtrickle.cdc.wal import DecoderThread, slot_name_for

    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '20 seconds' WHERE name = 'wal_transition_timeout'")
    db.sql("CREATE TABLE animals (id int PRIMARY KEY, kind text, legs int)")
    db.sql("INSERT INTO animals SELECT g, 'a' || (g % 3), g % 5 FROM generate_series(1, 30) g")
    create_st(
        db,
        "per_kind",
        "SELECT kind, count(*) AS n, sum(legs) AS legs FROM animals GROUP BY kind",
        schedule="1h",
    )
    refresh_and_check(db, "per_kind")
    db.sql("SELECT pgtrickle.set_cdc_mode('animals', 'wal')")
    threads: list[DecoderThread] = []

    def start_decoder() -> None:
        if not threads:
            threads.append(DecoderThread(db.dsn, slot_name_for(db.dsn.rsplit("/", 1)[1])))
            threads[0].start()

    try:
        CaptureManager(db.conn, start_decoder).reconcile()
        assert (
            db.scalar("SELECT cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_name = 'animals'")
            == "wal"
        )
        db.sql("INSERT INTO animals VALUES (31, 'a0', 4)")
        _differential(db, "per_kind")
        db.sql("CREATE TABLE birds (id int NOT NULL, kind text, legs int)")
        db.sql("INSERT INTO birds VALUES (400, 'bird', 2), (401, 'bird', 2)")
        db.sql("ALTER TABLE birds INHERIT animals")
        [(mode, reason)] = db.sql("SELECT cdc_mode, reason FROM pgtrickle.check_cdc_health()")
        assert mode == "trigger" and "inheritance children" in reason, (mode, reason)
        db.sql("INSERT INTO birds VALUES (402, 'bird', 2)")
        db.sql("UPDATE animals SET legs = 0 WHERE id = 2")
        outcomes = _actions(refresh_and_check(db, "per_kind"))
        assert outcomes["per_kind"][0] is Action.FULL and "birds" in outcomes["per_kind"][1], outcomes
        db.sql("DELETE FROM birds WHERE id = 400")
        _differential(db, "per_kind")
        assert db.sql("SELECT problems FROM pgtrickle.check_cdc_health()") == [([],)]
    finally:
        for thread in threads:
            thread.stop()
