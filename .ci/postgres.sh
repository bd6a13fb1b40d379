#!/usr/bin/env bash
# Install (Debian's packages) and start a PostgreSQL server for the test suite, the way the tests expect it:
# 127.0.0.1:5432, trust authentication for loopback TCP, a database named `test` owned by `postgres`.
# Idempotent: an installed package, a running cluster or an existing database is left as it is.
# Test-only: trust authentication on loopback is not a production setting (docs/operations.md says how to run
# PostgreSQL for production). Needs root and apt-get when the server is not installed yet.
set -euo pipefail

PORT=5432
log() { echo "== postgres.sh: $*"; }

if pg_isready -q -h 127.0.0.1 -p "$PORT" 2>/dev/null && psql -h 127.0.0.1 -p "$PORT" -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
  log "PostgreSQL already answers at 127.0.0.1:$PORT (database test)"
  exit 0
fi

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL is not installed and this is not a root Debian shell: install it (apt-get install postgresql)" >&2
    exit 1
  fi
  log "installing postgresql (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 900 apt-get install -y -q postgresql >/dev/null 2>&1 \
    || { timeout 300 apt-get update -q >/dev/null && timeout 900 apt-get install -y -q postgresql >/dev/null; }
fi

ver="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -qx "$ver main"; then
  log "creating cluster $ver/main"
  pg_createcluster "$ver" main --port "$PORT" >/dev/null
fi

hba="/etc/postgresql/$ver/main/pg_hba.conf"
marker="# lace-tests: trust on loopback"
if ! grep -qF "$marker" "$hba"; then
  log "trust authentication for 127.0.0.1 and ::1 in $hba"
  tmp="$(mktemp)"
  { echo "$marker"; echo "host all all 127.0.0.1/32 trust"; echo "host all all ::1/128 trust"; cat "$hba"; } > "$tmp"
  cat "$tmp" > "$hba"
  rm -f "$tmp"
fi

status="$(pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $4}')"
if [ "$status" = online ]; then
  pg_ctlcluster "$ver" main reload
else
  log "starting cluster $ver/main"
  pg_ctlcluster "$ver" main start
fi

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$PORT" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$PORT" >/dev/null || { log "the server did not come up" >&2; exit 1; }

if [ "$(psql -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -Atc "select 1 from pg_database where datname = 'test'")" != 1 ]; then
  log "creating database test"
  psql -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null
fi
log "PostgreSQL $ver answers at 127.0.0.1:$PORT (trust, database test)"
