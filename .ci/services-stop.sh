#!/usr/bin/env bash
# Stops what .ci/services.sh started, by the pid files it wrote, and nothing else.
set -euo pipefail
root="${PK_SERVICES_ROOT:-/tmp}"
for name in pk-registry pk-docker; do
    pidfile="$root/$name.pid"
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        echo "services: stopping $name ($pid)" >&2
        kill "$pid"
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
    fi
    rm -f "$pidfile"
done
