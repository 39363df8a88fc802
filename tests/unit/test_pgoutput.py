"""Unit tests for pgtrickle.cdc.pgoutput (the pgoutput message decoder).

Payloads are built by ``encode`` below, a small encoder written from the
PostgreSQL documentation ("Logical Replication Message Formats") as the
inverse of the decoder, plus a few literal byte strings so that a mistake
shared by encoder and decoder cannot hide.
"""

from __future__ import annotations

import dataclasses
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgtrickle.cdc.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    ColumnValue,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    PgOutputError,
    Prepare,
    Relation,
    RelationCache,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TypeMessage,
    Update,
    decode_message,
    lsn_to_str,
    pg_timestamp,
    str_to_lsn,
)
from pgtrickle.errors import PgTrickleError

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
T0 = datetime(2024, 5, 17, 12, 34, 56, 789012, tzinfo=UTC)
T1 = datetime(2024, 5, 17, 12, 35, 0, 1, tzinfo=UTC)
_TAGS = b"BCORYIUDTMSEcAbPKrp"  # every message type of protocol versions 1-4


# ------------------------------------------------------------------- test encoder


def _micros(moment: datetime) -> int:
    return (moment - PG_EPOCH) // timedelta(microseconds=1)


def _string(text: str) -> bytes:
    return text.encode() + b"\0"


def _xid(message: Any, in_stream: bool) -> bytes:
    if not in_stream:
        assert getattr(message, "xid", None) is None
        return b""
    return struct.pack("!I", message.xid)


def encode_tuple(values: TupleData) -> bytes:
    parts = [struct.pack("!H", len(values))]
    for kind, value in values:
        parts.append(kind.encode())
        if kind == "t":
            assert isinstance(value, str)
            raw = value.encode()
            parts.append(struct.pack("!i", len(raw)) + raw)
        elif kind == "b":
            assert isinstance(value, bytes)
            parts.append(struct.pack("!i", len(value)) + value)
    return b"".join(parts)


def encode(message: Message, *, in_stream: bool = False) -> bytes:
    """The pgoutput bytes of ``message`` (inverse of decode_message)."""
    m: Any = message
    match message:
        case Begin():
            return b"B" + struct.pack("!QqI", m.final_lsn, _micros(m.commit_time), m.xid)
        case Commit():
            return b"C" + struct.pack("!BQQq", m.flags, m.commit_lsn, m.end_lsn, _micros(m.commit_time))
        case Origin():
            return b"O" + struct.pack("!Q", m.origin_lsn) + _string(m.name)
        case Relation():
            out = [
                b"R",
                _xid(m, in_stream),
                struct.pack("!I", m.relid),
                _string(m.namespace),
                _string(m.name),
                struct.pack("!BH", ord(m.replica_identity), len(m.columns)),
            ]
            for column in m.columns:
                out.append(
                    struct.pack("!B", column.flags)
                    + _string(column.name)
                    + struct.pack("!Ii", column.type_oid, column.type_modifier)
                )
            return b"".join(out)
        case TypeMessage():
            return (
                b"Y"
                + _xid(m, in_stream)
                + struct.pack("!I", m.type_oid)
                + _string(m.namespace)
                + _string(m.name)
            )
        case Insert():
            return b"I" + _xid(m, in_stream) + struct.pack("!I", m.relid) + b"N" + encode_tuple(m.new)
        case Update():
            out = [b"U", _xid(m, in_stream), struct.pack("!I", m.relid)]
            if m.key is not None:
                out.append(b"K" + encode_tuple(m.key))
            if m.old is not None:
                out.append(b"O" + encode_tuple(m.old))
            out.append(b"N" + encode_tuple(m.new))
            return b"".join(out)
        case Delete():
            old_part = b"K" + encode_tuple(m.key) if m.key is not None else b"O" + encode_tuple(m.old)
            return b"D" + _xid(m, in_stream) + struct.pack("!I", m.relid) + old_part
        case Truncate():
            options = (1 if m.cascade else 0) | (2 if m.restart_identity else 0)
            return (
                b"T"
                + _xid(m, in_stream)
                + struct.pack("!IB", len(m.relids), options)
                + b"".join(struct.pack("!I", relid) for relid in m.relids)
            )
        case LogicalMessage():
            content: bytes = m.content
            return (
                b"M"
                + _xid(m, in_stream)
                + struct.pack("!BQ", int(m.transactional), m.lsn)
                + _string(m.prefix)
                + struct.pack("!i", len(content))
                + content
            )
        case StreamStart():
            return b"S" + struct.pack("!IB", m.xid, int(m.first_segment))
        case StreamStop():
            return b"E"
        case StreamCommit():
            return b"c" + struct.pack(
                "!IBQQq", m.xid, m.flags, m.commit_lsn, m.end_lsn, _micros(m.commit_time)
            )
        case StreamAbort():
            out_bytes: bytes = b"A" + struct.pack("!II", m.xid, m.subxid)
            if m.abort_lsn is not None:
                out_bytes += struct.pack("!Qq", m.abort_lsn, _micros(m.abort_time))
            return out_bytes
        case BeginPrepare():
            return (
                b"b"
                + struct.pack("!QQqI", m.prepare_lsn, m.end_lsn, _micros(m.prepare_time), m.xid)
                + _string(m.gid)
            )
        case Prepare() | StreamPrepare():
            tag = b"P" if isinstance(message, Prepare) else b"p"
            return (
                tag
                + struct.pack("!BQQqI", m.flags, m.prepare_lsn, m.end_lsn, _micros(m.prepare_time), m.xid)
                + _string(m.gid)
            )
        case CommitPrepared():
            return (
                b"K"
                + struct.pack("!BQQqI", m.flags, m.commit_lsn, m.end_lsn, _micros(m.commit_time), m.xid)
                + _string(m.gid)
            )
        case RollbackPrepared():
            return (
                b"r"
                + struct.pack(
                    "!BQQqqI",
                    m.flags,
                    m.prepare_end_lsn,
                    m.rollback_end_lsn,
                    _micros(m.prepare_time),
                    _micros(m.rollback_time),
                    m.xid,
                )
                + _string(m.gid)
            )
    raise AssertionError(f"no encoder for {message!r}")


