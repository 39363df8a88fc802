"""Exception hierarchy for pgtrickle.

Every error says what went wrong and, where there is one, what to do about it.
"""

from __future__ import annotations


class PgTrickleError(Exception):
    """Base class of every error pgtrickle raises on purpose."""


class ConfigError(PgTrickleError):
    """A setting is missing or invalid."""


class EmbeddedPostgresError(PgTrickleError):
    """The embedded PostgreSQL server could not be set up, started or stopped."""


class ScheduleError(PgTrickleError, ValueError):
    """A schedule string is not a duration, a cron expression or 'calculated'."""


class DependencyCycleError(PgTrickleError):
    """Stream tables depend on each other in a cycle."""


class UnsupportedQueryError(PgTrickleError):
    """The defining query uses something the Spark translation cannot run."""


class CatalogError(PgTrickleError):
    """The pgtrickle catalog is missing, too old, or inconsistent."""


class SparkError(PgTrickleError):
    """Spark could not be started or a Spark job failed."""


class SparkConnectUnreachableError(SparkError):
    """The Spark Connect server (``--spark-remote``) cannot be reached or refused the session.

    ``url`` is the server's address without its parameters (no token).
    """

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class RefreshError(PgTrickleError):
    """A refresh failed; the stream table keeps its previous contents."""


class CaptureBrokenError(RefreshError):
    """A change capture object (buffer table or view, trigger function, trigger) is missing:
    changes may have been lost. ``pgtrickle install`` recreates it; the stream tables reading the
    source are then recomputed in full."""


class ValueNotCarriedError(RefreshError):
    """A source value Spark cannot carry exactly: the refresh was refused rather than store it altered.

    ``sqlstate`` is PostgreSQL's code of the refusal: 22003 for a numeric
    value, 22008 for a date/time value (see docs/TYPES.md).
    """

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class NoDeltaRuleError(UnsupportedQueryError):
    """The defining query uses a construct the delta engine has no rule for (WITH RECURSIVE,
    LATERAL, a volatile function, ...). ``construct`` names it, for callers that branch on it."""

    def __init__(self, construct: str, detail: str = "") -> None:
        message = f"{construct} has no delta rule" + (f": {detail}" if detail else "")
        super().__init__(message)
        self.construct = construct
