#!/bin/sh
# Entrypoint of the toolfence image: gives each container its own
# prometheus-client multiprocess directory on the shared metrics volume.
#
# Processes in different containers repeat PIDs (each container numbers its
# own), and two processes writing one `counter_<pid>.db` overwrite each other's
# counts. With TOOLFENCE_METRICS_ROOT set, this container writes into
# $TOOLFENCE_METRICS_ROOT/<container hostname>/; the exporter, whose
# PROMETHEUS_MULTIPROC_DIR is the root itself, sums the root and every
# subdirectory (executor.telemetry.exporter.MultiprocessTreeCollector). A restarted
# container keeps its hostname and so its files: counters stay monotonic.
set -eu

if [ -n "${TOOLFENCE_METRICS_ROOT:-}" ]; then
    container="${HOSTNAME:-$(cat /proc/sys/kernel/hostname)}"
    PROMETHEUS_MULTIPROC_DIR="${TOOLFENCE_METRICS_ROOT%/}/${container}"
    export PROMETHEUS_MULTIPROC_DIR
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
fi

exec "$@"
