"""Decisions of an atomic group refresh (pure; the I/O is in :mod:`pgtrickle.refresh.group`).

* which members refresh, and how (:func:`member_actions`);
* the frontier the members commit (:func:`frontier_with_own_xid`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pgtrickle.errors import RefreshError
from pgtrickle.refresh.plan import Action

MAX_SKIPPED_XIDS = 100_000
"""Transactions that may start between the group's snapshot and its own xid (normally a handful)."""


def member_actions(
    order: Sequence[int], in_group_upstream: Mapping[int, frozenset[int]], own: Mapping[int, Action]
) -> dict[int, Action]:
    """What each member of a group does, given what its own plan says.

    A *root* (no upstream member) keeps its own plan: NO_DATA, DIFFERENTIAL
    or FULL. Any other member is recomputed (FULL, reading its upstream
    members' new contents) when its own plan has work or any upstream member
    changes; otherwise it is NO_DATA. ``order`` lists the members upstream
    first.
    """
    actions: dict[int, Action] = {}
    for pgt_id in order:
        ups = in_group_upstream.get(pgt_id, frozenset())
        mine = own[pgt_id]
        if not ups:
            actions[pgt_id] = mine
        elif mine is not Action.NO_DATA or any(actions[u] is not Action.NO_DATA for u in ups):
            actions[pgt_id] = Action.FULL
        else:
            actions[pgt_id] = Action.NO_DATA
    return actions


def frontier_with_own_xid(snapshot: str, xid: int) -> str:
    """``snapshot`` with transaction ``xid`` (the group's own, later than the snapshot) made visible.

    Members commit this as their frontier: it sees exactly what the group read
    (``snapshot``) plus the group's own writes — so a downstream member does
    not take the rows its upstream members wrote into their change buffers in
    this same transaction for changes still to apply. Transactions that began
    between the snapshot and ``xid`` stay invisible (listed as in progress).
    """
    try:
        xmin_text, xmax_text, xip_text = snapshot.split(":")
        xmin, xmax = int(xmin_text), int(xmax_text)
        xip = [int(x) for x in xip_text.split(",") if x]
    except ValueError:
        raise ValueError(f"not a pg_snapshot: {snapshot!r}") from None
    if xid < xmax:
        return snapshot if xid not in xip else _format(xmin, xmax, [x for x in xip if x != xid])
    if xid - xmax > MAX_SKIPPED_XIDS:
        raise RefreshError(
            f"{xid - xmax} transactions started between the group's snapshot and its commit; "
            "the refresh is discarded and will be retried"
        )
    return _format(xmin, xid + 1, sorted(set(xip) | set(range(xmax, xid))))


def _format(xmin: int, xmax: int, xip: Sequence[int]) -> str:
    return f"{xmin}:{xmax}:{','.join(str(x) for x in xip)}"
