"""What differs between a local-JVM SparkSession and a Spark Connect one, in one place.

The refresh code asks this module, never ``sparkContext`` (which a Spark
Connect client does not have):

* ``parallelism`` -- how many tasks the cluster runs at once (sizes
  partitioned JDBC reads and a delta's shuffle). A local JVM session knows
  it (``defaultParallelism``); on Spark Connect it is measured once per
  session with one tiny job: ``range()`` without a partition count is split
  into exactly the default parallelism.
* failed jobs -- a local session's error carries the Java exception chain
  (the JDBC driver's SQLSTATE); a Spark Connect client gets text only.
* naming and cancelling a refresh's jobs -- a job group (interrupting the
  tasks' threads on cancel) on a local JVM; a job tag and ``interruptAll`` on
  Spark Connect.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pgtrickle.spark import jobs

_PARALLELISM_PROBE = "SELECT max(p) + 1 FROM (SELECT spark_partition_id() AS p FROM range(65536))"


@dataclass(frozen=True)
class Capabilities:
    """What one SparkSession offers."""

    connect: bool
    """A Spark Connect client (no JVM, no SparkContext, in this process)."""
    parallelism: int

    @property
    def java_errors(self) -> bool:
        """A failed job's error carries the Java exception chain (PostgreSQL's SQLSTATE among it)."""
        return not self.connect


_lock = threading.Lock()
_known: dict[int, tuple[object, Capabilities]] = {}


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (by its class, not by the process's environment)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def capabilities(spark) -> Capabilities:
    """The capabilities of ``spark`` (measured once per session)."""
    with _lock:
        known = _known.get(id(spark))
        if known is not None and known[0] is spark:
            return known[1]
    connect = is_connect(spark)
    if connect:
        row = spark.sql(_PARALLELISM_PROBE).collect()[0]
        parallelism = max(1, int(row[0] or 1))
    else:
        parallelism = int(spark.sparkContext.defaultParallelism)
    caps = Capabilities(connect, parallelism)
    with _lock:
        _known[id(spark)] = (spark, caps)
    return caps


def forget(spark) -> None:
    """Drop what is known of a stopped session."""
    with _lock:
        _known.pop(id(spark), None)


def tag_jobs(spark, tag: str, description: str) -> None:
    """Name the jobs this thread starts from now on ``tag`` (and only that).

    While a refresh counts its jobs on this thread (:mod:`pgtrickle.spark.jobs`),
    its own unique job group replaces ``tag``.
    """
    group = jobs.group_for(tag)
    connect = is_connect(spark)
    jobs.note_session(spark, connect)
    if connect:
        spark.clearTags()
        spark.addTag(group)
    else:
        spark.sparkContext.setJobGroup(group, description, True)


def join_count(spark) -> None:
    """Put the jobs this thread starts on ``spark`` into the job group of the refresh counted on it
    (once per session and count; nothing when no count is active)."""
    count = jobs.active()
    if count is not None and not any(s is spark for s in count.sessions):
        tag_jobs(spark, count.group, count.description)


def interrupt_all(spark) -> None:
    """Cancel every job the session is running."""
    if is_connect(spark):
        spark.interruptAll()
    else:
        spark.sparkContext.cancelAllJobs()
