#!/usr/bin/env bash
# `make test`: .ci/test.sh CMD...  Sets up (.ci/setup.sh: system packages, then the services of
# .ci/services.sh under $PK_SERVICES_ROOT), runs CMD (the suite) with the services' environment,
# and at the end stops what this run started, and only that, whether CMD passed, failed or was
# interrupted.  Services of ours that already answered when it began are left running.
#
# One Ctrl-C (SIGINT, or a SIGTERM) ends the run within 10 s: each step (the set-up, the suite)
# runs in a session of its own, so that this script is what the terminal's signal reaches; it
# passes SIGINT on to the step's process group, gives it $PK_TEST_GRACE seconds (default 2) to
# end, then terminates the group (SIGTERM, one second later SIGKILL), then stops the services,
# naming each.  (pytest-xdist's controller can take half a minute over a SIGINT.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [ "$(id -u)" != 0 ]; then
    echo "make test: needs root (it installs Debian packages, registers qemu's binfmt entry," \
         "starts dockerd, sshd and Podman)" >&2
    exit 2
fi
export PK_SERVICES_ROOT="${PK_SERVICES_ROOT:-/tmp/patchkit-tests}"
export PK_SERVICES_ENV="${PK_SERVICES_ENV:-$PK_SERVICES_ROOT/services.env}"
mkdir -p "$PK_SERVICES_ROOT"
chmod 700 "$PK_SERVICES_ROOT"
# Two runs on one root would stop each other's services: the second waits for no one.
exec 9>"$PK_SERVICES_ROOT/run.lock"
if ! flock -n 9; then
    echo "make test: another run uses the services under $PK_SERVICES_ROOT; let it end, or" \
         "give this one a folder of its own (PK_SERVICES_ROOT=...)" >&2
    exit 2
fi
export PK_SERVICES_STARTED="$PK_SERVICES_ROOT/started.$$"
: >"$PK_SERVICES_STARTED"
grace="${PK_TEST_GRACE:-2}"
child=""

group_alive() { # PGID: a process of that group still runs (a zombie does not count)
    ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { up = 1 } END { exit !up }'
}

finish() {
    local code=$?
    trap '' INT TERM
    if [ -s "$PK_SERVICES_STARTED" ]; then
        echo "make test: stopping what this run started" >&2
        PK_STOP_WAIT=4 bash .ci/services-stop.sh "$PK_SERVICES_STARTED"
    fi
    rm -f "$PK_SERVICES_STARTED"
    exit "$code"
}

interrupted() { # SIGNAL
    trap '' INT TERM
    echo "make test: $1; ending the run" >&2
    if [ -n "$child" ]; then
        kill -INT -- "-$child" 2>/dev/null
        local _
        for _ in $(seq 1 $((grace * 10))); do
            group_alive "$child" || break
            sleep 0.1
        done
        if group_alive "$child"; then
            echo "make test: still running after ${grace} s; terminating it" >&2
            kill -TERM -- "-$child" 2>/dev/null
            for _ in $(seq 1 10); do
                group_alive "$child" || break
                sleep 0.1
            done
            kill -KILL -- "-$child" 2>/dev/null
        fi
    fi
    exit 130
}

trap finish EXIT
trap 'interrupted SIGINT' INT
trap 'interrupted SIGTERM' TERM

# step CMD...: CMD in a session (and process group) of its own, waited for.  A command started
# in the background gets SIGINT ignored; env gives it back its default.
step() {
    setsid env --default-signal=INT,QUIT "$@" </dev/null 9>&- &
    child=$!
    wait "$child"
    local code=$?
    child=""
    return "$code"
}

# PK_TEST_SETUP: another set-up script (tests/test_ci_scripts.py gives a stand-in)
step bash "${PK_TEST_SETUP:-.ci/setup.sh}" || exit $?
# shellcheck disable=SC1090
. "$PK_SERVICES_ENV"
step "$@"