def t(value: str) -> ColumnValue:
    return ColumnValue("t", value)


NULL = ColumnValue("n", None)
UNCHANGED = ColumnValue("u", None)

ORDERS = Relation(
    16384,
    "public",
    "orders",
    "d",
    (
        RelationColumn(1, "id", 23, -1, True),
        RelationColumn(0, "customer", 25, -1, False),
        RelationColumn(0, "amount", 1700, 655366, False),
        RelationColumn(0, "note", 25, -1, False),
    ),
)
ROW = (t("1"), t("alice"), t("12.50"), NULL)

SAMPLES: list[Message] = [
    Begin(0x16_B374_D848, T0, 771),
    Commit(0, 0x16_B374_D848, 0x16_B374_D880, T0),
    Origin(0x1_0000_0001, "node_a"),
    ORDERS,
    Relation(16390, "", "pg_cat_table", "n", ()),
    Relation(16391, "s", "full", "f", (RelationColumn(1, "a", 23, -1, True),)),
    TypeMessage(16400, "public", "mood"),
    Insert(16384, ROW),
    Insert(16384, ()),
    Update(16384, None, None, ROW),
    Update(16384, None, (t("1"), NULL, NULL, NULL), (t("2"), t("alice"), t("12.50"), NULL)),
    Update(16384, ROW, None, (t("1"), t("bob"), t("12.50"), NULL)),
    Update(16384, None, None, (t("1"), t("bob"), UNCHANGED, UNCHANGED)),
    Delete(16384, None, (t("1"), NULL, NULL, NULL)),
    Delete(16384, ROW, None),
    Truncate((16384,), False, False),
    Truncate((16384, 16390, 16391), True, False),
    Truncate((16384,), False, True),
    Truncate((16384, 1), True, True),
    Truncate((), False, False),
    LogicalMessage(True, 0x20, "pgtrickle", b"hello \x00 world"),
    LogicalMessage(False, 0x21, "", b""),
    StreamStart(900, True),
    StreamStart(900, False),
    StreamStop(),
    StreamCommit(900, 0, 0x30, 0x38, T1),
    StreamAbort(900, 901),
    StreamAbort(900, 900, 0x40, T1),
    BeginPrepare(0x50, 0x58, T0, 902, "gid-1"),
    Prepare(0, 0x50, 0x58, T0, 902, "gid-1"),
    CommitPrepared(0, 0x60, 0x68, T1, 902, "gid-1"),
    RollbackPrepared(0, 0x58, 0x70, T0, T1, 903, "gid-ü"),
    StreamPrepare(0, 0x50, 0x58, T0, 904, "gid-2"),
]

