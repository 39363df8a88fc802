"""Publishing stream tables for logical replication, read back through a pgoutput slot.

A subscriber is simulated by replaying the decoded changes onto the stream
table's contents as of the slot's creation (DELETE / UPDATE remove one row
equal to the old row — what a subscriber does with REPLICA IDENTITY FULL);
the replay must equal the stream table after every refresh, duplicates included.
"""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from psycopg import sql

from pgtrickle.cdc.pgoutput import Delete, Insert, Relation, Truncate, Update, decode_message
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

SLOT = "pgt_test_pub"
# Duplicates: several source rows give the same (grp, v) row, sharing one __pgt_row_id.
LINEAR = "SELECT grp, v FROM src WHERE v > 0"
AGG = "SELECT grp, sum(v) AS total, count(*) AS n FROM src GROUP BY grp"


class Subscriber:
    """Decodes the slot's changes and applies them to copies of the published tables."""

    def __init__(self, db: Database, tables: list[str]) -> None:
        self.db = db
        self.relations: dict[int, Relation] = {}
        self.rows: dict[str, Counter] = {t: Counter(self.contents(t)) for t in tables}
        self.seen: list[tuple[str, str]] = []

    def contents(self, table: str) -> list[tuple]:
        """The table's rows as pgoutput sends them (text, every column in attribute order)."""
        cols = [
            r[0]
            for r in self.db.sql(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum",
                (table,),
            )
        ]
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in cols),
            sql.Identifier(table),
        )
        return [tuple(r) for r in self.db.conn.execute(query).fetchall()]

    def consume(self) -> list[tuple[str, str]]:
        """Apply the changes pending in the slot; returns (table, kind) of each, in order."""
        rows = self.db.sql(
            "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', 'pgt_pub')",
            (SLOT,),
        )
        events = []
        for (data,) in rows:
            msg = decode_message(bytes(data))
            if isinstance(msg, Relation):
                self.relations[msg.relid] = msg
            elif isinstance(msg, Insert):
                table = self.relations[msg.relid].name
                self.rows[table][self._values(msg.new)] += 1
                events.append((table, "INSERT"))
            elif isinstance(msg, (Update, Delete)):
                table = self.relations[msg.relid].name
                assert msg.old is not None, "REPLICA IDENTITY FULL sends the whole old row"
                old = self._values(msg.old)
                assert self.rows[table][old] > 0, f"{table}: the subscriber has no row {old}"
                self.rows[table][old] -= 1
                if isinstance(msg, Update):
                    self.rows[table][self._values(msg.new)] += 1
                events.append((table, "UPDATE" if isinstance(msg, Update) else "DELETE"))
            elif isinstance(msg, Truncate):
                for relid in msg.relids:
                    self.rows[self.relations[relid].name].clear()
                    events.append((self.relations[relid].name, "TRUNCATE"))
        self.seen += events
        return events

    @staticmethod
    def _values(data) -> tuple:  # type: ignore[no-untyped-def]
        return tuple(v.value for v in data)

    def matches(self, table: str) -> bool:
        return +self.rows[table] == Counter(self.contents(table))


@pytest.fixture
def published(db: Database) -> Database:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp text, v int)")
    db.sql("INSERT INTO src SELECT g, 'g' || (g % 3), 1 + g % 2 FROM generate_series(1, 30) g")
    create_st(db, "lin", LINEAR, schedule="1h")
    create_st(db, "agg", AGG, schedule="1h")
    refresh(db)
    assert_oracle(db)
    db.sql("SELECT pgtrickle.publish_stream_table('lin', 'pgt_pub')")
    db.sql("SELECT pgtrickle.publish_stream_table('agg', 'pgt_pub')")
    db.sql("SELECT pgtrickle.publish_stream_table('agg', 'pgt_pub')")  # idempotent
    return db


