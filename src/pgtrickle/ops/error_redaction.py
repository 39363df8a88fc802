"""Keep source row values out of errors that other roles can read.

A failed refresh is recorded in places every ``pgtrickle_user`` reads: the
stream table's ``last_error``, the refresh history (``get_refresh_history``)
and the alerts (``pgtrickle.alerts`` and ``NOTIFY pg_trickle_alert``). The
error texts of PostgreSQL and Spark quote the data that broke them
(``The value 'ssn-1' of the type "STRING" cannot be cast to "INT"``,
``DETAIL: Key (id)=(42) already exists``, ``Failing row contains (...)``,
the failed ``INSERT ... VALUES (...)`` of a JDBC batch), and those readers
may not be allowed to select the sources.

So what is stored and broadcast is :func:`public_error`: the error's class,
SQLSTATE, and the names of types, columns, constraints and relations, with
every value masked (``***``). The full text goes only to the daemon's log
(see docs/SECURITY.md). Messages pgtrickle writes itself (a
:class:`~pgtrickle.errors.PgTrickleError` of its own) carry no row values and
are kept as they are.

:func:`redact_message` is pure; :func:`public_error` reads an exception's
SQLSTATE (psycopg) and picks the text (:func:`full_error`).
"""

from __future__ import annotations

import re

from pgtrickle.db.redaction import scrub
from pgtrickle.errors import PgTrickleError

MASK = "***"

WITHHELD = (
    "the message of an error raised by a function or trigger is withheld from the catalog "
    "(it may quote data); the pgtrickle daemon's log has it"
)

# PostgreSQL quotes names and values alike with double quotes: a double-quoted string is kept only
# after a word that introduces a name (or, in Spark's messages, a type or setting).
_NAME_WORDS = frozenset(
    {
        "relation",
        "table",
        "column",
        "constraint",
        "index",
        "type",
        "schema",
        "function",
        "sequence",
        "view",
        "database",
        "role",
        "trigger",
        "publication",
        "extension",
        "operator",
        "to",
        "set",
        "as",
        "collation",
        "of",
        "in",
        "domain",
        "cursor",
        "savepoint",
        "statement",
        "parameter",
    }
)
_KEY_VALUES = re.compile(
    r"(?i)(\bkey \((?P<cols>[^()]*)\)=)\(.*?\)"
    r"(?=\s+already exists|\s+is not present|\s+is still referenced|\s+conflicts with|"
    r"\s*\.?\s*$|\.\s)"
)
_FAILING_ROW = re.compile(r"(?i)(failing row contains )\(.*\)")
_BATCH_VALUES = re.compile(r"(?is)(\bVALUES\s*)\(.*?\)(?=\s+was aborted)")
_COPY_CONTEXT = re.compile(r"(?is)\b(CONTEXT|Where):.*$")
_NUMBER = re.compile(r"(?<![\w.$])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:BD|L|S|Y|D)?(?![\w.])")
_SQLSTATE = re.compile(r"SQLSTATE:?\s*[0-9A-Z]{5}")
_TYPE_ARGS = re.compile(
    r"(?i)\b(decimal|numeric|varchar|char|character varying|character|bit|varbit|"
    r"time|timestamp|interval)\s*\(\s*\d+(?:\s*,\s*\d+)?\s*\)"
)
_SAFE_SINGLE = re.compile(r"^try_[a-z_]+$")
# Numbers that count Spark's and the driver's own things (tasks, stages, attempts, batch entries,
# query positions), not data: "Task 3 in stage 2.0 failed 2 times", "(TID 7)", "line 1 pos 12".
_COUNTING_BEFORE = re.compile(
    r"(?i)\b(?:task|stage|tid|entry|line|pos|position|attempt|partition|executor|job|"
    r"failed)\s*\(?\s*$"
)


