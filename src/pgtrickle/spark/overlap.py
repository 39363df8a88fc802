"""Driver-side Spark calls that wait on I/O, overlapped: the reads of one refresh's plan.

Registering a read of a delta plan is driver work that starts no Spark job: a JDBC relation
(Spark opens a connection to PostgreSQL and asks the query's columns: a round trip), its
analysis, and a temporary view. One read costs ~50 ms on this machine, and a TPC-H Q9 refresh
registers eight, one after the other, while both cores idle for the PostgreSQL round trips.
:func:`run_all` runs such calls from a small pool of threads kept for the process (PySpark's
pinned threads: each keeps its own connection to the JVM, so the pool is reused, not rebuilt per
refresh).

The calls must start no Spark job (a job's group, which counts a refresh's jobs, is the calling
thread's: :mod:`pgtrickle.spark.jobs`); each runs in a copy of the caller's context
(``contextvars``), so what the caller records per context (:func:`pgtrickle.spark.jdbc.checked_reads`)
sees them.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["WORKERS", "run_all"]

WORKERS = 4
"""Threads of the pool: the reads of one plan wait mostly on PostgreSQL and the JVM's analysis,
which two cores run side by side; more threads than reads is no gain (TPC-H plans read 1–8)."""

_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="pgtrickle-read")
        return _pool


def run_all(calls: Sequence[Callable[[], _T]]) -> list[_T]:
    """The results of ``calls``, run side by side (one alone runs in the caller's thread). Every
    call finishes before this returns; the first to fail (in ``calls``' order) raises its error."""
    if len(calls) <= 1:
        return [call() for call in calls]
    pool = _executor()
    futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
    wait(futures)
    return [f.result() for f in futures]
