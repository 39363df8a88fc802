"""pgtrickle: self-maintaining stream tables for PostgreSQL, computed on Apache Spark."""

__version__ = "0.1.0"
