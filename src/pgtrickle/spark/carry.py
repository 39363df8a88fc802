"""How each source column's values cross from PostgreSQL to Spark: exactly, or loudly refused.

Spark's JDBC reader maps PostgreSQL types to Spark types, and several of
those mappings alter values without a word: unconstrained ``numeric``
becomes ``decimal(38,18)`` (``1e-20`` arrives as ``0``), ``time`` travels as
``java.sql.Time`` (milliseconds: ``23:59:59.999999`` arrives as
``23:59:59.999``), ``timetz`` loses its offset, ``timestamptz 'infinity'``
arrives as ``9999-12-31 23:59:59.999``. So every read of source rows (the
sources of a FULL refresh, the change buffers and state reads of a
DIFFERENTIAL one, hold_back's rebuilds) selects each column through the
expression :func:`read_expression` gives for its type (domains resolved to
their base type). Each kind is one of:

* **native** -- the JDBC mapping is exact (integers, floats incl. NaN and
  ±Infinity and -0, money, text types, bytea, bool, interval, uuid,
  json/jsonb, arrays, enums, network types, ranges, composites...):
  selected as it is.
* **checked** -- exact for the values Spark's type can hold, which PostgreSQL
  checks row by row while reading (a ``CASE`` around the column, cheap
  built-in tests; the refusal function runs only for a value that fails):
  unconstrained ``numeric`` (and ``numeric(p,s)`` with ``p > 38`` or a
  negative scale) travels as ``decimal(38,18)``, so a value with more than
  20 integer or 18 fraction digits, ``NaN`` or ``±Infinity`` is refused;
  ``numeric(p,s)`` with ``p <= 38`` travels as ``decimal(p,s)`` and refuses
  ``NaN``; ``date`` and both timestamps refuse
  ``±infinity``, values outside years 1..9999 (Spark's and Python's range)
  and the ten days 1582-10-05..14, which Java's hybrid calendar skips (the
  JDBC driver moves them ten days on: ``1582-10-10`` arrives as ``1582-10-20``).
* **re-carried** -- sent as another PostgreSQL type that maps exactly and
  converts back on write: ``time`` as a ``timestamp`` on 1970-01-01 (the
  Spark type it always had, now with microseconds; ``24:00:00`` is
  refused); ``timetz`` and ``bit(n)`` as text (``bit(n)`` otherwise arrives
  as binary or boolean, which does not convert back); ``character(n)`` as
  ``text``, which drops its insignificant trailing blanks (PostgreSQL pads
  it again on write; see :mod:`pgtrickle.sql.blank_padded`).

A refused value stops the refresh before anything is written, with
SQLSTATE 22003 (numeric) or 22008 (date/time) and a message naming the
column, its type, the value and what to do; :func:`refusal_in` finds it in
a failed Spark job (the engine raises ``ValueNotCarriedError``; a
DIFFERENTIAL refresh first falls back to FULL, since the refused value may
be in a change that no longer exists at the new snapshot). See docs/TYPES.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgtrickle.spark import numeric
from pgtrickle.sql.blank_padded import width_from_type_name

NATIVE = "native"
CHECKED = "checked"
RECARRIED = "re-carried"

NUMERIC_RANGE_SQLSTATE = "22003"
DATETIME_RANGE_SQLSTATE = "22008"
REFUSAL_SQLSTATES = frozenset({NUMERIC_RANGE_SQLSTATE, DATETIME_RANGE_SQLSTATE})

_NUMERIC = re.compile(r"^numeric(?:\((\d+)(?:,\s*(-?\d+))?\))?$")
_TIMESTAMP = re.compile(r"^timestamp(?:\(\d\))? with(out)? time zone$")
_TIME = re.compile(r"^time(?:\(\d\))? without time zone$")
_TIMETZ = re.compile(r"^time(?:\(\d\))? with time zone$")
_BIT = re.compile(r"^bit(?:\(\d+\))?$")

_NUMERIC_HINT = (
    "Spark carries this column as decimal(38,18) (at most 20 digits before and 18 after the "
    "decimal point, no NaN or Infinity); declare it numeric(p,s) with p <= 38 "
    "(ALTER TABLE ... ALTER COLUMN ... TYPE numeric(p,s)) to carry s fraction digits, "
    "or change the value."
)
_DATETIME_HINT = (
    "Spark carries dates and timestamps of years 1 to 9999 only (no infinity, no BC), and "
    "not the ten days 1582-10-05 to 1582-10-14 that Java's calendar skips; change the value, "
    "or keep such rows out of the sources the stream table reads."
)
_TIME_HINT = "Spark carries a time of day below 24:00:00; store 24:00:00 as 00:00:00 of the next day."


@dataclass(frozen=True)
class Carry:
    """How one column crosses to Spark.

    ``kind`` is native, checked or re-carried; ``test`` the SQL condition
    (``{c}`` is the column) a value must meet, else it is refused with
    ``sqlstate`` and ``hint``; ``read_as`` the PostgreSQL type it is read as
    (``None``: as it is).
    """

    kind: str
    test: str = ""
    read_as: str | None = None
    sqlstate: str | None = None
    hint: str | None = None


def decide(base_type: str) -> Carry:
    """How a column of ``base_type`` (``format_type`` text, domains resolved) crosses to Spark. Pure."""
    t = base_type.strip().lower()
    numeric = _NUMERIC.match(t)
    if numeric:
        precision = int(numeric.group(1)) if numeric.group(1) else None
        scale = int(numeric.group(2) or 0)
        if precision is not None and precision <= 38 and 0 <= scale <= precision:
            return Carry(CHECKED, "{c} <> 'NaN'::numeric", t, NUMERIC_RANGE_SQLSTATE, _NUMERIC_HINT)
        # Unconstrained (or beyond Spark's decimals): decimal(38,18) when the value fits it.
        # min_scale: trailing zeros do not count (1.0000000000000000000 fits).
        return Carry(
            CHECKED,
            "min_scale({c}) <= 18 AND abs({c}) < 1e20",
            "numeric",
            NUMERIC_RANGE_SQLSTATE,
            _NUMERIC_HINT,
        )
    if t == "date":
        return Carry(
            CHECKED,
            "{c} BETWEEN '0001-01-01'::date AND '9999-12-31'::date"
            " AND NOT {c} BETWEEN '1582-10-05'::date AND '1582-10-14'::date",
            None,
            DATETIME_RANGE_SQLSTATE,
            _DATETIME_HINT,
        )
    if _TIMESTAMP.match(t):
        if t.endswith("without time zone"):
            bounds = "'0001-01-01 00:00:00'::timestamp AND '9999-12-31 23:59:59.999999'::timestamp"
            gap = "'1582-10-05 00:00:00'::timestamp AND '1582-10-14 23:59:59.999999'::timestamp"
        else:
            # Rendered in any time zone (the JVM's, the session's), the instant must stay within
            # years 1..9999 and outside the calendar gap, so a day is kept at each edge.
            bounds = "'0001-01-02 00:00:00+00'::timestamptz AND '9999-12-30 23:59:59.999999+00'::timestamptz"
            gap = "'1582-10-04 00:00:00+00'::timestamptz AND '1582-10-15 23:59:59.999999+00'::timestamptz"
        return Carry(
            CHECKED,
            f"{{c}} BETWEEN {bounds} AND NOT {{c}} BETWEEN {gap}",
            None,
            DATETIME_RANGE_SQLSTATE,
            _DATETIME_HINT,
        )
    if _TIME.match(t):
        return Carry(
            RECARRIED,
            "{c} < '24:00:00'::time",
            "timestamp without time zone",
            DATETIME_RANGE_SQLSTATE,
            _TIME_HINT,
        )
    if _TIMETZ.match(t) or _BIT.match(t):
        return Carry(RECARRIED, "", "text")
    if width_from_type_name(t) is not None:
        # character(n): its value without the insignificant trailing blanks (sql/blank_padded.py).
        return Carry(RECARRIED, "", "text")
    return Carry(NATIVE)


def read_expression(column: sql.Composable, base_type: str, label: str) -> sql.Composable:
    """The select-list expression reading ``column`` (of ``base_type``) exactly, or refusing its value.

    ``label`` names the column in a refusal (``public.orders.amount``). The
    expression has the type Spark should see; give it an alias yourself.
    """
    carry = decide(base_type)
    if carry.kind == NATIVE:
        return column
    if not carry.test:
        return sql.SQL("{}::{}").format(column, sql.SQL(carry.read_as or "text"))

    def value(x: sql.Composable) -> sql.Composable:
        if _TIME.match(base_type.strip().lower()):
            return sql.SQL("('1970-01-01'::date + {})").format(x)
        return x

    test = sql.SQL(carry.test.replace("{c}", "{0}")).format(column)
    refuse = sql.SQL("pgtrickle._value_not_carried({c}, {label}, {type}, {code}, {hint})").format(
        c=column,
        label=sql.Literal(label),
        type=sql.Literal(base_type),
        code=sql.Literal(carry.sqlstate),
        hint=sql.Literal(carry.hint),
    )
    expression = sql.SQL("CASE WHEN {c} IS NULL OR ({test}) THEN {ok} ELSE {refused} END").format(
        c=column, test=test, ok=value(column), refused=value(refuse)
    )
    if carry.read_as is None:
        return expression
    return sql.SQL("({})::{}").format(expression, sql.SQL(carry.read_as))


def select_list(
    columns: Sequence[tuple[str, str]], label: str, source_names: Mapping[str, str] | None = None
) -> sql.Composable:
    """``expr AS "name", ...`` for ``columns`` (name, base type) of relation ``label``.

    ``source_names`` maps a column to the column it is read from (a change
    buffer's ``new_c3`` for ``amount``); by default the column itself.
    """
    items = []
    for name, base_type in columns:
        source = sql.Identifier((source_names or {}).get(name, name))
        items.append(
            sql.SQL("{} AS {}").format(
                read_expression(source, base_type, f"{label}.{name}"), sql.Identifier(name)
            )
        )
    return sql.SQL(", ").join(items)


def needs_care(base_types: Mapping[str, str]) -> bool:
    """Whether any column of a relation is read other than as it is (pure)."""
    return any(decide(t).kind != NATIVE for t in base_types.values())


def base_types(conn: psycopg.Connection, relids: Sequence[int]) -> dict[int, dict[str, str]]:
    """Each relation's columns with their base types (domains resolved, with the domain's modifier)."""
    rows = conn.execute(
        """
        WITH RECURSIVE d(relid, attnum, attname, typid, typmod) AS (
            SELECT a.attrelid, a.attnum, a.attname, a.atttypid, a.atttypmod FROM pg_attribute a
             WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
            UNION ALL
            SELECT d.relid, d.attnum, d.attname, t.typbasetype, t.typtypmod
              FROM d JOIN pg_type t ON t.oid = d.typid WHERE t.typtype = 'd')
        SELECT d.relid::bigint, d.attname::text, format_type(d.typid, d.typmod)
          FROM d JOIN pg_type t ON t.oid = d.typid WHERE t.typtype <> 'd' ORDER BY d.relid, d.attnum
        """,
        (list(relids),),
    ).fetchall()
    result: dict[int, dict[str, str]] = {int(r): {} for r in relids}
    for relid, name, type_name in rows:
        result[int(relid)][name] = type_name
    return result


def source_columns(
    conn: psycopg.Connection, relid: int, column_types: Sequence[tuple[str, str]]
) -> list[tuple[str, str]] | None:
    """(name, base type) of the columns of a source to read through :func:`select_list`.

    ``None`` when every column is native, so the read stays a plain table
    read. ``column_types`` are the source's visible columns (a stream table's
    hidden ``__pgt_`` columns are not read).
    """
    bases = base_types(conn, [relid]).get(relid, {})
    columns = [(name, bases.get(name, type_name)) for name, type_name in column_types]
    if not needs_care(dict(columns)):
        return None
    return columns


@dataclass(frozen=True)
class Refusal:
    """A value refused while Spark read it (PostgreSQL's error, found in a failed Spark job)."""

    sqlstate: str
    message: str
    hint: str | None


class RefusedRead(Exception):
    """A failed Spark job whose reads hold a refused value, as PostgreSQL itself reported it."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def refusal_in(exc: BaseException) -> Refusal | None:
    """The refusal of :func:`read_expression` that failed ``exc`` (a Spark job's error), if it is one.

    Walks the Java exception's causes for the JDBC driver's
    ``PSQLException`` and matches its server error's SQLSTATE and routine
    (the refusal function's), never the message text. (A Spark Connect
    client sees no Java exceptions: :func:`refusals_checked` finds the
    refusal in PostgreSQL and raises :class:`RefusedRead`.)
    """
    python: BaseException | None = exc
    for _ in range(10):  # the Python chain (__cause__/__context__), bounded against cycles
        if python is None:
            break
        if isinstance(python, RefusedRead):
            return python.refusal
        quotient = numeric.refusal_in(python)
        if quotient is not None:  # a numeric quotient refused on Spark (pgtrickle.spark.numeric)
            return Refusal(quotient[0], quotient[1], None)
        found = _refusal_in_java(getattr(python, "java_exception", None) or getattr(python, "_origin", None))
        if found is not None:
            return found
        python = python.__cause__ or python.__context__
    return None


def _refusal_in_java(java: Any) -> Refusal | None:
    """``java``: a py4j proxy of a Java Throwable (untyped: py4j resolves its methods at run time)."""
    seen = 0
    while java is not None and seen < 20:
        seen += 1
        try:
            if java.getClass().getName() == "org.postgresql.util.PSQLException":
                server = java.getServerErrorMessage()
                if (
                    server is not None
                    and server.getSQLState() in REFUSAL_SQLSTATES
                    and "_value_not_carried" in (server.getWhere() or "")
                ):
                    return Refusal(
                        str(server.getSQLState()),
                        str(server.getMessage()),
                        str(server.getHint()) if server.getHint() else None,
                    )
            java = java.getCause()
        except Exception:
            return None
    return None


@contextmanager
def refusals_checked(spark: Callable[[], object], conn: psycopg.Connection) -> Iterator[None]:
    """Within: a Spark job that failed on a refused value raises :class:`RefusedRead`, wherever Spark runs.

    A local JVM session's error carries PostgreSQL's (:func:`refusal_in`).
    A Spark Connect client gets only the server's text, so the reads with
    checked columns started in the block (:func:`pgtrickle.spark.jdbc.checked_reads`)
    are run again in PostgreSQL on ``conn`` -- the refresh's coordinator,
    whose snapshot is the one Spark read -- each in a savepoint, until one
    raises the refusal; its SQLSTATE and routine say what it is.
    """
    from pgtrickle.spark import jdbc
    from pgtrickle.spark.capabilities import capabilities

    with jdbc.checked_reads() as reads:
        try:
            yield
        except Exception as exc:
            if reads and refusal_in(exc) is None and not capabilities(spark()).java_errors:
                found = find_refusal(conn, reads)
                if found is not None:
                    raise RefusedRead(found) from exc
            raise


def find_refusal(conn: psycopg.Connection, queries: Sequence[str]) -> Refusal | None:
    """The refusal one of ``queries`` (checked reads) raises when PostgreSQL runs it on ``conn``, if any."""
    for query in dict.fromkeys(queries):
        try:
            with conn.transaction():  # a savepoint: the coordinator's transaction goes on
                conn.execute(sql.SQL("SELECT count(q.*) FROM ({}) AS q").format(sql.SQL(query)))
        except psycopg.Error as err:
            diag = err.diag
            if err.sqlstate in REFUSAL_SQLSTATES and "_value_not_carried" in (diag.context or ""):
                return Refusal(str(err.sqlstate), str(diag.message_primary), diag.message_hint)
    return None
