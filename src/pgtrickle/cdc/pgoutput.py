"""Decoder of the messages of PostgreSQL's built-in ``pgoutput`` logical decoding plugin.

Pure and I/O-free: :func:`decode_message` turns the payload of one message of
the logical replication stream (``msg.payload`` of a psycopg2
``LogicalReplicationConnection`` started with ``decode=False``) into a frozen
dataclass. The byte layouts are those of the PostgreSQL documentation,
"Logical Replication Message Formats", protocol versions 1 to 4:

* version 1: Begin, Commit, Origin, Relation, Type, Insert, Update, Delete,
  Truncate, and (PostgreSQL 14+, ``messages 'true'``) logical decoding Message;
* version 2 adds streamed transactions: Stream Start/Stop/Commit/Abort, and
  inside a stream (between Stream Start and Stream Stop) Relation, Type,
  Insert, Update, Delete, Truncate and Message carry the xid of the streamed
  transaction first. That field cannot be recognised from the bytes alone, so
  the caller says whether a message is inside a stream with ``in_stream``;
* version 3 adds two-phase commit: Begin Prepare, Prepare, Commit Prepared,
  Rollback Prepared, Stream Prepare;
* version 4 (``streaming 'parallel'``) adds the abort LSN and time to Stream
  Abort; both are ``None`` when the server did not send them.

Tuple column values arrive as text (kind ``'t'``, the value is a ``str``),
binary (``'b'``, ``bytes``, only with ``binary 'true'``), NULL (``'n'``) or an
unchanged TOASTed value that was not sent (``'u'``); both of the last two have
the value ``None``. Text is decoded as UTF-8 (the server and client encoding
of pgtrickle's databases).

Every malformed, truncated or unknown input raises :class:`PgOutputError`
naming the message type and the byte offset; no ``IndexError``,
``struct.error`` or ``UnicodeDecodeError`` escapes.

The Insert/Update/Delete path is written for speed (a few hundred thousand
messages a second): precompiled :class:`struct.Struct` objects, offset
arithmetic on the payload, shared NULL/unchanged column values.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, NoReturn, TypeAlias, TypeVar, overload

from pgtrickle.errors import PgTrickleError

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "BeginPrepare",
    "ColumnValue",
    "Commit",
    "CommitPrepared",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "PgOutputError",
    "Prepare",
    "Relation",
    "RelationCache",
    "RelationColumn",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "TypeMessage",
    "Update",
    "decode_message",
    "lsn_to_str",
    "pg_timestamp",
    "str_to_lsn",
]


class PgOutputError(PgTrickleError):
    """A pgoutput message is truncated, malformed or of an unknown type, or a
    decoded tuple cannot be materialised as asked."""


# ----------------------------------------------------------------------------- values


class ColumnValue(NamedTuple):
    """One column of a TupleData part.

    ``kind`` is ``'t'`` (text, ``value`` is ``str``), ``'b'`` (binary,
    ``value`` is ``bytes``), ``'n'`` (NULL) or ``'u'`` (unchanged TOASTed value,
    not sent); ``value`` is ``None`` for the last two. A named tuple rather
    than a dataclass: one is built per column, so construction cost matters.
    """

    kind: Literal["n", "u", "t", "b"]
    value: str | bytes | None


TupleData: TypeAlias = tuple[ColumnValue, ...]

NULL_VALUE: Final = ColumnValue("n", None)
UNCHANGED_VALUE: Final = ColumnValue("u", None)

_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def pg_timestamp(microseconds: int) -> datetime:
    """A PostgreSQL ``TimestampTz`` (microseconds since 2000-01-01 UTC) as an aware UTC datetime."""
    return _PG_EPOCH + timedelta(microseconds=microseconds)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a (non-streamed) transaction: ``final_lsn`` is the LSN of its commit record."""

    final_lsn: int
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction; ``end_lsn`` is the LSN to confirm as flushed once it is applied."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """The transaction was replicated from another node (replication origin)."""

    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One published column of a relation; ``is_key`` when ``flags`` marks it part of the replica identity."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """Description of a table, sent before its first change (and again after it changes).

    ``namespace`` is empty for ``pg_catalog``; ``replica_identity`` is the
    ``pg_class.relreplident`` letter: ``'d'`` default (primary key), ``'n'``
    nothing, ``'f'`` full, ``'i'`` index. ``xid`` is set only inside a stream.
    """

    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class TypeMessage:
    """Description of a non-built-in data type used by a following Relation."""

    type_oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relid: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """An updated row.

    ``old`` is the whole old row (REPLICA IDENTITY FULL); ``key`` is the old
    replica-identity key, sent only when the update changed it (the other
    columns are NULL); at most one of them is set.
    """

    relid: int
    old: TupleData | None
    key: TupleData | None
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """A deleted row: ``old`` (REPLICA IDENTITY FULL) or ``key`` (the identity key, other columns NULL)."""

    relid: int
    old: TupleData | None
    key: TupleData | None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A message written with ``pg_logical_emit_message`` (publication option ``messages 'true'``)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Abort of a streamed (sub)transaction; ``subxid == xid`` for the top-level one.

    ``abort_lsn``/``abort_time`` are sent only with protocol 4 and ``streaming 'parallel'``.
    """

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: datetime
    rollback_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: datetime
    xid: int
    gid: str


