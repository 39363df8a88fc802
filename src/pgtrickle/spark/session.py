"""One long-lived SparkSession for the daemon (starting one costs ~5 s).

A local JVM driver by default; with ``--spark-remote`` a Spark Connect client
(see :mod:`pgtrickle.spark.connect`).

Any Spark setting can be given through :class:`~pgtrickle.config.Settings`
(``spark_master``, ``spark_conf``); the PostgreSQL JDBC driver jar is put on
the classpath of the driver and shipped to executors with ``spark.jars``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pgtrickle.config import Settings
from pgtrickle.errors import SparkError

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_lock = threading.Lock()
_session = None
"""The session started last (kept for callers that look at it)."""
_sessions: dict[str | None, Any] = {}
"""Per Spark Connect URL (``None``: the local JVM driver), the session of this process."""
_startup_seconds: float | None = None


def default_conf(settings: Settings) -> dict[str, str]:
    """Spark settings pgtrickle uses unless the user overrides them."""
    cores = os.cpu_count() or 2
    return {
        "spark.app.name": "pgtrickle",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Refresh jobs are small or medium: many shuffle partitions only add overhead.
        "spark.sql.shuffle.partitions": str(max(2, cores)),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "true",
        # Exact or loud: with precision loss allowed, Spark rounds a decimal result whose type would
        # need more than 38 digits to fewer fraction digits, silently (unconstrained numeric crosses
        # as decimal(38,18): n + 1 drops its 18th fraction digit, n * n keeps 6). Without, the
        # result keeps its scale, and a value that does not fit raises NUMERIC_VALUE_OUT_OF_RANGE
        # (SQLSTATE 22003): the refresh fails saying so, as PostgreSQL would on an overflow.
        "spark.sql.decimalOperations.allowPrecisionLoss": "false",
        # A differential plan unions one term per changed input. Spark's constraint propagation
        # rewrites each union child's constraints onto the union's output and fails on some of ours
        # at planning ("key not found: p_partkey#..." in UnionBase.rewriteConstraints: TPC-H Q2
        # kept, every refresh). The filters it infers (IS NOT NULL beside joins) were measured
        # worth nothing to our plans (TPC-H Q8, Q16, Q20 DIFFERENTIAL: 22.1 s with it off against
        # 23.6 s on), so it is off.
        "spark.sql.constraintPropagation.enabled": "false",
        "spark.local.dir": str(settings.spark_local_dir),
        "spark.driver.memory": "2g",
        "spark.sql.warehouse.dir": str(settings.spark_local_dir / "warehouse"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={settings.spark_local_dir} -Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        # Identifiers arrive already case-folded by PostgreSQL; "A" and "a" are different columns.
        "spark.sql.caseSensitive": "true",
        # Parallel refreshes (max_parallel_refreshes > 1) each submit their jobs in a pool of their own
        # (use_pool): fair sharing, so one big refresh does not hold up the small ones behind it.
        "spark.scheduler.mode": "FAIR",
    }


def check_jdbc_jar(settings: Settings) -> Path:
    jar = Path(settings.jdbc_jar)
    if not jar.is_file():
        raise SparkError(
            f"the PostgreSQL JDBC driver was not found at {jar}; install it "
            "(Debian: apt-get install libpostgresql-jdbc-java) or point PGTRICKLE_JDBC_JAR "
            "/ --jdbc-jar at the jar"
        )
    return jar


_MASTER_FORMS = (
    r"local",
    r"local\[(\*|[1-9]\d*)(,[1-9]\d*)?\]",
    r"local-cluster\[\s*[1-9]\d*\s*,\s*[1-9]\d*\s*,\s*[1-9]\d*\s*\]",
    r"spark://[^/\s]+(,[^/\s]+)*",
    r"yarn",
    r"k8s://\S+",
)


def check_master(master: str) -> None:
    """Refuse a master URL Spark cannot parse, saying which forms there are (pure).

    Spark itself only reports "Java gateway process exited" for one.
    """
    if not any(re.fullmatch(form, master) for form in _MASTER_FORMS):
        raise SparkError(
            f"{master!r} is not a Spark master URL; use local, local[N], local[*], local-cluster[N,cores,MB], "
            "spark://host:port, yarn or k8s://https://host:port (--spark-master / PGTRICKLE_SPARK_MASTER)"
        )


def reach_master(master: str, timeout: float = 5.0) -> None:
    """For a standalone master (``spark://host:port[,host:port]``), fail clearly when none answers.

    Spark would start anyway, retry registering for a minute, and fail the
    first job with "SparkContext was shut down".
    """
    if not master.startswith("spark://"):
        return
    problems = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            problems.append(f"{address}: {exc}")
    raise SparkError(
        f"no Spark master answers at {master} ({'; '.join(problems)}); is the master running, "
        "and is --spark-master / PGTRICKLE_SPARK_MASTER right?"
    )


def check_java() -> str:
    """The ``java`` Spark will launch (``$JAVA_HOME/bin/java``, else the one on ``PATH``), or a clear error."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise SparkError(
                f"Spark needs Java (17 or 21), and JAVA_HOME={java_home} has no bin/java; point JAVA_HOME "
                "at a Java installation or unset it to use the java on PATH"
            )
        return str(java)
    found = shutil.which("java")
    if found is None:
        raise SparkError(
            "Spark needs Java (17 or 21) and none was found: JAVA_HOME is not set and there is no java on "
            "PATH; install one (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


def get_spark(settings: Settings):
    """The process's SparkSession, created on first use.

    With ``settings.spark_remote`` a Spark Connect session on that server
    (:mod:`pgtrickle.spark.connect`; no JVM here), else a local JVM driver
    for ``settings.spark_master``. One of each kind is kept per process.
    """
    global _session, _startup_seconds
    key = settings.spark_remote
    with _lock:
        if key in _sessions:
            return _sessions[key]
        started = time.monotonic()
        if key is not None:
            from pgtrickle.spark import connect

            session = connect.open_session(settings, default_conf(settings))
            where = f"Spark Connect server {connect.parse_remote(key).shown}"
        else:
            session = _start_local(settings)
            where = f"master {settings.spark_master}"
        _startup_seconds = time.monotonic() - started
        log.info("SparkSession started in %.1fs (%s)", _startup_seconds, where)
        _sessions[key] = session
        _session = session
        return session


def _start_local(settings: Settings):
    """A SparkSession with a JVM driver in this process."""
    jar = check_jdbc_jar(settings)
    check_master(settings.spark_master)
    check_java()
    reach_master(settings.spark_master)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings.spark_local_dir.mkdir(parents=True, exist_ok=True)
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise SparkError("pyspark is not installed; run `make setup`") from exc
    conf = default_conf(settings)
    conf.update(settings.spark_conf)
    existing_jars = conf.get("spark.jars", "")
    conf["spark.jars"] = ",".join(j for j in (existing_jars, str(jar)) if j)
    builder = SparkSession.builder.master(settings.spark_master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        session = launch(builder.getOrCreate)
    except Exception as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SparkError(
            f"Spark could not start with master {settings.spark_master!r}: {detail}; check the master "
            "(--spark-master / PGTRICKLE_SPARK_MASTER) and any PGTRICKLE_SPARK_CONF settings (the "
            "JVM's own message, if it printed one, is on standard error above)"
        ) from exc
    session.sparkContext.setLogLevel("ERROR")
    return session


#: Attempts at starting the driver JVM, and the pause before each retry (seconds). A JVM that
#: exits before handing PySpark its port is retried: seen once in CI, where one of three test
#: workers starting their JVMs at the same moment got JAVA_GATEWAY_EXITED and the others did not.
#: A JVM that cannot start at all (a bad option, no memory) fails the same way each time and is
#: reported after the last attempt, a few seconds later than without retries.
LAUNCH_ATTEMPTS = 3
LAUNCH_PAUSES = (1.0, 3.0)


def launch_failed_transiently(exc: BaseException) -> bool:
    """Whether a failed ``getOrCreate`` is the JVM exiting before it reported its port (pure).

    Decided by PySpark's error class, never by the message text."""
    error_class = getattr(exc, "getErrorClass", None)
    return callable(error_class) and error_class() == "JAVA_GATEWAY_EXITED"


def launch(start: Callable[[], _T], sleep: Callable[[float], object] = time.sleep) -> _T:
    """``start()``, retried while the JVM exits before reporting its port (up to LAUNCH_ATTEMPTS)."""
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        try:
            return start()
        except Exception as exc:
            if attempt == LAUNCH_ATTEMPTS or not launch_failed_transiently(exc):
                raise
            pause = LAUNCH_PAUSES[min(attempt, len(LAUNCH_PAUSES)) - 1]
            log.warning(
                "the Spark driver JVM exited before it started (attempt %d of %d); retrying in %.0fs",
                attempt,
                LAUNCH_ATTEMPTS,
                pause,
            )
            sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def child_session(parent, settings: Settings):
    """A session of its own for one parallel refresh worker: separate temporary views and SQL
    settings (two refreshes register views of the same names, and tune settings per job).

    A local session's child shares its SparkContext (the JVM, the executors, the cache); a Spark
    Connect session's is a new session on the same server, with pgtrickle's settings set.
    """
    from pgtrickle.spark.capabilities import is_connect

    if is_connect(parent):
        from pgtrickle.spark import connect

        return connect.open_session(settings, default_conf(settings))
    return parent.newSession()


def use_pool(session, pool: str) -> bool:
    """Submit the jobs the calling thread starts from now on in fair scheduler pool ``pool``.

    Spark Connect has no thread-local properties: there each worker's session is its own
    server session and the server schedules their jobs (its ``spark.scheduler.mode``).
    Returns whether a pool was set.
    """
    from pgtrickle.spark.capabilities import is_connect

    if is_connect(session):
        return False
    session.sparkContext.setLocalProperty("spark.scheduler.pool", pool)
    return True


def startup_seconds() -> float | None:
    return _startup_seconds


def active_sessions() -> list:
    """The sessions this process has started (to cancel their jobs)."""
    with _lock:
        return list(_sessions.values())


def cancel_all_jobs() -> None:
    """Cancel every Spark job of the sessions this process started (local or Spark Connect)."""
    from pgtrickle.spark.capabilities import interrupt_all

    for session in active_sessions():
        interrupt_all(session)


def stop_spark() -> None:
    """Stop every session this process started (a Spark Connect session only closes its client)."""
    global _session
    from pgtrickle.spark import capabilities

    with _lock:
        for session in _sessions.values():
            capabilities.forget(session)
            session.stop()
        _sessions.clear()
        _session = None


def session_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the Spark Connect server no longer knows this client's session (pure).

    A restarted server, or one that expired or closed the session, answers
    with error condition ``INVALID_HANDLE.SESSION_*``: the session can
    never work again, but a new one can.
    """
    current: BaseException | None = exc
    for _ in range(10):
        if current is None:
            return False
        condition = getattr(current, "getCondition", None)
        try:
            name = condition() if callable(condition) else None
        except Exception:
            name = None
        if isinstance(name, str) and name.startswith("INVALID_HANDLE.SESSION"):
            return True
        current = current.__cause__ or current.__context__
    return False


def discard_lost_session(exc: BaseException) -> bool:
    """After a failed refresh: forget the Spark Connect sessions if ``exc`` says the server lost them,
    so the next refresh opens a new one (the daemon keeps running). Returns whether it did."""
    if not session_lost(exc):
        return False
    from pgtrickle.spark import capabilities

    with _lock:
        for key in [k for k in _sessions if k is not None]:
            session = _sessions.pop(key)
            capabilities.forget(session)
            try:
                session.stop()
            except Exception:
                log.debug("closing a lost Spark Connect session failed", exc_info=True)
    log.warning(
        "the Spark Connect server no longer knows pgtrickle's session; the next refresh opens a new one"
    )
    return True
