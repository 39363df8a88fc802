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
INTERPRETED_MAX_CHANGES = 100_000
"""A batch's plans run without whole-stage code generation below this many changes when no member
reads a table whole (:func:`compiles`)."""


def compiles(changes: int, whole_table_reads: int) -> bool:
    """Whether a job is worth Spark's whole-stage code generation (pure).

    Code generation compiles Java for every stage of a plan: worth it for millions of rows, not
    for a small delta read through change windows and key-filtered reads. A batch of 60 one-row
    deltas (a fan of stream tables) spent 2.1-2.9 s in its one task with it, 0.7-1.0 s without
    (docs/BENCHMARKS.md, "Scheduler overhead"). A plan reading a table whole keeps it.
    """
    return whole_table_reads > 0 or changes >= INTERPRETED_MAX_CHANGES


@contextmanager
def whole_stage_codegen(spark: Any) -> Iterator[Callable[[bool], None]]:
    """Within: ``switch(on)`` turns whole-stage code generation on or off for the plans planned
    next (on means the session's own setting: a session configured without it stays without); the
    session's setting comes back after."""
    saved = spark.conf.get(WHOLE_STAGE_CODEGEN)

    def switch(on: bool) -> None:
        spark.conf.set(WHOLE_STAGE_CODEGEN, (saved or "true") if on else "false")

    try:
        yield switch
    finally:
        if saved is None:
            spark.conf.unset(WHOLE_STAGE_CODEGEN)
        else:
            spark.conf.set(WHOLE_STAGE_CODEGEN, saved)


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
