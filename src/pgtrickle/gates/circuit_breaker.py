"""The circuit breaker's decision: is this refresh's change volume anomalous? (pure)

The metric is the number of captured changes pending for the refresh
window, counted per source from the change buffers before any Spark job
starts (the same count the refresh plan uses). Deletions are judged on their
own too: a mass DELETE is the main danger.

Modes
-----
``fixed``     trip above ``ceiling`` changes, or above ``max_ratio`` × the
              sources' row count.
``adaptive``  trip above μ + k·σ of the recent refreshes (``window`` of them,
              or an exponentially weighted average with ``baseline='ewma'``);
              with a ``ceiling`` it is the seed's combined option C: the
              ceiling trips whatever the baseline says.

σ has a floor: a count of independent changes varies at least like a
Poisson count (variance μ), and real write traffic is burstier than that, so
σ is never taken below √(2μ) (nor below 1) — a perfectly steady history does
not trip on +1, and 200 refreshes of Poisson-distributed volume trip nothing
at the default k = 3. For deletions the floor is also a tenth of the mean
total volume, so that a few deletions in a history without any do not trip. Until the window holds ``window`` refreshes
(cold start) the adaptive test is not trusted and the backstop ``cold_start_ceiling``
applies instead. A TRUNCATE of a source trips any enabled breaker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BreakerConfig:
    mode: str  # 'none' | 'fixed' | 'adaptive'
    ceiling: int | None = None
    max_ratio: float | None = None
    sensitivity: float = 3.0
    window: int = 20
    baseline: str = "window"  # 'window' | 'ewma'
    cold_start_ceiling: int = 100_000


@dataclass(frozen=True)
class Volume:
    """Changes pending for one refresh window, over all sources."""

    total: int
    deletes: int
    truncated: tuple[str, ...] = ()
    source_rows: float = 0.0


@dataclass(frozen=True)
class Baseline:
    mean: float
    stddev: float
    deletes_mean: float
    deletes_stddev: float
    samples: int


@dataclass(frozen=True)
class TripDecision:
    trip: bool
    reason: str
    threshold: float | None
    baseline: Baseline | None


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def _ewma(values: Sequence[float], span: int) -> tuple[float, float]:
    """Exponentially weighted mean and standard deviation, oldest value first."""
    if not values:
        return 0.0, 0.0
    alpha = 2.0 / (span + 1.0)
    mean = float(values[0])
    var = 0.0
    for v in values[1:]:
        diff = v - mean
        incr = alpha * diff
        mean += incr
        var = (1.0 - alpha) * (var + diff * incr)
    return mean, math.sqrt(var)


def compute_baseline(history: Sequence[tuple[int, int]], window: int, method: str) -> Baseline:
    """Baseline from past refreshes' (total, deletes), oldest first.

    ``window``: the last ``window`` refreshes. ``ewma``: all given history
    (callers pass a few windows' worth), weighted with span ``window``.
    """
    if method == "ewma":
        totals = [float(t) for t, _ in history]
        deletes = [float(d) for _, d in history]
        mean, std = _ewma(totals, window)
        dmean, dstd = _ewma(deletes, window)
        return Baseline(mean, std, dmean, dstd, min(len(history), window))
    recent = history[-window:] if window > 0 else []
    mean, std = _mean_std([float(t) for t, _ in recent])
    dmean, dstd = _mean_std([float(d) for _, d in recent])
    return Baseline(mean, std, dmean, dstd, len(recent))


def thresholds(baseline: Baseline, sensitivity: float) -> tuple[float, float]:
    """(total threshold, deletions threshold) with the σ floors."""
    sigma = max(baseline.stddev, math.sqrt(2.0 * max(baseline.mean, 0.0)), 1.0)
    d_sigma = max(
        baseline.deletes_stddev, math.sqrt(2.0 * max(baseline.deletes_mean, 0.0)), 0.1 * baseline.mean, 1.0
    )
    return baseline.mean + sensitivity * sigma, baseline.deletes_mean + sensitivity * d_sigma


def should_trip(config: BreakerConfig, volume: Volume, history: Sequence[tuple[int, int]]) -> TripDecision:
    """Decide whether the breaker trips for this refresh window."""
    if config.mode == "none":
        return TripDecision(False, "circuit breaker disabled", None, None)
    if volume.truncated:
        return TripDecision(True, f"source {', '.join(volume.truncated)} was truncated", None, None)
    if config.ceiling is not None and volume.total > config.ceiling:
        return TripDecision(
            True, f"delta {volume.total} exceeds the ceiling {config.ceiling}", float(config.ceiling), None
        )
    if config.mode == "fixed":
        if config.max_ratio is not None and volume.source_rows > 0:
            limit = config.max_ratio * volume.source_rows
            if volume.total > limit:
                return TripDecision(
                    True,
                    f"delta {volume.total} exceeds {config.max_ratio:g} × {volume.source_rows:,.0f} "
                    f"source rows ({limit:,.0f})",
                    limit,
                    None,
                )
        threshold = float(config.ceiling) if config.ceiling is not None else None
        return TripDecision(False, "within the fixed limits", threshold, None)
    baseline = compute_baseline(history, config.window, config.baseline)
    if baseline.samples < config.window:
        if volume.total > config.cold_start_ceiling:
            return TripDecision(
                True,
                f"delta {volume.total} exceeds the cold-start ceiling {config.cold_start_ceiling} "
                f"({baseline.samples} of {config.window} refreshes in the baseline)",
                float(config.cold_start_ceiling),
                baseline,
            )
        return TripDecision(
            False,
            f"cold start: {baseline.samples} of {config.window} refreshes in the baseline",
            float(config.cold_start_ceiling),
            baseline,
        )
    limit, d_limit = thresholds(baseline, config.sensitivity)
    k = config.sensitivity
    if volume.deletes > d_limit:
        return TripDecision(
            True,
            f"deletions {volume.deletes} exceed the adaptive threshold {d_limit:.0f} "
            f"(μ={baseline.deletes_mean:.0f}, {k:g}σ={d_limit - baseline.deletes_mean:.0f})",
            d_limit,
            baseline,
        )
    if volume.total > limit:
        return TripDecision(
            True,
            f"delta {volume.total} exceeds adaptive threshold {limit:.0f} "
            f"(μ={baseline.mean:.0f}, {k:g}σ={limit - baseline.mean:.0f})",
            limit,
            baseline,
        )
    return TripDecision(False, f"within the adaptive threshold {limit:.0f}", limit, baseline)
