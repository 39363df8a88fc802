"""One long-lived SparkSession for the daemon (starting one costs ~5 s).

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
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={settings.spark_local_dir} -Duser.timezone=UTC",
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
    """The process's SparkSession, created on first use."""
    global _session, _startup_seconds
    with _lock:
        if _session is not None:
            return _session
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
        started = time.monotonic()
        try:
            session = builder.getOrCreate()
        except Exception as exc:
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SparkError(
                f"Spark could not start with master {settings.spark_master!r}: {detail}; check the master "
                "(--spark-master / PGTRICKLE_SPARK_MASTER) and any PGTRICKLE_SPARK_CONF settings"
            ) from exc
        session.sparkContext.setLogLevel("ERROR")
        _startup_seconds = time.monotonic() - started
        log.info("SparkSession started in %.1fs (master %s)", _startup_seconds, settings.spark_master)
        _session = session
        return session


def startup_seconds() -> float | None:
    return _startup_seconds


def cancel_all_jobs() -> None:
    """Cancel every Spark job of the process's session, if one was started."""
    session = _session
    if session is not None:
        session.sparkContext.cancelAllJobs()


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