def redact_message(text: str) -> str:
    """``text`` (a PostgreSQL, JDBC or Spark error message) with every data value masked.

    Kept: error classes (``[CAST_INVALID_INPUT]``), SQLSTATEs, exception class
    names, double-quoted names after a word that introduces one (``relation
    "t"``, ``constraint "t_pkey"``, ``cast to "INT"``), backquoted
    identifiers, column lists of ``Key (...)``, type modifiers
    (``Decimal(3, 1)``). Masked: every single-quoted literal, every other
    double-quoted string (``integer: "ssn-1"``, ``value "42"``), every
    number, the values of ``Key (...)=(...)`` and ``Failing row contains
    (...)``, the row of a failed JDBC batch ``INSERT ... VALUES (...)``.
    Dropped: a ``CONTEXT:``/``Where:`` section (a COPY context quotes the
    line it failed on).
    """
    out = _COPY_CONTEXT.sub("", text).rstrip()
    out = _KEY_VALUES.sub(lambda m: f"{m.group(1)}({MASK})", out)
    out = _FAILING_ROW.sub(lambda m: f"{m.group(1)}({MASK})", out)
    out = _BATCH_VALUES.sub(lambda m: f"{m.group(1)}({MASK})", out)
    return _mask_literals(out)


def _mask_literals(text: str) -> str:
    """Mask quoted values and numbers, scanning once so that quotes nest correctly."""
    keep: list[tuple[int, int]] = [m.span() for m in _SQLSTATE.finditer(text)]
    keep += [m.span() for m in _TYPE_ARGS.finditer(text)]
    keep += [(m.start(), m.end()) for m in re.finditer(rf"\(\*\*\*\)|{re.escape(MASK)}", text)]

    def kept(pos: int) -> bool:
        return any(a <= pos < b for a, b in keep)

    parts: list[str] = []
    i = 0
    n = len(text)
    plain_start = 0

    def counting(start: int, end: int) -> bool:
        return bool(_COUNTING_BEFORE.search(text, max(0, start - 24), start)) or text.startswith(
            " times", end
        )

    def flush(end: int) -> None:
        chunk = text[plain_start:end]
        base = plain_start
        parts.append(
            _NUMBER.sub(
                lambda m: (
                    m.group(0)
                    if kept(base + m.start()) or counting(base + m.start(), base + m.end())
                    else MASK
                ),
                chunk,
            )
        )

    while i < n:
        ch = text[i]
        if ch in "'\"`" and not kept(i):
            end = _closing(text, i)
            flush(i)
            literal = text[i:end]
            inner = literal[1:-1] if len(literal) >= 2 else literal[1:]
            if ch == "`":
                parts.append(literal)
            elif ch == "'":
                parts.append(literal if _SAFE_SINGLE.match(inner) else f"'{MASK}'")
            else:
                before = re.findall(r"[A-Za-z_]+", text[max(0, i - 40) : i])
                word = before[-1].lower() if before else ""
                parts.append(
                    literal if word in _NAME_WORDS and not text[:i].rstrip().endswith(":") else f'"{MASK}"'
                )
            i = end
            plain_start = i
            continue
        i += 1
    flush(n)
    return "".join(parts)


def _closing(text: str, start: int) -> int:
    """The index just past the quote closing the one at ``start`` (doubled quotes escape it)."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`" and i + 1 < len(text):
            i += 2
            continue
        if text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return len(text)


def full_error(exc: BaseException) -> str:
    """The first line of an error (passwords scrubbed); for a failed Spark job, the JVM's reason.

    py4j's first line only names the call ("An error occurred while calling
    o86.collectToPython."); the line after it says why (e.g. "Job aborted due
    to stage failure: Task 3 in stage 2.0 failed 2 times ... ExecutorLostFailure").
    This is the text for the daemon's log, not for the catalog.
    """
    lines = [line.strip() for line in scrub(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0]
    if first.startswith("An error occurred while calling") and len(lines) > 1:
        first = lines[1].lstrip(": ")
    # A PostgreSQL error's DETAIL line names the key or row that failed: it stays with the message.
    detail = next((line for line in lines[1:3] if line.startswith("DETAIL:")), None)
    if detail and not first.startswith("[") and "Detail:" not in first:
        first = f"{first} {detail}"
    return first[:2000]


def own_message(exc: BaseException) -> bool:
    """Whether the text is pgtrickle's own (a PgTrickleError not wrapping a foreign error)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not isinstance(current, PgTrickleError):
            return False
        current = current.__cause__
    return True


def public_error(exc: BaseException) -> str:
    """What may be stored and broadcast about ``exc``: no row values (see the module doc)."""
    text = full_error(exc)
    if own_message(exc):
        return text
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate.startswith("P0"):
        return f"{WITHHELD} (SQLSTATE {sqlstate})"
    public = redact_message(text)
    if isinstance(sqlstate, str) and sqlstate and "SQLSTATE" not in public:
        public = f"{public} (SQLSTATE {sqlstate})"
    return public
