"""The Spark side of one refresh's job: its shuffle sized to the delta, and data errors.

Used by the lone differential refresh (refresh/differential.py) and by batches (refresh/batch.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pgtrickle.spark.capabilities import capabilities

LIMIT_FIRST_ROUND = 100_000
"""Partitions a collect's LIMIT scans in its first round (Spark's default, 1, then 4x more per
round, runs a job per round over a plan of many partitions)."""


WHOLE_STAGE_CODEGEN = "spark.sql.codegen.wholeStage"
CODEGEN_FACTORY_MODE = "spark.sql.codegen.factoryMode"
"""How Spark builds the projections, predicates and orderings of each operator: generated and
compiled Java (``FALLBACK``, its default: compiled, interpreted where that fails) or interpreted
(``NO_CODEGEN``). Read by the tasks (the session's SQL settings travel with each job)."""
INTERPRETED = "NO_CODEGEN"
INTERPRETED_MAX_CHANGES = 100_000
"""A refresh's plans run without whole-stage code generation below this many changes when they
read few rows whole (:func:`compiles`)."""
COMPILED_MIN_ROWS_READ = 1_000_000
"""Rows read whole (tables, hidden state tables, the stream table's own rows: their planner
estimates) from which a refresh's plans get whole-stage code generation (:func:`compiles`)."""
ROWS_READ_WHOLE = "rows_read_whole"
"""The timings key summing the estimated rows of a refresh's reads not bounded by keys or windows
(refresh/delta_reads.py)."""


def compiles(changes: int, rows_read_whole: float) -> bool:
    """Whether a batch's plans, or a lone refresh's plans computed in parts, are worth Spark's
    whole-stage code generation (pure).

    Code generation compiles Java for every stage of a plan when the plan is prepared, and for
    every operator's projections and predicates when a task runs it: worth it for millions of
    rows, not for a union of many small plans or a plan of many stages over a delta read through
    change windows, key-filtered reads and a few small tables read whole. A batch of 60 one-row
    deltas (a fan of stream tables) spent 2.1-2.9 s in its one task with whole-stage code
    generation, 0.7-1.0 s without (docs/BENCHMARKS.md, "Scheduler overhead"), and 0.17 s with its
    operators interpreted too (1.6 s compiling them); TPC-H Q13, Q18, Q21, Q22 at scale
    factor 1 (hidden state tables, ~30 stages, at most a 150,000-row table read whole) refreshed in
    0.71-0.91 of the time without (docs/BENCHMARKS.md, "Code generation for plans in parts"). Plans
    reading a million rows or more whole keep it.
    """
    return rows_read_whole >= COMPILED_MIN_ROWS_READ or changes >= INTERPRETED_MAX_CHANGES


def lone_compiles(changes: int, rows_read_whole: float, in_parts: bool) -> bool:
    """Whether a lone differential refresh's next plan gets whole-stage code generation (pure):
    ``in_parts`` - the refresh computes hidden state tables' changes or sub-plans first, then one
    action over them - as :func:`compiles` says; a plan in one piece always (a delta aggregated
    over the stream table's stored state: 10,000 changes to a 1M-row table refreshed ~10 % slower
    without, and TPC-H Q1 too)."""
    return not in_parts or compiles(changes, rows_read_whole)


@contextmanager
def code_generation(spark: Any) -> Iterator[Callable[[bool], None]]:
    """Within: ``switch(on)`` turns Spark's code generation on or off - whole-stage code generation
    for the plans planned next, and compiled operators (:data:`CODEGEN_FACTORY_MODE`) for the jobs
    run next. On means the session's own settings (a session configured without either stays
    without); the session's settings come back after."""
    saved = {key: spark.conf.get(key) for key in (WHOLE_STAGE_CODEGEN, CODEGEN_FACTORY_MODE)}

    def switch(on: bool) -> None:
        spark.conf.set(WHOLE_STAGE_CODEGEN, (saved[WHOLE_STAGE_CODEGEN] or "true") if on else "false")
        if on and saved[CODEGEN_FACTORY_MODE] is None:
            spark.conf.unset(CODEGEN_FACTORY_MODE)
        else:
            spark.conf.set(CODEGEN_FACTORY_MODE, saved[CODEGEN_FACTORY_MODE] if on else INTERPRETED)

    try:
        yield switch
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def data_error_state(exc: BaseException) -> str | None:
    """The SQLSTATE of a Spark error of class 22 (data exception: overflow, invalid cast, division
    by zero...), ``None`` for any other error (pure)."""
    get = getattr(exc, "getSqlState", None)
    state = get() if callable(get) else None
    return state if isinstance(state, str) and state.startswith("22") else None


@contextmanager
def shuffle_sized(spark: Any, changes: int, one_round: bool = False) -> Iterator[None]:
    """Within: Spark's shuffle sized to a delta of ``changes`` rows, not to the sources (small
    deltas skip AQE's re-planning); with ``one_round`` a LIMIT scans every partition in its first
    round (one job: a batch's union of many plans has many partitions). The session's settings
    come back after."""
    partitions = max(1, min(capabilities(spark).parallelism, 1 + changes // 50_000))
    tuned = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.enabled": "false" if changes < 100_000 else "true",
    }
    if one_round:
        tuned["spark.sql.limit.initialNumPartitions"] = str(LIMIT_FIRST_ROUND)
    saved = {key: spark.conf.get(key) for key in tuned}
    for key, value in tuned.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
