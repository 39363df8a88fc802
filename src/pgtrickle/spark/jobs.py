"""Counting the Spark jobs of one refresh (recorded in its history row).

A refresh runs inside :func:`counting` (``Refresher.execute``). The count
names a job group of its own, unique to this refresh (``pgtrickle-<pgt_id>-
<random>``): every Spark job the refreshing thread starts from then on
belongs to it (:func:`pgtrickle.spark.capabilities.tag_jobs` uses the
count's group instead of the per-table tag while one is active). Job groups
are per thread (PySpark's pinned thread mode), so refreshes running at the
same time in other threads never count each other's jobs - no global
counter.

At the end (:func:`figures`) the driver's status tracker lists the jobs of
the group (``statusTracker().getJobIdsForGroup``; local and cluster mode
alike, since the tracker lives in the driver). Its store is fed by the
listener bus asynchronously, so the bus is drained first (bounded wait).

* No Spark session used (a refresh that failed before reading): 0 jobs.
* Outside a count (an atomic group recording a member's failure after the
  group's transaction rolled back): ``None``.
* A Spark Connect session has no SparkContext in this process and its
  client learns nothing of the server's jobs (progress reports carry stages
  only, at intervals): ``None`` (recorded as NULL).
* More than one job: :attr:`JobFigures.why` says which actions ran them
  (Spark's call site of each job - the pgtrickle line that started it - with
  a count), e.g. ``3 jobs: 2x collect at engine.py:768, 1x jdbc at
  jdbc.py:120 (...)``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

LISTENER_WAIT_MS = 2000
"""How long to wait for Spark's listener bus to deliver the last job events before counting."""


@dataclass(frozen=True)
class JobFigures:
    """What one refresh ran on Spark (``None`` fields: not countable, e.g. Spark Connect)."""

    jobs: int | None
    stages: int | None = None
    why: str | None = None
    """Set when more than one job ran: what started each (see :func:`explain_jobs`)."""


SEVERAL_JOBS_PER_ACTION = (
    "one action can run several jobs: adaptive query execution runs its shuffle stages as jobs "
    "first, a LIMIT scans partitions in rounds"
)

NOT_COUNTED = JobFigures(None)
NO_JOBS = JobFigures(0, 0)


@dataclass
class JobCount:
    """The job group of one refresh in progress on this thread."""

    group: str
    description: str
    sessions: list[object] = field(default_factory=list)
    """The Spark sessions this refresh tagged (normally one)."""
    connect: bool = False
    recorded: JobFigures | None = None
    """What :func:`figures` last counted (the figures the history row got)."""
    fixed: JobFigures | None = None
    """Set by :func:`attributed`: the figures to record, not counted from the group."""


_local = threading.local()


def active() -> JobCount | None:
    """The count of the refresh running on this thread, if any."""
    return getattr(_local, "count", None)


@contextmanager
def counting(tag: str, description: str) -> Iterator[JobCount]:
    """Count the Spark jobs this thread starts inside the block under a job group unique to it."""
    count = JobCount(f"{tag}-{uuid.uuid4().hex[:12]}", description)
    previous = active()
    _local.count = count
    try:
        yield count
    finally:
        _local.count = previous


@contextmanager
def attributed(fixed: JobFigures, description: str) -> Iterator[JobCount]:
    """Within: this thread's refresh records ``fixed`` as its Spark jobs (a member of a batch,
    whose delta a job shared with other stream tables computed: refresh/batch.py)."""
    with counting("pgtrickle-attributed", description) as count:
        count.fixed = fixed
        yield count


def group_for(tag: str) -> str:
    """The job group (or Spark Connect tag) to give this thread's jobs: the counted refresh's, else ``tag``."""
    count = active()
    return count.group if count is not None else tag


def note_session(spark: object, connect: bool) -> bool:
    """Remember that the counted refresh on this thread uses ``spark``; False when it was known already."""
    count = active()
    if count is None or any(s is spark for s in count.sessions):
        return False
    count.sessions.append(spark)
    count.connect = count.connect or connect
    return True


