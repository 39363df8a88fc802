"""The shared job of a batch (refresh/batch.py, refresh/delta_reads.py): its query and its shared reads (pure)."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from pgtrickle.refresh.spark_job import data_error_state
from pgtrickle.refresh.shared_reads import SharedReads
from pgtrickle.refresh.tagged import SMALL_UNION_ROWS, union_sql

TEXTS = [
    "SELECT a AS c0, b AS c1, __pgt_w, __pgt_row_id FROM t1",
    "SELECT x AS c0, __pgt_w, __pgt_row_id FROM t2",
]


def test_the_union_gives_each_member_a_struct_of_its_own_and_consolidates_once() -> None:
    text = union_sql([7, 9], [2, 1], TEXTS, changes=10)
    tree = sqlglot.parse_one(text, dialect="spark")
    assert [c.alias_or_name for c in tree.expressions] == [
        "__pgt_member",
        "m0",
        "m1",
        "__pgt_w",
        "__pgt_row_id",
    ]
    assert [g.sql() for g in tree.args["group"].expressions] == ["__pgt_member", "m0", "m1", "__pgt_row_id"]
    assert tree.args["having"] is not None
    assert len(list(tree.find_all(exp.Union))) == 1  # two branches
    # Member 7's values in m0 (member 9's rows: NULL there), member 9's in m1.
    assert "CAST(7 AS BIGINT) AS __pgt_member, named_struct('c0', c0, 'c1', c1) AS m0, NULL AS m1" in text
    assert "CAST(9 AS BIGINT) AS __pgt_member, NULL AS m0, named_struct('c0', c0) AS m1" in text


def test_members_sharing_a_slot_put_their_values_in_one_struct_column() -> None:
    texts = [*TEXTS, "SELECT p AS c0, q AS c1, __pgt_w, __pgt_row_id FROM t3"]
    text = union_sql([7, 9, 4], [2, 1, 2], texts, changes=10, slots=[0, 1, 0])
    tree = sqlglot.parse_one(text, dialect="spark")
    assert [c.alias_or_name for c in tree.expressions] == [
        "__pgt_member",
        "m0",
        "m1",
        "__pgt_w",
        "__pgt_row_id",
    ]
    assert [g.sql() for g in tree.args["group"].expressions] == ["__pgt_member", "m0", "m1", "__pgt_row_id"]
    assert "CAST(7 AS BIGINT) AS __pgt_member, named_struct('c0', c0, 'c1', c1) AS m0, NULL AS m1" in text
    assert "CAST(9 AS BIGINT) AS __pgt_member, NULL AS m0, named_struct('c0', c0) AS m1" in text
    assert "CAST(4 AS BIGINT) AS __pgt_member, named_struct('c0', c0, 'c1', c1) AS m0, NULL AS m1" in text


def test_a_staged_member_takes_its_columns_from_its_slot_and_only_its_rows_where_shared() -> None:
    from pgtrickle.refresh.batch import _flat

    assert _flat(1, 0, 9, [0, 1, 0]) == "m1.c0 AS m1_c0"  # a slot of its own
    assert _flat(2, 1, 4, [0, 1, 0]) == "CASE WHEN __pgt_member = 4 THEN m0.c1 END AS m2_c1"


def test_a_small_union_is_consolidated_in_one_partition_a_large_one_is_not() -> None:
    assert "COALESCE(1)" in union_sql([1, 2], [2, 1], TEXTS, changes=SMALL_UNION_ROWS - 1)
    assert "COALESCE(1)" not in union_sql([1, 2], [2, 1], TEXTS, changes=SMALL_UNION_ROWS)


class Frame:
    def __init__(self, name: str) -> None:
        self.name = name
        self.persisted = False

    def persist(self) -> Frame:
        self.persisted = True
        return self

    def unpersist(self) -> None:
        self.persisted = False


def test_shared_reads_make_each_read_once_and_persist_the_bounded_ones_read_twice() -> None:
    shared = SharedReads()
    made: list[str] = []

    def make(name: str):
        def inner() -> Frame:
            made.append(name)
            return Frame(name)

        return inner

    a1 = shared.frame(("q", "buffer"), make("buffer"), bounded=True)
    a2 = shared.frame(("q", "buffer"), make("buffer"), bounded=True)
    t1 = shared.frame(("t", "dim"), make("dim"), bounded=False)
    t2 = shared.frame(("t", "dim"), make("dim"), bounded=False)
    once = shared.frame(("q", "keys"), make("keys"), bounded=True)
    assert a1 is a2 and t1 is t2 and made == ["buffer", "dim", "keys"]
    assert shared.persist_shared() == 1
    assert a1.persisted and not t1.persisted and not once.persisted
    assert shared.note() == "5 reads of its members served by 3 JDBC reads (1 persisted)"
    shared.release()
    assert not a1.persisted


def test_a_read_used_twice_by_one_plan_is_persisted_too() -> None:
    shared = SharedReads()
    frame = shared.frame(("q", "buffer"), lambda: Frame("buffer"), bounded=True, uses=2)
    assert shared.persist_shared() == 1 and frame.persisted
    assert shared.note() is None  # one read asked for, one made: nothing shared


def test_windows_and_columns_of_several_members_are_collected_once_each() -> None:
    shared = SharedReads()
    shared.add_window(10, "5:9:")
    shared.add_window(10, "7:9:")
    shared.add_window(10, "5:9:")
    shared.widen({"public.src": frozenset({"id", "v"})})
    shared.widen({"public.src": frozenset({"note"}), "public.dim": frozenset({"grp"})})
    assert shared.frontiers == {10: ["5:9:", "7:9:"]}
    assert shared.columns == {"public.src": {"id", "v", "note"}, "public.dim": {"grp"}}


class SparkError(Exception):
    def __init__(self, state: str | None) -> None:
        super().__init__("boom")
        self.state = state

    def getSqlState(self) -> str | None:  # noqa: N802 - PySpark's name
        return self.state


def test_only_data_exceptions_are_data_errors() -> None:
    assert data_error_state(SparkError("22003")) == "22003"
    assert data_error_state(SparkError("22012")) == "22012"
    assert data_error_state(SparkError("42703")) is None
    assert data_error_state(SparkError(None)) is None
    assert data_error_state(ValueError("22003")) is None
