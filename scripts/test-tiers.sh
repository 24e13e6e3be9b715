#!/usr/bin/env bash
# `make test`: the suite as three pytest runs at once, on this 2-core machine.
#
#   processes  tests/fleet tests/chaos   real relays, workers, reconcilers, servers:
#                                        mostly waiting on subprocesses and timers
#   fuzz       tests/fuzz tests/http     Hypothesis fuzzing and the HTTP API: CPU in
#                                        one process
#   in-process the rest of tests/        unit and integration: CPU in one process,
#                                        waiting on PostgreSQL
#
# Run one after the other they leave a core idle most of the time (the suite took
# 22-25 minutes on a fresh clone); at once, each fills the others' waits. They
# share nothing by name: PostgreSQL databases are per process and per test, Redis
# queues per test, ports are free ones, every TOOLFENCE_HOME is a temporary
# directory, and the chaos campaign and the Redis-restart test run their own
# servers (docs/decisions/0190-make-test-runs-three-tiers-at-once.md).
#
# Each run's output goes to a log, printed whole when all have ended, then one
# closing line with the counts of all; the exit status is non-zero if any run
# failed.
#
#   scripts/test-tiers.sh PYTHON [pytest arguments for every run...]
set -u

python=${1:?usage: scripts/test-tiers.sh PYTHON [pytest arguments]}
shift

cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d "${TMPDIR:-/tmp}/toolfence-tests.XXXXXX")

names=(processes fuzz in-process)
declare -A dirs=([processes]="tests/fleet tests/chaos" [fuzz]="tests/fuzz tests/http" [in-process]="")
# The last tier takes every directory of tests/ the others do not name, so a new
# suite runs without being listed here.
for entry in tests/*/; do
    entry=${entry%/}
    case " ${dirs[processes]} ${dirs[fuzz]} " in *" $entry "*) continue ;; esac
    [ "$entry" = tests/__pycache__ ] && continue
    dirs[in-process]="${dirs[in-process]:+${dirs[in-process]} }$entry"
done

declare -A pids=()
for name in "${names[@]}"; do
    # shellcheck disable=SC2086  # the directories are words
    "$python" -m pytest -q "$@" ${dirs[$name]} > "$logs/$name.log" 2>&1 &
    pids[$name]=$!
done
# Ctrl-C or a CI timeout: stop every run, not only this script.
trap 'kill "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM

printf 'toolfence tests: three pytest runs at once; logs in %s\n' "$logs"
declare -A status=()
for name in "${names[@]}"; do
    wait "${pids[$name]}"
    status[$name]=$?
done

for name in "${names[@]}"; do
    printf '\n===== %s: %s =====\n' "$name" "${dirs[$name]}"
    cat "$logs/$name.log"
done

# pytest's last line of each run, e.g. "2 failed, 1376 passed, 3 skipped in 214.51s".
count() {  # log, word
    tail -n 5 "$1" | grep -oE "[0-9]+ $2" | tail -n 1 | grep -oE '^[0-9]+' || echo 0
}
total() {  # word
    local sum=0 name
    for name in "${names[@]}"; do
        sum=$(( sum + $(count "$logs/$name.log" "$1") ))
    done
    echo "$sum"
}
failed=$(( $(total failed) + $(total error) ))
printf '\ntotal: %d passed, %d failed, %d skipped\n' "$(total passed)" "$failed" "$(total skipped)"

failures=""
for name in "${names[@]}"; do
    [ "${status[$name]}" -eq 0 ] || failures="$failures $name (exit ${status[$name]})"
done
if [ -n "$failures" ]; then
    printf 'toolfence tests failed in:%s; logs in %s\n' "$failures" "$logs"
    exit 1
fi
rm -rf "$logs"
exit 0
