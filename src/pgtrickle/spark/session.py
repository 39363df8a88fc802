"""One long-lived SparkSession for the daemon (starting one costs ~5 s).

Any Spark setting can be given through :class:`~pgtrickle.config.Settings`
(``spark_master``, ``spark_conf``); the PostgreSQL JDBC driver jar is put on
the classpath of the driver and shipped to executors with ``spark.jars``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from pgtrickle.config import Settings
from pgtrickle.errors import SparkError

log = logging.getLogger(__name__)

_lock = threading.Lock()
_session = None
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
        "spark.local.dir": str(settings.spark_local_dir),
        "spark.driver.memory": "2g",
        "spark.sql.warehouse.dir": str(settings.spark_local_dir / "warehouse"),
        "spark.driver.extraJavaOptions":
            f"-Dderby.system.home={settings.spark_local_dir} -Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        # Identifiers arrive already case-folded by PostgreSQL; "A" and "a" are different columns.
        "spark.sql.caseSensitive": "true",
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


def get_spark(settings: Settings):  # type: ignore[no-untyped-def]
    """The process's SparkSession, created on first use."""
    global _session, _startup_seconds
    with _lock:
        if _session is not None:
            return _session
        jar = check_jdbc_jar(settings)
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
        started = time.monotonic()
        try:
            session = builder.getOrCreate()
        except Exception as exc:  # noqa: BLE001 - Spark raises many kinds
            raise SparkError(
                f"Spark could not start with master {settings.spark_master!r}: {exc}"
            ) from exc
        session.sparkContext.setLogLevel("ERROR")
        _startup_seconds = time.monotonic() - started
        log.info("SparkSession started in %.1fs (master %s)", _startup_seconds, settings.spark_master)
        _session = session
        return session


def startup_seconds() -> float | None:
    return _startup_seconds


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