Message: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMessage
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)

# ------------------------------------------------------------------------ byte layouts

_U8: Final = struct.Struct("!B")
_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_I32: Final = struct.Struct("!i")
_U64: Final = struct.Struct("!Q")
_RELID_MARKER: Final = struct.Struct("!IB")  # relation OID, Byte1 'N'/'K'/'O'
_BEGIN: Final = struct.Struct("!QqI")  # final LSN, commit time, xid
_COMMIT: Final = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit time
_RELATION_TAIL: Final = struct.Struct("!BH")  # replica identity, column count
_COLUMN_TYPE: Final = struct.Struct("!Ii")  # type OID, type modifier
_MESSAGE_HEAD: Final = struct.Struct("!BQ")  # flags, LSN
_TRUNCATE_HEAD: Final = struct.Struct("!IB")  # relation count, option bits
_STREAM_START: Final = struct.Struct("!IB")  # xid, first-segment flag
_STREAM_COMMIT: Final = struct.Struct("!IBQQq")  # xid, flags, commit LSN, end LSN, time
_STREAM_ABORT: Final = struct.Struct("!II")  # xid, subxid
_STREAM_ABORT_V4: Final = struct.Struct("!IIQq")  # ... + abort LSN, abort time
_BEGIN_PREPARE: Final = struct.Struct("!QQqI")  # prepare LSN, end LSN, time, xid
_PREPARE: Final = struct.Struct("!BQQqI")  # flags, LSN, end LSN, time, xid
_ROLLBACK_PREPARED: Final = struct.Struct("!BQQqqI")  # flags, 2 LSNs, 2 times, xid

_unpack_u16 = _U16.unpack_from
_unpack_i32 = _I32.unpack_from
_unpack_relid_marker = _RELID_MARKER.unpack_from
_new_value = tuple.__new__

_TRUNCATE_CASCADE: Final = 1
_TRUNCATE_RESTART_IDENTITY: Final = 2

_NAMES: Final[dict[int, str]] = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}


# ----------------------------------------------------------------------------- errors


def _fail(msg: str, offset: int, problem: str, size: int) -> NoReturn:
    raise PgOutputError(
        f"malformed pgoutput {msg} message at byte offset {offset}: {problem} (message is {size} bytes)"
    )


def _truncated(msg: str, offset: int, what: str, need: int, size: int) -> NoReturn:
    left = max(size - offset, 0)
    raise PgOutputError(
        f"truncated pgoutput {msg} message at byte offset {offset}: reading {what} needs "
        f"{need} byte(s) but {left} remain (message is {size} bytes)"
    )


def _check_end(msg: str, offset: int, size: int) -> None:
    if offset != size:
        _fail(msg, offset, f"{size - offset} unexpected trailing byte(s)", size)


