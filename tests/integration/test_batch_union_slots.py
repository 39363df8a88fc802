"""The union of a batch's deltas (refresh/tagged.py, refresh/union_types.py): members whose values
have the same Spark types share one struct column once their types are known; members of other
types never do, so no value is widened. Real PostgreSQL and Spark, the oracle on every table."""

from __future__ import annotations

from typing import Any

import pytest

from pgtrickle.daemon.loop import Scheduler
from pgtrickle.refresh import batch as batch_module
from pgtrickle.refresh import union_types
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

SAME = {  # (int, int) each
    "u_plus1": "SELECT id, v + 1 AS v FROM src",
    "u_plus2": "SELECT id, v + 2 AS v FROM src",
    "u_times3": "SELECT id, v * 3 AS v FROM src WHERE v > 0",
}
OTHERS = {  # (int, decimal(11,2)), (int, decimal(13,4)), (int, string): a type each
    "u_scale2": "SELECT id, a + 0 AS x FROM src",
    "u_scale4": "SELECT id, b + 0 AS x FROM src",
    "u_text": "SELECT id, v::text AS x FROM src",
}


def time_passes(db: Database) -> None:
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '2 hours', "
        "last_attempt_at = last_attempt_at - interval '2 hours'"
    )


def the_numbers_read_as_postgresql_writes_them(db: Database) -> None:
    """The numeric members' values as text (scale included, which EXCEPT ALL's equality ignores)."""
    for name, column in (("u_scale2", "a"), ("u_scale4", "b")):
        for left, right in (
            (f"SELECT id, x::text FROM {name}", f"SELECT id, ({column} + 0)::text FROM src"),
            (f"SELECT id, ({column} + 0)::text FROM src", f"SELECT id, x::text FROM {name}"),
        ):
            assert not db.sql(f"{left} EXCEPT ALL {right}"), f"{name}: a value changed its scale"


def test_members_of_one_type_share_a_column_of_the_union_others_never(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    union_types.forget()
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL, a numeric(10,2), b numeric(12,4))")
    db.sql("INSERT INTO src SELECT g, g - 50, g / 4.0, g / 8.0 FROM generate_series(1, 200) g")
    for name, query in {**SAME, **OTHERS}.items():
        create_st(db, name, query, schedule="1h", refresh_mode="DIFFERENTIAL")
    unions: list[dict[str, Any]] = []
    real = batch_module.union_sql

    def recorded(members, widths, texts, changes, slots=None):  # type: ignore[no-untyped-def]
        names = dict(db.sql("SELECT pgt_id, pgt_name FROM pgtrickle.pgt_stream_tables"))
        unions.append({names[m]: s for m, s in zip(members, slots, strict=True)})
        return real(members, widths, texts, changes, slots)

    monkeypatch.setattr(batch_module, "union_sql", recorded)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        assert not scheduler.tick().failed  # the initial refreshes
        for round_ in range(3):
            db.sql("INSERT INTO src VALUES (%s, 7, 1.5, 1.5)", (1000 + round_,))
            db.sql("UPDATE src SET v = v + 1, a = a + 0.25, b = b + 0.0625 WHERE id %% 9 = %s", (round_,))
            db.sql("DELETE FROM src WHERE id %% 31 = %s", (round_,))
            if round_ == 2:  # the last round's union is large: staged through one table
                monkeypatch.setattr(batch_module, "COPY_MAX_ROWS", 5)
            time_passes(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert sorted(o.st.name for o in report.refreshed) == sorted([*SAME, *OTHERS])
            assert all(o.action is Action.DIFFERENTIAL for o in report.refreshed)
            assert_oracle(db)
            the_numbers_read_as_postgresql_writes_them(db)
        first, *later = unions
        assert len(set(first.values())) == 6, f"types not known yet: a column each {first}"
        for slots in later:
            assert len({slots[n] for n in SAME}) == 1, f"the members of one type share: {slots}"
            others = [slots[n] for n in OTHERS]
            assert len(set(others)) == 3 and slots["u_plus1"] not in others, f"other types never: {slots}"
        assert not db.sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'pgtrickle_changes'"
            " AND (tablename LIKE 'batch\\_%%' OR tablename LIKE 'delta\\_%%')"
        ), "staging tables are dropped"
    finally:
        scheduler.close()
