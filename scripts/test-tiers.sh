#!/usr/bin/env bash
# `make test`: the suite as two pytest runs at once, on this 2-core machine.
#
#   processes  tests/fleet tests/chaos     real relays, workers, reconcilers, servers:
#                                          mostly waiting on subprocesses and sleeps
#   in-process the rest of tests/          unit, integration, http, fuzz: mostly CPU in
#                                          this one process
#
# Run one after the other they leave a core idle most of the time (the suite took
# 22-25 minutes on a fresh clone); together each fills the other's waits. The two
# share nothing by name: PostgreSQL databases are per process and per test, Redis
# queues per test, ports are free ones, every TOOLFENCE_HOME is a temporary
# directory, and the chaos campaign and the Redis-restart test run their own
# servers (docs/decisions/0190-make-test-runs-two-tiers-at-once.md).
#
# Each run's output goes to a log, printed whole when both have ended (the
# processes tier first), then one closing line with the counts of both; the
# exit status is non-zero if either run failed.
#
#   scripts/test-tiers.sh PYTHON [pytest arguments for both runs...]
set -u

python=${1:?usage: scripts/test-tiers.sh PYTHON [pytest arguments]}
shift

cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d "${TMPDIR:-/tmp}/toolfence-tests.XXXXXX")

processes=(tests/fleet tests/chaos)
in_process=()
for entry in tests/*/; do
    entry=${entry%/}
    case " ${processes[*]} " in *" $entry "*) continue ;; esac
    [ "$entry" = tests/__pycache__ ] && continue
    in_process+=("$entry")
done

# A run that cannot start its servers (a stopped PostgreSQL) fails loudly in its
# own log; neither run waits for the other.
"$python" -m pytest -q "$@" "${processes[@]}" > "$logs/processes.log" 2>&1 &
processes_pid=$!
"$python" -m pytest -q "$@" "${in_process[@]}" > "$logs/in-process.log" 2>&1 &
in_process_pid=$!

# Ctrl-C or a CI timeout: stop both runs, not only this script.
trap 'kill "$processes_pid" "$in_process_pid" 2>/dev/null; wait; exit 130' INT TERM

printf 'toolfence tests: %s and %s at once; logs in %s\n' \
    "${processes[*]}" "${in_process[*]}" "$logs"
wait "$processes_pid"; processes_status=$?
wait "$in_process_pid"; in_process_status=$?

for tier in processes in-process; do
    printf '\n===== %s tier =====\n' "$tier"
    cat "$logs/$tier.log"
done

# pytest's last line of each run, e.g. "2 failed, 1376 passed, 3 skipped in 214.51s".
count() {  # log, word
    tail -n 5 "$1" | grep -oE "[0-9]+ $2" | tail -n 1 | grep -oE '^[0-9]+' || echo 0
}
total() {  # word
    echo $(( $(count "$logs/processes.log" "$1") + $(count "$logs/in-process.log" "$1") ))
}
failed=$(( $(total failed) + $(total error) ))
printf '\ntotal: %d passed, %d failed, %d skipped\n' "$(total passed)" "$failed" "$(total skipped)"

if [ "$processes_status" -ne 0 ] || [ "$in_process_status" -ne 0 ]; then
    printf 'toolfence tests: processes tier exit %d, in-process tier exit %d\n' \
        "$processes_status" "$in_process_status"
    exit 1
fi
rm -rf "$logs"
exit 0