STREAMABLE: list[Message] = [
    dataclasses.replace(m, xid=4242)
    for m in SAMPLES
    if isinstance(m, Relation | TypeMessage | Insert | Update | Delete | Truncate | LogicalMessage)
]


def _id(message: Message) -> str:
    return type(message).__name__


# ------------------------------------------------------------------- round trips


@pytest.mark.parametrize("message", SAMPLES, ids=_id)
def test_every_message_type_round_trips(message: Message) -> None:
    assert decode_message(encode(message)) == message


@pytest.mark.parametrize("message", STREAMABLE, ids=_id)
def test_messages_inside_a_stream_carry_the_xid(message: Message) -> None:
    payload = encode(message, in_stream=True)
    decoded = decode_message(payload, in_stream=True)
    assert decoded == message
    assert decoded.xid == 4242  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "message",
    [
        m
        for m in SAMPLES
        if not isinstance(m, Relation | TypeMessage | Insert | Update | Delete | Truncate | LogicalMessage)
    ],
    ids=_id,
)
def test_in_stream_does_not_change_transaction_control_messages(message: Message) -> None:
    assert decode_message(encode(message), in_stream=True) == message


def test_all_message_tags_are_covered_by_the_samples() -> None:
    assert {encode(m)[0] for m in SAMPLES} == set(_TAGS)


def test_begin_from_literal_bytes() -> None:
    # final LSN 0/3000060, commit time 2000-01-02 00:00:00.000001 UTC, xid 739
    payload = bytes.fromhex("420000000003000060000000141dd76001000002e3")
    assert decode_message(payload) == Begin(0x3000060, datetime(2000, 1, 2, 0, 0, 0, 1, tzinfo=UTC), 739)


def test_insert_from_literal_bytes() -> None:
    payload = (
        b"I"
        + bytes.fromhex("00004000")
        + b"N"
        + bytes.fromhex("0003")
        + b"t"
        + bytes.fromhex("00000002")
        + b"42"
        + b"n"
        + b"t"
        + bytes.fromhex("00000003")
        + "é!".encode()
    )
    assert decode_message(payload) == Insert(16384, (t("42"), NULL, t("é!")))


def test_commit_time_is_utc_and_exact_to_the_microsecond() -> None:
    message = decode_message(encode(Commit(0, 1, 2, T0)))
    assert isinstance(message, Commit)
    assert message.commit_time == T0
    assert message.commit_time.tzinfo is UTC
    assert message.commit_time.microsecond == 789012


def test_timestamps_before_2000_are_negative_offsets() -> None:
    moment = datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert decode_message(encode(Begin(1, moment, 2))) == Begin(1, moment, 2)
    assert pg_timestamp(-1) == moment
    assert pg_timestamp(0) == PG_EPOCH


@pytest.mark.parametrize(
    "values",
    [
        (NULL, NULL),
        (t(""), t("")),
        (t("ünïcødé ✓ 🐘"), t("日本語")),
        (t("with\nnewline\tand 'quotes' and \\ backslash"),),
        (t("\x00 inside"),),
        (UNCHANGED, t("x"), UNCHANGED),
        (ColumnValue("b", b"\x00\x01\xff"), ColumnValue("b", b"")),
        (ColumnValue("b", "not utf-8 é".encode("latin-1")),),
        (t("x" * 100_000),),
        tuple(t(str(i)) for i in range(1600)),
    ],
    ids=[
        "nulls",
        "empty",
        "unicode",
        "specials",
        "nul-char",
        "unchanged",
        "binary",
        "binary-not-utf8",
        "long",
        "1600-columns",
    ],
)
def test_column_values_round_trip(values: TupleData) -> None:
    assert decode_message(encode(Insert(7, values))) == Insert(7, values)


