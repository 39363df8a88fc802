"""Members of an atomic group that read another member refresh DIFFERENTIAL (refresh/group.py).

The group: ``base`` (a root reading ``orders``) and below it a projection with a filter
(``proj``), an aggregate with a non-invertible MAX (``agg``), a join with an external table
(``joined``) and a second level (``top``, over ``agg``). Each downstream member takes its change
from ``base`` (or ``agg``) as computed in the same transaction; the oracle checks every member
after every refresh, and the history says DIFFERENTIAL (or FULL, with the reason, where it must).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import assert_oracle, create_st, refresh

MEMBERS = ("base", "proj", "agg", "joined", "top")
DOWNSTREAM = MEMBERS[1:]
REGIONS = 40


def build(db: Database, orders: int = 400, ratio: float | None = 1.0) -> None:
    """The sources, the five members as one explicit group, populated."""
    db.sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, region int NOT NULL, amount int NOT NULL,"
        " price numeric(12,3), at timestamptz NOT NULL, note text)"
    )
    db.sql(
        "INSERT INTO orders SELECT g, g %% %s, g %% 97, (g %% 13) * 1.125, timestamptz '2026-01-01 10:00:00+00'"
        " + g * interval '1 minute 0.5 second', CASE WHEN g %% 5 = 0 THEN NULL ELSE 'n' || g END"
        " FROM generate_series(1, %s) g",
        (REGIONS, orders),
    )
    db.sql("CREATE TABLE regions (region int PRIMARY KEY, label text)")
    db.sql("INSERT INTO regions SELECT g, 'region ' || g FROM generate_series(0, %s) g", (REGIONS - 1,))
    mode = {"refresh_mode": "DIFFERENTIAL"}
    create_st(db, "base", "SELECT id, region, amount, price, at, note FROM orders WHERE amount > 5", **mode)
    create_st(
        db,
        "proj",
        "SELECT id, amount * 2 AS dbl, price, at, coalesce(note, '-') AS note FROM base WHERE amount < 80",
        **mode,
    )
    create_st(
        db,
        "agg",
        "SELECT region, sum(amount) AS total, count(*) AS n, max(amount) AS top, sum(price) AS price"
        " FROM base GROUP BY region",
        **mode,
    )
    create_st(
        db, "joined", "SELECT b.id, b.amount, r.label FROM base b JOIN regions r USING (region)", **mode
    )
    create_st(db, "top", "SELECT region, total, top FROM agg WHERE n > 3", **mode)
    if ratio is not None:
        for name in MEMBERS:
            db.sql(
                "SELECT pgtrickle.alter_stream_table(%s, differential_fallback_ratio => %s)", (name, ratio)
            )
    db.sql("SELECT pgtrickle.create_refresh_group('g', ARRAY['base', 'proj', 'agg', 'joined', 'top'])")
    refresh(db)
    assert_oracle(db, *MEMBERS)


def last_rows(db: Database) -> dict[str, tuple]:
    """Per member: (action, status, mode_reason or skip/error text, spark_jobs) of its last refresh."""
    rows = db.sql(
        "SELECT DISTINCT ON (s.pgt_name) s.pgt_name, h.action, h.status,"
        " coalesce(h.skip_reason, h.error_message, h.mode_reason), h.spark_jobs"
        " FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " ORDER BY s.pgt_name, h.refresh_id DESC"
    )
    return {r[0]: tuple(r[1:]) for r in rows}


def contents(db: Database) -> dict[str, list[tuple]]:
    return {n: db.sql(f"SELECT * FROM {n} ORDER BY 1, 2") for n in MEMBERS}


def frontiers(db: Database) -> list[tuple]:
    return db.sql("SELECT pgt_name, frontier::text FROM pgtrickle.pgt_stream_tables ORDER BY 1")


DML = st.lists(
    st.tuples(
        st.sampled_from(["insert", "update", "delete", "move", "relabel"]),
        st.integers(0, 10_000),
        st.integers(-40, 40),
    ),
    min_size=1,
    max_size=6,
)


def test_downstream_members_stay_exact_and_differential_under_random_dml(db: Database) -> None:
    build(db)
    next_id = [10_000]

    @settings(
        max_examples=examples(3),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # a shrink re-runs whole group refreshes: minutes
    )
    @given(DML)
    def round_of(dml: list[tuple[str, int, int]]) -> None:
        for kind, key, value in dml:
            if kind == "insert":
                next_id[0] += 1
                db.sql(
                    "INSERT INTO orders VALUES (%s, %s, %s, %s, now(), %s)",
                    (
                        next_id[0],
                        key % REGIONS,
                        abs(value) + 3,
                        None if key % 4 == 0 else value / 8,
                        f"x{key}",
                    ),
                )
            elif kind == "update":
                db.sql(
                    "UPDATE orders SET amount = abs(amount + %s), price = price + 0.001 WHERE id %% 37 = %s",
                    (value, key % 37),
                )
            elif kind == "move":
                db.sql(
                    "UPDATE orders SET region = (region + 1) %% %s WHERE id %% 41 = %s", (REGIONS, key % 41)
                )
            elif kind == "relabel":
                db.sql("UPDATE regions SET label = label || '*' WHERE region = %s", (key % REGIONS,))
            else:
                db.sql("DELETE FROM orders WHERE id %% 53 = %s", (key % 53,))
        outcomes = {o.st.name: o for o in refresh(db)}
        assert_oracle(db, *MEMBERS)
        assert set(outcomes) == set(MEMBERS)
        # A DELETE or UPDATE may match no row (nothing captured), a change may not pass a filter:
        # what each member wrote into its change buffer decides whether its readers have work.
        wrote = {n for n, o in outcomes.items() if o.rows_inserted + o.rows_deleted > 0}
        expected = set()
        if any(kind != "relabel" for kind, _, _ in dml) and outcomes["base"].action is not Action.NO_DATA:
            expected.add("base")
        if "base" in wrote:
            expected |= {"proj", "agg", "joined"}
        if "agg" in wrote:
            expected.add("top")
        if any(kind == "relabel" for kind, _, _ in dml):
            expected.add("joined")
        ran = {n for n, o in outcomes.items() if o.action is not Action.NO_DATA}
        assert ran == expected, {
            n: (o.action, o.reason, o.rows_inserted, o.rows_deleted) for n, o in outcomes.items()
        }
        assert any(kind == "insert" for kind, _, _ in dml) <= ("base" in ran)
        history = last_rows(db)
        for name in ran:
            action, status, reason, jobs = history[name]
            assert (action, status) == ("DIFFERENTIAL", "COMPLETED"), (name, history[name])
            assert outcomes[name].action is Action.DIFFERENTIAL
            assert jobs is not None and jobs >= 1, (name, history[name])
            if (name in DOWNSTREAM and name != "joined") or (name == "joined" and "base" in wrote):
                assert "atomic group g: the change of upstream member" in reason, (name, reason)

    round_of()


def test_an_upstream_member_refreshed_full_makes_its_readers_full_and_says_why(db: Database) -> None:
    build(db, ratio=None)
    # Over the adaptive fallback's ratio (15 % of the sources' rows): base is recomputed in full.
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id % 2 = 0")
    outcomes = {o.st.name: o.action for o in refresh(db)}
    assert outcomes == dict.fromkeys(MEMBERS, Action.FULL)
    assert_oracle(db, *MEMBERS)
    history = last_rows(db)
    assert "pending changes exceed" in history["base"][2]
    for name in ("proj", "agg", "joined"):
        assert history[name][:2] == ("FULL", "COMPLETED")
        assert "upstream member public.base refreshes FULL" in history[name][2], history[name]
    assert "upstream member public.agg refreshes FULL" in history["top"][2]
    # The next small change: differential again all the way down.
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id = 7")
    outcomes = {o.st.name: o.action for o in refresh(db)}
    assert outcomes == dict.fromkeys(MEMBERS, Action.DIFFERENTIAL)
    assert_oracle(db, *MEMBERS)


def test_a_failing_downstream_apply_rolls_the_whole_group_back(db: Database) -> None:
    build(db)
    before, at = contents(db), frontiers(db)
    db.sql("ALTER TABLE agg ADD CONSTRAINT small CHECK (top < 200)")
    db.sql("INSERT INTO orders VALUES (90001, 3, 250, 1, now(), 'big')")
    try:
        refresh(db)
    except PgTrickleError as exc:
        assert "no member was changed" in str(exc)
    else:
        raise AssertionError("the group refresh should have failed")
    assert contents(db) == before and frontiers(db) == at
    history = last_rows(db)
    assert history["agg"][:2] == ("DIFFERENTIAL", "FAILED"), history["agg"]
    for name in ("base", "proj", "joined", "top"):
        assert history[name][:2] == ("SKIP", "SKIPPED") and "agg failed" in history[name][2]
    # Nothing was lost: once the constraint allows it, the next refresh takes the same change.
    db.sql("ALTER TABLE agg DROP CONSTRAINT small")
    outcomes = {o.st.name: o.action for o in refresh(db)}
    assert outcomes == dict.fromkeys(MEMBERS, Action.DIFFERENTIAL)
    assert_oracle(db, *MEMBERS)
    assert not db.sql("SELECT 1 FROM pg_tables WHERE tablename LIKE 'group_changes_%%'"), "copies dropped"


def test_a_member_that_joins_with_untaken_changes_is_recomputed_once(db: Database) -> None:
    """``proj`` reads ``base`` outside any group; ``base`` refreshes alone (its change waits in its
    buffer for ``proj``); then both form a group: ``proj`` cannot take ``base``'s change of this
    refresh alone, so it is recomputed, saying why - and is differential from then on."""
    db.sql("CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL)")
    db.sql("INSERT INTO orders SELECT g, g % 50 FROM generate_series(1, 300) g")
    create_st(db, "base", "SELECT id, amount FROM orders WHERE amount > 5", refresh_mode="DIFFERENTIAL")
    create_st(
        db, "proj", "SELECT amount, count(*) AS n FROM base GROUP BY amount", refresh_mode="DIFFERENTIAL"
    )
    refresh(db)
    db.sql("DELETE FROM orders WHERE id <= 10")
    assert [o.st.name for o in refresh(db, "base")] == ["base"]
    db.sql("SELECT pgtrickle.create_refresh_group('pair', ARRAY['base', 'proj'])")
    db.sql("INSERT INTO orders VALUES (1000, 20)")
    outcomes = {o.st.name: o.action for o in refresh(db)}
    assert outcomes == {"base": Action.DIFFERENTIAL, "proj": Action.FULL}
    assert_oracle(db, "base", "proj")
    assert "were not taken yet" in last_rows(db)["proj"][2]
    db.sql("UPDATE orders SET amount = 30 WHERE id = 1000")
    outcomes = {o.st.name: o.action for o in refresh(db)}
    assert outcomes == {"base": Action.DIFFERENTIAL, "proj": Action.DIFFERENTIAL}
    assert_oracle(db, "base", "proj")


def test_a_key_bounded_read_of_an_upstream_member_includes_its_change(db: Database) -> None:
    """``base`` over 10k rows: the join term ``post(base) ⋈ Δregions`` reads only the changed
    regions' rows of ``base`` - its stored rows at the snapshot with its change of this refresh."""
    build(db, orders=24_000)
    db.sql("ANALYZE base")
    db.sql("UPDATE regions SET label = 'renamed' WHERE region IN (3, 4)")
    db.sql("INSERT INTO orders VALUES (90001, 3, 50, 1, now(), 'new'), (90002, 4, 60, 2, now(), NULL)")
    db.sql("DELETE FROM orders WHERE id IN (43, 44, 83)")  # regions 3, 4 and 3
    outcomes = {o.st.name: o for o in refresh(db)}
    assert_oracle(db, *MEMBERS)
    joined = outcomes["joined"]
    assert joined.action is Action.DIFFERENTIAL
    assert joined.timings.get("key_filtered_reads", 0) >= 1, joined.timings
    assert joined.timings.get("group_member_reads", 0) >= 1, joined.timings


