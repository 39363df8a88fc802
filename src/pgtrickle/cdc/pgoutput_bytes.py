"""Reading pgoutput message bytes: the shared integer layouts, a sequential reader and the errors.

Pure.  Every problem raises :class:`~pgtrickle.cdc.pgoutput_messages.PgOutputError`
naming the message type and the byte offset.
"""

from __future__ import annotations

import struct
from datetime import datetime, timedelta
from typing import Any, Final, NoReturn

from pgtrickle.cdc.pgoutput_messages import PG_EPOCH, PgOutputError

U8: Final = struct.Struct("!B")


U16: Final = struct.Struct("!H")


U32: Final = struct.Struct("!I")


I32: Final = struct.Struct("!i")


U64: Final = struct.Struct("!Q")


def malformed(msg: str, offset: int, problem: str, size: int) -> NoReturn:
    raise PgOutputError(
        f"malformed pgoutput {msg} message at byte offset {offset}: {problem} (message is {size} bytes)"
    )


def truncated(msg: str, offset: int, what: str, need: int, size: int) -> NoReturn:
    left = max(size - offset, 0)
    raise PgOutputError(
        f"truncated pgoutput {msg} message at byte offset {offset}: reading {what} needs "
        f"{need} byte(s) but {left} remain (message is {size} bytes)"
    )


def check_end(msg: str, offset: int, size: int) -> None:
    if offset != size:
        malformed(msg, offset, f"{size - offset} unexpected trailing byte(s)", size)


def read_time(msg: str, offset: int, microseconds: int, what: str, size: int) -> datetime:
    try:
        return PG_EPOCH + timedelta(microseconds=microseconds)
    except OverflowError:
        malformed(msg, offset, f"{what} {microseconds} µs since 2000-01-01 is out of range", size)


class ByteReader:
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
            truncated(self.msg, off, what, layout.size, self.size)
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
            malformed(self.msg, start + exc.start, f"{what} is not valid UTF-8 ({exc.reason})", self.size)

    def take(self, length: int, what: str) -> bytes:
        off = self.off
        if length < 0:
            malformed(self.msg, off, f"{what} has negative length {length}", self.size)
        if off + length > self.size:
            truncated(self.msg, off, what, length, self.size)
        self.off = off + length
        return self.buf[off : off + length]

    def xid(self, in_stream: bool) -> int | None:
        if not in_stream:
            return None
        (xid,) = self.unpack(U32, "the xid of the streamed transaction")
        return int(xid)

    def time(self, microseconds: int, what: str) -> datetime:
        return read_time(self.msg, self.off, microseconds, what, self.size)

    def finish(self) -> None:
        check_end(self.msg, self.off, self.size)