def test_decoded_values_have_the_right_python_types() -> None:
    values = (t("a"), NULL, UNCHANGED, ColumnValue("b", b"\x01"))
    decoded = decode_message(encode(Insert(1, values)))
    assert isinstance(decoded, Insert)
    assert [type(v.value) for v in decoded.new] == [str, type(None), type(None), bytes]
    assert [v.kind for v in decoded.new] == ["t", "n", "u", "b"]
    assert decoded.new[0] == ("t", "a")  # a ColumnValue is a named tuple


def test_update_without_old_tuple_has_neither_old_nor_key() -> None:
    decoded = decode_message(encode(Update(5, None, None, ROW)))
    assert isinstance(decoded, Update)
    assert decoded.old is None and decoded.key is None and decoded.new == ROW


def test_update_with_key_and_with_old() -> None:
    key = (t("1"), NULL, NULL, NULL)
    with_key = decode_message(encode(Update(5, None, key, ROW)))
    with_old = decode_message(encode(Update(5, ROW, None, ROW)))
    assert isinstance(with_key, Update) and isinstance(with_old, Update)
    assert (with_key.key, with_key.old) == (key, None)
    assert (with_old.key, with_old.old) == (None, ROW)


@pytest.mark.parametrize(
    ("options", "cascade", "restart"),
    [(0, False, False), (1, True, False), (2, False, True), (3, True, True)],
)
def test_truncate_option_bits(options: int, cascade: bool, restart: bool) -> None:
    payload = b"T" + struct.pack("!IBII", 2, options, 10, 11)
    assert decode_message(payload) == Truncate((10, 11), cascade, restart)


def test_decoded_messages_are_frozen_hashable_and_equal_to_constructed_ones() -> None:
    for message in SAMPLES:
        decoded = decode_message(encode(message))
        assert type(decoded) is type(message)
        assert decoded == message and hash(decoded) == hash(message)
        assert repr(decoded) == repr(message)
        field = dataclasses.fields(decoded)[0].name if dataclasses.fields(decoded) else None
        if field is not None:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(decoded, field, 0)


def test_relation_columns_key_flag() -> None:
    decoded = decode_message(encode(ORDERS))
    assert isinstance(decoded, Relation)
    assert [c.is_key for c in decoded.columns] == [True, False, False, False]
    assert decoded.columns[2].type_modifier == 655366
    assert decoded.replica_identity == "d"


@pytest.mark.parametrize("payload_type", [bytearray, memoryview])
def test_bytes_like_payloads_are_accepted(payload_type: type) -> None:
    message = Insert(3, (t("a"), ColumnValue("b", b"\x01")))
    decoded = decode_message(payload_type(encode(message)))
    assert decoded == message
    assert isinstance(decoded, Insert) and type(decoded.new[1].value) is bytes


# ------------------------------------------------------------------------ errors


def test_pgoutput_error_is_a_pgtrickle_error() -> None:
    assert issubclass(PgOutputError, PgTrickleError)


def test_empty_payload() -> None:
    with pytest.raises(PgOutputError, match="empty pgoutput message"):
        decode_message(b"")


def test_unknown_message_type_names_the_byte_and_offset() -> None:
    with pytest.raises(
        PgOutputError,
        match=r"unknown pgoutput message type 'Z' \(byte 0x5a\) "
        r"at byte offset 0",
    ):
        decode_message(b"Z\x00\x00")


_NAMES = {
    Begin: "Begin",
    Commit: "Commit",
    Origin: "Origin",
    Relation: "Relation",
    TypeMessage: "Type",
    Insert: "Insert",
    Update: "Update",
    Delete: "Delete",
    Truncate: "Truncate",
    LogicalMessage: "Message",
    StreamStart: "Stream Start",
    StreamStop: "Stream Stop",
    StreamCommit: "Stream Commit",
    StreamAbort: "Stream Abort",
    BeginPrepare: "Begin Prepare",
    Prepare: "Prepare",
    CommitPrepared: "Commit Prepared",
    RollbackPrepared: "Rollback Prepared",
    StreamPrepare: "Stream Prepare",
}


