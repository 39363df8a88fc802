"""Merging the change of a stored aggregate state into its stream table, in PostgreSQL.

A stream table keeping its root aggregate's state (:mod:`pgtrickle.dvm.stored`) gets from Spark
one row per touched group: its keys, ``__pgt_row_id`` and the *change* of every state column
(:mod:`pgtrickle.dvm.state_change`). In the apply transaction, matching a group by its row
identity and every key (``IS NOT DISTINCT FROM``, or the type's own ``=``):

1. DELETE the groups whose row count reaches 0;
2. UPDATE the others: every count and sum += its change; a sum whose non-NULL count reaches 0
   becomes NULL; each AVG is recomputed from its new hidden sum and count exactly as
   PostgreSQL's ``avg`` divides (:func:`pgtrickle.dvm.stored.average_of`), and each column
   derived from the state (``sum(a) / sum(b)``) from the new state, in PostgreSQL;
3. INSERT the groups the table does not hold yet (their row count change is positive).

Counted check: every delta row must be exactly one of these - a group the table does not hold
whose count would not grow, or a count going negative, means the delta does not match the table
(:class:`DeltaMismatch`: the refresh runs FULL). A user's row-level trigger sees a changed group
as one UPDATE. When other stream tables read this one, the touched groups' rows before (``D``)
and after (``I``) the merge go to its own change buffer.

The statements are built by pure functions (:func:`merge_statements`); :class:`StateMerge` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgtrickle.db.query import scalar
from pgtrickle.dvm.layout import ROW_ID
from pgtrickle.dvm.rules.aggregate import ROW_COUNT
from pgtrickle.dvm.stored import StoredAggregate, average_of
from pgtrickle.refresh.delta_apply import (
    DELTA_TABLE,
    RAW_TABLE,
    DeltaApply,
    DeltaMismatch,
    Staged,
    same_value,
)
from pgtrickle.sql.ident import quote_ident

__all__ = ["MergeStatements", "StateMerge", "merge_statements"]


@dataclass(frozen=True)
class MergeStatements:
    """The statements of one merge (``d``: the delta table, ``t``: the stream table)."""

    match: str
    """True where a stream-table row ``t`` holds the group of the delta row ``d``."""
    delete: str
    update: str
    insert: str


def merge_statements(
    stored: StoredAggregate, target: str, types: Mapping[str, str], equality: Mapping[str, str]
) -> MergeStatements:
    """The DELETE / UPDATE / INSERT folding ``DELTA_TABLE`` into ``target`` (pure).

    ``types``: the PostgreSQL type of each visible column (an AVG's decides its division);
    ``equality``: the schema-qualified ``=`` of key columns whose type has its own.
    """
    d = DELTA_TABLE
    count = quote_ident(stored.stored_of(ROW_COUNT))
    if stored.keys:
        match = " AND ".join(
            [f"t.{ROW_ID} = d.{ROW_ID}"]
            + [same_value(f"t.{quote_ident(k)}", f"d.{quote_ident(k)}", equality.get(k)) for k in stored.keys]
        )
    else:
        match = "true"
    sums = dict(stored.sums)

    def merged(column: str, old: str | None) -> str:
        """The new value of a state column from its old value (``None``: a new group)."""
        change = f"d.{quote_ident(column)}"
        if column in sums:
            n = quote_ident(sums[column])
            new_count = f"d.{n}" if old is None else f"t.{n} + d.{n}"
            total = f"coalesce({change}, 0)" if old is None else f"coalesce({old}, 0) + coalesce({change}, 0)"
            return f"CASE WHEN {new_count} > 0 THEN {total} END"
        return change if old is None else f"{old} + {change}"

    def values(new: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        state: dict[str, str] = {}
        for _, column in stored.names:
            if column in stored.keys:
                continue
            state[column] = merged(column, None if new else f"t.{quote_ident(column)}")
            out.append((column, state[column]))
        for average in stored.averages:
            pg_type = types.get(average.column, "numeric")
            out.append(
                (average.column, average_of(state[average.sum_column], state[average.count_column], pg_type))
            )
        for derived in stored.derived:
            out.append(
                (derived.column, stored.derived_sql(derived, lambda c: state.get(c) or f"d.{quote_ident(c)}"))
            )
        return out

    assignments = ", ".join(f"{quote_ident(c)} = {v}" for c, v in values(new=False))
    grows = f"t.{count} + d.{count} > 0"
    update = f"UPDATE {target} AS t SET {assignments} FROM {d} AS d WHERE {match}"
    if not stored.keys:
        return MergeStatements(match, "", update, "")
    delete = f"DELETE FROM {target} AS t USING {d} AS d WHERE {match} AND t.{count} + d.{count} = 0"
    inserted = values(new=True)
    columns = [*stored.keys, *(c for c, _ in inserted), ROW_ID]
    selected = [*(f"d.{quote_ident(k)}" for k in stored.keys), *(v for _, v in inserted), f"d.{ROW_ID}"]
    insert = (
        f"INSERT INTO {target} ({', '.join(quote_ident(c) for c in columns)}) SELECT {', '.join(selected)}"
        f" FROM {d} AS d WHERE d.{count} > 0 AND NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {match})"
    )
    return MergeStatements(match, delete, f"{update} AND {grows}", insert)


class StateMerge(DeltaApply):
    """The merge of one state change into ``st`` (inside the caller's transaction)."""

    def apply(self, rows: Sequence[tuple] | Staged) -> tuple[int, int]:
        """Returns (inserted, deleted) as rows: an updated group counts as one of each."""
        stored = self.layout.stored
        assert stored is not None
        written = list(self.layout.columns)
        self._load(rows, written)
        cols = ", ".join(quote_ident(c) for c in [*written, ROW_ID])
        self.conn.execute(
            f"CREATE TEMP TABLE {DELTA_TABLE.split('.')[-1]} ON COMMIT DROP AS SELECT {cols} FROM {RAW_TABLE}"
        )
        self.conn.execute(f"ANALYZE {DELTA_TABLE}")
        types = {c.name: c.type for c in self.st.columns}
        statements = merge_statements(stored, self.st.qualified, types, self.equality)
        groups = int(scalar(self.conn, f"SELECT count(*) FROM {DELTA_TABLE}"))
        self._snapshot(statements.match, "D")
        deleted = self.conn.execute(statements.delete).rowcount if statements.delete else 0
        updated = self.conn.execute(statements.update).rowcount
        inserted = self.conn.execute(statements.insert).rowcount if statements.insert else 0
        if deleted + updated + inserted != groups:
            raise DeltaMismatch(
                f"the delta changes {groups} groups but {deleted + updated + inserted} matched the stream table"
            )
        self._snapshot(statements.match, "I")
        return inserted + updated, deleted + updated

    def _snapshot(self, match: str, action: str) -> None:
        """Record the touched groups' current rows in the own buffer (before: D, after: I)."""
        buffer = self.buffer
        if buffer is None:
            return
        prefix = "new_" if action == "I" else "old_"
        cols = [c.name for c in self.st.columns if c.name in buffer.columns]
        targets = "".join(f", {quote_ident(prefix + buffer.columns[c])}" for c in cols)
        values = "".join(f", t.{quote_ident(c)}" for c in cols)
        self.conn.execute(
            f"INSERT INTO {buffer.table} (xid, action{targets})"
            f" SELECT pg_current_xact_id(), '{action}'{values} FROM {self.st.qualified} AS t"
            f" WHERE EXISTS (SELECT 1 FROM {DELTA_TABLE} AS d WHERE {match})"
        )
