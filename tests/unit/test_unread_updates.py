"""refresh/unread_updates.py's pure parts: the columns a query reads, the sources worth checking."""

from __future__ import annotations

from pgtrickle.catalog.store import Source
from pgtrickle.cdc.buffers import PendingChanges
from pgtrickle.dvm.lower import lower
from pgtrickle.refresh.unread_updates import candidates, query_columns
from pgtrickle.sql.translate import parse_query

SCHEMA = {
    "public.c": ["id", "nk", "bal", "name"],
    "public.o": ["ok", "cid", "d", "prio"],
}


def _columns(sql: str) -> dict[str, frozenset[str]]:
    return query_columns(lower(parse_query(sql), SCHEMA))


def test_the_columns_a_query_reads_are_those_of_its_scans_after_pruning() -> None:
    got = _columns(
        "SELECT c.nk, sum(o.ok) FROM public.c c JOIN public.o o ON o.cid = c.id WHERE o.d > 3 GROUP BY c.nk"
    )
    assert got == {"public.c": frozenset({"id", "nk"}), "public.o": frozenset({"ok", "cid", "d"})}


def test_a_self_join_reads_the_union_of_both_scans() -> None:
    got = _columns("SELECT a.nk, b.name FROM public.c a JOIN public.c b ON a.id = b.nk")
    assert got == {"public.c": frozenset({"id", "nk", "name"})}


def test_count_star_still_reads_a_column() -> None:
    assert _columns("SELECT count(*) FROM public.o")["public.o"]


def _pending(relid: int, name: str, i: int, d: int, u: int, truncated: bool = False) -> PendingChanges:
    return PendingChanges(Source(relid, "public", name, "TABLE", f"b{relid}"), i, d, u, truncated)


def test_only_update_only_windows_of_read_relations_are_checked() -> None:
    columns = {"public.c": frozenset({"id"}), "public.o": frozenset({"ok"})}
    pending = {
        1: _pending(1, "c", 0, 0, 5),  # only updates: checked
        2: _pending(2, "o", 1, 0, 5),  # an insert too: kept as it is
        3: _pending(3, "x", 0, 0, 5),  # not read by the query (no Scan): kept as it is
        4: _pending(4, "o", 0, 2, 3),
        5: _pending(5, "c", 0, 0, 0, truncated=True),
    }
    assert [p.source.relid for p in candidates(pending, columns)] == [1]