def _is_v2_abort_prefix(message: Message, cut: int) -> bool:
    """A protocol-4 Stream Abort cut after the subxid is a valid protocol-2 one."""
    return isinstance(message, StreamAbort) and message.abort_lsn is not None and cut == 9


def test_stream_abort_size_selects_the_protocol_layout() -> None:
    v4 = encode(StreamAbort(900, 901, 0x40, T1))
    assert decode_message(v4[:9]) == StreamAbort(900, 901)
    assert decode_message(v4) == StreamAbort(900, 901, 0x40, T1)


@pytest.mark.parametrize("message", SAMPLES + STREAMABLE, ids=_id)
def test_every_truncation_raises_pgoutput_error_naming_type_and_offset(message: Message) -> None:
    in_stream = message in STREAMABLE and getattr(message, "xid", None) is not None
    payload = encode(message, in_stream=in_stream)
    for cut in range(1, len(payload)):
        if _is_v2_abort_prefix(message, cut):
            continue
        with pytest.raises(PgOutputError) as info:
            decode_message(payload[:cut], in_stream=in_stream)
        text = str(info.value)
        assert f"pgoutput {_NAMES[type(message)]} message" in text
        assert "byte offset" in text


@pytest.mark.parametrize("message", SAMPLES, ids=_id)
def test_trailing_bytes_are_rejected(message: Message) -> None:
    payload = encode(message) + b"\x00"
    if isinstance(message, StreamAbort) and message.abort_lsn is None:
        payload += b"\x00" * 7  # 8 extra bytes would still not be the v4 layout (16 more)
    with pytest.raises(PgOutputError, match=r"trailing byte|truncated"):
        decode_message(payload)


def test_truncated_column_value_reports_offset_and_column() -> None:
    payload = encode(Insert(1, (t("abc"), t("defgh"))))[:-2]
    with pytest.raises(
        PgOutputError,
        match=r"Insert message at byte offset 21: reading the value "
        r"of column 2 of 2 of the new tuple needs 5 byte",
    ):
        decode_message(payload)


def test_unknown_column_kind() -> None:
    payload = b"I" + struct.pack("!IBH", 1, ord("N"), 1) + b"x"
    with pytest.raises(
        PgOutputError,
        match=r"byte offset 8: column 1 of 1 of the new tuple has "
        r"unknown kind",
    ):
        decode_message(payload)


def test_negative_value_length() -> None:
    payload = b"I" + struct.pack("!IBHci", 1, ord("N"), 1, b"t", -1)
    with pytest.raises(PgOutputError, match="negative length -1"):
        decode_message(payload)


def test_invalid_utf8_text_value() -> None:
    payload = b"I" + struct.pack("!IBHci", 1, ord("N"), 1, b"t", 2) + b"\xc3\x28"
    with pytest.raises(PgOutputError, match=r"byte offset 13: column 1 of 1 .* not valid UTF-8"):
        decode_message(payload)


def test_invalid_utf8_relation_name() -> None:
    payload = b"R" + struct.pack("!I", 1) + b"public\0" + b"\xff\0" + struct.pack("!BH", 100, 0)
    with pytest.raises(PgOutputError, match="Relation message at byte offset 12: the relation name"):
        decode_message(payload)


def test_unterminated_string() -> None:
    with pytest.raises(
        PgOutputError, match="Origin message at byte offset 9: the origin name has no terminating NUL"
    ):
        decode_message(b"O" + struct.pack("!Q", 1) + b"abc")


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"I" + struct.pack("!IB", 1, ord("K")), "expected 'N' before the new tuple, got 'K'"),
        (b"U" + struct.pack("!IB", 1, ord("X")), "expected 'K', 'O' or 'N', got 'X'"),
        (b"U" + struct.pack("!IBH", 1, ord("K"), 0) + b"K", "expected 'N' after the old tuple"),
        (b"D" + struct.pack("!IB", 1, ord("N")), "expected 'K' or 'O', got 'N'"),
    ],
)
def test_bad_tuple_markers(payload: bytes, problem: str) -> None:
    with pytest.raises(PgOutputError, match=problem):
        decode_message(payload)


def test_stream_abort_of_an_unknown_size() -> None:
    with pytest.raises(PgOutputError, match="Stream Abort"):
        decode_message(b"A" + struct.pack("!IIQ", 1, 1, 5))