def _time(msg: str, offset: int, microseconds: int, what: str, size: int) -> datetime:
    try:
        return _PG_EPOCH + timedelta(microseconds=microseconds)
    except OverflowError:
        _fail(msg, offset, f"{what} {microseconds} µs since 2000-01-01 is out of range", size)


# ------------------------------------------------------------------------- tuple data


def _read_tuple(
    buf: bytes,
    off: int,
    size: int,
    msg: str,
    part: str,
    _unpack_i32: Callable[[bytes, int], tuple[int]] = _unpack_i32,
    _new_value: Callable[..., ColumnValue] = _new_value,
    _cv: type[ColumnValue] = ColumnValue,
    _null: ColumnValue = NULL_VALUE,
    _unchanged: ColumnValue = UNCHANGED_VALUE,
) -> tuple[TupleData, int]:
    """Decode a TupleData part starting at ``off``; returns it and the offset after it.

    (The keyword defaults make module globals local names, for speed; never pass them.)
    """
    if off + 2 > size:
        _truncated(msg, off, f"the column count of the {part}", 2, size)
    (ncols,) = _unpack_u16(buf, off)
    off += 2
    values: list[ColumnValue] = []
    append = values.append
    column = 0
    start = off
    try:
        for column in range(ncols):
            kind = buf[off]
            if kind == 0x74:  # 't'
                (length,) = _unpack_i32(buf, off + 1)
                start = off + 5
                off = start + length
                if length < 0 or off > size:
                    off = start - 5
                    break
                append(_new_value(_cv, ("t", buf[start:off].decode())))
            elif kind == 0x6E:  # 'n'
                append(_null)
                off += 1
            elif kind == 0x75:  # 'u'
                append(_unchanged)
                off += 1
            elif kind == 0x62:  # 'b'
                (length,) = _unpack_i32(buf, off + 1)
                start = off + 5
                off = start + length
                if length < 0 or off > size:
                    off = start - 5
                    break
                append(_new_value(_cv, ("b", buf[start:off])))
            else:
                _fail(
                    msg,
                    off,
                    f"column {column + 1} of {ncols} of the {part} has unknown kind "
                    f"{kind!r} ({chr(kind)!r}; expected 'n', 'u', 't' or 'b')",
                    size,
                )
        else:
            return tuple(values), off
    except (IndexError, struct.error):
        if off >= size:
            _truncated(msg, off, f"the kind byte of column {column + 1} of {ncols} of the {part}", 1, size)
        _truncated(msg, off + 1, f"the length of column {column + 1} of {ncols} of the {part}", 4, size)
    except UnicodeDecodeError as exc:
        _fail(
            msg,
            start + exc.start,
            f"column {column + 1} of {ncols} of the {part} is not valid UTF-8 text ({exc.reason})",
            size,
        )
    # the loop broke out on a bad value length
    (length,) = _unpack_i32(buf, off + 1)
    if length < 0:
        _fail(
            msg, off + 1, f"column {column + 1} of {ncols} of the {part} has negative length {length}", size
        )
    _truncated(msg, off + 5, f"the value of column {column + 1} of {ncols} of the {part}", length, size)


# ------------------------------------------------------------------ hot path decoders

# A frozen dataclass's __init__ assigns every field through object.__setattr__,
# which costs about as much as decoding a short row. The hot path builds the
# same objects by writing the slots directly: _make_insert(r, n, x) is equal in
# every way to Insert(r, n, x), at half the cost.
_new_object = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in names)


_set_insert = _slot_setters(Insert, "relid", "new", "xid")
_set_update = _slot_setters(Update, "relid", "old", "key", "new", "xid")
_set_delete = _slot_setters(Delete, "relid", "old", "key", "xid")


def _make_insert(
    relid: int, new: TupleData, xid: int | None, _set: tuple[Callable[[Any, Any], None], ...] = _set_insert
) -> Insert:
    obj = _new_object(Insert)
    _set[0](obj, relid)
    _set[1](obj, new)
    _set[2](obj, xid)
    return obj


