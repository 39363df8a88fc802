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
arithmetic on the payload, shared NULL/unchanged column values
(``cdc/pgoutput_changes.py``). The message values are in
``cdc/pgoutput_messages.py``, the byte reader and its errors in
``cdc/pgoutput_bytes.py``, and the turning of tuples into rows by column name
in ``cdc/relation_cache.py``; this module decodes the other message types and
dispatches, and re-exports the public names of all of them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from pgtrickle.cdc.pgoutput_bytes import I32, U8, U32, U64, ByteReader, check_end, read_time, truncated
from pgtrickle.cdc.pgoutput_changes import decode_delete, decode_insert, decode_update
from pgtrickle.cdc.pgoutput_messages import (
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
    lsn_to_str,
    pg_timestamp,
    str_to_lsn,
)
from pgtrickle.cdc.relation_cache import UNCHANGED_TOAST, RelationCache

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


def _decode_begin(buf: bytes, size: int, in_stream: bool) -> Begin:
    if size != 21:
        if size < 21:
            truncated("Begin", 1, "final LSN, commit time and xid", 20, size)
        check_end("Begin", 21, size)
    final_lsn, micros, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(final_lsn, read_time("Begin", 9, micros, "commit time", size), xid)


def _decode_commit(buf: bytes, size: int, in_stream: bool) -> Commit:
    if size != 26:
        if size < 26:
            truncated("Commit", 1, "flags, commit LSN, end LSN and commit time", 25, size)
        check_end("Commit", 26, size)
    flags, commit_lsn, end_lsn, micros = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, commit_lsn, end_lsn, read_time("Commit", 18, micros, "commit time", size))


def _decode_origin(buf: bytes, size: int, in_stream: bool) -> Origin:
    r = ByteReader(buf, size, "Origin")
    (lsn,) = r.unpack(U64, "the origin LSN")
    name = r.string("the origin name")
    r.finish()
    return Origin(lsn, name)


def _decode_relation(buf: bytes, size: int, in_stream: bool) -> Relation:
    r = ByteReader(buf, size, "Relation")
    xid = r.xid(in_stream)
    (relid,) = r.unpack(U32, "the relation OID")
    namespace = r.string("the namespace")
    name = r.string("the relation name")
    identity, ncols = r.unpack(_RELATION_TAIL, "the replica identity and column count")
    columns = []
    for i in range(ncols):
        (flags,) = r.unpack(U8, f"the flags of column {i + 1} of {ncols}")
        column_name = r.string(f"the name of column {i + 1} of {ncols}")
        type_oid, typmod = r.unpack(_COLUMN_TYPE, f"the type of column {i + 1} of {ncols}")
        columns.append(RelationColumn(flags, column_name, type_oid, typmod, bool(flags & 1)))
    r.finish()
    return Relation(relid, namespace, name, chr(identity), tuple(columns), xid)


def _decode_type(buf: bytes, size: int, in_stream: bool) -> TypeMessage:
    r = ByteReader(buf, size, "Type")
    xid = r.xid(in_stream)
    (type_oid,) = r.unpack(U32, "the type OID")
    namespace = r.string("the namespace")
    name = r.string("the type name")
    r.finish()
    return TypeMessage(type_oid, namespace, name, xid)


def _decode_truncate(buf: bytes, size: int, in_stream: bool) -> Truncate:
    r = ByteReader(buf, size, "Truncate")
    xid = r.xid(in_stream)
    nrels, options = r.unpack(_TRUNCATE_HEAD, "the relation count and options")
    if r.off + 4 * nrels > size:
        truncated("Truncate", r.off, f"{nrels} relation OIDs", 4 * nrels, size)
    relids = struct.unpack_from(f"!{nrels}I", buf, r.off)
    r.off += 4 * nrels
    r.finish()
    return Truncate(
        relids, bool(options & _TRUNCATE_CASCADE), bool(options & _TRUNCATE_RESTART_IDENTITY), xid
    )


