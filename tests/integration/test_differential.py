"""DIFFERENTIAL refresh end to end: real PostgreSQL, real Spark, the oracle after every refresh."""

from __future__ import annotations

import pytest

from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _setup(db) -> None:  # type: ignore[no-untyped-def]
    # Small tables: keep the adaptive fallback out of the way (tested on its own).
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, cust int, region text, amount numeric(10,2), qty int)")
    db.sql("CREATE TABLE customers (id int PRIMARY KEY, name text, tier int)")
    db.sql("INSERT INTO customers SELECT g, 'c' || g, g % 3 FROM generate_series(1, 20) g")
    db.sql(
        "INSERT INTO orders SELECT g, 1 + g % 25, (ARRAY['n','s','e',NULL])[1 + g % 4], g * 1.5, g % 7"
        " FROM generate_series(1, 200) g"
    )


def _churn(db, base: int = 200) -> None:  # type: ignore[no-untyped-def]
    db.sql(
        "INSERT INTO orders SELECT g, 1 + g %% 25, (ARRAY['n','w',NULL])[1 + g %% 3], g %% 1000, NULL"
        " FROM generate_series(%s::int, %s::int) g",
        (base + 1, base + 30),
    )
    db.sql("UPDATE orders SET amount = amount + 1, region = 'e' WHERE id % 11 = 0")
    db.sql("UPDATE orders SET id = id + 1000 WHERE id % 37 = 0")
    db.sql("DELETE FROM orders WHERE id % 13 = 0")
    db.sql("UPDATE customers SET tier = tier + 1 WHERE id % 4 = 0")
    db.sql("DELETE FROM customers WHERE id = 7")
    db.sql("INSERT INTO customers VALUES (%s, 'late', 2) ON CONFLICT DO NOTHING", (25 + base // 10000,))


QUERIES = {
    "filter": "SELECT id, region, amount FROM orders WHERE amount > 20",
    "join": "SELECT o.id, c.name, o.amount FROM orders o JOIN customers c ON c.id = o.cust",
    "agg": "SELECT region, count(*) AS n, sum(amount) AS total, avg(qty) AS q, count(qty) AS cq FROM orders GROUP BY region",
    "joinagg": "SELECT c.tier, sum(o.amount) AS total, count(*) AS n FROM orders o JOIN customers c ON c.id = o.cust GROUP BY c.tier",
    "scalar": "SELECT count(*) AS n, sum(qty) AS s FROM orders",
    "distinct": "SELECT DISTINCT region, qty FROM orders",
    "minmax": "SELECT region, min(amount) AS lo, max(amount) AS hi FROM orders GROUP BY region",
    "having": "SELECT cust, count(*) AS n FROM orders GROUP BY cust HAVING count(*) > 8",
    "union": "SELECT region AS r FROM orders UNION SELECT name FROM customers",
    "unionall": "SELECT id, region FROM orders WHERE qty = 1 UNION ALL SELECT id, name FROM customers",
    "leftjoin": "SELECT c.id, c.name, o.id AS oid, o.amount FROM customers c LEFT JOIN orders o ON o.cust = c.id",
    "exists": "SELECT c.id FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.cust = c.id AND o.qty > 3)",
    "window": "SELECT id, region, rank() OVER (PARTITION BY region ORDER BY amount, id) AS r FROM orders",
    "selfjoin": "SELECT a.id, b.id AS bid FROM orders a JOIN orders b ON a.cust = b.cust AND a.id < b.id WHERE a.qty = 2",
}


@pytest.mark.parametrize("shape", sorted(QUERIES))
def test_differential_shapes(db, shape) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(db, f"st_{shape}", QUERIES[shape])
    refresh(db)
    assert_oracle(db)
    _churn(db)
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert_oracle(db)
    _churn_again = "UPDATE orders SET qty = coalesce(qty, 0) + 1 WHERE id % 5 = 0"
    db.sql(_churn_again)
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert_oracle(db)


def _history(db, name: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    return db.sql(
        "SELECT action, was_full_fallback, mode_reason FROM pgtrickle.get_refresh_history(%s, 50)"
        " ORDER BY refresh_id",
        (name,),
    )


def test_top_k_keeps_its_input_and_refreshes_differential(db) -> None:  # type: ignore[no-untyped-def]
    """refresh_mode DIFFERENTIAL: ORDER BY ... LIMIT keeps its input in a hidden state table; the
    first refresh (FULL) fills it, later ones are DIFFERENTIAL and exact, and explain / the history
    say so (AUTO refreshes it FULL: tests/integration/test_differential_properties.py)."""
    _setup(db)
    create_st(
        db,
        "st_first",
        "SELECT o.id, o.amount FROM orders o ORDER BY o.amount DESC, o.id LIMIT 5",
        refresh_mode="DIFFERENTIAL",
    )
    refresh(db)
    [(table, reason)] = db.sql("SELECT relid::regclass::text, reason FROM pgtrickle.pgt_state_tables")
    assert table.startswith("pgtrickle_changes.state_") and "TopK" in reason
    for base in (200, 400):
        _churn(db, base)
        [outcome] = refresh(db)
        assert outcome.action.value == "DIFFERENTIAL", outcome.reason
        assert_oracle(db)
    mode = db.sql(
        "SELECT configured_mode, effective_mode, reason FROM pgtrickle.explain_refresh_mode('st_first')"
    )
    assert mode[0][:2] == ("DIFFERENTIAL", "DIFFERENTIAL") and "TopK" in mode[0][2]
    info = db.sql("SELECT effective_mode FROM pgtrickle.stream_tables_info")
    assert info[0][0] == "DIFFERENTIAL"
    history = db.sql("SELECT action FROM pgtrickle.pgt_refresh_history ORDER BY refresh_id")
    assert history[-1][0] == "DIFFERENTIAL"


def test_not_in_applies_only_the_difference(db) -> None:  # type: ignore[no-untyped-def]
    """NOT IN is an anti join: only the rows whose existence flips are applied, NULLs included."""
    _setup(db)
    create_st(db, "st_notin", "SELECT o.id FROM orders o WHERE o.cust NOT IN (SELECT c.id FROM customers c)")
    refresh(db)
    db.sql("INSERT INTO customers VALUES (24, 'new', 1)")
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL" and "anti join" in outcome.reason, outcome.reason
    assert outcome.rows_deleted > 0 and outcome.rows_inserted == 0
    assert_oracle(db)
    # a NULL entering the NOT IN subquery empties the result: everything goes, by explicit deletes
    assert db.scalar("SELECT count(*) FROM st_notin") > 0
    db.sql("ALTER TABLE customers DROP CONSTRAINT customers_pkey")
    db.sql("ALTER TABLE customers ALTER COLUMN id DROP NOT NULL")
    db.sql("INSERT INTO customers VALUES (NULL, 'nobody', 0)")
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert db.scalar("SELECT count(*) FROM st_notin") == 0
    assert_oracle(db)


def test_differential_mode_on_unsupported_query_is_an_error_naming_the_construct(db) -> None:  # type: ignore[no-untyped-def]
    from pgtrickle.errors import PgTrickleError

    _setup(db)
    # ORDER BY ... LIMIT used to be refused here; it keeps its input in a hidden state table now
    create_st(
        db,
        "st_first",
        "SELECT cust, count(*) AS n FROM orders GROUP BY ROLLUP (cust)",
        refresh_mode="DIFFERENTIAL",
    )
    with pytest.raises(PgTrickleError, match="ROLLUP"):
        refresh(db)
    status, error = db.sql("SELECT status, last_error FROM pgtrickle.pgt_stream_tables")[0]
    assert status == "ERROR" and "DIFFERENTIAL" in error and "ROLLUP" in error
    assert db.scalar("SELECT count(*) FROM st_first") == 0


def test_explain_before_and_after_the_first_refresh(db) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(db, "st_agg", QUERIES["agg"], initialize=False)
    row = db.sql("SELECT effective_mode, reason FROM pgtrickle.explain_refresh_mode('st_agg')")[0]
    assert row[0] is None and "not analysed yet" in row[1]
    refresh(db)
    row = db.sql("SELECT effective_mode, reason FROM pgtrickle.explain_refresh_mode('st_agg')")[0]
    assert row[0] == "DIFFERENTIAL" and "Aggregate: algebraic over stored state" in row[1]
    db.sql("SELECT pgtrickle.alter_stream_table('st_agg', refresh_mode => 'FULL')")
    row = db.sql("SELECT effective_mode, reason FROM pgtrickle.explain_refresh_mode('st_agg')")[0]
    assert row == ("FULL", "refresh_mode is FULL")


def test_adaptive_fallback_records_a_full_refresh(db) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(db, "st_f", QUERIES["filter"])
    db.sql("SELECT pgtrickle.alter_stream_table('st_f', differential_fallback_ratio => 0.05)")
    db.sql("ANALYZE orders")
    refresh(db)
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id <= 5")  # 5 changes of 200 rows: 2.5%
    [small] = refresh(db)
    assert small.action.value == "DIFFERENTIAL"
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id <= 40")  # 20%
    [big] = refresh(db)
    assert big.action.value == "FULL" and "differential_fallback_ratio" in big.reason
    assert_oracle(db)
    assert _history(db, "st_f")[-1][:2] == ("FULL", True)


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, float("nan")])
def test_bad_fallback_ratio_is_refused(db, bad: float) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    from tests.integration.helpers import catalog_fingerprint

    _setup(db)
    create_st(db, "st_f", QUERIES["filter"], initialize=False)
    before = catalog_fingerprint(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="differential_fallback_ratio"):
        db.sql("SELECT pgtrickle.alter_stream_table('st_f', differential_fallback_ratio => %s)", (bad,))
    assert catalog_fingerprint(db) == before


def test_truncated_source_forces_full(db) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(db, "st_j", QUERIES["join"])
    refresh(db)
    db.sql("TRUNCATE customers")
    db.sql("INSERT INTO customers VALUES (1, 'one', 1), (2, 'two', 2)")
    [outcome] = refresh(db)
    assert outcome.action.value == "FULL" and "truncated" in outcome.reason
    assert_oracle(db)


def test_stream_table_over_stream_table_is_differential_at_both_levels(db) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(
        db, "lvl1", "SELECT o.id, o.cust, c.tier, o.amount FROM orders o JOIN customers c ON c.id = o.cust"
    )
    create_st(db, "lvl2", "SELECT tier, count(*) AS n, sum(amount) AS total FROM lvl1 GROUP BY tier")
    create_st(db, "lvl3", "SELECT DISTINCT tier FROM lvl2 WHERE n > 10")
    refresh(db)
    assert_oracle(db)
    for i in range(2):
        _churn(db, 10000 * (i + 1))
        outcomes = refresh(db)
        assert {o.st.name: o.action.value for o in outcomes} == {
            "lvl1": "DIFFERENTIAL",
            "lvl2": "DIFFERENTIAL",
            "lvl3": "DIFFERENTIAL",
        }, [o.reason for o in outcomes]
        assert_oracle(db)


def test_wal_capture_feeds_differential_refresh(db) -> None:  # type: ignore[no-untyped-def]
    from pgtrickle.daemon.loop import Scheduler

    _setup(db)
    db.sql("UPDATE pgtrickle.pgt_settings SET value = 'auto' WHERE name = 'cdc_mode'")
    create_st(db, "st_ja", QUERIES["joinagg"])
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        scheduler.tick()  # initial population, then the move to WAL capture
    finally:
        scheduler.close()
    assert {
        r[0] for r in db.sql("SELECT cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_kind = 'TABLE'")
    } == {"wal"}
    _churn(db)
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert_oracle(db)


def test_other_side_of_a_join_is_read_by_key(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE facts (id int PRIMARY KEY, dim int, v int)")
    db.sql("CREATE TABLE dims (id int PRIMARY KEY, name text)")
    db.sql("INSERT INTO facts SELECT g, g % 500, g FROM generate_series(1, 60000) g")
    db.sql("INSERT INTO dims SELECT g, 'd' || g FROM generate_series(0, 499) g")
    db.sql("ANALYZE facts")
    create_st(db, "fd", "SELECT f.id, d.name FROM facts f JOIN dims d ON d.id = f.dim")
    refresh(db)
    db.sql("UPDATE dims SET name = name || '!' WHERE id IN (3, 4)")
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL"
    assert outcome.timings.get("key_filtered_reads") == 1, outcome.timings  # facts, by dim in (3, 4)
    assert "whole_table_reads" not in outcome.timings
    assert_oracle(db)


def test_aggregates_over_joins_recompute_their_touched_groups(db) -> None:  # type: ignore[no-untyped-def]
    """Aggregates over joins recompute their touched groups (keys found in Spark, one job)."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE ords (id int PRIMARY KEY, customer int)")
    db.sql("CREATE TABLE lines (id int PRIMARY KEY, ord int, product int, qty int)")
    db.sql("INSERT INTO ords SELECT g, g % 300 FROM generate_series(1, 20000) g")
    db.sql("INSERT INTO lines SELECT g, 1 + g % 20000, g % 37, g % 5 FROM generate_series(1, 60000) g")
    db.sql("CREATE INDEX ON lines (ord)")
    db.sql("ANALYZE ords, lines")
    create_st(
        db,
        "per_customer",
        "SELECT o.customer, count(DISTINCT l.product) AS products, max(l.qty) AS top "
        "FROM lines l JOIN ords o ON o.id = l.ord GROUP BY o.customer",
    )
    # a self-join must not get one occurrence's key filter applied to the other
    create_st(
        db,
        "same_bucket",
        "SELECT x.customer, max(y.id) AS last_id FROM ords x JOIN ords y "
        "ON y.customer % 7 = x.customer % 7 AND y.id < 300 GROUP BY x.customer",
    )
    # INTERSECT: each branch is read for the touched row values only
    create_st(
        db, "busy", "SELECT customer AS c FROM ords INTERSECT ALL SELECT qty FROM lines WHERE product < 30"
    )
    refresh(db)
    db.sql("UPDATE lines SET qty = 9 WHERE id IN (5, 6)")
    db.sql("DELETE FROM lines WHERE id = 7")
    db.sql("UPDATE ords SET customer = 299 WHERE id IN (1, 250)")
    outcomes = {o.st.name: o for o in refresh(db)}
    outcome = outcomes["per_customer"]
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert "touched groups, recompute" in outcome.reason
    assert outcomes["same_bucket"].action.value == "DIFFERENTIAL"
    busy = outcomes["busy"]
    assert busy.action.value == "DIFFERENTIAL", busy.reason
    assert_oracle(db)


def test_user_trigger_on_stream_table_sees_old_and_new(db) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(db, "st_agg", QUERIES["agg"])
    refresh(db)
    db.sql("CREATE TABLE audit (op text, old_n bigint, new_n bigint, region text)")
    db.sql("""CREATE FUNCTION audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN
                INSERT INTO audit VALUES (TG_OP, CASE WHEN TG_OP <> 'INSERT' THEN OLD.n END,
                                          CASE WHEN TG_OP <> 'DELETE' THEN NEW.n END,
                                          coalesce(NEW.region, OLD.region));
                RETURN NULL;
              END $$""")
    db.sql(
        "CREATE TRIGGER a AFTER INSERT OR UPDATE OR DELETE ON st_agg FOR EACH ROW EXECUTE FUNCTION audit_fn()"
    )
    before = dict(db.sql("SELECT region, n FROM st_agg WHERE region IS NOT NULL"))
    db.sql("INSERT INTO orders VALUES (5000, 1, 'n', 1, 1), (5001, 1, 'zz', 1, 1)")
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL"
    rows = db.sql("SELECT op, old_n, new_n, region FROM audit ORDER BY op, region")
    # a stored-state group changes in place: one UPDATE with the old and the new row
    assert ("UPDATE", before["n"], before["n"] + 1, "n") in rows
    assert ("INSERT", None, 1, "zz") in rows
    assert len(rows) == 2
    assert_oracle(db)


@pytest.mark.parametrize("shape", ["join", "agg", "having"])
def test_large_deltas_travel_by_jdbc_staging(db, shape: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from pgtrickle.refresh import differential

    monkeypatch.setattr(differential, "COPY_MAX_ROWS", 3)
    _setup(db)
    create_st(db, f"st_{shape}", QUERIES[shape])
    refresh(db)
    _churn(db)
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert_oracle(db)
    assert db.scalar("SELECT count(*) FROM pg_class WHERE relname LIKE 'delta\\_%%'") == 0


def test_history_records_differential_refreshes(db) -> None:  # type: ignore[no-untyped-def]
    _setup(db)
    create_st(db, "st_f", QUERIES["filter"])
    refresh(db)
    db.sql("UPDATE orders SET amount = amount + 100 WHERE id IN (1, 2, 3)")
    db.sql("DELETE FROM orders WHERE id = 150")
    refresh(db)
    history = db.sql(
        "SELECT action, status, rows_inserted, rows_deleted, delta_row_count, was_full_fallback"
        " FROM pgtrickle.get_refresh_history('st_f') ORDER BY refresh_id"
    )
    assert history[0][:2] == ("FULL", "COMPLETED")
    # ids 1..3 move above the filter's threshold (3 in, updated rows of ids > 13 would be 3 out + 3 in), 150 goes
    assert history[1][:2] == ("DIFFERENTIAL", "COMPLETED") and history[1][4] == 4 and history[1][5] is False
    assert history[1][3] >= 1 and history[1][2] >= 3
    assert_oracle(db)


def test_a_stored_sum_over_an_expression_stays_exact(db) -> None:
    """sum(v + 1) kept as state: deletes and group-key updates change it by (v + 1)·w (a
    precedence slip once made it v + w)."""
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL)")
    db.sql("INSERT INTO src SELECT g, g % 5, g FROM generate_series(1, 300) g")
    create_st(
        db,
        "sums",
        "SELECT grp, sum(v + 1) AS total, sum(2 * v - 3) AS other, count(*) AS n "
        "FROM src WHERE id % 4 <> 0 GROUP BY grp",
        refresh_mode="DIFFERENTIAL",
    )
    refresh(db, "sums")
    for statement in (
        "UPDATE src SET v = v - 5, grp = (grp + 1) % 7 WHERE id % 37 = 10",
        "DELETE FROM src WHERE id % 53 = 8",
        "INSERT INTO src VALUES (1001, 4, -44), (1002, 2, -3)",
        "DELETE FROM src WHERE id % 31 = 0",
    ):
        db.sql(statement)
        (outcome,) = refresh(db, "sums")
        assert outcome.action.value == "DIFFERENTIAL", outcome.reason
        assert_oracle(db, "sums")