@pytest.mark.parametrize("micros", [2**63 - 1, -(2**63)])
def test_timestamp_out_of_datetime_range(micros: int) -> None:
    payload = b"B" + struct.pack("!QqI", 1, micros, 2)
    with pytest.raises(
        PgOutputError,
        match=r"Begin message at byte offset 9: commit time .* out "
        r"of range",
    ):
        decode_message(payload)


def test_in_stream_message_decoded_without_in_stream_fails_cleanly_or_differs() -> None:
    payload = encode(Insert(16384, ROW, 77), in_stream=True)
    try:
        decoded = decode_message(payload)
    except PgOutputError:
        return
    assert decoded != Insert(16384, ROW, 77)


# ---------------------------------------------------------------- RelationCache


def _cache() -> RelationCache:
    cache = RelationCache()
    cache.observe(decode_message(encode(ORDERS)))
    return cache


def test_row_dict_maps_names_to_text_and_none() -> None:
    assert _cache().row_dict(16384, ROW) == {"id": "1", "customer": "alice", "amount": "12.50", "note": None}


def test_row_dict_keeps_empty_strings_distinct_from_null() -> None:
    row = _cache().row_dict(16384, (t("1"), t(""), NULL, t("")))
    assert row == {"id": "1", "customer": "", "amount": None, "note": ""}


def test_row_dict_refuses_unchanged_toast_by_default() -> None:
    with pytest.raises(
        PgOutputError,
        match=r"column 'note' of public.orders is an unchanged "
        r"TOASTed value",
    ):
        _cache().row_dict(16384, (t("1"), t("a"), t("1"), UNCHANGED))


def test_row_dict_substitutes_a_sentinel_for_unchanged_toast() -> None:
    mine = object()
    cache = _cache()
    values = (t("1"), UNCHANGED, t("1"), UNCHANGED)
    assert cache.row_dict(16384, values, unchanged=mine) == {
        "id": "1",
        "customer": mine,
        "amount": "1",
        "note": mine,
    }
    assert cache.row_dict(16384, values, unchanged=UNCHANGED_TOAST)["note"] is UNCHANGED_TOAST
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


def test_row_dict_refuses_binary_values() -> None:
    with pytest.raises(PgOutputError, match="binary 'false'"):
        _cache().row_dict(16384, (ColumnValue("b", b"\x00\x00\x00\x01"), NULL, NULL, NULL))


def test_row_dict_column_count_mismatch() -> None:
    with pytest.raises(
        PgOutputError,
        match=r"public.orders \(OID 16384\) has 4 columns but the "
        r"tuple has 2",
    ):
        _cache().row_dict(16384, (t("1"), t("2")))


def test_unknown_relation() -> None:
    cache = _cache()
    with pytest.raises(PgOutputError, match="no Relation message was seen for relation OID 99"):
        cache.row_dict(99, ())
    with pytest.raises(PgOutputError, match="OID 99"):
        cache.get(99)
    assert 99 not in cache and 16384 in cache and len(cache) == 1


def test_observe_ignores_other_messages_and_a_new_relation_replaces_the_old() -> None:
    cache = _cache()
    cache.observe(Insert(16384, ROW))
    cache.observe(Begin(1, T0, 2))
    assert len(cache) == 1
    altered = dataclasses.replace(
        ORDERS, columns=(*ORDERS.columns, RelationColumn(0, "added", 23, -1, False))
    )
    cache.observe(altered)
    assert cache.get(16384) is altered
    assert cache.row_dict(16384, (*ROW, t("5")))["added"] == "5"
    cache.clear()
    assert len(cache) == 0


def test_key_dict_keeps_only_replica_identity_columns() -> None:
    assert _cache().key_dict(16384, (t("7"), NULL, NULL, NULL)) == {"id": "7"}
    assert _cache().key_dict(16384, (t("7"), UNCHANGED, NULL, NULL)) == {"id": "7"}
    with pytest.raises(PgOutputError, match="unchanged"):
        _cache().key_dict(16384, (UNCHANGED, NULL, NULL, NULL))


