"""How hard the property tests try: one knob for the whole suite.

``PGTRICKLE_HYPOTHESIS_PROFILE`` picks a profile:

* ``ci`` (the default): each property test is sized to run in seconds, so ``make test`` stays short;
* ``thorough``: every test tries ten times as many examples (``make stress`` uses it; a night's run).

A test states its example count for ``ci`` through :func:`examples`; the profile scales it. A test
without a count gets hypothesis' ``max_examples`` from the profile (100 in ``ci``). A test's own
environment variable (``PGTRICKLE_PROPERTY_EXAMPLES``, ``PGTRICKLE_FUZZ_EXAMPLES``), when set, wins.
"""

from __future__ import annotations

import os

from hypothesis import settings

ENV = "PGTRICKLE_HYPOTHESIS_PROFILE"

#: profile name -> how many times each test's ``ci`` example count it runs
FACTORS = {"ci": 1, "thorough": 10}


class UnknownProfileError(ValueError):
    """PGTRICKLE_HYPOTHESIS_PROFILE names no profile."""


def profile_name(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    name = environ.get(ENV, "ci").strip() or "ci"
    if name not in FACTORS:
        raise UnknownProfileError(f"{ENV}={name!r} is not a profile; use one of {', '.join(sorted(FACTORS))}")
    return name


def examples(ci: int, env: str | None = None) -> int:
    """The example count for a test that tries ``ci`` examples in the ``ci`` profile."""
    if env is not None and os.environ.get(env, "").strip():
        return int(os.environ[env])
    return ci * FACTORS[profile_name()]


def load() -> str:
    """Register the profiles with hypothesis and load the chosen one; return its name."""
    for name, factor in FACTORS.items():
        # No per-example deadline: the tests check results, not speed, and on a shared 2-core
        # machine one example of a pure test took 266 ms against hypothesis' default 200 ms.
        settings.register_profile(name, max_examples=100 * factor, deadline=None)
    name = profile_name()
    settings.load_profile(name)
    return name
