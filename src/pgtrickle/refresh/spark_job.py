"""The Spark side of one refresh's job: its shuffle sized to the delta, and data errors.

Used by the lone differential refresh (refresh/differential.py) and by batches (refresh/batch.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pgtrickle.spark.capabilities import capabilities

LIMIT_FIRST_ROUND = 100_000
"""Partitions a collect's LIMIT scans in its first round (Spark's default, 1, then 4x more per
round, runs a job per round over a plan of many partitions)."""


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
