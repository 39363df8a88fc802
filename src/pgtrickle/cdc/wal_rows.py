"""Change-buffer rows in PostgreSQL's binary COPY format, cut out of binary ``pgoutput`` tuples.

Pure and I/O-free; the WAL decoder's fast path (:mod:`pgtrickle.cdc.wal`).

With the ``pgoutput`` option ``binary 'true'`` (PostgreSQL 14+) a column value
of a tuple is ``'b' Int32 length, bytes`` — the type's binary send format —
and a field of ``COPY ... FROM STDIN (FORMAT binary)`` is ``Int32 length,
bytes`` in the binary receive format of the column's type (``-1``, no bytes,
for NULL). When the buffer column has exactly the source column's type, a
buffer row is therefore the source tuple's values, sliced out of the message
without decoding any of them, behind three fixed fields:

* ``xid`` ``xid8``: Int32 8, Int64;
* ``action`` ``"char"``: Int32 1, one byte;
* ``captured_at`` ``timestamptz``: Int32 8, Int64 microseconds since
  2000-01-01 UTC (the commit time of the ``Begin`` message, as sent);

then the ``new_*`` fields, then the ``old_*`` fields, each in the order of the
buffer's captured columns (:class:`BinaryPlan`).

When binary rows are impossible — a captured column's type has no binary
send/receive function (``pgoutput`` then sends it as text), the buffer column's
type is not the one the WAL carries (after ``ALTER COLUMN ... TYPE``), or any
column of a published table has a type whose binary output would fail —
:class:`NeedTextMode` says why, and the decoder decodes in text mode instead
(:func:`binary_problem` is the up-front check).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Final, cast

from pgtrickle.cdc import pgoutput
from pgtrickle.errors import PgTrickleError

COPY_HEADER: Final = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
"""Signature, flags (no OIDs), header extension length."""
COPY_TRAILER: Final = struct.pack("!h", -1)
NULL_FIELD: Final = struct.pack("!i", -1)

_PREFIX: Final = struct.Struct("!hiqiciq")  # field count; xid8; "char" action; timestamptz
_U16: Final = struct.Struct("!H")
_KIND_LENGTH: Final = struct.Struct("!Bi")
_PAD: Final = bytes(4)
_RELID: Final = struct.Struct("!I")

_TEXT: Final = object()
"""Placeholder of a value pgoutput sent as text (kind 't') although binary was asked."""

relid_of: Final[Callable[[bytes, int], tuple[int]]] = _RELID.unpack_from
"""``relid_of(payload, 1)``: the relation OID of an Insert/Update/Delete message (outside a stream)."""


class WalCaptureError(PgTrickleError):
    """WAL capture cannot proceed (no slot, decoder not running, bad replica identity…)."""


class NeedTextMode(Exception):
    """Binary rows are impossible for this run; ``reason`` says why (for the log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def row_prefix(width: int, xid8: int, action: str, commit_time_us: int) -> bytes:
    """The start of a buffer row of ``width`` captured columns: field count, xid, action, captured_at."""
    return _PREFIX.pack(3 + 2 * width, 8, xid8, 1, action.encode("ascii"), 8, commit_time_us)


@dataclass(frozen=True)
class ColumnTypes:
    """What decides whether one captured column can be copied in binary.

    ``wal_type`` is the type OID the Relation message gives for the column
    (``None``: the column is not in the relation any more); ``buffer_type`` is
    the type OID of the buffer's ``new_``/``old_`` columns (``None`` when the
    two differ); ``binary_io`` whether that type (and every type inside it)
    has binary send and receive functions.
    """

    name: str
    wal_type: int | None
    buffer_type: int | None
    binary_io: bool


def binary_problem(columns: Sequence[ColumnTypes]) -> str | None:
    """Why the captured columns of one relation cannot be copied in binary, or ``None`` when they can."""
    for column in columns:
        if not column.binary_io:
            return f"column {column.name!r} has a type without binary send/receive functions"
        if column.buffer_type is None:
            return f"the buffer columns of {column.name!r} do not have one type"
        if column.wal_type is not None and column.wal_type != column.buffer_type:
            return (
                f"column {column.name!r} is of type {column.wal_type} in the WAL but its buffer "
                f"column is of type {column.buffer_type}"
            )
    return None


class BinaryPlan:
    """How one relation's binary tuples become buffer rows.

    ``positions[i]`` is the tuple column of the buffer's i-th captured column
    (``None``: not in the relation, copied as NULL); ``ncols`` the number of
    columns of the relation's tuples.
    """

    __slots__ = ("cut", "identity", "ncols", "nulls", "pick", "positions", "width")

    def __init__(self, positions: Sequence[int | None], ncols: int) -> None:
        self.positions = tuple(positions)
        self.ncols = ncols
        self.width = len(self.positions)
        self.nulls = NULL_FIELD * self.width
        self.identity = self.positions == tuple(range(ncols))
        self.pick: Callable[[list[bytes | None]], Sequence[bytes | None]]
        if None in self.positions:
            present = self.positions

            def pick(values: list[bytes | None]) -> list[bytes | None]:
                return [NULL_FIELD if p is None else values[p] for p in present]

            self.pick = pick
        elif self.width == 1:
            only = self.positions[0]
            self.pick = lambda values: (values[only],)  # type: ignore[index]  # no None position: the branch above
        elif self.width == 0:
            self.pick = lambda values: ()
        else:
            self.pick = itemgetter(*self.positions)
        self.cut = _compile(self.positions, ncols, self.nulls)
        """By message type (Insert, Update, Delete): ``cut(payload, out, prefix)`` appends the row for
        the common case (every value binary or NULL) and raises :class:`Uncommon` for anything else."""


class Uncommon(Exception):
    """The message is not of the common shape :attr:`BinaryPlan.cut` handles: use :func:`append_row`."""


def _compile(
    positions: tuple[int | None, ...], ncols: int, nulls: bytes
) -> dict[int, Callable[[bytes, list[bytes], bytes], None]]:
    """Straight-line cutters for one relation's Insert, Update and Delete messages (see ``BinaryPlan.cut``).

    One generated function per message type, with the column loop unrolled and
    the buffer's column order built in: about half the work of :func:`append_row`
    for the messages that make up nearly all of a stream. They accept only
    values of kind 'b' or 'n', the relation's column count, every marker in
    place and the message ending exactly after its last tuple; anything else
    raises :class:`Uncommon`.
    """
    wanted = {p for p in positions if p is not None}

    def tuple_lines(name: str) -> list[str]:
        lines = ["    if _u16(buf, off)[0] != NCOLS:", "        raise _uncommon", "    off += 2"]
        for i in range(ncols):
            keep = f"        {name}{i} = buf[off + 1:end]" if i in wanted else None
            lines += [
                "    kind, length = _kind_length(buf, off)",
                "    if kind == 98 and length >= 0:",
                "        end = off + 5 + length",
                *([keep] if keep else []),
                "        off = end",
                "    elif kind == 110:",
                *([f"        {name}{i} = _null"] if i in wanted else []),
                "        off += 1",
                "    else:",
                "        raise _uncommon",
            ]
        return lines

    def fields(name: str) -> str:
        return "".join(f"{name}{p}, " if p is not None else "_null, " for p in positions)

    head = [
        "def cut(payload, out, prefix):",
        "    buf = payload + _pad",
        "    size = len(payload)",
        "    try:",
    ]
    tail = ["    except (IndexError, struct.error):", "        raise _uncommon from None"]
    bodies = {
        0x49: [
            "    if buf[5] != 78:",
            "        raise _uncommon",
            "    off = 6",
            *tuple_lines("n"),
            "    if off != size:",
            "        raise _uncommon",
            f"    out += (prefix, {fields('n')}_nulls)",
        ],
        0x55: [
            "    if buf[5] != 79:",
            "        raise _uncommon",
            "    off = 6",
            *tuple_lines("o"),
            "    if buf[off] != 78:",
            "        raise _uncommon",
            "    off += 1",
            *tuple_lines("n"),
            "    if off != size:",
            "        raise _uncommon",
            f"    out += (prefix, {fields('n')}{fields('o')})",
        ],
        0x44: [
            "    if buf[5] != 79:",
            "        raise _uncommon",
            "    off = 6",
            *tuple_lines("o"),
            "    if off != size:",
            "        raise _uncommon",
            f"    out += (prefix, _nulls, {fields('o')})",
        ],
    }
    cutters: dict[int, Callable[[bytes, list[bytes], bytes], None]] = {}
    for tag, body in bodies.items():
        code = "\n".join(head + ["    " + line for line in body] + tail).replace("NCOLS", str(ncols))
        namespace = {
            "_u16": _U16.unpack_from,
            "_kind_length": _KIND_LENGTH.unpack_from,
            "_null": NULL_FIELD,
            "_nulls": nulls,
            "_pad": _PAD,
            "_uncommon": Uncommon,
            "struct": struct,
        }
        exec(code, namespace)
        cutters[tag] = cast(
            Callable[[bytes, list[bytes], bytes], None], namespace["cut"]
        )  # made by exec above
    return cutters


def _malformed(payload: bytes) -> PgTrickleError:
    """The precise error of a message the fast path could not cut."""
    try:
        pgoutput.decode_message(payload)
    except pgoutput.PgOutputError as exc:
        return exc
    return pgoutput.PgOutputError(f"malformed pgoutput {chr(payload[0])!r} message ({len(payload)} bytes)")


def _fields(
    buf: bytes,
    off: int,
    _u16: Callable[[bytes, int], tuple[int]] = _U16.unpack_from,
    _kind_length: Callable[[bytes, int], tuple[int, int]] = _KIND_LENGTH.unpack_from,
    _null: bytes = NULL_FIELD,
    _text: object = _TEXT,
) -> tuple[list, int, bool]:
    """The COPY fields of the TupleData at ``off``: (fields, offset after, whether any is not 'b'/'n').

    ``buf`` is the message followed by :data:`_PAD` (so that kind and length
    can be read in one go even for a 1-byte NULL at the end). A field is the
    value's bytes with their length, ``NULL_FIELD``, ``None`` (unchanged
    TOASTed value) or ``_TEXT``. Raises ``IndexError``, ``struct.error`` or
    ``ValueError`` on damaged input; a bad length shows as an offset after the
    tuple that is not where the message's next part starts, which the caller
    checks. (Keyword defaults make globals local names, for speed; never pass them.)
    """
    (ncols,) = _u16(buf, off)
    off += 2
    fields: list = []
    append = fields.append
    odd = False
    for _ in range(ncols):
        kind, length = _kind_length(buf, off)
        if kind == 0x62:  # 'b'
            end = off + 5 + length
            append(buf[off + 1 : end])
            off = end
        elif kind == 0x6E:  # 'n'
            append(_null)
            off += 1
        elif kind == 0x75:  # 'u'
            append(None)
            odd = True
            off += 1
        elif kind == 0x74 and length >= 0:  # 't'
            append(_text)
            odd = True
            off += 5 + length
        else:
            raise ValueError
    return fields, off, odd


def _checked(values: Sequence, relid: int, old: list | None, positions: Sequence[int | None]) -> list:
    """``values`` (picked new or old fields) with unchanged TOAST filled from ``old``; raises if impossible."""
    out = list(values)
    for i, value in enumerate(out):
        if value is _TEXT:
            raise NeedTextMode(
                f"a value of relation {relid} arrived as text (its type has no binary send function)"
            )
        if value is None:
            pos = positions[i]
            fallback = old[pos] if old is not None and pos is not None else None
            if fallback is None:
                raise WalCaptureError(
                    f"an UPDATE of relation {relid} left a TOASTed column unchanged and no old value "
                    "was sent; the source needs REPLICA IDENTITY FULL"
                )
            if fallback is _TEXT:
                raise NeedTextMode(
                    f"a value of relation {relid} arrived as text (its type has no binary send function)"
                )
            out[i] = fallback
    return out


def append_row(out: list[bytes], payload: bytes, relid: int, plan: BinaryPlan, prefix: bytes) -> None:
    """Append the buffer row of one Insert, Update or Delete message (binary pgoutput) to ``out``.

    ``out`` collects pieces for one ``b"".join``. ``prefix`` is
    :func:`row_prefix` for the message's action. Raises :class:`NeedTextMode`
    when a captured value arrived as text, :class:`WalCaptureError` when the
    old row needed is missing (the source lacks REPLICA IDENTITY FULL) and
    :class:`pgoutput.PgOutputError` for a damaged message.
    """
    try:
        plan.cut[payload[0]](payload, out, prefix)
    except Uncommon:
        append_row_checked(out, payload, relid, plan, prefix)


def append_row_checked(out: list[bytes], payload: bytes, relid: int, plan: BinaryPlan, prefix: bytes) -> None:
    """:func:`append_row` for every message, common or not (unchanged TOAST, text values, errors)."""
    tag = payload[0]
    size = len(payload)
    buf = payload + _PAD
    try:
        if tag == 0x49:  # 'I': relid, 'N', new tuple
            if payload[5] != 0x4E:
                raise ValueError
            new, _, off = _picked(buf, 6, relid, plan, None)
            old = None
        else:
            marker = payload[5]
            if marker != 0x4F:  # 'O': the whole old row (REPLICA IDENTITY FULL)
                if marker not in (0x4B, 0x4E) or tag not in (0x55, 0x44):  # 'K' or (Update only) 'N'
                    raise ValueError
                what = "an UPDATE" if tag == 0x55 else "a DELETE"
                raise WalCaptureError(
                    f"{what} of relation {relid} arrived without its old row; the "
                    "source needs REPLICA IDENTITY FULL"
                )
            old, old_fields, off = _picked(buf, 6, relid, plan, None)
            if tag == 0x55:  # 'U': relid, 'O', old tuple, 'N', new tuple
                if off >= size or buf[off] != 0x4E:
                    raise ValueError
                new, _, off = _picked(buf, off + 1, relid, plan, old_fields)
            elif tag == 0x44:  # 'D': relid, 'O', old tuple
                new = None
            else:
                raise ValueError
        if off != size:
            raise ValueError
    except (IndexError, ValueError, struct.error):
        raise _malformed(payload) from None
    out.append(prefix)
    if new is None:
        out.append(plan.nulls)
    else:
        out += new
    if old is None:
        out.append(plan.nulls)
    else:
        out += old


def _picked(
    buf: bytes, off: int, relid: int, plan: BinaryPlan, old: list | None
) -> tuple[Sequence, list, int]:
    """The tuple at ``off``: (its fields in the buffer's order, all its fields, the offset after it).

    An unchanged TOASTed value is taken from ``old`` (all fields of the old row).
    """
    fields, off, odd = _fields(buf, off)
    if len(fields) != plan.ncols:
        raise _width_error(relid, plan, len(fields))
    if odd:
        return _checked(plan.pick(fields), relid, old, plan.positions), fields, off
    return (fields if plan.identity else plan.pick(fields)), fields, off


def _width_error(relid: int, plan: BinaryPlan, got: int) -> pgoutput.PgOutputError:
    return pgoutput.PgOutputError(
        f"relation OID {relid} has {plan.ncols} columns but the tuple has {got}; was a Relation "
        "message missed?"
    )


def text_values(
    relid: int,
    positions: Sequence[int | None],
    tup: pgoutput.TupleData | None,
    fallback: pgoutput.TupleData | None,
) -> list[str | None]:
    """Text mode: a buffer row's ``new_*`` or ``old_*`` values, by the captured columns' ``positions`` in ``tup``.

    An unchanged TOASTed value is taken from ``fallback`` (the old row of an
    Update), which must then have sent it.
    """
    if tup is None:
        return [None] * len(positions)
    out: list[str | None] = []
    for pos in positions:
        if pos is None:
            out.append(None)
            continue
        kind, value = tup[pos]
        if kind == "t":
            out.append(value)  # type: ignore[arg-type]  # kind "t": a text value, a str
        elif kind == "n":
            out.append(None)
        elif kind == "u":
            if fallback is None or fallback[pos].kind not in ("t", "n"):
                raise WalCaptureError(
                    f"an UPDATE of relation {relid} left a TOASTed column unchanged and no old value "
                    "was sent; the source needs REPLICA IDENTITY FULL"
                )
            out.append(fallback[pos].value)  # type: ignore[arg-type]  # kind "t" or "n": a str or None
        else:
            raise WalCaptureError("binary pgoutput values are not expected (binary = false)")
    return out