def _make_update(
    relid: int,
    old: TupleData | None,
    key: TupleData | None,
    new: TupleData,
    xid: int | None,
    _set: tuple[Callable[[Any, Any], None], ...] = _set_update,
) -> Update:
    obj = _new_object(Update)
    _set[0](obj, relid)
    _set[1](obj, old)
    _set[2](obj, key)
    _set[3](obj, new)
    _set[4](obj, xid)
    return obj


def _make_delete(
    relid: int,
    old: TupleData | None,
    key: TupleData | None,
    xid: int | None,
    _set: tuple[Callable[[Any, Any], None], ...] = _set_delete,
) -> Delete:
    obj = _new_object(Delete)
    _set[0](obj, relid)
    _set[1](obj, old)
    _set[2](obj, key)
    _set[3](obj, xid)
    return obj


def _stream_xid(buf: bytes, size: int, msg: str, in_stream: bool) -> tuple[int | None, int]:
    if not in_stream:
        return None, 1
    if size < 5:
        _truncated(msg, 1, "the xid of the streamed transaction", 4, size)
    return _U32.unpack_from(buf, 1)[0], 5


def _decode_insert(buf: bytes, size: int, in_stream: bool) -> Insert:
    if in_stream:
        xid, off = _stream_xid(buf, size, "Insert", True)
    else:
        xid, off = None, 1
    if off + 5 > size:
        _truncated("Insert", off, "the relation OID and the 'N' marker", 5, size)
    relid, marker = _unpack_relid_marker(buf, off)
    if marker != 0x4E:  # 'N'
        _fail("Insert", off + 4, f"expected 'N' before the new tuple, got {chr(marker)!r}", size)
    new, off = _read_tuple(buf, off + 5, size, "Insert", "new tuple")
    if off != size:
        _check_end("Insert", off, size)
    return _make_insert(relid, new, xid)


def _decode_update(buf: bytes, size: int, in_stream: bool) -> Update:
    if in_stream:
        xid, off = _stream_xid(buf, size, "Update", True)
    else:
        xid, off = None, 1
    if off + 5 > size:
        _truncated("Update", off, "the relation OID and the 'K'/'O'/'N' marker", 5, size)
    relid, marker = _unpack_relid_marker(buf, off)
    off += 5
    old = key = None
    if marker == 0x4B or marker == 0x4F:  # 'K' or 'O'
        if marker == 0x4B:
            key, off = _read_tuple(buf, off, size, "Update", "old key")
        else:
            old, off = _read_tuple(buf, off, size, "Update", "old tuple")
        if off >= size:
            _truncated("Update", off, "the 'N' marker", 1, size)
        marker = buf[off]
        off += 1
        if marker != 0x4E:
            _fail("Update", off - 1, f"expected 'N' after the old tuple, got {chr(marker)!r}", size)
    elif marker != 0x4E:
        _fail("Update", off - 1, f"expected 'K', 'O' or 'N', got {chr(marker)!r}", size)
    new, off = _read_tuple(buf, off, size, "Update", "new tuple")
    if off != size:
        _check_end("Update", off, size)
    return _make_update(relid, old, key, new, xid)


def _decode_delete(buf: bytes, size: int, in_stream: bool) -> Delete:
    if in_stream:
        xid, off = _stream_xid(buf, size, "Delete", True)
    else:
        xid, off = None, 1
    if off + 5 > size:
        _truncated("Delete", off, "the relation OID and the 'K'/'O' marker", 5, size)
    relid, marker = _unpack_relid_marker(buf, off)
    if marker == 0x4B:  # 'K'
        key, off = _read_tuple(buf, off + 5, size, "Delete", "old key")
        old = None
    elif marker == 0x4F:  # 'O'
        old, off = _read_tuple(buf, off + 5, size, "Delete", "old tuple")
        key = None
    else:
        _fail("Delete", off + 4, f"expected 'K' or 'O', got {chr(marker)!r}", size)
    if off != size:
        _check_end("Delete", off, size)
    return _make_delete(relid, old, key, xid)


# ------------------------------------------------------------- the other message types


