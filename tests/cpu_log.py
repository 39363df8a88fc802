"""Per-test CPU seconds, for measuring the suite on a shared machine (docs/TESTING.md).

Wall time on the shared 2-core machine mostly measures the other engineers' load; CPU seconds
do not. With ``PGTRICKLE_TEST_CPU_LOG=<file>`` every test (set-up, call and tear-down together)
appends one JSON line to ``<file>``: its node id, wall seconds, CPU seconds of the pytest process
and of every process below it (the session's Spark JVM, the PostgreSQL server, daemons and
``pgtrickle refresh`` processes the test starts), the pytest-xdist worker and the load average at
its end. Unset (the default), nothing is measured.

The CPU of a process is read as the kernel keeps it: its own user + system seconds and those of
its children it has waited for (``/proc/<pid>/stat``; pytest's own through ``getrusage``), so a
daemon or ``pgtrickle refresh`` process that started and ended within the test counts. Not
counted: processes no longer below pytest — the PostgreSQL server (``pg_ctl`` detaches it) and a
process whose parent was killed before waiting for it (a SIGKILLed daemon's JVM). When such a
process was below pytest at the test's start and is gone at its end (``"ended"`` > 0: the session's
Spark Connect server stopped in the last test's tear-down), its CPU leaves the sum and the line's
``cpu`` is too low, even negative. The log lines are appended as tests finish, so a run stopped
early keeps them.
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
    """User + system CPU seconds of a process and of its waited-for children, from the text of its
    ``/proc/<pid>/stat`` (utime, stime, cutime, cstime) (pure)."""
    # The command name (field 2) is in parentheses and may hold spaces: fields count from its end.
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15]) / ticks


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


def tree_cpu_seconds() -> tuple[float, set[int]]:
    """CPU seconds of this process, of its waited-for children and of every live process below it;
    and the live processes below it.

    A process reaped between two readings moves from the live sum into its parent's children's
    seconds, so the difference of two readings is the CPU spent between them."""
    total, live = 0.0, set()
    stack = _children(os.getpid())
    while stack:
        pid = stack.pop()
        text = _read(f"/proc/{pid}/stat")
        if text is not None:
            total += stat_cpu_seconds(text, _TICKS)
            live.add(pid)
            stack += _children(pid)
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total, live


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    (cpu, live), wall = tree_cpu_seconds(), time.monotonic()
    yield
    cpu_end, live_end = tree_cpu_seconds()
    line = {
        "id": item.nodeid,
        "wall": round(time.monotonic() - wall, 2),
        "cpu": round(cpu_end - cpu, 2),
        # processes below pytest at the start that are gone at the end: see the module docstring
        "ended": len(live - live_end),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
        "load": float((_read("/proc/loadavg") or "0").split()[0]),
        "end": time.strftime("%H:%M:%S"),
    }
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")
