#!/usr/bin/env bash
# Time deploy/local/services.sh from `up` to ready (Kafka accepting requests, PostgreSQL
# accepting connections), on a second pair of services of its own: its own state directory
# and ports, so services already running are not touched. The jar cache is copied from the
# main state directory first (no download is timed). Then:
#   cold: `up` on a new state directory (initdb, Kafka storage format, both started);
#   warm: `down` then `up` on the same state directory, ROUNDS times (stopped -> ready).
# At the end (and on any exit) `down --purge` of that pair only, and its directory removed.
#
#   bash bench/services_startup.sh [ROUNDS]     (default 3)
#   ports: POSTBACKS_BENCH_KAFKA_PORT (29092), POSTBACKS_BENCH_KAFKA_CONTROLLER_PORT (29093),
#          POSTBACKS_BENCH_PG_PORT (25432)
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
SERVICES="$REPO_DIR/deploy/local/services.sh"
ROUNDS=${1:-3}
KPORT=${POSTBACKS_BENCH_KAFKA_PORT:-29092}
CPORT=${POSTBACKS_BENCH_KAFKA_CONTROLLER_PORT:-29093}
PPORT=${POSTBACKS_BENCH_PG_PORT:-25432}
MAIN_LIB="${POSTBACKS_STATE_DIR:-$REPO_DIR/.local}/kafka-lib"

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive number" >&2; exit 2; }
for port in "$KPORT" "$CPORT" "$PPORT"; do
  if timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$port" 2>/dev/null; then
    echo "port $port is in use: set POSTBACKS_BENCH_*_PORT" >&2; exit 2
  fi
done
[[ -d $MAIN_LIB ]] || { echo "no jar cache in $MAIN_LIB: run 'services.sh up' once" >&2; exit 2; }

STATE=$(mktemp -d "${TMPDIR:-/tmp}/postbacks-startup.XXXXXX")
chmod 755 "$STATE"  # as the repository's .local: the postgres user reads its pgdata there
cp -r -- "$MAIN_LIB" "$STATE/kafka-lib"

pair() {
  POSTBACKS_STATE_DIR="$STATE" POSTBACKS_KAFKA_PORT="$KPORT" \
    POSTBACKS_KAFKA_CONTROLLER_PORT="$CPORT" POSTBACKS_PG_PORT="$PPORT" \
    bash "$SERVICES" "$@"
}

finish() {
  if pair down --purge >>"$STATE/bench.log" 2>&1; then
    rm -rf -- "$STATE"
  else
    echo "down --purge failed: the pair's state is kept in $STATE (bench.log)" >&2
  fi
}
trap finish EXIT

# seconds that `up` took, to the millisecond
timed_up() {
  local t0=$EPOCHREALTIME
  pair up >>"$STATE/bench.log" 2>&1 || { tail -n 40 "$STATE/bench.log" >&2; exit 1; }
  awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'
}

printf 'services.sh up -> ready, second pair on ports %s/%s (Kafka) and %s (PostgreSQL)\n' \
  "$KPORT" "$CPORT" "$PPORT"
cold=$(timed_up)
printf 'cold (new state dir: initdb + storage format + start): %s s\n' "$cold"
warm=()
for ((i = 1; i <= ROUNDS; i++)); do
  pair down >>"$STATE/bench.log" 2>&1
  warm+=("$(timed_up)")
  printf 'warm %d (stopped -> ready): %s s\n' "$i" "${warm[-1]}"
done
printf 'warm median of %d: %s s\n' "$ROUNDS" \
  "$(printf '%s\n' "${warm[@]}" | sort -n | awk '{ v[NR] = $1 } END {
     if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