def test_delete_key_row_through_the_cache() -> None:
    cache = _cache()
    message = decode_message(encode(Delete(16384, None, (t("3"), NULL, NULL, NULL))))
    assert isinstance(message, Delete) and message.key is not None
    assert cache.key_dict(message.relid, message.key) == {"id": "3"}


# ---------------------------------------------------------------------------- LSNs


@pytest.mark.parametrize(
    ("lsn", "text"),
    [
        (0, "0/0"),
        (0x16_B374_D848, "16/B374D848"),
        (0x1_0000_0000, "1/0"),
        (0xFFFF_FFFF, "0/FFFFFFFF"),
        (2**64 - 1, "FFFFFFFF/FFFFFFFF"),
    ],
)
def test_lsn_formatting(lsn: int, text: str) -> None:
    assert lsn_to_str(lsn) == text
    assert str_to_lsn(text) == lsn


def test_str_to_lsn_accepts_lower_case_and_leading_zeros() -> None:
    assert str_to_lsn("16/b374d848") == 0x16_B374_D848
    assert str_to_lsn("00000016/0000000A") == 0x16_0000_000A


@pytest.mark.parametrize(
    "text", ["", "16", "16/", "/1", "G/1", "1/2/3", "123456789/0", " 1/2", "1/2 ", "-1/2", "0x1/2"]
)
def test_str_to_lsn_rejects_garbage(text: str) -> None:
    with pytest.raises(PgOutputError, match="is not an LSN"):
        str_to_lsn(text)


@pytest.mark.parametrize("lsn", [-1, 2**64])
def test_lsn_to_str_rejects_out_of_range(lsn: int) -> None:
    with pytest.raises(PgOutputError, match="outside the 64-bit"):
        lsn_to_str(lsn)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lsn_round_trip(lsn: int) -> None:
    assert str_to_lsn(lsn_to_str(lsn)) == lsn


@given(st.integers(min_value=0, max_value=2**64 - 2), st.integers(min_value=0, max_value=2**64 - 2))
def test_lsn_text_is_not_ordered_but_ints_are(a: int, b: int) -> None:
    # the point of str_to_lsn: compare LSNs as integers, never as text
    assert (str_to_lsn(lsn_to_str(a)) < str_to_lsn(lsn_to_str(b))) == (a < b)


# ---------------------------------------------------------------------- hypothesis

_u32 = st.integers(min_value=0, max_value=2**32 - 1)
_u64 = st.integers(min_value=0, max_value=2**64 - 1)
_name = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_moment = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
_column_value = st.one_of(
    st.just(NULL),
    st.just(UNCHANGED),
    st.builds(lambda s: ColumnValue("t", s), st.text(st.characters(codec="utf-8"), max_size=30)),
    st.builds(lambda b: ColumnValue("b", b), st.binary(max_size=30)),
)
_tuple = st.lists(_column_value, max_size=12).map(tuple)
_maybe_xid = st.one_of(st.none(), _u32)

_relation = st.builds(
    Relation,
    relid=_u32,
    namespace=_name,
    name=_name,
    replica_identity=st.sampled_from("dnfi"),
    columns=st.lists(
        st.builds(
            lambda flags, name, oid, typmod: RelationColumn(flags, name, oid, typmod, bool(flags & 1)),
            st.integers(0, 255),
            _name,
            _u32,
            st.integers(-(2**31), 2**31 - 1),
        ),
        max_size=10,
    ).map(tuple),
    xid=_maybe_xid,
)
_row_change = st.one_of(
    st.builds(Insert, _u32, _tuple, _maybe_xid),
    st.builds(Update, _u32, st.none(), st.none(), _tuple, _maybe_xid),
    st.builds(Update, _u32, _tuple, st.none(), _tuple, _maybe_xid),
    st.builds(Update, _u32, st.none(), _tuple, _tuple, _maybe_xid),
    st.builds(Delete, _u32, _tuple, st.none(), _maybe_xid),
    st.builds(Delete, _u32, st.none(), _tuple, _maybe_xid),
)
_any_message = st.one_of(
    _relation,
    _row_change,
    st.builds(Begin, _u64, _moment, _u32),
    st.builds(Commit, st.integers(0, 255), _u64, _u64, _moment),
    st.builds(Origin, _u64, _name),
    st.builds(TypeMessage, _u32, _name, _name, _maybe_xid),
    st.builds(Truncate, st.lists(_u32, max_size=5).map(tuple), st.booleans(), st.booleans(), _maybe_xid),
    st.builds(LogicalMessage, st.booleans(), _u64, _name, st.binary(max_size=40), _maybe_xid),
    st.builds(StreamStart, _u32, st.booleans()),
    st.builds(StreamCommit, _u32, st.integers(0, 255), _u64, _u64, _moment),
    st.builds(StreamAbort, _u32, _u32),
    st.builds(StreamAbort, _u32, _u32, _u64, _moment),
    st.builds(RollbackPrepared, st.integers(0, 255), _u64, _u64, _moment, _moment, _u32, _name),
)


