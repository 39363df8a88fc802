"""Per-test CPU seconds, for measuring the suite on a shared machine (docs/TESTING.md).

Wall time on the shared 2-core machine mostly measures the other engineers' load; CPU seconds
do not. With ``PGTRICKLE_TEST_CPU_LOG=<file>`` every test (set-up, call and tear-down together)
appends one JSON line to ``<file>``: its node id, wall seconds, CPU seconds of the pytest process
and of every process below it (the session's Spark JVM, the PostgreSQL server, daemons and
``pgtrickle refresh`` processes the test starts), the pytest-xdist worker and the load average at
its end. Unset (the default), nothing is measured.

A process that ended during the test counts with the CPU it had when last seen (at the test's
start, or never, if it started and ended within the test): a lower bound for short-lived
processes. The log lines are appended as tests finish, so a run stopped early keeps them.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "PGTRICKLE_TEST_CPU_LOG"
_TICKS = os.sysconf("SC_CLK_TCK")


def stat_cpu_seconds(stat: str, ticks: int) -> float:
    """User + system CPU seconds from the text of a ``/proc/<pid>/stat`` (pure)."""
    # The command name (field 2) is in parentheses and may hold spaces: fields count from its end.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        text = _read(f"/proc/{pid}/task/{task}/children")
        out += [int(child) for child in (text or "").split()]
    return out


class TreeCpu:
    """CPU seconds of this process and every process below it, remembered across readings."""

    def __init__(self) -> None:
        self._last: dict[int, float] = {}

    def seconds(self) -> float:
        stack = _children(os.getpid())
        while stack:
            pid = stack.pop()
            text = _read(f"/proc/{pid}/stat")
            if text is not None:
                self._last[pid] = stat_cpu_seconds(text, _TICKS)
                stack += _children(pid)
        own = resource.getrusage(resource.RUSAGE_SELF)
        return own.ru_utime + own.ru_stime + sum(self._last.values())


_tree = TreeCpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    cpu, wall = _tree.seconds(), time.monotonic()
    yield
    line = {
        "id": item.nodeid,
        "wall": round(time.monotonic() - wall, 2),
        "cpu": round(_tree.seconds() - cpu, 2),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
        "load": float((_read("/proc/loadavg") or "0").split()[0]),
        "end": time.strftime("%H:%M:%S"),
    }
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")
