"""User triggers on stream tables during a refresh (setting ``user_triggers``).

A DIFFERENTIAL refresh applies explicit DELETE / UPDATE / INSERT, so a
user's row-level AFTER trigger on the stream table sees the real OLD / NEW
rows (an aggregate's changed group is one UPDATE). A FULL refresh rewrites
the table (TRUNCATE + reload), which says nothing useful row by row, so by
default (``auto``) the user triggers are switched off around it and one
``NOTIFY pg_trickle_refresh`` tells listeners the table was rewritten.

``on``: user triggers fire on every refresh (FULL: the TRUNCATE, then one
INSERT per row). ``off``: user triggers never fire on a refresh; every
refresh sends the NOTIFY.

How they are switched off: ``ALTER TABLE … DISABLE TRIGGER <name>`` for each
*enabled* user trigger, inside the apply transaction, and enabled again (in
its original mode: ORIGIN, ALWAYS or REPLICA) before the commit. ALTER TABLE
is transactional: a refresh that fails midway rolls back the disabling with
everything else, so a trigger can never be left disabled. Triggers the user
disabled stay disabled; internal triggers (foreign keys) are not touched, and
pgtrickle puts no triggers of its own on stream tables (their change buffer
is written by the apply itself). ``session_replication_role = replica`` was
not chosen: setting it needs superuser, it switches off foreign-key checks
too, and it does not stop ``ENABLE ALWAYS`` triggers while it *fires*
``ENABLE REPLICA`` ones.

Decisions are pure functions (:func:`parse_mode`, :func:`policy`,
:func:`statements`); :func:`begin` / :func:`finish` do the I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import StreamTable
from pgtrickle.errors import ConfigError

CHANNEL = "pg_trickle_refresh"
MODES = ("auto", "on", "off")
DEFAULT_MODE = "auto"

_ENABLE = {"O": "ENABLE TRIGGER", "A": "ENABLE ALWAYS TRIGGER", "R": "ENABLE REPLICA TRIGGER"}
"""pg_trigger.tgenabled of an enabled trigger → the ALTER TABLE clause restoring it."""


def parse_mode(value: str | None) -> str:
    """A ``user_triggers`` value, normalised; ``None`` is the default. Anything else is an error."""
    if value is None:
        return DEFAULT_MODE
    mode = value.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"invalid user_triggers {value!r}: use 'auto', 'on' or 'off'")
    return mode


@dataclass(frozen=True)
class Policy:
    suppress: bool
    """Disable the stream table's enabled user triggers for this refresh."""
    notify: bool
    """Send ``NOTIFY pg_trickle_refresh`` when the refresh commits."""


def policy(mode: str, action: str) -> Policy:
    """What a refresh of ``action`` (``FULL`` / ``DIFFERENTIAL``) does with user triggers under ``mode``."""
    mode = parse_mode(mode)
    if mode == "off":
        return Policy(suppress=True, notify=True)
    if mode == "auto" and action == "FULL":
        return Policy(suppress=True, notify=True)
    return Policy(suppress=False, notify=False)


def statements(table: str, triggers: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(disable, restore) statements for ``triggers`` = [(name, tgenabled)] of ``table`` (quoted).

    Only enabled triggers are disabled, and each is restored to its own mode.
    """
    disable, restore = [], []
    for name, enabled in triggers:
        clause = _ENABLE.get(enabled)
        if clause is None:  # 'D': disabled by its owner; leave it so
            continue
        ident = '"' + name.replace('"', '""') + '"'
        disable.append(f"ALTER TABLE {table} DISABLE TRIGGER {ident}")
        restore.append(f"ALTER TABLE {table} {clause} {ident}")
    return disable, restore


def payload(
    st: StreamTable, action: str, inserted: int, deleted: int, refresh_id: int | None, suppressed: list[str]
) -> dict[str, object]:
    return {
        "st_name": st.name,
        "schema": st.schema,
        "action": action,
        "rows": inserted,
        "rows_inserted": inserted,
        "rows_deleted": deleted,
        "refresh_id": refresh_id,
        "triggers_suppressed": suppressed,
    }


@dataclass
class Suppression:
    action: str
    policy: Policy
    restore: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


def effective_mode(conn: psycopg.Connection, st: StreamTable) -> str:
    """The stream table's ``user_triggers`` override, else the setting, else ``auto``."""
    row = conn.execute(
        "SELECT coalesce((SELECT user_triggers FROM pgtrickle.pgt_stream_tables WHERE pgt_id = %s),"
        " (SELECT value FROM pgtrickle.pgt_settings WHERE name = 'user_triggers'))",
        (st.pgt_id,),
    ).fetchone()
    return parse_mode(row[0] if row else None)


def begin(conn: psycopg.Connection, st: StreamTable, action: str) -> Suppression:
    """In the apply transaction, before the data changes: disable user triggers if the policy says so."""
    pol = policy(effective_mode(conn, st), action)
    done = Suppression(action, pol)
    if not pol.suppress:
        return done
    triggers = [
        (str(n), str(e))
        for n, e in conn.execute(
            "SELECT tgname::text, tgenabled::text FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal"
            " ORDER BY tgname",
            (st.relid,),
        ).fetchall()
    ]
    table = sql.SQL("{}.{}").format(sql.Identifier(st.schema), sql.Identifier(st.name)).as_string(conn)
    disable, done.restore = statements(table, triggers)
    done.names = [n for n, e in triggers if e in _ENABLE]
    for stmt in disable:
        conn.execute(stmt)
    return done


def finish(
    conn: psycopg.Connection,
    st: StreamTable,
    done: Suppression,
    inserted: int,
    deleted: int,
    refresh_id: int | None,
) -> None:
    """In the apply transaction, after the data changes: enable the triggers again; NOTIFY if due."""
    for stmt in done.restore:
        conn.execute(stmt)
    if done.policy.notify:
        conn.execute(
            "SELECT pg_notify(%s, %s)",
            (CHANNEL, json.dumps(payload(st, done.action, inserted, deleted, refresh_id, done.names))),
        )