def test_values_re_carried_on_their_way_to_spark_cross_a_group_exactly(db: Database) -> None:
    """Columns Spark's JDBC mapping would alter (spark/carry.py: ``time``, ``timetz``,
    ``character(n)``, unconstrained ``numeric``) reach a downstream member's change and its
    upstream member's stored rows in one representation: the delete of an old row matches it."""
    db.sql("CREATE TABLE kinds (id int PRIMARY KEY, t time, tz timetz, c character(4), n numeric)")
    db.sql(
        "INSERT INTO kinds SELECT g, time '10:00:00.123456' + g * interval '1 second',"
        " timetz '08:00:00.5+02' + g * interval '1 minute', (ARRAY['a', 'bb', 'ccc', NULL])[g % 4 + 1],"
        " round(g / 7.0, 6) FROM generate_series(1, 60) g"
    )
    mode = {"refresh_mode": "DIFFERENTIAL"}
    create_st(db, "k_base", "SELECT id, t, tz, c, n FROM kinds WHERE id % 10 <> 0", **mode)
    create_st(db, "k_rows", "SELECT id, t, tz, c, -n AS neg FROM k_base WHERE n > 1", **mode)
    create_st(
        db, "k_agg", "SELECT c, count(*) AS cnt, sum(n) AS n, max(t) AS t FROM k_base GROUP BY c", **mode
    )
    names = ("k_base", "k_rows", "k_agg")
    for name in names:
        db.sql("SELECT pgtrickle.alter_stream_table(%s, differential_fallback_ratio => 1)", (name,))
    db.sql("SELECT pgtrickle.create_refresh_group('kinds', ARRAY['k_base', 'k_rows', 'k_agg'])")
    refresh(db)
    assert_oracle(db, *names)
    for statement in (
        "UPDATE kinds SET t = t + interval '0.000001 second', n = n + 1e-15 WHERE id % 3 = 0",
        "UPDATE kinds SET c = 'dd', tz = tz + interval '1 hour' WHERE id % 4 = 1",
        "DELETE FROM kinds WHERE id % 5 = 2",
        "INSERT INTO kinds VALUES (101, '23:59:59.999999', '23:59:59.999999-11', 'e', 12345.000000000000000001)",
    ):
        db.sql(statement)
        outcomes = {o.st.name: o.action for o in refresh(db)}
        assert outcomes == dict.fromkeys(names, Action.DIFFERENTIAL), statement
        assert_oracle(db, *names)
