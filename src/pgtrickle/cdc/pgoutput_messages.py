"""The values of the pgoutput protocol: decoded messages, tuple columns, LSNs, and the decoding error.

Pure data: frozen dataclasses, one per message type of protocol versions 1 to 4
(``cdc/pgoutput.py`` decodes the bytes into them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, NamedTuple, TypeAlias

from pgtrickle.errors import PgTrickleError


class PgOutputError(PgTrickleError):
    """A pgoutput message is truncated, malformed or of an unknown type, or a
    decoded tuple cannot be materialised as asked."""


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


PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def pg_timestamp(microseconds: int) -> datetime:
    """A PostgreSQL ``TimestampTz`` (microseconds since 2000-01-01 UTC) as an aware UTC datetime."""
    return PG_EPOCH + timedelta(microseconds=microseconds)


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
