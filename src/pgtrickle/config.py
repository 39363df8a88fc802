"""Settings: where PostgreSQL and Spark are, and how pgtrickle behaves.

Every setting has a safe default and can be given by environment variable
(``PGTRICKLE_<NAME>``) or by CLI flag (which wins). Nothing here does I/O
beyond reading the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import platformdirs

from pgtrickle.errors import ConfigError

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
DEFAULT_EMBEDDED_PORT = 55432


def _default_data_dir() -> Path:
    # A root-run embedded server runs as a non-root OS user, which cannot reach
    # into /root; use the conventional service location instead.
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/pgtrickle")
    return Path(platformdirs.user_data_dir("pgtrickle"))


def _env(name: str) -> str | None:
    value = os.environ.get(f"PGTRICKLE_{name}")
    return value if value not in (None, "") else None


def _env_number(name: str, default: float, kind: type[int] | type[float]) -> float:
    raw = _env(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"PGTRICKLE_{name} must be {what}, got {raw!r}") from exc


def _parse_spark_conf(raw: str | None) -> dict[str, str]:
    """``key=value,key=value`` → dict (PGTRICKLE_SPARK_CONF)."""
    conf: dict[str, str] = {}
    if not raw:
        return conf
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"PGTRICKLE_SPARK_CONF entries must look like key=value, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def default_parallel_refreshes() -> int:
    """How many refreshes the daemon runs at once unless told: one per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


MAX_PARALLEL_REFRESHES_LIMIT = 64
"""Each parallel refresh holds its own PostgreSQL connections; more than this is refused."""

DEFAULT_MAX_BATCH_SIZE = 32
"""Stream tables refreshed together by one Spark job unless told (scheduler/batches.py)."""

MAX_BATCH_SIZE_LIMIT = 256
"""A batch holds one advisory lock and one Spark view per read of each member: more is refused."""


def _metrics_port() -> int | None:
    """PGTRICKLE_METRICS_PORT: unset, empty or ``off`` leaves the metrics server off."""
    raw = _env("METRICS_PORT")
    if raw is None or raw.lower() == "off":
        return None
    return int(_env_number("METRICS_PORT", 0, int))


@dataclass(frozen=True)
class Settings:
    """All of pgtrickle's settings in one immutable value."""

    dsn: str | None = None
    """libpq connection string or URI. ``None`` means: use the embedded server."""

    data_dir: Path = field(default_factory=_default_data_dir)
    """Where the embedded PostgreSQL keeps its data, and Spark its scratch files."""

    embedded_port: int = DEFAULT_EMBEDDED_PORT
    spark_master: str = "local[*]"
    spark_remote: str | None = None
    """Spark Connect URL (``sc://host:port``): every refresh runs on that server, no local JVM
    (``spark_master`` and ``jdbc_jar`` are then the server's business)."""

    spark_conf: dict[str, str] = field(default_factory=dict)
    jdbc_jar: str = DEFAULT_JDBC_JAR
    tick_seconds: float = 1.0
    """How often the daemon wakes up when no NOTIFY arrives."""

    jdbc_partition_rows: int = 500_000
    """Sources larger than this (by pg_class.reltuples) are read with parallel JDBC partitions."""

    metrics_port: int | None = None
    """Port the daemon serves Prometheus metrics on (``/metrics``); ``None``: off (the default); 0: any free port."""

    metrics_address: str = "127.0.0.1"
    """Address the metrics server listens on (``0.0.0.0`` to let a Prometheus on another host scrape it)."""

    max_parallel_refreshes: int = field(default_factory=default_parallel_refreshes)
    """How many refreshes (stream tables or atomic groups) the daemon runs at once; 1: one at a time."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    """How many DIFFERENTIAL refreshes ready together share one snapshot and one Spark job
    (scheduler/batches.py); 1: every stream table refreshes on its own."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_parallel_refreshes <= MAX_PARALLEL_REFRESHES_LIMIT:
            raise ConfigError(
                f"max_parallel_refreshes must be between 1 and {MAX_PARALLEL_REFRESHES_LIMIT}, "
                f"got {self.max_parallel_refreshes}"
            )
        if not 1 <= self.max_batch_size <= MAX_BATCH_SIZE_LIMIT:
            raise ConfigError(
                f"max_batch_size must be between 1 and {MAX_BATCH_SIZE_LIMIT}, got {self.max_batch_size}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"the metrics port must be between 0 and 65535, got {self.metrics_port}")

    @classmethod
    def from_env(cls) -> Settings:
        data_dir = _env("DATA_DIR")
        return cls(
            dsn=_env("DSN"),
            data_dir=Path(data_dir) if data_dir else _default_data_dir(),
            embedded_port=int(_env_number("PORT", DEFAULT_EMBEDDED_PORT, int)),
            spark_master=_env("SPARK_MASTER") or "local[*]",
            spark_remote=_env("SPARK_REMOTE"),
            spark_conf=_parse_spark_conf(_env("SPARK_CONF")),
            jdbc_jar=_env("JDBC_JAR") or DEFAULT_JDBC_JAR,
            tick_seconds=_env_number("TICK_SECONDS", 1.0, float),
            jdbc_partition_rows=int(_env_number("JDBC_PARTITION_ROWS", 500_000, int)),
            metrics_port=_metrics_port(),
            metrics_address=_env("METRICS_ADDRESS") or "127.0.0.1",
            max_parallel_refreshes=int(
                _env_number("MAX_PARALLEL_REFRESHES", default_parallel_refreshes(), int)
            ),
            max_batch_size=int(_env_number("MAX_BATCH_SIZE", DEFAULT_MAX_BATCH_SIZE, int)),
        )

    def with_overrides(self, **overrides: object) -> Settings:
        """A copy with the given non-``None`` values replaced (CLI flags)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if "data_dir" in given:
            given["data_dir"] = Path(str(given["data_dir"]))
        return replace(self, **given)  # type: ignore[arg-type]  # the CLI passes Settings fields, typed by its options

    @property
    def spark_local_dir(self) -> Path:
        return self.data_dir / "spark-tmp"
