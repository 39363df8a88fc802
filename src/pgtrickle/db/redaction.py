"""Keep passwords out of logs, errors, the catalog and ``status``.

Every DSN pgtrickle resolves is registered here (:func:`register_dsn`); any
text on its way out — a log record, an error message written to the catalog,
an error the CLI prints — goes through :func:`scrub`, which replaces

* each registered password (as given, and URL-encoded as it appears in a URI),
* ``password=...`` in libpq strings and JDBC property dumps, and
* the password of any ``scheme://user:password@host`` URI

with ``****``. The pattern rules catch passwords pgtrickle never saw (a DSN
quoted back by a driver); the registry catches a password quoted on its own.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import quote, quote_plus

import psycopg
from psycopg.conninfo import conninfo_to_dict

MASK = "****"

_lock = threading.Lock()
_secrets: set[str] = set()

# password=secret, password = 'se cret', "password": "secret", password -> secret (JDBC property dumps)
_KEY_VALUE = re.compile(
    r"""(?P<key>\b(?:password|passwd|pwd|PGPASSWORD)\b["']?\s*(?:=|:|->)\s*)"""
    r"""(?P<value>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"|[^\s,;&)}\]'"]+)""",
    re.IGNORECASE,
)
# scheme://user:password@host
_URI_PASSWORD = re.compile(
    r"(?P<head>\b[a-z][a-z0-9+.\-]*://[^/\s:@]*:)(?P<pw>[^@\s/]+)(?P<at>@)", re.IGNORECASE
)


def dsn_password(dsn: str | None) -> str | None:
    """The password a libpq DSN (key=value or URI) carries, if any."""
    if not dsn:
        return None
    try:
        value = conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return None
    return str(value) if value else None


def register_secret(secret: str | None) -> None:
    """Remember a secret so that :func:`scrub` removes it wherever it appears."""
    if not secret or len(secret) < 3:  # too short to find without masking ordinary text
        return
    with _lock:
        _secrets.add(secret)
        _secrets.add(quote(secret, safe=""))
        _secrets.add(quote_plus(secret, safe=""))


def register_dsn(dsn: str | None) -> None:
    register_secret(dsn_password(dsn))


def scrub(text: object, *dsns: str | None) -> str:
    """``text`` with every known password (registered, or in ``dsns``) and password-looking value masked."""
    out = str(text)
    with _lock:
        secrets = set(_secrets)
    for dsn in dsns:
        pw = dsn_password(dsn)
        if pw:
            secrets |= {pw, quote(pw, safe=""), quote_plus(pw, safe="")}
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            out = out.replace(secret, MASK)
    out = _URI_PASSWORD.sub(lambda m: m.group("head") + MASK + m.group("at"), out)
    out = _KEY_VALUE.sub(lambda m: m.group("key") + MASK, out)
    return out


class RedactingFilter(logging.Filter):
    """A handler filter: the message (with its arguments) and any traceback, scrubbed."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        record.msg = scrub(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Put a :class:`RedactingFilter` on every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
