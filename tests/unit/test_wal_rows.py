"""Unit tests for pgtrickle.cdc.wal_rows: binary COPY rows cut out of binary pgoutput messages.

Messages are built by hand from the documented layouts ("Logical Replication
Message Formats"); the expected rows are built field by field from the
documented binary COPY format, independently of the code under test.
"""

from __future__ import annotations

import struct

import pytest

from pgtrickle.cdc.pgoutput import PgOutputError
from pgtrickle.cdc.wal_rows import (
    COPY_HEADER,
    COPY_TRAILER,
    NULL_FIELD,
    BinaryPlan,
    ColumnTypes,
    NeedTextMode,
    Uncommon,
    WalCaptureError,
    append_row,
    append_row_checked,
    binary_problem,
    row_prefix,
)

RELID = 16384


def b(value: bytes) -> bytes:
    return b"b" + struct.pack("!i", len(value)) + value


def t(value: str) -> bytes:
    raw = value.encode()
    return b"t" + struct.pack("!i", len(raw)) + raw


N, U = b"n", b"u"


def tup(*cols: bytes) -> bytes:
    return struct.pack("!H", len(cols)) + b"".join(cols)


def insert(*cols: bytes) -> bytes:
    return b"I" + struct.pack("!I", RELID) + b"N" + tup(*cols)


def update(old: tuple[bytes, ...], new: tuple[bytes, ...], marker: bytes = b"O") -> bytes:
    head = b"U" + struct.pack("!I", RELID)
    if marker == b"N":
        return head + b"N" + tup(*new)
    return head + marker + tup(*old) + b"N" + tup(*new)


def delete(*cols: bytes, marker: bytes = b"O") -> bytes:
    return b"D" + struct.pack("!I", RELID) + marker + tup(*cols)


def field(value: bytes | None) -> bytes:
    return NULL_FIELD if value is None else struct.pack("!i", len(value)) + value


def expected(
    action: str,
    new: list[bytes | None] | None,
    old: list[bytes | None] | None,
    width: int,
    xid8: int = 1 << 33,
    at: int = 123_456_789,
) -> bytes:
    fixed = (
        struct.pack("!h", 3 + 2 * width)
        + field(struct.pack("!q", xid8))
        + field(action.encode())
        + field(struct.pack("!q", at))
    )
    new = new if new is not None else [None] * width
    old = old if old is not None else [None] * width
    return fixed + b"".join(map(field, new)) + b"".join(map(field, old))


def row(payload: bytes, plan: BinaryPlan, action: str) -> bytes:
    out: list[bytes] = []
    append_row(out, payload, RELID, plan, row_prefix(plan.width, 1 << 33, action, 123_456_789))
    return b"".join(out)


I8 = struct.pack("!q", 42)
I4 = struct.pack("!i", -7)
TXT = "tab\there\nback\\slash ünï".encode()


def test_copy_framing_constants() -> None:
    assert COPY_HEADER == b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
    assert COPY_TRAILER == b"\xff\xff"
    assert NULL_FIELD == b"\xff\xff\xff\xff"


def test_insert_all_columns_with_null() -> None:
    plan = BinaryPlan([0, 1, 2], 3)
    assert row(insert(b(I8), N, b(TXT)), plan, "I") == expected("I", [I8, None, TXT], None, 3)


def test_insert_of_empty_value_is_not_null() -> None:
    plan = BinaryPlan([0], 1)
    assert row(insert(b(b"")), plan, "I") == expected("I", [b""], None, 1)


def test_subset_reordered_and_missing_columns() -> None:
    plan = BinaryPlan([2, None, 0], 3)
    assert row(insert(b(I8), b(I4), b(TXT)), plan, "I") == expected("I", [TXT, None, I8], None, 3)
    single = BinaryPlan([1], 3)
    assert row(insert(b(I8), b(I4), N), single, "I") == expected("I", [I4], None, 1)


def test_update_carries_new_then_old() -> None:
    plan = BinaryPlan([0, 1], 2)
    msg = update((b(I8), b(b"old")), (b(I8), b(b"new")))
    assert row(msg, plan, "U") == expected("U", [I8, b"new"], [I8, b"old"], 2)


def test_unchanged_toast_is_taken_from_the_old_row() -> None:
    big = b"x" * 10_000
    plan = BinaryPlan([0, 1], 2)
    msg = update((b(I8), b(big)), (b(I4), U))
    assert row(msg, plan, "U") == expected("U", [I4, big], [I8, big], 2)
    # also through a non-identity plan
    plan = BinaryPlan([1, 0], 2)
    assert row(msg, plan, "U") == expected("U", [big, I4], [big, I8], 2)


def test_unchanged_toast_of_an_uncaptured_column_is_ignored() -> None:
    plan = BinaryPlan([0], 2)
    msg = update((b(I8), U), (b(I4), U))
    assert row(msg, plan, "U") == expected("U", [I4], [I8], 1)


def test_unchanged_toast_without_old_value_is_a_clear_error() -> None:
    plan = BinaryPlan([0, 1], 2)
    with pytest.raises(WalCaptureError, match="REPLICA IDENTITY FULL"):
        row(insert(b(I8), U), plan, "I")


