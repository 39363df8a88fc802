"""Decisions of an atomic group refresh (pure; the I/O is in :mod:`pgtrickle.refresh.group`).

* which members refresh, and how (:func:`member_action`, :func:`member_actions`): a member
  reading another member refreshes DIFFERENTIAL from that member's change computed in the same
  transaction, or FULL with the reason;
* the frontier the members commit (:func:`frontier_with_own_xid`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pgtrickle.errors import RefreshError
from pgtrickle.refresh.plan import Action

MAX_SKIPPED_XIDS = 100_000
"""Transactions that may start between the group's snapshot and its own xid (normally a handful)."""


@dataclass(frozen=True)
class MemberPlan:
    """What one member of a group does, and why when it is not what its own plan said."""

    action: Action
    why: str | None = None
    """``None``: the member's own plan stands (its own reason); otherwise the reason to record."""


@dataclass(frozen=True)
class MemberInputs:
    """What the decision reads of one member besides its upstream members' actions."""

    own: Action
    """Its own plan at the group's snapshot (NO_DATA, DIFFERENTIAL or FULL)."""
    full_reason: str | None = None
    """Why it cannot refresh differentially from an upstream member's change (``None``: it can;
    :func:`pgtrickle.refresh.plan.differential_blocker`)."""
    untaken: Mapping[int, int] = field(default_factory=dict)
    """Per upstream member, the rows of its change buffer in this member's own window
    (frontier, snapshot] - changes it has not taken yet."""


def member_action(
    inputs: MemberInputs, upstream: Mapping[int, Action], names: Mapping[int, str]
) -> MemberPlan:
    """What a member does, given its upstream members' actions (``upstream``: empty for a root).

    A *root* keeps its own plan. Any other member:

    * its own plan is FULL (initial population, reinitialization, ...): FULL, for that reason;
    * an upstream member refreshes FULL: FULL - that member's change is not computed, so this
      member is recomputed from the upstream members' new contents;
    * it has changes of an upstream member it has not taken yet (it joined the group since its
      last refresh): FULL - the upstream's buffer holds more than this refresh's change;
    * nothing changes upstream and nothing of its own: NO_DATA;
    * it cannot refresh differentially (``full_reason``): FULL, for that reason;
    * otherwise DIFFERENTIAL: its change from an upstream member is that member's change computed
      (and written to its change buffer) in this same transaction.

    ``names`` names the members in the reasons.
    """
    own = inputs.own
    if not upstream or own is Action.FULL:
        return MemberPlan(own)
    full_up = sorted(u for u, a in upstream.items() if a is Action.FULL)
    if full_up:
        return MemberPlan(
            Action.FULL,
            f"recomputed because upstream member {_names(full_up, names)} refreshes FULL "
            "(its change is not computed)",
        )
    behind = sorted(u for u, n in inputs.untaken.items() if n > 0 and u in upstream)
    if behind:
        rows = sum(inputs.untaken[u] for u in behind)
        return MemberPlan(
            Action.FULL,
            f"recomputed because {rows:,} changes of upstream member {_names(behind, names)} "
            "were not taken yet (it joined the group since its last refresh)",
        )
    changed_up = sorted(u for u, a in upstream.items() if a is Action.DIFFERENTIAL)
    if own is Action.NO_DATA and not changed_up:
        return MemberPlan(Action.NO_DATA)
    if inputs.full_reason is not None:
        return MemberPlan(Action.FULL, inputs.full_reason)
    if not changed_up:
        return MemberPlan(own)
    return MemberPlan(
        Action.DIFFERENTIAL,
        f"the change of upstream member {_names(changed_up, names)} computed in this refresh",
    )


def member_actions(
    order: Sequence[int],
    in_group_upstream: Mapping[int, frozenset[int]],
    inputs: Mapping[int, MemberInputs],
    names: Mapping[int, str] | None = None,
) -> dict[int, MemberPlan]:
    """:func:`member_action` of every member, upstream first (``order``), each given what its
    upstream members were decided to do."""
    names = names or {}
    plans: dict[int, MemberPlan] = {}
    for pgt_id in order:
        ups = in_group_upstream.get(pgt_id, frozenset())
        plans[pgt_id] = member_action(inputs[pgt_id], {u: plans[u].action for u in ups}, names)
    return plans


def _names(ids: Sequence[int], names: Mapping[int, str]) -> str:
    return ", ".join(names.get(i, f"#{i}") for i in ids)


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
