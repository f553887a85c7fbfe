#!/bin/sh
# Checks what `make` cannot install by itself and says how to get it.
#   prereqs.sh python   before creating the virtualenv
#   prereqs.sh test     before running the tests
#   prereqs.sh jdk      before building the Spark connector's jar
set -u
fail=0
need() { echo "tidegate: missing prerequisite: $1" >&2; echo "  install it with: $2" >&2; fail=1; }

case "${1:-}" in
python)
  PY=${PYTHON:-python3}
  if ! command -v "$PY" >/dev/null 2>&1; then
    need "$PY (Python >= 3.11)" "apt-get install python3 python3-venv"
  elif ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    need "Python >= 3.11 (found $("$PY" --version 2>&1))" "apt-get install python3.11 python3.11-venv"
  elif ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    need "the venv module with ensurepip" "apt-get install python3-venv"
  fi
  ;;
test)
  command -v redis-server >/dev/null 2>&1 || need "redis-server (the tests start their own)" "apt-get install redis-server"
  pg_ok=0
  if command -v initdb >/dev/null 2>&1; then pg_ok=1
  else for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && pg_ok=1; done; fi
  [ "$pg_ok" = 1 ] || need "PostgreSQL's server binaries (the tests start their own server)" "apt-get install postgresql"
  java_ok=0
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then java_ok=1
  elif command -v java >/dev/null 2>&1; then java_ok=1; fi
  [ "$java_ok" = 1 ] || need "a Java 17+ runtime (Spark runs the tiering tests in local[2] and on a standalone cluster)" "apt-get install openjdk-17-jre-headless"
  # The console's browser tests drive Debian's Chromium (never a browser Playwright downloads).
  [ -x /usr/bin/chromium ] || need "Chromium at /usr/bin/chromium (the console's browser tests)" "apt-get install chromium"
  command -v kcat >/dev/null 2>&1 || need "kcat (a real Kafka client the Kafka listener's tests drive)" "apt-get install kcat"
  ;;
jdk)
  javac=javac
  [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/javac" ] && javac="$JAVA_HOME/bin/javac"
  if ! command -v "$javac" >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
    echo "tidegate: building the Spark connector's jar needs a Java 17 JDK (javac and jar); install it with: apt-get install openjdk-17-jdk-headless" >&2
    fail=1
  fi
  ;;
esac
exit $fail
