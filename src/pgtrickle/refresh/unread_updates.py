"""Updates no query column sees: a source whose window holds only such updates has no change.

An UPDATE that leaves every column a stream table's query reads of its source as it was (by
stored image: :func:`pgtrickle.cdc.buffers.updates_change`) changes nothing the query can see.
Projected on those columns its old and new rows are one row with weights -1 and +1, so when a
source's window holds only such updates the source's change is zero, and so is every term of
the delta plan that reads it (``pre`` of the source equals its ``post``). Leaving the source out
of the changed set is exact and drops those terms and the reads only they needed: in the TPC-H
workload an update of customers' balances no longer makes the queries that do not read
``c_acctbal`` (Q3, Q5, Q7, Q8, Q13, Q18) read the orders and lines of those customers.

Kept as they are: a source with inserts or deletes in the window, a source whose buffer does not
carry a column the query reads, and what ``skip`` names (an atomic group's upstream member,
whose change is its group's transaction's, not its buffer's window).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import psycopg

from pgtrickle.catalog.store import Source
from pgtrickle.cdc.buffers import PendingChanges, updates_change
from pgtrickle.dvm import ir
from pgtrickle.refresh.read_names import relation_key
from pgtrickle.refresh.shared_reads import buffer_columns

__all__ = ["affecting", "query_columns"]

log = logging.getLogger(__name__)


def query_columns(tree: ir.Node) -> dict[str, frozenset[str]]:
    """Per relation (``schema.name``), the source columns some Scan of ``tree`` reads (pure)."""
    found: dict[str, set[str]] = {}
    for node in ir.walk(tree):
        if isinstance(node, ir.Scan):
            found.setdefault(node.relation, set()).update(node.source_columns)
    return {relation: frozenset(cols) for relation, cols in found.items()}


def candidates(
    pending: Mapping[int, PendingChanges], columns: Mapping[str, frozenset[str]]
) -> list[PendingChanges]:
    """The sources whose window holds only updates, of relations the query reads (pure)."""
    return [
        p
        for p in pending.values()
        if p.updates
        and not p.inserts
        and not p.deletes
        and not p.truncated
        and relation_key(p.source) in columns
    ]


def affecting(
    conn: psycopg.Connection,
    pending: Mapping[int, PendingChanges],
    columns: Mapping[str, frozenset[str]],
    window: tuple[str, str],
    skip: Callable[[Source], bool],
    timings: dict[str, float],
) -> dict[int, PendingChanges]:
    """``pending`` without the sources whose updates in the window (frontier, snapshot] change no
    column of ``columns``; how many updates were left out goes into ``timings["updates_not_read"]``."""
    found = [p for p in candidates(pending, columns) if not skip(p.source)]
    out = dict(pending)
    if not found:
        return out
    carried = buffer_columns(conn, [p.source.relid for p in found])
    for p in found:
        mapping = carried.get(p.source.relid, {})
        read = sorted(columns[relation_key(p.source)])
        if any(c not in mapping for c in read):
            continue
        if not updates_change(conn, p.source, [mapping[c] for c in read], *window):
            del out[p.source.relid]
            timings["updates_not_read"] = timings.get("updates_not_read", 0) + p.updates
            log.debug(
                "%d update(s) of %s change no column the query reads", p.updates, relation_key(p.source)
            )
    return out
