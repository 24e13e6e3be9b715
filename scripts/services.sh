#!/usr/bin/env bash
# Make sure the servers the test suite uses answer on loopback, starting each one
# that is down. `make test` and `make chaos` run it (target `services`, after
# `deps`); .ci/run only calls `make test`.
#
#   scripts/services.sh [postgres] [redis] [rabbitmq]    # no argument: all three
#
# A server that already answers is left alone. A server that is down is started
# the way Debian's packages lay it out, then waited for (bounded):
#   postgres  pg_ctlcluster --skip-systemctl-redirect <version> main start
#   redis     redis-server --daemonize yes ... --save "" --appendonly no (no persistence)
#   rabbitmq  rabbitmq-server -detached
# Starting needs root, except Redis in a directory the caller may write
# (TOOLFENCE_REDIS_DIR). Not root and a server down: one line on stderr saying
# what to start, exit 1. Not up within the timeout: one line naming its log, exit 1.
#
# Environment (defaults are what tests/ connect to):
#   TOOLFENCE_PG_PORT=5432          where PostgreSQL must answer (the cluster's own port)
#   TOOLFENCE_PG_VERSION            cluster version under /etc/postgresql (default: the newest)
#   TOOLFENCE_REDIS_PORT=6379       where Redis must answer and is started
#   TOOLFENCE_REDIS_DIR=/var/lib/redis            Redis's working directory
#   TOOLFENCE_REDIS_LOG=/var/log/redis/ci.log     Redis's log file
#   TOOLFENCE_AMQP_PORT=5672        where RabbitMQ must accept connections
#   TOOLFENCE_SERVICES_TIMEOUT=90   seconds to wait for each server
set -euo pipefail

PATH="$PATH:/usr/sbin:/sbin"
HOST=127.0.0.1
PG_PORT="${TOOLFENCE_PG_PORT:-5432}"
REDIS_PORT="${TOOLFENCE_REDIS_PORT:-6379}"
REDIS_DIR="${TOOLFENCE_REDIS_DIR:-/var/lib/redis}"
REDIS_LOG="${TOOLFENCE_REDIS_LOG:-/var/log/redis/ci.log}"
AMQP_PORT="${TOOLFENCE_AMQP_PORT:-5672}"
TIMEOUT="${TOOLFENCE_SERVICES_TIMEOUT:-90}"

log() { printf 'services: %s\n' "$*"; }              # progress: stdout
fail() { printf 'services: %s\n' "$*" >&2; exit 1; }  # the one error line: stderr
is_root() { [ "$(id -u)" -eq 0 ]; }

require() {  # command, Debian package
    command -v "$1" >/dev/null 2>&1 || fail "$1 not found: run scripts/ci-deps.sh as root (Debian package $2)"
}

wait_for() {  # name, where, log hint, check command...
    local name=$1 where=$2 hint=$3; shift 3
    local deadline=$((SECONDS + TIMEOUT))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if "$@" >/dev/null 2>&1; then log "$name is up on $where"; return 0; fi
        sleep 0.5
    done
    fail "$name did not come up on $where within ${TIMEOUT} s (see $hint)"
}

# ---------------------------------------------------------------- PostgreSQL

pg_up() { pg_isready -q -t 3 -h "$HOST" -p "$PG_PORT"; }

postgres() {
    require pg_isready postgresql-client
    if pg_up; then log "PostgreSQL is up on $HOST:$PG_PORT"; return 0; fi
    is_root || fail "PostgreSQL is not running on $HOST:$PG_PORT: start it (sudo pg_ctlcluster <version> main start) or run make test as root"
    require pg_ctlcluster postgresql-common
    local version="${TOOLFENCE_PG_VERSION:-}"
    if [ -z "$version" ]; then
        version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)
    fi
    [ -n "$version" ] || fail "PostgreSQL is not running and no cluster exists under /etc/postgresql (Debian package postgresql)"
    log "starting PostgreSQL $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    wait_for PostgreSQL "$HOST:$PG_PORT" "/var/log/postgresql/postgresql-$version-main.log" pg_up
}

# ---------------------------------------------------------------------- Redis

redis_up() { [ "$(timeout 2 redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

may_write() {  # directory (existing, or creatable under an existing parent we may write)
    local dir=$1
    while [ ! -e "$dir" ]; do dir=$(dirname "$dir"); done
    [ -d "$dir" ] && [ -w "$dir" ]
}

redis() {
    require redis-cli redis-tools
    if redis_up; then log "Redis is up on $HOST:$REDIS_PORT"; return 0; fi
    if ! is_root && ! { may_write "$REDIS_DIR" && may_write "$(dirname "$REDIS_LOG")"; }; then
        fail "Redis is not running on $HOST:$REDIS_PORT: start it (sudo systemctl start redis-server) or run make test as root"
    fi
    require redis-server redis-server
    log "starting Redis on port $REDIS_PORT in $REDIS_DIR"
    mkdir -p "$REDIS_DIR" "$(dirname "$REDIS_LOG")"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
        --dir "$REDIS_DIR" --logfile "$REDIS_LOG" || true
    wait_for Redis "$HOST:$REDIS_PORT" "$REDIS_LOG" redis_up
}

# ------------------------------------------------------------------- RabbitMQ

amqp_up() { timeout 5 bash -c "exec 3<>/dev/tcp/$HOST/$AMQP_PORT"; }

rabbitmq() {
    if amqp_up 2>/dev/null; then log "RabbitMQ is up on $HOST:$AMQP_PORT"; return 0; fi
    is_root || fail "RabbitMQ is not running on $HOST:$AMQP_PORT: start it (sudo systemctl start rabbitmq-server) or run make test as root"
    require rabbitmq-server rabbitmq-server
    log "starting RabbitMQ"
    rabbitmq-server -detached || true
    wait_for RabbitMQ "$HOST:$AMQP_PORT" /var/log/rabbitmq/ amqp_up
}

# ----------------------------------------------------------------------------

if [ "$#" -eq 0 ]; then set -- postgres redis rabbitmq; fi
for service in "$@"; do
    case "$service" in
        postgres | redis | rabbitmq) ;;
        *) fail "unknown service '$service' (known: postgres redis rabbitmq)" ;;
    esac
done
for service in "$@"; do "$service"; done