def _decode_logical_message(buf: bytes, size: int, in_stream: bool) -> LogicalMessage:
    r = ByteReader(buf, size, "Message")
    xid = r.xid(in_stream)
    flags, lsn = r.unpack(_MESSAGE_HEAD, "the flags and LSN")
    prefix = r.string("the prefix")
    (length,) = r.unpack(I32, "the content length")
    content = r.take(length, "the content")
    r.finish()
    return LogicalMessage(bool(flags & 1), lsn, prefix, content, xid)


def _decode_stream_start(buf: bytes, size: int, in_stream: bool) -> StreamStart:
    r = ByteReader(buf, size, "Stream Start")
    xid, first = r.unpack(_STREAM_START, "the xid and first-segment flag")
    r.finish()
    return StreamStart(xid, first == 1)


def _decode_stream_stop(buf: bytes, size: int, in_stream: bool) -> StreamStop:
    check_end("Stream Stop", 1, size)
    return StreamStop()


def _decode_stream_commit(buf: bytes, size: int, in_stream: bool) -> StreamCommit:
    r = ByteReader(buf, size, "Stream Commit")
    xid, flags, commit_lsn, end_lsn, micros = r.unpack(
        _STREAM_COMMIT, "xid, flags, commit LSN, end LSN and commit time"
    )
    r.finish()
    return StreamCommit(
        xid, flags, commit_lsn, end_lsn, read_time("Stream Commit", 22, micros, "commit time", size)
    )


def _decode_stream_abort(buf: bytes, size: int, in_stream: bool) -> StreamAbort:
    r = ByteReader(buf, size, "Stream Abort")
    if size == 1 + _STREAM_ABORT_V4.size:
        xid, subxid, abort_lsn, micros = r.unpack(_STREAM_ABORT_V4, "xids, abort LSN and time")
        return StreamAbort(xid, subxid, abort_lsn, read_time("Stream Abort", 17, micros, "abort time", size))
    xid, subxid = r.unpack(_STREAM_ABORT, "the xid and subtransaction xid")
    r.finish()
    return StreamAbort(xid, subxid)


def _decode_begin_prepare(buf: bytes, size: int, in_stream: bool) -> BeginPrepare:
    r = ByteReader(buf, size, "Begin Prepare")
    prepare_lsn, end_lsn, micros, xid = r.unpack(_BEGIN_PREPARE, "prepare LSN, end LSN, prepare time and xid")
    gid = r.string("the GID")
    r.finish()
    return BeginPrepare(
        prepare_lsn, end_lsn, read_time("Begin Prepare", 17, micros, "prepare time", size), xid, gid
    )


def _prepare_like(kind: str) -> Callable[[bytes, int, bool], tuple[Any, ...]]:
    def decode(buf: bytes, size: int, in_stream: bool) -> tuple[Any, ...]:
        r = ByteReader(buf, size, kind)
        flags, lsn, end_lsn, micros, xid = r.unpack(_PREPARE, "flags, LSNs, time and xid")
        gid = r.string("the GID")
        r.finish()
        return flags, lsn, end_lsn, read_time(kind, 18, micros, "time", size), xid, gid

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
    r = ByteReader(buf, size, "Rollback Prepared")
    flags, prepare_end, rollback_end, prepare_us, rollback_us, xid = r.unpack(
        _ROLLBACK_PREPARED, "flags, LSNs, times and xid"
    )
    gid = r.string("the GID")
    r.finish()
    return RollbackPrepared(
        flags,
        prepare_end,
        rollback_end,
        read_time("Rollback Prepared", 18, prepare_us, "prepare time", size),
        read_time("Rollback Prepared", 26, rollback_us, "rollback time", size),
        xid,
        gid,
    )


_DECODERS: Final[dict[int, Callable[[bytes, int, bool], Message]]] = {
    ord("I"): decode_insert,
    ord("U"): decode_update,
    ord("D"): decode_delete,
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
