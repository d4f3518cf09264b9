#!/usr/bin/env bash
# Local Apache Kafka (KRaft, single node) + PostgreSQL for tests and the demo.
#
#   bash deploy/local/services.sh up            start both (idempotent), wait until ready
#   bash deploy/local/services.sh down [--purge] stop what we started (--purge: delete data)
#   bash deploy/local/services.sh status        exit non-zero unless both are ready
#   bash deploy/local/services.sh logs          last 100 lines of each log
#   bash deploy/local/services.sh env           print the export lines only
#   bash deploy/local/services.sh browser       install Debian's chromium if missing
#   bash deploy/local/services.sh prometheus    install Debian's prometheus (server + promtool)
#   bash deploy/local/services.sh restart-kafka [SECONDS]     stop the broker, wait, start it
#   bash deploy/local/services.sh restart-postgres [SECONDS]  the same for PostgreSQL
#                                               (failure tests: a broker restart, a DB outage)
#   bash deploy/local/services.sh cluster up|down|status|env|logs|kill N|start N|stop N
#                                               a three-broker Kafka cluster beside the single
#                                               broker (deploy/local/cluster.sh)
#
# Everything binds to 127.0.0.1. No Docker. See deploy/local/README.md.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd -- "$SCRIPT_DIR/../.." && pwd)

STATE=${POSTBACKS_STATE_DIR:-$REPO_DIR/.local}
KAFKA_PORT=${POSTBACKS_KAFKA_PORT:-19092}
KAFKA_CTRL_PORT=${POSTBACKS_KAFKA_CONTROLLER_PORT:-19093}
PG_PORT=${POSTBACKS_PG_PORT:-15432}
TIMEOUT=${POSTBACKS_SERVICES_TIMEOUT:-90}
PG_EXTRA_DBS=${POSTBACKS_PG_EXTRA_DBS:-}
# Extra JVM options for the broker, split on spaces (e.g. GC logging:
# POSTBACKS_KAFKA_JVM_EXTRA="-Xlog:gc:file=/tmp/kafka-gc.log:time,uptime").
read -r -a KAFKA_JVM_EXTRA <<<"${POSTBACKS_KAFKA_JVM_EXTRA:-}"
PG_USER=postbacks
PG_DB=postbacks

POM="$SCRIPT_DIR/kafka/pom.xml"
LOG4J_CONF="$SCRIPT_DIR/kafka/log4j2.properties"
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")

# Resolved in init_paths (STATE may be relative or not yet exist).
LIB= LOGS= RUN= KAFKA_DATA= KAFKA_CONF_DIR= KAFKA_PROPS= KAFKA_LOG= KAFKA_PID=
PG_LOG= PG_PIDFILE= PG_PRIMARY= PG_FALLBACK_HOME=
# Resolved in resolve_pg_layout.
PGDATA= PG_SOCK= PG_BIN=
JAVA=java

# ----------------------------------------------------------------------------- helpers

