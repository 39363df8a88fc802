"""How long Spark spends planning a refresh's query, and how large the plan is.

A delta plan with kept nodes can cost more to plan than to run (the optimizer walks every
operator many times), so a refresh records, per query it runs, in its timings:

- ``<label>_analysis``: seconds of ``spark.sql`` (parsing and analysis, done eagerly);
- ``<label>_planning``: seconds of the optimizer and the physical planner, forced before the
  action (the action then reuses the planned query, so nothing is planned twice);
- ``<label>_operators``: the operators of the optimized logical plan (its tree's nodes).

Several queries with one label add up. A Spark Connect session plans on the server, where this
process cannot see it: only the analysis seconds are recorded there.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pgtrickle.spark.numeric import ensure_functions

log = logging.getLogger(__name__)


def sql(spark: Any, text: str, timings: dict[str, float], label: str) -> Any:
    """``spark.sql(text)``, its analysis seconds added to ``timings[label + '_analysis']`` (the
    numeric division functions registered first when ``text`` calls them: spark/numeric.py)."""
    ensure_functions(spark, text)
    started = time.monotonic()
    df = spark.sql(text)
    _add(timings, f"{label}_analysis", time.monotonic() - started)
    return df


def planned(df: Any, timings: dict[str, float], label: str) -> Any:
    """``df``, optimized and physically planned now, the seconds and the plan's operators added to
    ``timings`` (see the module docstring); run the action on this very ``df``."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # Spark Connect: planned on the server
        return df
    execution = jdf.queryExecution()
    started = time.monotonic()
    execution.executedPlan()
    _add(timings, f"{label}_planning", time.monotonic() - started)
    _add(timings, f"{label}_operators", operator_count(execution.optimizedPlan().treeString()))
    return df


def computed_once(df: Any, timings: dict[str, float], label: str) -> Any:
    """``df`` as a leaf of the plans that read it: a lazy local checkpoint. Spark plans ``df``
    now, once (the seconds added to ``<label>_planning``, its optimized plan's operators to
    ``<label>_operators``); the plans reading it analyse and optimize one relation, not ``df``'s
    operators again at every read; the first action computes it, once, and keeps its rows for
    the other reads (:func:`release` frees them). No job runs here (with adaptive execution
    off: AQE would run ``df``'s shuffle stages now)."""
    started = time.monotonic()
    leaf = df.localCheckpoint(eager=False)
    _add(timings, f"{label}_planning", time.monotonic() - started)
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # not on Spark Connect: planned on the server
        _add(timings, f"{label}_operators", operator_count(jdf.queryExecution().optimizedPlan().treeString()))
    return leaf


def release(leaf: Any) -> None:
    """Free the rows a :func:`computed_once` leaf kept (Spark Connect frees them with the DataFrame)."""
    jdf = getattr(leaf, "_jdf", None)
    if jdf is None:
        return
    try:
        jdf.queryExecution().analyzed().rdd().unpersist(False)
    except Exception:  # freeing must never fail the refresh: Spark's cleaner frees them later
        log.warning("could not free the rows of a computed-once relation", exc_info=True)


def operator_count(tree: str) -> int:
    """The operators of a plan given as Spark's ``treeString`` (one line each) (pure)."""
    return sum(1 for line in tree.splitlines() if line.strip())


def _add(timings: dict[str, float], key: str, value: float) -> None:
    timings[key] = timings.get(key, 0) + value