class _Reader:
    """Sequential reader for the less frequent message types, with precise errors."""

    __slots__ = ("buf", "msg", "off", "size")

    def __init__(self, buf: bytes, size: int, msg: str) -> None:
        self.buf = buf
        self.size = size
        self.msg = msg
        self.off = 1

    def unpack(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        off = self.off
        if off + layout.size > self.size:
            _truncated(self.msg, off, what, layout.size, self.size)
        self.off = off + layout.size
        return layout.unpack_from(self.buf, off)

    def string(self, what: str) -> str:
        off = self.off
        end = self.buf.find(0, off)
        if end < 0:
            raise PgOutputError(
                f"truncated pgoutput {self.msg} message at byte offset {off}: {what} has no "
                f"terminating NUL byte (message is {self.size} bytes)"
            )
        self.off = end + 1
        return self.text(off, end, what)

    def text(self, start: int, end: int, what: str) -> str:
        try:
            return self.buf[start:end].decode()
        except UnicodeDecodeError as exc:
            _fail(self.msg, start + exc.start, f"{what} is not valid UTF-8 ({exc.reason})", self.size)

    def take(self, length: int, what: str) -> bytes:
        off = self.off
        if length < 0:
            _fail(self.msg, off, f"{what} has negative length {length}", self.size)
        if off + length > self.size:
            _truncated(self.msg, off, what, length, self.size)
        self.off = off + length
        return self.buf[off : off + length]

    def xid(self, in_stream: bool) -> int | None:
        if not in_stream:
            return None
        (xid,) = self.unpack(_U32, "the xid of the streamed transaction")
        return int(xid)

    def time(self, microseconds: int, what: str) -> datetime:
        return _time(self.msg, self.off, microseconds, what, self.size)

    def finish(self) -> None:
        _check_end(self.msg, self.off, self.size)


def _decode_begin(buf: bytes, size: int, in_stream: bool) -> Begin:
    if size != 21:
        if size < 21:
            _truncated("Begin", 1, "final LSN, commit time and xid", 20, size)
        _check_end("Begin", 21, size)
    final_lsn, micros, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(final_lsn, _time("Begin", 9, micros, "commit time", size), xid)


def _decode_commit(buf: bytes, size: int, in_stream: bool) -> Commit:
    if size != 26:
        if size < 26:
            _truncated("Commit", 1, "flags, commit LSN, end LSN and commit time", 25, size)
        _check_end("Commit", 26, size)
    flags, commit_lsn, end_lsn, micros = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, commit_lsn, end_lsn, _time("Commit", 18, micros, "commit time", size))


def _decode_origin(buf: bytes, size: int, in_stream: bool) -> Origin:
    r = _Reader(buf, size, "Origin")
    (lsn,) = r.unpack(_U64, "the origin LSN")
    name = r.string("the origin name")
    r.finish()
    return Origin(lsn, name)


def _decode_relation(buf: bytes, size: int, in_stream: bool) -> Relation:
    r = _Reader(buf, size, "Relation")
    xid = r.xid(in_stream)
    (relid,) = r.unpack(_U32, "the relation OID")
    namespace = r.string("the namespace")
    name = r.string("the relation name")
    identity, ncols = r.unpack(_RELATION_TAIL, "the replica identity and column count")
    columns = []
    for i in range(ncols):
        (flags,) = r.unpack(_U8, f"the flags of column {i + 1} of {ncols}")
        column_name = r.string(f"the name of column {i + 1} of {ncols}")
        type_oid, typmod = r.unpack(_COLUMN_TYPE, f"the type of column {i + 1} of {ncols}")
        columns.append(RelationColumn(flags, column_name, type_oid, typmod, bool(flags & 1)))
    r.finish()
    return Relation(relid, namespace, name, chr(identity), tuple(columns), xid)


def _decode_type(buf: bytes, size: int, in_stream: bool) -> TypeMessage:
    r = _Reader(buf, size, "Type")
    xid = r.xid(in_stream)
    (type_oid,) = r.unpack(_U32, "the type OID")
    namespace = r.string("the namespace")
    name = r.string("the type name")
    r.finish()
    return TypeMessage(type_oid, namespace, name, xid)


