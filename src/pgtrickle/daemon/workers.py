"""Parallel refreshes: a pool of workers running a tick's units as soon as their upstreams are done.

With ``max_parallel_refreshes`` N > 1 the daemon keeps N workers, each with
its own :class:`~pgtrickle.refresh.engine.Refresher` (PostgreSQL connection,
advisory locks) and its own Spark session (:func:`~pgtrickle.spark.session.child_session`:
separate temporary views and SQL settings over the one SparkContext; worker 0
uses the process's session), and
submits each worker's jobs in a fair scheduler pool of its own. The daemon's
main thread decides (which unit may start: :class:`~pgtrickle.scheduler.ready.ReadySet`;
is it due) and merges the results; workers only refresh. With N = 1 the
units run one after the other in the main thread, on the daemon's own
refresher, exactly as before parallel refreshes existed.

Analyses, layouts and differential plans are shared by every worker
(:mod:`pgtrickle.refresh.engine` caches them per database, thread-safely).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import psycopg

from pgtrickle.catalog.store import StreamTable
from pgtrickle.config import Settings
from pgtrickle.daemon.units import TickReport, Worker
from pgtrickle.refresh.engine import Cancelled, Refresher
from pgtrickle.scheduler.batches import BatchFacts, batches, spread_size, why_alone
from pgtrickle.scheduler.ready import ReadySet, Unit

log = logging.getLogger(__name__)

Job = Callable[[Worker], TickReport]
"""A unit's refresh, run on a worker (``None`` from ``prepare``: nothing due, the unit is done)."""


class ChildSpark:
    """A worker's Spark session, made from the process's session on first use (again if that one changed).

    Worker 0 uses the process's session itself (the daemon's own refresher uses it only when the
    pool does not run), so work that runs one unit at a time -- a chain -- needs no second session.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self._lock = threading.Lock()
        self._parent: Any = None
        self.session: Any = None

    def __call__(self, settings: Settings) -> Any:
        from pgtrickle.spark.session import child_session, get_spark

        parent = get_spark(settings)
        if self.index == 0:
            return parent
        with self._lock:
            if self.session is None or self._parent is not parent:
                self.session = child_session(parent, settings)
                self._parent = parent
            return self.session

    def cancel(self) -> None:
        from pgtrickle.spark.capabilities import interrupt_all

        if self.session is not None:
            interrupt_all(self.session)

    def close(self) -> None:
        from pgtrickle.spark.capabilities import forget, is_connect

        session, self.session = self.session, None
        if session is not None and is_connect(session):
            forget(session)
            try:
                session.stop()  # a Spark Connect child is a server session of its own
            except Exception:
                log.debug("closing a worker's Spark Connect session failed", exc_info=True)


class WorkerPool:
    """``size`` workers with their own connections and Spark sessions, made on first use."""

    def __init__(self, settings: Settings, dsn: str, size: int, progress: Callable[[str], None]) -> None:
        self.settings = settings
        self.dsn = dsn
        self.size = size
        self.progress = progress
        self.workers: list[Worker] = []
        self._sparks: list[ChildSpark] = []
        self._executor: ThreadPoolExecutor | None = None

    def _start(self) -> None:
        if self.workers:
            return
        for index in range(self.size):
            spark = ChildSpark(index)
            refresher = Refresher(self.settings, self.dsn, progress=self.progress, spark_provider=spark)
            self.workers.append(Worker(index, refresher, refresher.conn))
            self._sparks.append(spark)
        self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="pgtrickle-refresh")

    def connections(self) -> list[psycopg.Connection]:
        return [c for w in self.workers for c in w.connections()]

    def run(
        self,
        ready: ReadySet,
        prepare: Callable[[Unit], Job | None],
        done: Callable[[Unit, TickReport], None],
        stop: Callable[[], bool],
        batching: Batching | None = None,
    ) -> None:
        """Run the tick's units on the workers; see :func:`run_units`."""
        self._start()
        assert self._executor is not None
        executor = self._executor
        free = list(range(len(self.workers)))  # a heap: the lowest free worker first (its caches are warm)
        free_lock = threading.Lock()

        def submit(job: Job) -> Future[TickReport]:
            with free_lock:
                index = heapq.heappop(free)  # never empty: at most `size` units run at once

            def task() -> TickReport:
                worker = self.workers[index]
                try:
                    from pgtrickle.spark.session import use_pool

                    use_pool(worker.refresher.spark, f"pgtrickle-{index}")
                    return job(worker)
                finally:
                    with free_lock:
                        heapq.heappush(free, index)

            return executor.submit(task)

        run_units(ready, prepare, done, stop, submit, batching)

    def cancel(self) -> None:
        """Abandon the refreshes in progress (second stop signal)."""
        for worker, spark in zip(self.workers, self._sparks, strict=True):
            worker.refresher.cancel()
            spark.cancel()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for worker, spark in zip(self.workers, self._sparks, strict=True):
            with contextlib.suppress(psycopg.Error):
                worker.refresher.close()
            spark.close()
        self.workers, self._sparks = [], []


def inline(worker: Worker) -> Callable[[Job], Future[TickReport]]:
    """Run each job at once in the calling thread, on ``worker`` (one refresh at a time)."""

    def submit(job: Job) -> Future[TickReport]:
        future: Future[TickReport] = Future()
        try:
            future.set_result(job(worker))
        except BaseException as exc:  # handed to run_units, which raises it
            future.set_exception(exc)
        return future

    return submit


