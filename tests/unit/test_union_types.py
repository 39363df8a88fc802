"""The Spark types of a batch's parts, remembered per what decides them (refresh/union_types.py;
pure: Spark's type classes only, no JVM)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql.types import DecimalType, IntegerType, StringType, StructField, StructType

from pgtrickle.catalog.store import Source
from pgtrickle.refresh import union_types
from pgtrickle.refresh.tagged import shared_slots


def source(relid: int, *types: str) -> Source:
    columns = tuple((f"c{i}", t) for i, t in enumerate(types))
    return Source(relid, "public", f"t{relid}", "TABLE", f"changes_{relid}", column_types=columns)


class Union:
    """What :func:`union_types.learn` reads of a union DataFrame: its schema."""

    def __init__(self, *slots: StructType) -> None:
        self.schema = StructType([StructField(f"m{i}", t) for i, t in enumerate(slots)])


PAIR = StructType([StructField("c0", IntegerType()), StructField("c1", IntegerType())])
SCALE2 = StructType([StructField("c0", IntegerType()), StructField("c1", DecimalType(11, 2))])
SCALE4 = StructType([StructField("c0", IntegerType()), StructField("c1", DecimalType(13, 4))])


@pytest.fixture(autouse=True)
def nothing_known() -> Iterator[None]:
    union_types.forget()
    yield
    union_types.forget()


def test_the_key_changes_with_the_text_the_session_and_any_source_column_type() -> None:
    spark, other = object(), object()
    base = union_types.key(spark, "SELECT 1", [source(1, "integer", "numeric(10,2)")])
    assert base == union_types.key(spark, "SELECT 1", [source(1, "integer", "numeric(10,2)")])
    assert base != union_types.key(other, "SELECT 1", [source(1, "integer", "numeric(10,2)")])
    assert base != union_types.key(spark, "SELECT 2", [source(1, "integer", "numeric(10,2)")])
    assert base != union_types.key(spark, "SELECT 1", [source(1, "integer", "numeric(12,2)")])
    assert base != union_types.key(spark, "SELECT 1", [source(1, "bigint", "numeric(10,2)")])
    assert base != union_types.key(spark, "SELECT 1", [source(2, "integer", "numeric(10,2)")])
    # the order the sources are listed in does not matter
    two = [source(1, "integer"), source(2, "text")]
    assert union_types.key(spark, "q", two) == union_types.key(spark, "q", two[::-1])


def test_types_are_learnt_from_parts_with_a_slot_of_their_own_then_shared() -> None:
    keys = ["a", "b", "c", "d"]
    types = union_types.known(keys)
    assert types == [None] * 4
    slots = shared_slots(types)
    union_types.learn(Union(PAIR, SCALE2, PAIR, SCALE4), keys, slots, types)
    known = union_types.known(keys)
    assert known == ["struct<c0:int,c1:int>", "struct<c0:int,c1:decimal(11,2)>", known[0], known[3]]
    assert known[3] == "struct<c0:int,c1:decimal(13,4)>"
    assert shared_slots(known) == [0, 1, 0, 2]  # the two decimals of other scales never share


def test_a_known_part_is_not_learnt_again_from_a_shared_slot() -> None:
    union_types.learn(Union(PAIR), ["a"], [0], [None])
    types = union_types.known(["a", "new"])
    slots = shared_slots(types)
    assert slots == [0, 1]
    union_types.learn(Union(PAIR, StructType([StructField("c0", StringType())])), ["a", "new"], slots, types)
    assert union_types.known(["a", "new"]) == ["struct<c0:int,c1:int>", "struct<c0:string>"]


def test_the_memory_is_bounded_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(union_types, "LIMIT", 2)
    for k in ("a", "b"):
        union_types.learn(Union(PAIR), [k], [0], [None])
    union_types.known(["a"])  # used: now the newest
    union_types.learn(Union(PAIR), ["c"], [0], [None])
    assert union_types.known(["a", "b", "c"]) == ["struct<c0:int,c1:int>", None, "struct<c0:int,c1:int>"]
