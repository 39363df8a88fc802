#!/bin/sh
# Make sure the PostgreSQL JDBC driver Spark needs is present.
# Its location is $PGTRICKLE_JDBC_JAR, default /usr/share/java/postgresql.jar
# (Debian's libpostgresql-jdbc-java). Installs that package when missing.
set -eu
JAR="${PGTRICKLE_JDBC_JAR:-/usr/share/java/postgresql.jar}"
if [ -f "$JAR" ]; then
    exit 0
fi
if [ -n "${PGTRICKLE_JDBC_JAR:-}" ]; then
    echo "error: PGTRICKLE_JDBC_JAR=$JAR does not exist" >&2
    exit 1
fi
echo "The PostgreSQL JDBC driver is missing; installing Debian's libpostgresql-jdbc-java" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "error: run as root, or install libpostgresql-jdbc-java, or set PGTRICKLE_JDBC_JAR" >&2
    exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libpostgresql-jdbc-java >/dev/null
test -f "$JAR"
