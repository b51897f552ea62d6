#!/usr/bin/env bash
# Stops what .ci/services.sh started, by the pid files it wrote, and nothing else; removes the
# `pk-node2` and `pk-node3` blocks it wrote into root's ~/.ssh/config.  Data (images, keys) stays for next time.
set -euo pipefail
root="${PK_SERVICES_ROOT:-/tmp}"
# name of the pid file, and a word its process's command line must hold (a recycled pid is
# never taken for ours)
for entry in "pk-node2-sshd:$root/pk-node2-ssh/sshd_config" "pk-node2:$root/pk-node2.sock" \
             "pk-node3-sshd:$root/pk-node3-ssh/sshd_config" "pk-node3:$root/pk-node3.sock" \
             "pk-podman:$root/pk-podman/podman.sock" "pk-registry:$root/pk-registry" \
             "pk-docker:$root/pk-docker.sock"; do
    name="${entry%%:*}"
    word="${entry#*:}"
    pidfile="$root/$name.pid"
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] \
            && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$word"; then
        echo "services: stopping $name ($pid)" >&2
        kill "$pid"
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
    fi
    rm -f "$pidfile"
done

cfg="$(getent passwd "$(id -u)" | cut -d: -f6)/.ssh/config"
for alias in pk-node2 pk-node3; do
    begin="# >>> patchkit test services: $alias (written by .ci/services.sh) >>>"
    end="# <<< patchkit test services: $alias <<<"
    if [ -f "$cfg" ] && grep -qxF -- "$begin" "$cfg"; then
        awk -v b="$begin" -v e="$end" '
            $0 == b { skip = 1; next }
            skip && $0 == e { skip = 0; next }
            skip { next }
            { print }' "$cfg" >"$cfg.new.$$"
        chmod 600 "$cfg.new.$$"
        mv -f "$cfg.new.$$" "$cfg"
        echo "services: removed the $alias entry from $cfg" >&2
    fi
done