def test_delete_has_null_new_columns() -> None:
    plan = BinaryPlan([0, 1], 2)
    assert row(delete(b(I8), N), plan, "D") == expected("D", None, [I8, None], 2)


@pytest.mark.parametrize(
    "payload",
    [
        update((), (b(I8), b(I4)), marker=b"N"),
        update((b(I8), N), (b(I8), b(I4)), marker=b"K"),
        delete(b(I8), N, marker=b"K"),
    ],
)
def test_missing_old_row_is_a_clear_error(payload: bytes) -> None:
    with pytest.raises(WalCaptureError, match="without its old row.*REPLICA IDENTITY FULL"):
        row(payload, BinaryPlan([0, 1], 2), "U")


def test_a_captured_text_value_asks_for_text_mode() -> None:
    plan = BinaryPlan([0, 1], 2)
    with pytest.raises(NeedTextMode, match="as text"):
        row(insert(b(I8), t("abc")), plan, "I")
    with pytest.raises(NeedTextMode):
        row(update((b(I8), t("abc")), (b(I8), U)), plan, "U")


def test_a_text_value_of_an_uncaptured_column_is_ignored() -> None:
    plan = BinaryPlan([0], 2)
    assert row(insert(b(I8), t("abc")), plan, "I") == expected("I", [I8], None, 1)


def test_wrong_column_count_names_the_relation() -> None:
    with pytest.raises(PgOutputError, match="Relation message missed"):
        row(insert(b(I8)), BinaryPlan([0, 1], 2), "I")


@pytest.mark.parametrize(
    "payload",
    [
        insert(b(I8), b(I4))[:-2],  # truncated value
        insert(b(I8), b(I4)) + b"\x00",  # trailing byte
        insert(b(I8), b"x"),  # unknown kind
        update((b(I8), b(I4)), (b(I8), b(I4)))[:20],
        b"I" + struct.pack("!I", RELID) + b"X" + tup(b(I8), b(I4)),
    ],
)
def test_damaged_messages_raise_pgoutput_errors(payload: bytes) -> None:
    with pytest.raises(PgOutputError):
        row(payload, BinaryPlan([0, 1], 2), "I")


def test_rows_from_many_messages_concatenate() -> None:
    plan = BinaryPlan([0, 1], 2)
    out: list[bytes] = []
    prefix = row_prefix(2, 1 << 33, "I", 123_456_789)
    for i in range(3):
        append_row(out, insert(b(struct.pack("!q", i)), N), RELID, plan, prefix)
    assert b"".join(out) == b"".join(expected("I", [struct.pack("!q", i), None], None, 2) for i in range(3))


def test_row_prefix_layout() -> None:
    prefix = row_prefix(1, 5, "T", -1)
    assert prefix == struct.pack("!h", 5) + field(struct.pack("!q", 5)) + field(b"T") + field(
        struct.pack("!q", -1)
    )


def test_binary_problem_decision() -> None:
    ok = ColumnTypes("a", 23, 23, True)
    assert binary_problem([ok, ColumnTypes("gone", None, 25, True)]) is None
    assert "binary send/receive" in (binary_problem([ok, ColumnTypes("c", 9999, 9999, False)]) or "")
    assert "in the WAL" in (binary_problem([ColumnTypes("c", 23, 20, True)]) or "")
    assert "one type" in (binary_problem([ColumnTypes("c", 23, None, True)]) or "")
    assert binary_problem([]) is None


COMMON = [insert(b(I8), N, b(TXT)), update((b(I8), N, b(b"o")), (b(I4), b(b""), N)), delete(N, N, b(TXT))]
UNCOMMON = [
    insert(b(I8), U, b(TXT)),
    insert(b(I8), t("x"), N),
    insert(b(I8), N),
    update((b(I8), N, b(b"o")), (b(I4), U, N)),
    insert(b(I8), N, b(TXT))[:-1],
    delete(N, N, b(TXT), marker=b"K"),
    insert(b(I8), N, b(TXT)) + b"!",
    b"I" + struct.pack("!I", RELID) + b"N" + struct.pack("!H", 3) + b"b\xff\xff\xff\xfb" + b(I8) + N,
]


@pytest.mark.parametrize("positions", [[0, 1, 2], [2, 0], [None, 1], [1], []])
def test_the_unrolled_cutters_agree_with_the_checked_path(positions: list[int | None]) -> None:
    plan = BinaryPlan(positions, 3)
    prefix = row_prefix(plan.width, 9, "U", 1)
    for payload in COMMON:
        fast: list[bytes] = []
        checked: list[bytes] = []
        plan.cut[payload[0]](payload, fast, prefix)
        append_row_checked(checked, payload, RELID, plan, prefix)
        assert b"".join(fast) == b"".join(checked)
    for payload in UNCOMMON:
        out: list[bytes] = []
        with pytest.raises(Uncommon):
            plan.cut[payload[0]](payload, out, prefix)
        assert out == []
