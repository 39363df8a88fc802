"""``character(n)`` columns and the literals compared with them give PostgreSQL's answers (issue 17, item 5).

Values cross to Spark without their trailing blanks and PostgreSQL pads them
again on write (sql/blank_padded.py, spark/carry.py). Comparisons, GROUP BY,
DISTINCT, joins, length(), concatenation, LIKE and casts are checked with
the oracle after FULL and DIFFERENTIAL refreshes, over hostile values: all
blanks, empty, trailing tabs next to trailing blanks, NULL.
"""

from __future__ import annotations

import pytest

from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

HOSTILE = ["ab", "ab   ", "     ", "", "a\t", "a \t", "a\t ", None, "abcde", "x", " ab", "AB"]

QUERIES = {
    # one row per source row, one column per semantics checked: the oracle compares every column
    "per_row": "SELECT id, c, d, c = 'ab' AS eq, c = 'ab   ' AS eq_blanks, c = '' AS eq_empty, c < 'b' AS lt, "
    "d >= 'a' AS ge, c IN ('ab', 'x  ', 'a' || chr(9)) AS in_list, c = v AS eq_text, "
    "c LIKE '%b' AS like_end, c LIKE 'ab%' AS like_start, d ILIKE 'A_' AS ilike, c ~ 'b $' AS regex, "
    "length(c) AS len, c || '|' AS cat, octet_length(c) AS octets, concat(c, '|') AS concat, "
    "upper(c) AS up, v::char(2) AS v2, c::text AS t, c::varchar(3) AS vc FROM ch",
    "filtered": "SELECT id, c FROM ch WHERE c = 'ab   ' OR c = ''",
    "group_by": "SELECT c, count(*) AS n, min(d) AS lo FROM ch GROUP BY c",
    "distinct": "SELECT DISTINCT c FROM ch",
    "join_widths": "SELECT x.id, y.id AS id2, y.d FROM ch x JOIN ch2 y ON x.c = y.d",
}


@pytest.fixture
def chars(db: Database) -> Database:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE ch (id int, c char(5), d char(3), v text)")
    db.sql("CREATE TABLE ch2 (id int, d char(3))")
    for i, value in enumerate(HOSTILE):
        db.sql("INSERT INTO ch VALUES (%s, %s, %s, %s)", (i, value, value[:3] if value else value, value))
        db.sql("INSERT INTO ch2 VALUES (%s, %s)", (i, value[:3] if value else value))
    return db


def _change(db: Database, step: int) -> None:
    db.sql(
        "INSERT INTO ch VALUES (%s, 'ab  ', 'ab ', 'ab  '), (%s, '', '  ', ''), (%s, 'a\t', 'a\t', 'a ')",
        (100 + step, 200 + step, 300 + step),
    )
    db.sql("UPDATE ch SET c = d, v = v || ' ' WHERE id %% 3 = %s", (step % 3,))
    db.sql("DELETE FROM ch WHERE id = %s", (step * 2,))
    db.sql("INSERT INTO ch2 VALUES (%s, 'ab'), (%s, ' ')", (100 + step, 200 + step))


@pytest.mark.parametrize("mode", ["AUTO", "FULL"])
def test_character_n_gives_postgresql_answers(chars: Database, mode: str) -> None:
    db = chars
    names = sorted(QUERIES)
    for name in names:
        create_st(db, name, QUERIES[name], refresh_mode=mode)
    outcomes = refresh(db, *names)
    assert {o.action for o in outcomes} == {Action.FULL}
    assert_oracle(db, *names)
    # 'ab' and 'ab   ' are the same character(5) value; '' and '     ' too
    assert db.sql("SELECT count(*) FILTER (WHERE eq), count(*) FILTER (WHERE eq_empty) FROM per_row")[0] == (
        2,
        2,
    )
    expected = Action.DIFFERENTIAL if mode == "AUTO" else Action.FULL
    for step in range(1):
        _change(db, step)
        outcomes = refresh(db, *names)
        assert {o.st.name: o.action for o in outcomes} == {name: expected for name in names}
        assert_oracle(db, *names)


def test_like_on_bpchar_without_length_is_refused_before_any_refresh(db: Database) -> None:
    """Its padding is not known on Spark: refused by the analysis, never a failing FULL."""
    db.sql("CREATE TABLE b (id int, c bpchar)")
    db.sql("INSERT INTO b VALUES (1, 'ab  ')")
    create_st(db, "st", "SELECT id FROM b WHERE c LIKE '%b'")
    with pytest.raises(Exception, match="bpchar value without a length"):
        refresh(db, "st")
    history = db.sql("SELECT status, error_message FROM pgtrickle.pgt_refresh_history")
    assert len(history) == 1 and history[0][0] == "FAILED" and "without a length" in history[0][1]
    assert "without a length" in db.sql("SELECT reason FROM pgtrickle.explain_refresh_mode('st')")[0][0]


KEPT = {
    # a TopK over an aggregate grouped by a character(n) column: the aggregate is a hidden table
    "top_groups": "SELECT c, count(*) AS n FROM ch GROUP BY c ORDER BY n DESC, c LIMIT 3",
    # an aggregate of an aggregate (TPC-H Q13's shape) over character(n) groups
    "count_of_counts": "SELECT n, count(*) AS k FROM (SELECT c, count(*) AS n FROM ch GROUP BY c) g GROUP BY n",
    # EXISTS / NOT EXISTS correlated on a character(n) column (TPC-H Q21's shape)
    "exists_pairs": "SELECT x.c, count(*) AS n FROM ch x WHERE EXISTS (SELECT 1 FROM ch2 y WHERE y.d = x.d"
    " AND y.id <> x.id) AND NOT EXISTS (SELECT 1 FROM ch z WHERE z.c = x.c AND z.id > x.id AND z.d = 'ab')"
    " GROUP BY x.c",
}


def test_character_n_in_hidden_state_tables(chars: Database) -> None:
    """Kept nodes store character(n) values in hidden tables (PostgreSQL pads them there) and read
    them back: grouping and comparing with new, unpadded values must still meet."""
    db = chars
    names = sorted(KEPT)
    for name in names:
        create_st(db, name, KEPT[name], refresh_mode="DIFFERENTIAL")
    refresh(db, *names)
    assert_oracle(db, *names)
    for step in range(2):
        _change(db, step)
        outcomes = refresh(db, *names)
        assert {o.st.name: o.action for o in outcomes} == {name: Action.DIFFERENTIAL for name in names}
        assert_oracle(db, *names)
