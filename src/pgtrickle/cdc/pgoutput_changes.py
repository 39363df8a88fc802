"""The hot path of the pgoutput decoder: Insert, Update and Delete messages and their TupleData.

Pure and written for speed (a few hundred thousand messages a second):
precompiled :class:`struct.Struct` objects, offset arithmetic on the payload,
shared NULL/unchanged column values, objects built by writing their slots.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from pgtrickle.cdc.pgoutput_bytes import I32, U16, U32, check_end, malformed, truncated
from pgtrickle.cdc.pgoutput_messages import (
    NULL_VALUE,
    UNCHANGED_VALUE,
    ColumnValue,
    Delete,
    Insert,
    TupleData,
    Update,
)

_RELID_MARKER: Final = struct.Struct("!IB")  # relation OID, Byte1 'N'/'K'/'O'


_unpack_u16 = U16.unpack_from


_unpack_i32 = I32.unpack_from


_unpack_relid_marker = _RELID_MARKER.unpack_from


_new_value = tuple.__new__


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
        truncated(msg, off, f"the column count of the {part}", 2, size)
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
                malformed(
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
            truncated(msg, off, f"the kind byte of column {column + 1} of {ncols} of the {part}", 1, size)
        truncated(msg, off + 1, f"the length of column {column + 1} of {ncols} of the {part}", 4, size)
    except UnicodeDecodeError as exc:
        malformed(
            msg,
            start + exc.start,
            f"column {column + 1} of {ncols} of the {part} is not valid UTF-8 text ({exc.reason})",
            size,
        )
    # the loop broke out on a bad value length
    (length,) = _unpack_i32(buf, off + 1)
    if length < 0:
        malformed(
            msg, off + 1, f"column {column + 1} of {ncols} of the {part} has negative length {length}", size
        )
    truncated(msg, off + 5, f"the value of column {column + 1} of {ncols} of the {part}", length, size)


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
        truncated(msg, 1, "the xid of the streamed transaction", 4, size)
    return U32.unpack_from(buf, 1)[0], 5


def decode_insert(buf: bytes, size: int, in_stream: bool) -> Insert:
    if in_stream:
        xid, off = _stream_xid(buf, size, "Insert", True)
    else:
        xid, off = None, 1
    if off + 5 > size:
        truncated("Insert", off, "the relation OID and the 'N' marker", 5, size)
    relid, marker = _unpack_relid_marker(buf, off)
    if marker != 0x4E:  # 'N'
        malformed("Insert", off + 4, f"expected 'N' before the new tuple, got {chr(marker)!r}", size)
    new, off = _read_tuple(buf, off + 5, size, "Insert", "new tuple")
    if off != size:
        check_end("Insert", off, size)
    return _make_insert(relid, new, xid)


def decode_update(buf: bytes, size: int, in_stream: bool) -> Update:
    if in_stream:
        xid, off = _stream_xid(buf, size, "Update", True)
    else:
        xid, off = None, 1
    if off + 5 > size:
        truncated("Update", off, "the relation OID and the 'K'/'O'/'N' marker", 5, size)
    relid, marker = _unpack_relid_marker(buf, off)
    off += 5
    old = key = None
    if marker == 0x4B or marker == 0x4F:  # 'K' or 'O'
        if marker == 0x4B:
            key, off = _read_tuple(buf, off, size, "Update", "old key")
        else:
            old, off = _read_tuple(buf, off, size, "Update", "old tuple")
        if off >= size:
            truncated("Update", off, "the 'N' marker", 1, size)
        marker = buf[off]
        off += 1
        if marker != 0x4E:
            malformed("Update", off - 1, f"expected 'N' after the old tuple, got {chr(marker)!r}", size)
    elif marker != 0x4E:
        malformed("Update", off - 1, f"expected 'K', 'O' or 'N', got {chr(marker)!r}", size)
    new, off = _read_tuple(buf, off, size, "Update", "new tuple")
    if off != size:
        check_end("Update", off, size)
    return _make_update(relid, old, key, new, xid)


def decode_delete(buf: bytes, size: int, in_stream: bool) -> Delete:
    if in_stream:
        xid, off = _stream_xid(buf, size, "Delete", True)
    else:
        xid, off = None, 1
    if off + 5 > size:
        truncated("Delete", off, "the relation OID and the 'K'/'O' marker", 5, size)
    relid, marker = _unpack_relid_marker(buf, off)
    if marker == 0x4B:  # 'K'
        key, off = _read_tuple(buf, off + 5, size, "Delete", "old key")
        old = None
    elif marker == 0x4F:  # 'O'
        old, off = _read_tuple(buf, off + 5, size, "Delete", "old tuple")
        key = None
    else:
        malformed("Delete", off + 4, f"expected 'K' or 'O', got {chr(marker)!r}", size)
    if off != size:
        check_end("Delete", off, size)
    return _make_delete(relid, old, key, xid)