def _in_stream(message: Message) -> bool:
    return getattr(message, "xid", None) is not None and isinstance(
        message, Relation | TypeMessage | Insert | Update | Delete | Truncate | LogicalMessage
    )


@given(_row_change)
def test_random_row_changes_round_trip(message: Message) -> None:
    in_stream = _in_stream(message)
    assert decode_message(encode(message, in_stream=in_stream), in_stream=in_stream) == message


@given(_relation)
def test_random_relations_round_trip(relation: Relation) -> None:
    in_stream = relation.xid is not None
    assert decode_message(encode(relation, in_stream=in_stream), in_stream=in_stream) == relation


@given(_any_message)
def test_random_messages_round_trip(message: Message) -> None:
    in_stream = _in_stream(message)
    assert decode_message(encode(message, in_stream=in_stream), in_stream=in_stream) == message


@given(
    st.builds(
        lambda columns, values: (columns, values),
        st.lists(
            st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True), min_size=1, max_size=8, unique=True
        ),
        st.data(),
    )
)
def test_random_rows_through_the_cache(columns_and_data: tuple[list[str], Any]) -> None:
    names, data = columns_and_data
    relation = Relation(1, "public", "t", "d", tuple(RelationColumn(0, n, 25, -1, False) for n in names))
    values = data.draw(
        st.lists(st.one_of(st.none(), st.text(max_size=10)), min_size=len(names), max_size=len(names))
    )
    row = tuple(NULL if v is None else t(v) for v in values)
    cache = RelationCache()
    cache.observe(decode_message(encode(relation)))
    decoded = decode_message(encode(Insert(1, row)))
    assert isinstance(decoded, Insert)
    assert cache.row_dict(1, decoded.new) == dict(zip(names, values, strict=True))


def _decodes_or_raises_pgoutput_error(payload: bytes, in_stream: bool) -> None:
    try:
        result = decode_message(payload, in_stream=in_stream)
    except PgOutputError as exc:
        assert "pgoutput" in str(exc)
    else:
        assert isinstance(result, tuple(_NAMES))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64), st.booleans())
@example(b"", False)
@example(b"T\xff\xff\xff\xff\x00", False)
@example(b"I\x00\x00\x00\x01N\xff\xff", False)
def test_random_bytes_decode_or_raise_pgoutput_error(payload: bytes, in_stream: bool) -> None:
    _decodes_or_raises_pgoutput_error(payload, in_stream)


@given(st.sampled_from(_TAGS), st.binary(max_size=80), st.booleans())
def test_random_bodies_of_known_types_decode_or_raise(tag: int, body: bytes, in_stream: bool) -> None:
    _decodes_or_raises_pgoutput_error(bytes([tag]) + body, in_stream)


@given(_any_message, st.data())
def test_truncated_or_corrupted_messages_decode_or_raise(message: Message, data: Any) -> None:
    in_stream = _in_stream(message)
    payload = encode(message, in_stream=in_stream)
    cut = data.draw(st.integers(0, len(payload) - 1))
    if not _is_v2_abort_prefix(message, cut):
        with pytest.raises(PgOutputError):
            decode_message(payload[:cut], in_stream=in_stream)
    position = data.draw(st.integers(0, len(payload) - 1))
    flipped = bytearray(payload)
    flipped[position] = data.draw(st.integers(0, 255))
    _decodes_or_raises_pgoutput_error(bytes(flipped), data.draw(st.booleans()))
