"""Fault injection for crash tests: SIGKILL this process at a named point.

Set ``PGTRICKLE_FAULT_POINT=name[:nth[:delay]]`` in the environment of a
pgtrickle process (``pgtrickle run``, ``pgtrickle refresh``) and the
``nth`` time (default 1) the code passes :func:`point` with that ``name``
the process kills itself with SIGKILL — no cleanup, no ``finally``, no
rollback sent to PostgreSQL, exactly like ``kill -9`` or the OOM killer.
With a ``delay`` (seconds) the kill comes that long after the point was
reached, while the work after it runs (e.g. in the middle of a Spark job).
A line naming the point goes to stderr first, so a test can tell where the
process died.

Unset (the production case) :func:`point` only reads one environment
variable and returns. A malformed value raises :class:`ConfigError` at the
first point reached, so a crash test with a typo fails loudly instead of
never crashing.

The points (see docs/RELIABILITY.md):

==========================  ==========================================================
``refresh.spark_job``       the snapshot is exported and the Spark views are set up;
                            the Spark job (JDBC reads, compute) starts next
``refresh.apply``           inside the apply transaction: the stream table's contents
                            are changed, the frontier is not advanced yet
``refresh.before_commit``   the last statement of the apply transaction has run
``refresh.after_commit``    the apply transaction has committed
``wal.before_flush``        the WAL decoder wrote a batch, not committed yet
``wal.after_flush``         the decoder committed a batch, the server is not told yet
==========================  ==========================================================
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import Counter
from dataclasses import dataclass

from pgtrickle.errors import ConfigError

ENV = "PGTRICKLE_FAULT_POINT"

POINTS = frozenset(
    {
        "refresh.spark_job",
        "refresh.apply",
        "refresh.before_commit",
        "refresh.after_commit",
        "wal.before_flush",
        "wal.after_flush",
    }
)


@dataclass(frozen=True)
class FaultSpec:
    """Kill the process the ``nth`` time ``name`` is reached, ``delay`` seconds later."""

    name: str
    nth: int = 1
    delay: float = 0.0


def parse(raw: str) -> FaultSpec:
    """``name[:nth[:delay]]`` → :class:`FaultSpec` (pure)."""
    parts = raw.strip().split(":")
    if len(parts) > 3 or parts[0] not in POINTS:
        raise ConfigError(
            f"{ENV} must look like name[:nth[:delay]] with name one of {', '.join(sorted(POINTS))}; "
            f"got {raw!r}"
        )
    try:
        nth = int(parts[1]) if len(parts) > 1 else 1
        delay = float(parts[2]) if len(parts) > 2 else 0.0
    except ValueError:
        raise ConfigError(
            f"{ENV}: nth must be an integer and delay a number of seconds; got {raw!r}"
        ) from None
    if nth < 1 or not 0.0 <= delay <= 3600.0:
        raise ConfigError(f"{ENV}: nth must be at least 1 and delay between 0 and 3600 seconds; got {raw!r}")
    return FaultSpec(parts[0], nth, delay)


_lock = threading.Lock()
_hits: Counter[str] = Counter()
_parsed: dict[str, FaultSpec] = {}


def point(name: str) -> None:
    """A named point of the refresh / decode path: kill the process here when ``PGTRICKLE_FAULT_POINT`` says so."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    spec = _parsed.get(raw)
    if spec is None:
        spec = _parsed.setdefault(raw, parse(raw))
    if spec.name != name:
        return
    with _lock:
        _hits[name] += 1
        if _hits[name] != spec.nth:
            return
    when = f" in {spec.delay:g}s" if spec.delay else ""
    sys.stderr.write(f"pgtrickle: fault point {name} reached (hit {spec.nth}); SIGKILL{when} ({ENV}={raw})\n")
    sys.stderr.flush()
    if spec.delay:
        timer = threading.Timer(spec.delay, _kill)
        timer.daemon = True
        timer.start()
    else:
        _kill()


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