def test_publish_sets_replica_identity_full_and_publication(published: Database) -> None:
    db = published
    assert db.sql(
        "SELECT relname::text, relreplident::text FROM pg_class WHERE relname IN ('lin', 'agg') ORDER BY 1"
    ) == [("agg", "f"), ("lin", "f")]
    assert db.sql(
        "SELECT tablename::text FROM pg_publication_tables WHERE pubname = 'pgt_pub' ORDER BY 1"
    ) == [("agg",), ("lin",)]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="publication name"):
        db.sql("SELECT pgtrickle.publish_stream_table('lin', '')")
    with pytest.raises(psycopg.errors.UndefinedObject):
        db.sql("SELECT pgtrickle.publish_stream_table('nope', 'pgt_pub')")


def test_published_stream_tables_stream_their_changes(published: Database) -> None:
    db = published
    db.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    sub = Subscriber(db, ["lin", "agg"])
    assert sub.consume() == []

    # DIFFERENTIAL: one of several equal rows goes (a duplicate), a group changes, a group appears.
    assert db.scalar("SELECT count(*) FROM lin WHERE grp = 'g1' AND v = 2") > 1
    db.sql("DELETE FROM src WHERE id = 1")  # g1, v 2: one duplicate of several
    db.sql("UPDATE src SET v = 7 WHERE id = 2")  # g2: v 1 -> 7
    db.sql("INSERT INTO src VALUES (100, 'new', 5)")
    outcomes = refresh(db)
    assert {o.st.name: o.action.value for o in outcomes} == {"lin": "DIFFERENTIAL", "agg": "DIFFERENTIAL"}
    assert_oracle(db)
    events = Counter(sub.consume())
    assert events[("agg", "UPDATE")] == 2 and events[("agg", "INSERT")] == 1
    assert events[("lin", "DELETE")] == 2 and events[("lin", "INSERT")] == 2
    assert sub.matches("lin") and sub.matches("agg")

    # A group vanishes: a DELETE of its row.
    db.sql("DELETE FROM src WHERE grp = 'new'")
    refresh(db)
    assert_oracle(db)
    assert ("agg", "DELETE") in sub.consume()
    assert sub.matches("lin") and sub.matches("agg")

    # FULL: TRUNCATE, then the whole contents as INSERTs.
    for name in ("lin", "agg"):
        db.sql("SELECT pgtrickle.alter_stream_table(%s, refresh_mode => 'FULL')", (name,))
    db.sql("UPDATE src SET v = v + 10 WHERE id <= 5")
    outcomes = refresh(db)
    assert {o.st.name: o.action.value for o in outcomes} == {"lin": "FULL", "agg": "FULL"}
    assert_oracle(db)
    events = sub.consume()
    assert events[0] == ("lin", "TRUNCATE") and Counter(events)[("lin", "INSERT")] == db.scalar(
        "SELECT count(*) FROM lin"
    )
    assert ("agg", "TRUNCATE") in events
    assert sub.matches("lin") and sub.matches("agg")


def test_published_without_replica_identity_fails_clearly_until_published_properly(db: Database) -> None:
    """CREATE PUBLICATION alone: a DIFFERENTIAL refresh cannot DELETE from the table (no replica identity)."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp text, v int)")
    db.sql("INSERT INTO src SELECT g, 'g' || (g % 3), g FROM generate_series(1, 10) g")
    create_st(db, "lin", LINEAR, schedule="1h")
    refresh(db)
    db.sql("CREATE PUBLICATION pgt_pub FOR TABLE lin")
    db.sql("DELETE FROM src WHERE id = 1")
    before = db.sql("SELECT grp, v FROM lin ORDER BY 1, 2")
    with pytest.raises(Exception, match="replica identity"):
        refresh(db)
    assert db.sql("SELECT grp, v FROM lin ORDER BY 1, 2") == before
    db.sql("SELECT pgtrickle.publish_stream_table('lin', 'pgt_pub')")
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL"
    assert_oracle(db)