def _decode_truncate(buf: bytes, size: int, in_stream: bool) -> Truncate:
    r = _Reader(buf, size, "Truncate")
    xid = r.xid(in_stream)
    nrels, options = r.unpack(_TRUNCATE_HEAD, "the relation count and options")
    if r.off + 4 * nrels > size:
        _truncated("Truncate", r.off, f"{nrels} relation OIDs", 4 * nrels, size)
    relids = struct.unpack_from(f"!{nrels}I", buf, r.off)
    r.off += 4 * nrels
    r.finish()
    return Truncate(
        relids, bool(options & _TRUNCATE_CASCADE), bool(options & _TRUNCATE_RESTART_IDENTITY), xid
    )


def _decode_logical_message(buf: bytes, size: int, in_stream: bool) -> LogicalMessage:
    r = _Reader(buf, size, "Message")
    xid = r.xid(in_stream)
    flags, lsn = r.unpack(_MESSAGE_HEAD, "the flags and LSN")
    prefix = r.string("the prefix")
    (length,) = r.unpack(_I32, "the content length")
    content = r.take(length, "the content")
    r.finish()
    return LogicalMessage(bool(flags & 1), lsn, prefix, content, xid)


def _decode_stream_start(buf: bytes, size: int, in_stream: bool) -> StreamStart:
    r = _Reader(buf, size, "Stream Start")
    xid, first = r.unpack(_STREAM_START, "the xid and first-segment flag")
    r.finish()
    return StreamStart(xid, first == 1)


def _decode_stream_stop(buf: bytes, size: int, in_stream: bool) -> StreamStop:
    _check_end("Stream Stop", 1, size)
    return StreamStop()


def _decode_stream_commit(buf: bytes, size: int, in_stream: bool) -> StreamCommit:
    r = _Reader(buf, size, "Stream Commit")
    xid, flags, commit_lsn, end_lsn, micros = r.unpack(
        _STREAM_COMMIT, "xid, flags, commit LSN, end LSN and commit time"
    )
    r.finish()
    return StreamCommit(
        xid, flags, commit_lsn, end_lsn, _time("Stream Commit", 22, micros, "commit time", size)
    )


def _decode_stream_abort(buf: bytes, size: int, in_stream: bool) -> StreamAbort:
    r = _Reader(buf, size, "Stream Abort")
    if size == 1 + _STREAM_ABORT_V4.size:
        xid, subxid, abort_lsn, micros = r.unpack(_STREAM_ABORT_V4, "xids, abort LSN and time")
        return StreamAbort(xid, subxid, abort_lsn, _time("Stream Abort", 17, micros, "abort time", size))
    xid, subxid = r.unpack(_STREAM_ABORT, "the xid and subtransaction xid")
    r.finish()
    return StreamAbort(xid, subxid)


def _decode_begin_prepare(buf: bytes, size: int, in_stream: bool) -> BeginPrepare:
    r = _Reader(buf, size, "Begin Prepare")
    prepare_lsn, end_lsn, micros, xid = r.unpack(_BEGIN_PREPARE, "prepare LSN, end LSN, prepare time and xid")
    gid = r.string("the GID")
    r.finish()
    return BeginPrepare(
        prepare_lsn, end_lsn, _time("Begin Prepare", 17, micros, "prepare time", size), xid, gid
    )


def _prepare_like(kind: str) -> Callable[[bytes, int, bool], tuple[Any, ...]]:
    def decode(buf: bytes, size: int, in_stream: bool) -> tuple[Any, ...]:
        r = _Reader(buf, size, kind)
        flags, lsn, end_lsn, micros, xid = r.unpack(_PREPARE, "flags, LSNs, time and xid")
        gid = r.string("the GID")
        r.finish()
        return flags, lsn, end_lsn, _time(kind, 18, micros, "time", size), xid, gid

    return decode


_prepare_fields = _prepare_like("Prepare")
_commit_prepared_fields = _prepare_like("Commit Prepared")
_stream_prepare_fields = _prepare_like("Stream Prepare")


def _decode_prepare(buf: bytes, size: int, in_stream: bool) -> Prepare:
    return Prepare(*_prepare_fields(buf, size, in_stream))