@dataclass(frozen=True)
class Batching:
    """How a tick batches its ready units (scheduler/batches.py)."""

    alone: Callable[[Unit], str | None]
    """Why a unit refreshes on its own (``None``: it may join a batch)."""
    job: Callable[[Sequence[Unit]], Job]
    """The job refreshing several due units as one batch."""
    max_size: int
    follow: Callable[[Unit], Job | None] | None = None
    """The job of a unit joining a batch as a follower, if due (``None``: the tick's ``prepare``)."""


def tick_batching(
    settings: Settings,
    sts: Mapping[int, StreamTable],
    job: Callable[[Sequence[Unit]], Job],
    follow: Callable[[Unit], Job | None] | None = None,
) -> Batching | None:
    """How a tick over ``sts`` batches the stream tables ready together (``None``: max_batch_size 1)."""
    size = settings.max_batch_size
    if size <= 1:
        return None
    facts = {
        i: BatchFacts(st.refresh_mode, st.frontier is not None, st.needs_reinit) for i, st in sts.items()
    }
    connect = settings.spark_remote is not None
    return Batching(lambda unit: why_alone(unit, facts.get(unit.key), size, connect), job, size, follow)


def _chunks(waiting: Sequence[Unit], batching: Batching | None, free: int) -> list[list[Unit]]:
    """The units that may start now, as the jobs they start as: batches spread over the free slots."""
    if batching is None:
        return [[u] for u in waiting]
    alone = sum(1 for u in waiting if batching.alone(u) is not None)
    size = spread_size(len(waiting) - alone, alone, free, batching.max_size)
    return batches(waiting, batching.alone, size)


def _followers(
    ready: ReadySet,
    due: Sequence[tuple[Unit, Job]],
    batching: Batching,
    prepare: Callable[[Unit], Job | None],
) -> list[tuple[Unit, Job]]:
    """The due units downstream of ``due`` that join its batch (``ReadySet.can_follow``, in
    dependency order, up to ``max_batch_size`` in all): the batch computes each from its upstream
    units' deltas in the same Spark job (refresh/chained.py) instead of one job per level."""
    taken = [u.key for u, _ in due]
    out: list[tuple[Unit, Job]] = []
    for unit in ready.units:
        if len(taken) >= batching.max_size:
            break
        if not ready.can_follow(unit.key, taken) or batching.alone(unit) is not None:
            continue
        job = (batching.follow or prepare)(unit)
        if job is not None:
            out.append((unit, job))
            taken.append(unit.key)
    return out


def run_units(
    ready: ReadySet,
    prepare: Callable[[Unit], Job | None],
    done: Callable[[Unit, TickReport], None],
    stop: Callable[[], bool],
    submit: Callable[[Job], Future[TickReport]],
    batching: Batching | None = None,
) -> None:
    """Run every unit of ``ready``, each once the units it reads from finished.

    ``prepare`` (in the calling thread, when the unit may start) decides whether it is due and
    returns its job, or ``None``; ``done`` (in the calling thread) takes each job's report. When
    ``stop()`` turns true, nothing more starts; running jobs finish. A job that raises (a
    :class:`Cancelled` refresh, a lost connection) stops the tick the same way, and the first
    such error is raised once the running jobs are done.

    With ``batching``, the units that may start now are cut into batches spread over the free
    slots (:func:`~pgtrickle.scheduler.batches.batches`,
    :func:`~pgtrickle.scheduler.batches.spread_size`): the due units of a batch run as one job
    in one slot (``batching.job``); a batch with one due unit runs that unit's own job.
    """
    running: dict[Future[TickReport], list[Unit]] = {}
    error: BaseException | None = None
    while not ready.finished:
        if error is not None or stop():
            ready.skip_rest()
        skipped = False
        free = ready.limit - ready.slots_used
        waiting = ready.waiting()
        chunks = _chunks(waiting, batching, free)
        for chunk in chunks[: max(0, free)]:
            due: list[tuple[Unit, Job]] = []
            for unit in chunk:
                job = prepare(unit)
                if job is None:
                    ready.start(unit.key)
                    ready.finish(unit.key)
                    skipped = True
                else:
                    due.append((unit, job))
            if due and batching is not None:
                due += _followers(ready, due, batching, prepare)
            if due:
                ready.start_together([u.key for u, _ in due])
                units = [u for u, _ in due]
                whole = due[0][1] if len(due) == 1 or batching is None else batching.job(units)
                running[submit(whole)] = units
            if skipped:
                break  # finishing it may have made others ready, earlier in dependency order
        if skipped:
            continue
        if not running:
            if not ready.finished:
                raise RuntimeError(
                    "no unit can start and none is running: the tick's dependencies are inconsistent"
                )
            break
        finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for future in sorted(finished, key=lambda f: running[f][0].key):
            units = running.pop(future)
            for unit in units:
                ready.finish(unit.key)
            exc = future.exception()
            if exc is None:
                done(units[0], future.result())
            elif error is None or (isinstance(error, Cancelled) and not isinstance(exc, Cancelled)):
                error = exc
    if error is not None:
        raise error
