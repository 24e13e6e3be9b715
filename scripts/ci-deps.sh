#!/bin/sh
# Every system package the test suite needs beyond Python and make, checked and,
# as root, installed from Debian's archive. `make test` and `make chaos` run it
# first (target `deps`); scripts/services.sh then starts the servers.
#
#   command (where)                      Debian package     used by
#   pg_isready, psql                     postgresql-client  scripts/services.sh, bench
#   pg_ctlcluster                        postgresql-common  scripts/services.sh
#   initdb, pg_ctl ($TOOLFENCE_PG_BIN)   postgresql         tests/chaos (private cluster)
#   redis-server                         redis-server       tests/fleet, tests/chaos, services
#   redis-cli                            redis-tools        tests/fleet, scripts/services.sh
#   rabbitmq-server                      rabbitmq-server    scripts/services.sh
#   promtool, prometheus                 prometheus         tests/integration/test_ops_prometheus.py
#   prometheus-alertmanager, amtool      prometheus-alertmanager  tests/integration/test_ops_alertmanager.py
#   setpriv                              util-linux         tests/integration/test_setup_scripts.py
#   chromium                             chromium           tests/http (the console, via Playwright)
#   bwrap                                bubblewrap         tests/sandbox, tests/fleet (sandbox.run_python), bench
#   /usr/bin/python3                     python3            the sandbox's interpreter (TOOLFENCE_SANDBOX_PYTHON)
#   curl, jq                             curl, jq           tests/http/test_walkthrough.py (docs/http.md's curl walkthrough)
#   nft                                  nftables           tests/chaos/netns.py (partitions, loss, duplication)
#   ip, tc                               iproute2           tests/chaos/netns.py (namespaces, veth, TBF/HTB)
#   libfaketime.so.1                     libfaketime        tests/chaos (clock skew and jumps on workers, relays)
#   cc, <dlfcn.h>                        gcc, libc6-dev     tests/chaos/netns.py (a clock_nanosleep preload beside libfaketime)
#
# Idempotent and silent when everything is there. Not root and something is
# missing: one line on stderr naming the packages to install, exit 1. Commands
# are looked up in $PATH (plus /usr/sbin and /sbin, where rabbitmq-server lives),
# so a test can hide one by narrowing PATH; $TOOLFENCE_PG_BIN (default
# /usr/lib/postgresql/15/bin, as in tests/chaos/services.py) is checked by path.
#
# Package post-install scripts would start services (prometheus on :9090,
# alertmanager on :9093, the servers under their packaged configuration); a policy-rc.d that refuses
# service starts is put in place for the install (unless one exists), and
# scripts/services.sh starts the servers the way the suite expects.
set -eu

PATH="$PATH:/usr/sbin:/sbin"
PG_BIN="${TOOLFENCE_PG_BIN:-/usr/lib/postgresql/15/bin}"
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1

missing=""     # what is absent, for the message
packages=""    # the Debian packages that provide it, deduplicated

need() {  # package, what, present (0/1)
    if [ "$3" = 1 ]; then return 0; fi
    missing="${missing:+$missing, }$2"
    case " $packages " in
        *" $1 "*) ;;
        *) packages="${packages:+$packages }$1" ;;
    esac
}

has() { if command -v "$1" >/dev/null 2>&1; then echo 1; else echo 0; fi; }
has_file() { if [ -x "$1" ]; then echo 1; else echo 0; fi; }

check() {
    missing=""
    packages=""
    need postgresql-client pg_isready "$(has pg_isready)"
    need postgresql-client psql "$(has psql)"
    need postgresql-common pg_ctlcluster "$(has pg_ctlcluster)"
    need postgresql "$PG_BIN/initdb" "$(has_file "$PG_BIN/initdb")"
    need postgresql "$PG_BIN/pg_ctl" "$(has_file "$PG_BIN/pg_ctl")"
    need redis-server redis-server "$(has redis-server)"
    need redis-tools redis-cli "$(has redis-cli)"
    need rabbitmq-server rabbitmq-server "$(has rabbitmq-server)"
    need prometheus promtool "$(has promtool)"
    need prometheus prometheus "$(has prometheus)"
    need prometheus-alertmanager prometheus-alertmanager "$(has prometheus-alertmanager)"
    need prometheus-alertmanager amtool "$(has amtool)"
    need util-linux setpriv "$(has setpriv)"
    need chromium chromium "$(has chromium)"
    need bubblewrap bwrap "$(has bwrap)"
    need python3 /usr/bin/python3 "$(has_file /usr/bin/python3)"
    need curl curl "$(has curl)"
    need jq jq "$(has jq)"
    need nftables nft "$(has nft)"
    need iproute2 ip "$(has ip)"
    need iproute2 tc "$(has tc)"
    need libfaketime "$FAKETIME_LIB" "$(if [ -e "$FAKETIME_LIB" ]; then echo 1; else echo 0; fi)"
    need gcc cc "$(has cc)"
    need libc6-dev /usr/include/dlfcn.h "$(if [ -e /usr/include/dlfcn.h ]; then echo 1; else echo 0; fi)"
}

check
if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ci-deps: missing $missing; install as root: apt-get install $packages (or run make test as root)" >&2
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

echo "ci-deps: installing $packages (for $missing)" >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # $packages is a list of words
if ! { apt-get -o DPkg::Lock::Timeout=300 update &&
       apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends $packages; }; then
    echo "ci-deps: apt-get could not install $packages (see above)" >&2
    exit 1
fi

# Belt and braces: if a service manager started prometheus or alertmanager
# anyway, stop it (it would hold :9090 or :9093 and write to /var/lib/prometheus
# for nothing).
for unit in prometheus prometheus-alertmanager; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
        systemctl stop "$unit" || true
        systemctl disable "$unit" || true
    fi
done

check
if [ -n "$missing" ]; then
    echo "ci-deps: still missing after installing $packages: $missing (for PostgreSQL binaries elsewhere, set TOOLFENCE_PG_BIN)" >&2
    exit 1
fi