def _decode_commit_prepared(buf: bytes, size: int, in_stream: bool) -> CommitPrepared:
    return CommitPrepared(*_commit_prepared_fields(buf, size, in_stream))


def _decode_stream_prepare(buf: bytes, size: int, in_stream: bool) -> StreamPrepare:
    return StreamPrepare(*_stream_prepare_fields(buf, size, in_stream))


def _decode_rollback_prepared(buf: bytes, size: int, in_stream: bool) -> RollbackPrepared:
    r = _Reader(buf, size, "Rollback Prepared")
    flags, prepare_end, rollback_end, prepare_us, rollback_us, xid = r.unpack(
        _ROLLBACK_PREPARED, "flags, LSNs, times and xid"
    )
    gid = r.string("the GID")
    r.finish()
    return RollbackPrepared(
        flags,
        prepare_end,
        rollback_end,
        _time("Rollback Prepared", 18, prepare_us, "prepare time", size),
        _time("Rollback Prepared", 26, rollback_us, "rollback time", size),
        xid,
        gid,
    )


_DECODERS: Final[dict[int, Callable[[bytes, int, bool], Message]]] = {
    ord("I"): _decode_insert,
    ord("U"): _decode_update,
    ord("D"): _decode_delete,
    ord("B"): _decode_begin,
    ord("C"): _decode_commit,
    ord("R"): _decode_relation,
    ord("O"): _decode_origin,
    ord("Y"): _decode_type,
    ord("T"): _decode_truncate,
    ord("M"): _decode_logical_message,
    ord("S"): _decode_stream_start,
    ord("E"): _decode_stream_stop,
    ord("c"): _decode_stream_commit,
    ord("A"): _decode_stream_abort,
    ord("b"): _decode_begin_prepare,
    ord("P"): _decode_prepare,
    ord("K"): _decode_commit_prepared,
    ord("r"): _decode_rollback_prepared,
    ord("p"): _decode_stream_prepare,
}
assert set(_DECODERS) == set(_NAMES)


def decode_message(payload: bytes, *, in_stream: bool = False) -> Message:
    """Decode one pgoutput message.

    ``in_stream`` must be true for messages between a Stream Start and the
    next Stream Stop (protocol 2+ with ``streaming`` on): their data messages
    then begin with the xid of the streamed transaction, returned as ``xid``.

    Raises :class:`PgOutputError` for an empty, truncated, malformed or
    unknown message.
    """
    if type(payload) is not bytes:
        payload = bytes(payload)
    size = len(payload)
    if not size:
        raise PgOutputError("empty pgoutput message: expected at least a 1-byte message type")
    tag = payload[0]
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise PgOutputError(
            f"unknown pgoutput message type {chr(tag)!r} (byte 0x{tag:02x}) at byte offset 0 "
            f"(message is {size} bytes)"
        )
    return decoder(payload, size, in_stream)


# ------------------------------------------------------------------------ relations