def figures() -> JobFigures:
    """The jobs the refresh counted on this thread ran so far (:data:`NOT_COUNTED` outside a count)."""
    count = active()
    if count is None:
        return NOT_COUNTED
    if count.fixed is not None:
        count.recorded = count.fixed
        return count.fixed
    if not count.sessions:
        return NO_JOBS
    if count.connect:
        count.recorded = NOT_COUNTED
    else:
        try:
            count.recorded = _tracked(count)
        except Exception:  # a counting failure must never fail the refresh it describes
            log.warning("could not count the Spark jobs of job group %s", count.group, exc_info=True)
            count.recorded = NOT_COUNTED
    return count.recorded


def _tracked(count: JobCount) -> JobFigures:
    jobs: list[int] = []
    stages: set[int] = set()
    sites: list[str] = []
    for spark in count.sessions:
        sc = spark.sparkContext  # type: ignore[attr-defined]
        _drain_listener_bus(sc)
        tracker = sc.statusTracker()
        for job_id in sorted(tracker.getJobIdsForGroup(count.group)):
            jobs.append(job_id)
            info = tracker.getJobInfo(job_id)
            if info is None:
                continue
            ran = []
            for stage_id in info.stageIds:
                stage = tracker.getStageInfo(stage_id)
                # A skipped stage (its shuffle output reused) never ran a task.
                if (
                    stage is not None
                    and stage.numCompletedTasks + stage.numActiveTasks + stage.numFailedTasks
                ):
                    stages.add(stage_id)
                    ran.append(stage)
            last = max(ran, key=lambda s: s.stageId, default=None)
            if _broadcasts(sc, job_id):
                sites.append(BROADCAST_SITE)
            else:
                sites.append(last.name if last is not None else "(no stage ran)")
    return JobFigures(len(jobs), len(stages), explain_jobs(sites))


def _broadcasts(sc, job_id: int) -> bool:
    """Whether Spark ran job ``job_id`` to broadcast one side of a join: its tags (the status
    store's) name a broadcast exchange. Its call site does not tell: the exchange's thread
    captured the action's."""
    try:
        tags = sc._jsc.sc().statusStore().job(job_id).jobTags().toString()
    except Exception:  # not in the store (yet, or any more): counted under its call site
        return False
    return BROADCAST_TAG in str(tags)


def _drain_listener_bus(sc) -> None:
    """Wait (bounded) until Spark's listener bus has delivered every event posted so far."""
    try:
        sc._jsc.sc().listenerBus().waitUntilEmpty(LISTENER_WAIT_MS)
    except Exception:  # a busy bus: count what the tracker knows now
        log.debug("Spark's listener bus did not drain in %d ms", LISTENER_WAIT_MS, exc_info=True)


def explain_jobs(sites: Sequence[str]) -> str | None:
    """Why a refresh ran more than one job: each job's call site, counted (pure; ``None`` for 0 or 1 job).

    >>> explain_jobs(["jdbc at /x/jdbc.py:120", "collect at /x/engine.py:768"])
    '2 jobs: 1x collect at engine.py:768, 1x jdbc at jdbc.py:120'
    >>> explain_jobs(["count at a.py:1"]) is None
    True
    """
    if len(sites) <= 1:
        return None
    counted = Counter(_short_site(s) for s in sites)
    parts = [f"{n}x {site}" for site, n in sorted(counted.items(), key=lambda item: (-item[1], item[0]))]
    text = f"{len(sites)} jobs: " + ", ".join(parts)
    if any(n > 1 for site, n in counted.items() if site != BROADCAST_SITE):
        text += f" ({SEVERAL_JOBS_PER_ACTION})"
    return text


BROADCAST_SITE = "broadcast of a small table"
"""How :func:`explain_jobs` names a job Spark runs to broadcast one side of a join (a small table
read whole, refresh/delta_reads.py) before the plan's own job."""

BROADCAST_TAG = "broadcast exchange"
"""The start of the tag Spark gives the job of a broadcast exchange (``broadcast exchange (runId
…)``)."""


def _short_site(site: str) -> str:
    """``collect at /long/path/engine.py:768`` -> ``collect at engine.py:768``."""
    action, sep, where = site.partition(" at ")
    if not sep:
        return site
    return f"{action} at {where.rsplit('/', 1)[-1]}"
