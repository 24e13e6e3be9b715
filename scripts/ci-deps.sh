#!/bin/sh
# System packages the test suite needs beyond Python: Prometheus's server and
# promtool (Debian package `prometheus`), for tests/integration/test_ops_prometheus.py.
# Idempotent: installs nothing when promtool and prometheus are already there.
#
# The Debian package's post-install would start a prometheus service on :9090;
# the tests run their own server on a free loopback port, so a policy-rc.d that
# refuses service starts is put in place for the install (unless one exists).
set -eu

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ci-deps: promtool/prometheus missing and not root: install the 'prometheus' package" >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
own_policy=no
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    own_policy=yes
fi
cleanup() {
    if [ "$own_policy" = yes ]; then rm -f "$policy"; fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update
apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends prometheus

# Belt and braces: if a service manager started it anyway, stop it (it would
# hold :9090 and write to /var/lib/prometheus for nothing).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl stop prometheus || true
    systemctl disable prometheus || true
fi

command -v promtool >/dev/null
command -v prometheus >/dev/null