class _Unchanged:
    """Type of :data:`UNCHANGED_TOAST`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _Unchanged()
"""A ready-made sentinel for ``RelationCache.row_dict(..., unchanged=UNCHANGED_TOAST)``."""

_RAISE: Final = object()
_T = TypeVar("_T")


class RelationCache:
    """The Relation messages seen so far on a replication connection, by relation OID.

    pgoutput sends a Relation message before the first change of each table
    in a session (and again when the table's definition changes); feed every
    decoded message to :meth:`observe` (or Relations to :meth:`add`) and use
    :meth:`row_dict` to turn tuples into column-name dictionaries.
    """

    __slots__ = ("_names", "_relations")

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}
        self._names: dict[int, tuple[str, ...]] = {}

    def add(self, relation: Relation) -> None:
        self._relations[relation.relid] = relation
        self._names[relation.relid] = tuple(c.name for c in relation.columns)

    def observe(self, message: Message) -> None:
        """Remember ``message`` if it is a Relation; ignore any other message."""
        if type(message) is Relation:
            self.add(message)

    def get(self, relid: int) -> Relation:
        try:
            return self._relations[relid]
        except KeyError:
            raise PgOutputError(
                f"no Relation message was seen for relation OID {relid}; pgoutput sends one "
                "before the first change of each table on a connection, so every message of "
                "the connection must be passed to RelationCache.observe()"
            ) from None

    def __contains__(self, relid: object) -> bool:
        return relid in self._relations

    def __len__(self) -> int:
        return len(self._relations)

    def clear(self) -> None:
        self._relations.clear()
        self._names.clear()

    @overload
    def row_dict(self, relid: int, tuple_data: TupleData) -> dict[str, str | None]: ...

    @overload
    def row_dict(self, relid: int, tuple_data: TupleData, *, unchanged: _T) -> dict[str, str | _T | None]: ...

    def row_dict(self, relid: int, tuple_data: TupleData, *, unchanged: Any = _RAISE) -> dict[str, Any]:
        """Map the relation's column names to the tuple's text values (``None`` for NULL).

        An unchanged TOASTed value (kind ``'u'``, an Update that did not touch
        a large column) has no value to give: it raises :class:`PgOutputError`
        unless ``unchanged`` is given, which is then used in its place (e.g.
        :data:`UNCHANGED_TOAST`). Binary values (kind ``'b'``) raise too: they
        are type-specific bytes, not text; request ``binary 'false'``.
        """
        names = self._names.get(relid)
        if names is None:
            self.get(relid)  # raises
            raise AssertionError  # pragma: no cover
        if len(names) != len(tuple_data):
            relation = self._relations[relid]
            raise PgOutputError(
                f"relation {relation.namespace}.{relation.name} (OID {relid}) has {len(names)} "
                f"columns but the tuple has {len(tuple_data)}; was a Relation message missed?"
            )
        row: dict[str, Any] = {}
        for name, (kind, value) in zip(names, tuple_data, strict=True):
            if kind == "t" or kind == "n":
                row[name] = value
            elif kind == "u":
                if unchanged is _RAISE:
                    relation = self._relations[relid]
                    raise PgOutputError(
                        f"column {name!r} of {relation.namespace}.{relation.name} is an unchanged "
                        "TOASTed value that pgoutput did not send; pass unchanged=<sentinel> to "
                        "row_dict() to get a placeholder, or set REPLICA IDENTITY FULL on the table"
                    )
                row[name] = unchanged
            else:
                relation = self._relations[relid]
                raise PgOutputError(
                    f"column {name!r} of {relation.namespace}.{relation.name} arrived in binary "
                    "format, which row_dict() cannot turn into text; start replication with "
                    "binary 'false'"
                )
        return row

    def key_dict(self, relid: int, tuple_data: TupleData) -> dict[str, str | None]:
        """Like :meth:`row_dict` but only the replica-identity key columns (``is_key``)."""
        relation = self.get(relid)
        row = self.row_dict(relid, tuple_data, unchanged=UNCHANGED_TOAST)
        key: dict[str, str | None] = {}
        for column in relation.columns:
            if column.is_key:
                value = row[column.name]
                if value is UNCHANGED_TOAST:
                    self.row_dict(relid, tuple_data)  # raises the unchanged-TOAST error
                key[column.name] = value  # type: ignore[assignment]  # row_dict raised for UNCHANGED_TOAST
        return key


# ----------------------------------------------------------------------------- LSNs

_LSN_TEXT: Final = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def lsn_to_str(lsn: int) -> str:
    """Format an LSN the way PostgreSQL does (``pg_lsn``): ``'16/B374D848'``."""
    if not 0 <= lsn <= 0xFFFF_FFFF_FFFF_FFFF:
        raise PgOutputError(f"LSN {lsn} is outside the 64-bit unsigned range")
    return f"{lsn >> 32:X}/{lsn & 0xFFFF_FFFF:X}"


def str_to_lsn(text: str) -> int:
    """Parse a ``pg_lsn`` text such as ``'16/B374D848'`` (1-8 hex digits each side)."""
    match = _LSN_TEXT.fullmatch(text)
    if match is None:
        raise PgOutputError(
            f"{text!r} is not an LSN; expected two hexadecimal numbers of 1 to 8 digits "
            "separated by '/', such as '16/B374D848'"
        )
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)
