"""Chained members of a batch: a stream table computed from its upstream member's delta (pure).

A batch (refresh/batch.py) may hold a stream table D together with an upstream stream table U
that D reads (the scheduler adds the due downstream units of a batch's units to it:
:func:`pgtrickle.scheduler.batches.followers`). U's delta is computed by the batch's Spark job
anyway; D's ``delta(scan U)`` is then the rows of U's change buffer D has not taken yet **plus
U's delta in that same job**, so one job computes the whole chain instead of one job per level.

The result is exact only where U's apply writes exactly the delta the job computed, with the
values D would read back from U's change buffer; what this module decides:

* :func:`column_why_not`: a column of U that D reads crosses in-plan only when its value in the
  job *is* the stored value: a type PostgreSQL stores as Spark computes it (integers, booleans,
  unbounded text, floats, dates), read natively (not carried, spark/carry.py), with the same
  Spark type on both sides. A ``numeric(p,s)``, ``varchar(n)``, ``character(n)``, domain or
  time value may be rounded, checked or padded by PostgreSQL on write: D is then refreshed on
  its own, after U committed, from U's change buffer (as without a batch).
* :func:`chained_frontier`: D's frontier. U's apply commits in a transaction of its own after
  the batch's snapshot S; D has taken U's rows of that transaction, and nothing else that
  committed after S. So D commits S with U's transaction made visible
  (:func:`~pgtrickle.refresh.group_plan.frontier_with_own_xid`, as atomic groups do), and its
  gates are passed at that snapshot, as a lone refresh at that moment would pass them.

A D whose upstream member did not apply exactly its computed delta (its apply failed, it fell
back to FULL, it refreshed on its own) is refreshed on its own after it, from U's buffer.
"""

from __future__ import annotations

from collections.abc import Iterable

from pgtrickle.refresh.group_plan import frontier_with_own_xid

IN_PLAN_TYPES = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "boolean": "boolean",
    "text": "string",
    "character varying": "string",
    "double precision": "double",
    "real": "float",
    "date": "date",
}
"""PostgreSQL types whose values a Spark job computes exactly as PostgreSQL stores them, and the
Spark type (``simpleString``) a JDBC read of such a column gives."""


def column_why_not(
    name: str, pg_type: str, carried: bool, job_type: str, read_type: str | None = None
) -> str | None:
    """Why column ``name`` of an upstream member (PostgreSQL type ``pg_type``) cannot cross from
    the job's delta to a downstream member's read (``None``: it can). ``carried``: its change
    buffer is read through spark/carry.py; ``job_type`` / ``read_type``: the Spark types of the
    column in the job's delta and in the buffer's read (``simpleString``; ``None``: the buffer is
    not read, its window being empty - the type a read would give)."""
    if pg_type not in IN_PLAN_TYPES:
        return f"column {name} is {pg_type}, which PostgreSQL may round, check or pad on write"
    if carried:
        return f"column {name} is read through an exact carry"
    read_type = read_type or IN_PLAN_TYPES[pg_type]
    if job_type != read_type:
        return f"column {name} is {job_type} in the upstream delta but {read_type} when read back"
    return None


def chained_frontier(snapshot: str, xids: Iterable[int | None]) -> str:
    """The frontier a chained member commits: ``snapshot`` with its upstream members' apply
    transactions (``None``: one wrote nothing) made visible."""
    for xid in sorted({x for x in xids if x is not None}):
        snapshot = frontier_with_own_xid(snapshot, xid)
    return snapshot