log() { printf '[services] %s\n' "$*"; }
warn() { printf '[services] WARNING: %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

# die, after dumping the tail of a log file to stderr.
die_with_log() {
  local logfile=$1; shift
  printf '[services] ERROR: %s\n' "$*" >&2
  if [[ -r $logfile ]]; then
    printf '[services] ---- last 80 lines of %s ----\n' "$logfile" >&2
    tail -n 80 -- "$logfile" >&2 || true
    printf '[services] ---- end of %s ----\n' "$logfile" >&2
  fi
  exit 1
}

now_us() { printf '%s' "${EPOCHREALTIME/./}"; }

# elapsed START_US -> "12.3s"
elapsed() {
  local d=$(( $(now_us) - $1 ))
  printf '%d.%01ds' $(( d / 1000000 )) $(( (d % 1000000) / 100000 ))
}

deadline_in() { printf '%s' $(( $(date +%s) + $1 )); }
before() { (( $(date +%s) < $1 )); }

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

validate_env() {
  local v
  for v in KAFKA_PORT KAFKA_CTRL_PORT PG_PORT TIMEOUT; do
    is_uint "${!v}" || die "$v must be a number, got '${!v}'"
  done
  [[ $KAFKA_PORT != "$KAFKA_CTRL_PORT" ]] || die "Kafka broker and controller ports must differ"
  [[ -n $KAFKA_VERSION ]] || die "could not read <kafka.version> from $POM"
  for v in $PG_EXTRA_DBS; do
    [[ $v =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "bad database name in POSTBACKS_PG_EXTRA_DBS: '$v'"
  done
}

init_paths() {
  mkdir -p -- "$STATE"
  STATE=$(cd -- "$STATE" && pwd)
  LIB="$STATE/kafka-lib"
  LOGS="$STATE/logs"
  RUN="$STATE/run"
  KAFKA_DATA="$STATE/kafka-data"
  KAFKA_CONF_DIR="$STATE/kafka-config"
  KAFKA_PROPS="$KAFKA_CONF_DIR/server.properties"
  KAFKA_LOG="$LOGS/kafka.log"
  KAFKA_PID="$RUN/kafka.pid"
  PG_PIDFILE="$RUN/postgres.pid"
  PG_PRIMARY="$STATE/pgdata"
  PG_FALLBACK_HOME="/var/lib/postgresql/postbacks-$(printf '%s' "$STATE" | sha256sum | cut -c1-12)"
  mkdir -p -- "$LOGS" "$RUN"
}

# Serialise concurrent up/down runs on the same state dir.
take_lock() {
  exec 9>"$RUN/services.lock"
  flock -w "$TIMEOUT" 9 || die "another services.sh run holds $RUN/services.lock"
}

# ----------------------------------------------------------------------------- packages

APT_UPDATED=0
apt_install() {
  local sudo=()
  if (( EUID != 0 )); then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
    sudo=(sudo)
  fi
  command -v apt-get >/dev/null || die "apt-get not found; install $* manually"
  local aptlog="$LOGS/apt.log" attempt
  # A mirror's hiccup is retried (3 attempts, the index refreshed before each retry), and
  # no attempt runs unbounded: 30 s per stalled connection, 10 minutes per command.
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive timeout 600 apt-get
             -o Acquire::Retries=3 -o Acquire::http::Timeout=30)
  for attempt in 1 2 3; do
    if (( APT_UPDATED == 0 )); then
      log "apt-get update (log $aptlog)"
      "${apt[@]}" update >>"$aptlog" 2>&1 && APT_UPDATED=1
    fi
    log "apt-get install -y $* (attempt $attempt/3)"
    if (( APT_UPDATED == 1 )) && "${apt[@]}" install -y "$@" >>"$aptlog" 2>&1; then
      return 0
    fi
    (( attempt < 3 )) || break
    warn "apt-get failed, retrying in $((attempt * 10))s"
    "${sudo[@]}" dpkg --configure -a >>"$aptlog" 2>&1 || true  # one cut off mid-way
    sleep $((attempt * 10))
    APT_UPDATED=0
  done
  die_with_log "$aptlog" "apt-get install $* failed 3 times"
}

java_major() {
  { "$1" -XshowSettings:properties -version 2>&1 || true; } \
    | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p'
}

# Sets JAVA to a Java 17+ binary if one is installed.
find_java() {
  local cand major
  for cand in "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" /usr/lib/jvm/java-17-openjdk-*/bin/java; do
    [[ -n $cand && -x $cand ]] || continue
    major=$(java_major "$cand")
    if [[ -n $major ]] && (( major >= 17 )); then JAVA=$cand; return 0; fi
  done
  return 1
}

ensure_java() {
  local cand
  find_java && return 0
  apt_install openjdk-17-jre-headless
  for cand in /usr/lib/jvm/java-17-openjdk-*/bin/java; do
    [[ -x $cand ]] && { JAVA=$cand; return 0; }
  done
  die "no Java 17+ found after installing openjdk-17-jre-headless"
}

ensure_maven() {
  command -v mvn >/dev/null || apt_install maven
  command -v mvn >/dev/null || die "mvn not found after installing maven"
}

# ----------------------------------------------------------------------------- kafka jars

lib_stamp() {
  printf 'kafka=%s\npom-sha256=%s\n' "$KAFKA_VERSION" "$(sha256sum < "$POM" | cut -d' ' -f1)"
}

ensure_kafka_lib() {
  local stamp="$LIB/.stamp"
  if [[ -f $stamp ]] && [[ "$(cat -- "$stamp")" == "$(lib_stamp)" ]] \
      && compgen -G "$LIB/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null; then
    log "kafka jars: cached in $LIB (Kafka $KAFKA_VERSION)"
    return 0
  fi
  local t tmp="$LIB.tmp" mvnlog="$LOGS/maven.log" attempt delay=5
  t=$(now_us)
  ensure_maven
  : >"$mvnlog"
  for attempt in 1 2 3; do
    rm -rf -- "$tmp"
    log "kafka jars: mvn dependency:copy-dependencies (attempt $attempt/3, log $mvnlog)"
    if timeout 600 mvn -q -B dependency:copy-dependencies -DoutputDirectory="$tmp" \
        -f "$POM" >>"$mvnlog" 2>&1 \
        && [[ -f "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]]; then
      lib_stamp >"$tmp/.stamp"
      rm -rf -- "$LIB"
      mv -- "$tmp" "$LIB"
      log "kafka jars: $(find "$LIB" -name '*.jar' | wc -l) jars in $LIB, took $(elapsed "$t")"
      return 0
    fi
    if (( attempt < 3 )); then
      warn "maven failed, retrying in ${delay}s"
      sleep "$delay"
      delay=$(( delay * 3 ))
    fi
  done
  rm -rf -- "$tmp"
  die_with_log "$mvnlog" "could not download the Kafka jars with maven"
}

# ----------------------------------------------------------------------------- kafka

# Run a Kafka CLI class quietly (tool logs to stderr at WARN), with a hard time limit.
kafka_tool() {
  local limit=$1; shift
  timeout "$limit" "$JAVA" -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$LOG4J_CONF" -Dpostbacks.log.level=WARN \
    -Dpostbacks.log.target=SYSTEM_ERR \
    -cp "$LIB/*" "$@"
}

kafka_pid() {
  local pid cmdline
  [[ -f $KAFKA_PID ]] || return 1
  pid=$(<"$KAFKA_PID")
  is_uint "$pid" || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # Guard against PID reuse: must be our broker with our config.
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"kafka.Kafka $KAFKA_PROPS"* ]] || return 1
  printf '%s' "$pid"
}

# One readiness probe: listener open and a metadata + ApiVersions round trip works.
kafka_ready_once() {
  port_open "$KAFKA_PORT" || return 1
  kafka_tool 20 org.apache.kafka.tools.BrokerApiVersionsCommand \
    --bootstrap-server "127.0.0.1:$KAFKA_PORT" >/dev/null 2>&1
}

write_kafka_config() {
  mkdir -p -- "$KAFKA_CONF_DIR" "$KAFKA_DATA"
  local tmp="$KAFKA_PROPS.tmp"
  cat >"$tmp" <<EOF
# Generated by deploy/local/services.sh -- edits are overwritten on every 'up'.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CTRL_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CTRL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CTRL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=1
auto.create.topics.enable=false
log.retention.hours=168
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
transaction.max.timeout.ms=900000
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
  mv -- "$tmp" "$KAFKA_PROPS"
}

format_kafka_storage() {
  if [[ -f "$KAFKA_DATA/meta.properties" ]]; then
    local fmt_port
    fmt_port=$(cat -- "$KAFKA_CONF_DIR/formatted-controller-port" 2>/dev/null || true)
    if [[ -n $fmt_port && $fmt_port != "$KAFKA_CTRL_PORT" ]]; then
      warn "Kafka storage was formatted with controller port $fmt_port, now $KAFKA_CTRL_PORT;" \
           "if the broker does not come up, run 'down --purge' and 'up' again"
    fi
    return 0
  fi
  local t cluster_id
  t=$(now_us)
  cluster_id=$(kafka_tool 60 kafka.tools.StorageTool random-uuid 2>>"$KAFKA_LOG") \
    || die_with_log "$KAFKA_LOG" "kafka StorageTool random-uuid failed"
  {
    printf '===== %s services.sh: format storage (cluster id %s)\n' "$(date -Is)" "$cluster_id"
  } >>"$KAFKA_LOG"
  kafka_tool 120 kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$KAFKA_PROPS" \
    >>"$KAFKA_LOG" 2>&1 || die_with_log "$KAFKA_LOG" "kafka storage format failed"
  printf '%s\n' "$KAFKA_CTRL_PORT" >"$KAFKA_CONF_DIR/formatted-controller-port"
  log "kafka: formatted $KAFKA_DATA (cluster id $cluster_id) in $(elapsed "$t")"
}

wait_kafka_ready() {
  local pid=$1 deadline t
  deadline=$(deadline_in "$TIMEOUT")
  t=$(now_us)
  while before "$deadline"; do
    kill -0 "$pid" 2>/dev/null || die_with_log "$KAFKA_LOG" "kafka (pid $pid) exited during startup"
    if kafka_ready_once; then
      log "kafka: ready on 127.0.0.1:$KAFKA_PORT (waited $(elapsed "$t"))"
      return 0
    fi
    sleep 1
  done
  die_with_log "$KAFKA_LOG" "kafka not ready after ${TIMEOUT}s (pid $pid, port $KAFKA_PORT)"
}

# The broker's ports are free, unless our broker holds them (checked before PostgreSQL
# starts too, so a clash does not leave PostgreSQL running alone).
kafka_ports_free() {
  local p
  kafka_pid >/dev/null && return 0
  for p in "$KAFKA_PORT" "$KAFKA_CTRL_PORT"; do
    if port_open "$p"; then
      die "port 127.0.0.1:$p is already in use by a process this script did not start" \
        "(set POSTBACKS_KAFKA_PORT / POSTBACKS_KAFKA_CONTROLLER_PORT)"
    fi
  done
}

kafka_up() {
  local t pid
  t=$(now_us)
  if pid=$(kafka_pid); then
    if kafka_ready_once; then
      log "kafka: already running and ready (pid $pid) [check $(elapsed "$t")]"
      return 0
    fi
    log "kafka: running (pid $pid) but not ready yet, waiting"
    wait_kafka_ready "$pid"
    return 0
  fi
  rm -f -- "$KAFKA_PID"
  kafka_ports_free

  ensure_kafka_lib
  write_kafka_config
  format_kafka_storage

  t=$(now_us)
  printf '===== %s services.sh: starting kafka %s\n' "$(date -Is)" "$KAFKA_VERSION" >>"$KAFKA_LOG"
  # 9>&-: the broker must not inherit the lock fd.
  # setsid: own session, survives the calling shell; the child writes its own PID
  # (exec keeps it) so the PID file is right even if setsid has to fork.
  # shellcheck disable=SC2016
  setsid -f bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$KAFKA_PID" \
    nohup "$JAVA" -Xms256m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
      -Djava.awt.headless=true \
      -Dlog4j2.configurationFile="$LOG4J_CONF" "${KAFKA_JVM_EXTRA[@]}" \
      -cp "$LIB/*" kafka.Kafka "$KAFKA_PROPS" \
    >>"$KAFKA_LOG" 2>&1 </dev/null 9>&-
  local i
  for i in $(seq 1 50); do
    [[ -s $KAFKA_PID ]] && break
    sleep 0.1
  done
  [[ -s $KAFKA_PID ]] || die_with_log "$KAFKA_LOG" "kafka did not start (no PID file)"
  pid=$(<"$KAFKA_PID")
  log "kafka: started pid $pid (Kafka $KAFKA_VERSION, log $KAFKA_LOG)"
  wait_kafka_ready "$pid"
  log "kafka: start + ready took $(elapsed "$t")"
}

kafka_down() {
  local pid i
  if ! pid=$(kafka_pid); then
    rm -f -- "$KAFKA_PID"
    log "kafka: not running"
    return 0
  fi
  log "kafka: stopping pid $pid (SIGTERM)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    warn "kafka pid $pid still alive after 30s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f -- "$KAFKA_PID"
  log "kafka: stopped"
}

# ----------------------------------------------------------------------------- postgres

# Run a command as the postgres user (as ourselves when not root), from /, without
# the lock fd (the postmaster started by pg_ctl must not inherit it).
as_pg() {
  if (( EUID == 0 )); then
    (cd / && runuser -u postgres -- "$@") 9>&-
  else
    (cd / && "$@") 9>&-
  fi
}

pg_bin_for() { printf '/usr/lib/postgresql/%s/bin' "$1"; }

# Pick the PostgreSQL binaries for a new cluster: 15 if present, else the newest.
pick_pg_bin() {
  local d best=
  [[ -x $(pg_bin_for 15)/initdb ]] && { printf '%s' "$(pg_bin_for 15)"; return 0; }
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x $d/initdb ]] || continue
    if [[ -z $best ]] || (( ${d//[^0-9]/} > ${best//[^0-9]/} )); then best=$d; fi
  done
  [[ -n $best ]] || return 1
  printf '%s' "$best"
}

# Can the postgres user write into DIR (i.e. traverse every parent)?
pg_can_use_dir() { as_pg test -w "$1" -a -x "$1" 2>/dev/null; }

# Sets PGDATA, PG_SOCK, PG_LOG for an existing cluster. Returns 1 if none exists.
resolve_pg_layout() {
  PG_LOG="$LOGS/postgres.log"
  if [[ -f "$PG_PRIMARY/PG_VERSION" ]]; then
    PGDATA=$PG_PRIMARY
    PG_SOCK="$RUN/pgsock"
  elif [[ -f "$PG_FALLBACK_HOME/pgdata/PG_VERSION" ]]; then
    PGDATA="$PG_FALLBACK_HOME/pgdata"
    PG_SOCK="$PG_FALLBACK_HOME/sock"
    PG_LOG="$PG_FALLBACK_HOME/postgres.log"
  else
    return 1
  fi
  # Unix socket paths are limited to ~107 bytes.
  (( ${#PG_SOCK} + 20 < 100 )) || PG_SOCK=/tmp
  PG_BIN=$(pg_bin_for "$(<"$PGDATA/PG_VERSION")")
  [[ -x $PG_BIN/pg_ctl ]] || die "cluster $PGDATA needs PostgreSQL $(<"$PGDATA/PG_VERSION") binaries ($PG_BIN missing)"
}

pg_owner_chown() {
  if (( EUID == 0 )); then chown postgres:postgres "$@"; fi
}

pg_init_cluster() {
  local t bin
  t=$(now_us)
  if ! bin=$(pick_pg_bin); then
    apt_install postgresql
    bin=$(pick_pg_bin) || die "no /usr/lib/postgresql/*/bin/initdb after installing postgresql"
  fi
  if (( EUID == 0 )); then id postgres >/dev/null 2>&1 || die "user 'postgres' does not exist"; fi

  local target=$PG_PRIMARY
  mkdir -p -- "$target"
  pg_owner_chown "$target"
  chmod 700 "$target"
  if ! pg_can_use_dir "$target"; then
    rmdir -- "$target" 2>/dev/null || true
    mkdir -p -- "$PG_FALLBACK_HOME/pgdata" "$PG_FALLBACK_HOME/sock"
    pg_owner_chown "$PG_FALLBACK_HOME" "$PG_FALLBACK_HOME/pgdata" "$PG_FALLBACK_HOME/sock"
    chmod 700 "$PG_FALLBACK_HOME/pgdata"
    target="$PG_FALLBACK_HOME/pgdata"
    log "postgres: user 'postgres' cannot reach $PG_PRIMARY; using $target instead"
    log "postgres: its log is $PG_FALLBACK_HOME/postgres.log (symlinked from $LOGS/postgres.log)"
    ln -sfn -- "$PG_FALLBACK_HOME/postgres.log" "$LOGS/postgres.log"
  fi
  log "postgres: initdb $target ($("$bin/postgres" --version))"
  local initlog="$LOGS/postgres-initdb.log"
  as_pg "$bin/initdb" -D "$target" -U postgres -E UTF8 --locale=C \
      --auth-local=trust --auth-host=trust >"$initlog" 2>&1 \
    || die_with_log "$initlog" "initdb failed"
  log "postgres: initdb took $(elapsed "$t")"
}

write_pg_config() {
  mkdir -p -- "$PG_SOCK"
  if [[ $PG_SOCK != /tmp ]]; then pg_owner_chown "$PG_SOCK"; chmod 700 "$PG_SOCK"; fi
  touch -- "$PG_LOG"
  pg_owner_chown "$PG_LOG"
  local conf="$PGDATA/postbacks.conf"
  cat >"$conf" <<EOF
# Generated by deploy/local/services.sh -- rewritten on every 'up'.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
shared_buffers = 256MB
max_connections = 200
# The sink writes ~5 KB of WAL per delivery between checkpoints, and every page's first
# change after one is logged whole: with the defaults (5 min, 1 GB) a sustained 4,000/s
# forces a checkpoint every minute or so. Measured (bench/delivery.py --parts engine,
# 60,000 deliveries, 2 alternating pairs): 9.3-9.5 against 11.6-12.1 KB of WAL per
# delivery when the run starts at a checkpoint, 4.7-5.2 KB with none in the run. The
# PostgreSQL CPU per delivery moved less than the host's own swings (6 pairs).
max_wal_size = 8GB
checkpoint_timeout = 15min
EOF
  cat >"$PGDATA/pg_hba.conf" <<'EOF'
# Generated by deploy/local/services.sh. LOCAL DEV/CI ONLY: no passwords.
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
EOF
  pg_owner_chown "$conf" "$PGDATA/pg_hba.conf"
  chmod 600 "$conf" "$PGDATA/pg_hba.conf"
  grep -qxF "include_if_exists = 'postbacks.conf'" "$PGDATA/postgresql.conf" \
    || printf "\n# Added by deploy/local/services.sh\ninclude_if_exists = 'postbacks.conf'\n" \
         >>"$PGDATA/postgresql.conf"
}

pg_running() { as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }

pg_postmaster_pid() { head -n1 -- "$PGDATA/postmaster.pid" 2>/dev/null; }

psql_admin() {
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"
}

pg_ready_once() {
  "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 2 >/dev/null 2>&1 || return 1
  timeout 10 "$PG_BIN/psql" -X -q -At -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" \
    -c 'select 1' >/dev/null 2>&1
}

wait_pg_ready() {
  local deadline t
  deadline=$(deadline_in "$TIMEOUT")
  t=$(now_us)
  while before "$deadline"; do
    if pg_ready_once; then
      log "postgres: ready on 127.0.0.1:$PG_PORT (waited $(elapsed "$t"))"
      return 0
    fi
    pg_running || die_with_log "$PG_LOG" "postgres exited during startup"
    sleep 0.5
  done
  die_with_log "$PG_LOG" "postgres not ready after ${TIMEOUT}s (port $PG_PORT)"
}

pg_ensure_db() {
  local db=$1
  if [[ -z $(psql_admin -At -c "select 1 from pg_database where datname = '$db'") ]]; then
    psql_admin -c "create database \"$db\" owner \"$PG_USER\"" \
      || die_with_log "$PG_LOG" "could not create database $db"
    log "postgres: created database $db"
  fi
}

pg_ensure_roles_and_dbs() {
  local t db
  t=$(now_us)
  if [[ -z $(psql_admin -At -c "select 1 from pg_roles where rolname = '$PG_USER'") ]]; then
    psql_admin -c "create role \"$PG_USER\" login superuser" \
      || die_with_log "$PG_LOG" "could not create role $PG_USER"
    log "postgres: created role $PG_USER"
  fi
  pg_ensure_db "$PG_DB"
  for db in $PG_EXTRA_DBS; do pg_ensure_db "$db"; done
  log "postgres: role/databases checked in $(elapsed "$t")"
}

pg_up() {
  local t
  t=$(now_us)
  if ! resolve_pg_layout; then
    pg_init_cluster
    resolve_pg_layout || die "postgres cluster missing right after initdb"
  fi
  if pg_running; then
    printf '%s\n' "$(pg_postmaster_pid)" >"$PG_PIDFILE"
    if pg_ready_once; then
      pg_ensure_roles_and_dbs
      log "postgres: already running and ready (pid $(pg_postmaster_pid), data $PGDATA) [check $(elapsed "$t")]"
      return 0
    fi
    # Running, but on another port (config changed), or still starting up.
    local cur
    cur=$(sed -n 4p "$PGDATA/postmaster.pid" 2>/dev/null || true)
    if [[ -n $cur && $cur != "$PG_PORT" ]]; then
      die "postgres for $PGDATA is running on port $cur, not $PG_PORT; run 'down' first"
    fi
    log "postgres: running but not ready yet, waiting"
  else
    port_open "$PG_PORT" && die "port 127.0.0.1:$PG_PORT is already in use by a process this script" \
      "did not start (set POSTBACKS_PG_PORT)"
    write_pg_config
    printf '===== %s services.sh: starting postgres\n' "$(date -Is)" >>"$PG_LOG"
    t=$(now_us)
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$PG_LOG" -w -t "$TIMEOUT" start >/dev/null 2>&1 \
      || die_with_log "$PG_LOG" "pg_ctl start failed"
    printf '%s\n' "$(pg_postmaster_pid)" >"$PG_PIDFILE"
    log "postgres: started pid $(pg_postmaster_pid) in $(elapsed "$t") (data $PGDATA, log $PG_LOG)"
  fi
  # The postbacks role may not exist yet on a fresh cluster: wait for the server as
  # the admin user, create role/dbs, then do the real readiness check.
  local deadline
  deadline=$(deadline_in "$TIMEOUT")
  until "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 2 >/dev/null 2>&1; do
    before "$deadline" || die_with_log "$PG_LOG" "postgres not accepting connections after ${TIMEOUT}s"
    pg_running || die_with_log "$PG_LOG" "postgres exited during startup"
    sleep 0.5
  done
  pg_ensure_roles_and_dbs
  wait_pg_ready
}

pg_down() {
  if ! resolve_pg_layout; then
    log "postgres: no cluster"
    rm -f -- "$PG_PIDFILE"
    return 0
  fi
  if pg_running; then
    log "postgres: stopping (pg_ctl stop -m fast)"
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null 2>&1 \
      || die_with_log "$PG_LOG" "pg_ctl stop failed"
    log "postgres: stopped"
  else
    log "postgres: not running"
  fi
  rm -f -- "$PG_PIDFILE"
}

# ----------------------------------------------------------------------------- commands

print_env() {
  printf 'export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:%s\n' "$KAFKA_PORT"
  # one development broker: every topic with 1 replica, min.insync.replicas 1
  printf 'export POSTBACKS_KAFKA_REPLICATION=dev\n'
  printf 'export POSTBACKS_DATABASE_URL=postgresql://%s@127.0.0.1:%s/%s\n' "$PG_USER" "$PG_PORT" "$PG_DB"
}

cmd_up() {
  local t0
  t0=$(now_us)
  take_lock
  ensure_java
  kafka_ports_free
  pg_up
  kafka_up
  log "all services ready in $(elapsed "$t0") (state $STATE)"
  echo
  echo "# Use these in your shell (or: eval \"\$(bash deploy/local/services.sh env)\"):"
  print_env
}

cmd_down() {
  local purge=0 arg
  for arg in "$@"; do
    case $arg in
      --purge) purge=1 ;;
      *) die "unknown option for down: $arg" ;;
    esac
  done
  take_lock
  kafka_down
  pg_down
  if (( purge )); then
    local d
    for d in "$KAFKA_DATA" "$KAFKA_CONF_DIR" "$PG_PRIMARY" "$PG_FALLBACK_HOME" "$RUN/pgsock"; do
      [[ -e $d ]] || continue
      log "purge: removing $d"
      rm -rf -- "$d"
    done
    log "purge: done (jar cache $LIB and logs kept)"
  fi
}

cmd_status() {
  local rc=0 pid
  if pid=$(kafka_pid); then
    if find_java && [[ -d $LIB ]] && kafka_ready_once; then
      log "kafka:    running (pid $pid), ready on 127.0.0.1:$KAFKA_PORT"
    else
      log "kafka:    running (pid $pid), NOT ready on 127.0.0.1:$KAFKA_PORT"; rc=1
    fi
  else
    log "kafka:    not running"; rc=1
  fi
  if ! resolve_pg_layout; then
    log "postgres: no cluster (run 'up')"; rc=1
  elif pg_running; then
    if pg_ready_once; then
      log "postgres: running (pid $(pg_postmaster_pid)), ready on 127.0.0.1:$PG_PORT (data $PGDATA)"
    else
      log "postgres: running (pid $(pg_postmaster_pid)), NOT ready on 127.0.0.1:$PG_PORT"; rc=1
    fi
  else
    log "postgres: not running (data $PGDATA)"; rc=1
  fi
  return "$rc"
}

# Debian's chromium for the console's browser tests (Playwright drives it by path; no
# browser download). Retried: a mirror hiccup must not fail a CI run.
cmd_browser() {
  local try
  if [[ -x /usr/bin/chromium ]]; then
    log "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo present) at /usr/bin/chromium"
    return 0
  fi
  take_lock
  for try in 1 2 3; do
    if ( apt_install chromium ); then
      log "chromium: installed ($(/usr/bin/chromium --version 2>/dev/null))"
      return 0
    fi
    log "chromium install failed (try $try of 3)"
    APT_UPDATED=0
    sleep $(( try * 5 ))
  done
  die "could not install chromium (apt-get install chromium); see $LOGS/apt.log"
}

# Debian's Prometheus server and promtool: the alert-rule unit tests (promtool test rules),
# the metrics lint (promtool check metrics) and the end-to-end alert test. The package's
# own service is not started (no init system here; the tests start their own server).
cmd_prometheus() {
  local try
  if [[ -x /usr/bin/promtool && -x /usr/bin/prometheus ]]; then
    log "prometheus: $(/usr/bin/promtool --version 2>/dev/null | head -n 1)"
    return 0
  fi
  take_lock
  for try in 1 2 3; do
    if ( apt_install prometheus ); then
      log "prometheus: installed ($(/usr/bin/promtool --version 2>/dev/null | head -n 1))"
      return 0
    fi
    log "prometheus install failed (try $try of 3)"
    APT_UPDATED=0
    sleep $(( try * 5 ))
  done
  die "could not install prometheus (apt-get install prometheus); see $LOGS/apt.log"
}

cmd_logs() {
  local f
  resolve_pg_layout || PG_LOG="$LOGS/postgres.log"
  for f in "$KAFKA_LOG" "$PG_LOG"; do
    echo "==> $f <=="
    if [[ -r $f ]]; then tail -n 100 -- "$f"; else echo "(no log yet)"; fi
    echo
  done
}

usage() {
  sed -n "2,17p" "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

main() {
  local cmd=${1:-}
  [[ $# -gt 0 ]] && shift
  case $cmd in
    up|down|status|logs|env|browser|prometheus|restart-kafka|restart-postgres|cluster) ;;
    -h|--help|help) usage; return 0 ;;
    *) usage >&2; return 2 ;;
  esac
  validate_env
  init_paths
  case $cmd in
    up) cmd_up ;;
    down) cmd_down "$@" ;;
    status) cmd_status ;;
    logs) cmd_logs ;;
    env) print_env ;;
    browser) cmd_browser ;;
    prometheus) cmd_prometheus ;;
    restart-kafka) take_lock; ensure_java; kafka_down; sleep "${1:-0}"; kafka_up ;;
    restart-postgres) take_lock; pg_down; sleep "${1:-0}"; pg_up ;;
    cluster)
      # shellcheck source=deploy/local/cluster.sh
      source "$SCRIPT_DIR/cluster.sh"
      cmd_cluster "$@" ;;
  esac
}

main "$@"
