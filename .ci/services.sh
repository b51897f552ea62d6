#!/usr/bin/env bash
# Starts what the image tests talk to: a Docker Engine on a socket of its own, a registry on
# 127.0.0.1:5055, and arm64 emulation through qemu-user-static.  Idempotent: whatever already
# answers is left alone.  Run it (`bash .ci/services.sh`) or source it; either way it writes
# $PK_SERVICES_ENV (default /tmp/pk-services.env) with `export DOCKER_HOST=...`, and when
# sourced it also exports DOCKER_HOST into the calling shell.
#
# Everything lives under $PK_SERVICES_ROOT (default /tmp) so that it never touches a system
# engine that may run on the same machine.

pk_services_main() {
    set -euo pipefail
    local root="${PK_SERVICES_ROOT:-/tmp}"
    local sock="$root/pk-docker.sock"
    local data="$root/pk-docker"
    local exec_root="$root/pk-docker-exec"
    local pidfile="$root/pk-docker.pid"
    local reg_addr="${PK_REGISTRY_ADDR:-127.0.0.1:5055}"
    local reg_root="$root/pk-registry"
    local env_file="${PK_SERVICES_ENV:-/tmp/pk-services.env}"
    local missing=()

    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v docker-registry >/dev/null || missing+=(docker-registry)
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v skopeo >/dev/null || missing+=(skopeo)
    if ((${#missing[@]})); then
        echo "services: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi

    # arm64 binaries run through qemu; the F flag opens the interpreter when it is registered,
    # so it also works inside containers whose root has no qemu.
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        sed 's#:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:.*#:/usr/bin/qemu-aarch64-static:F#' \
            /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
    fi

    export DOCKER_HOST="unix://$sock"
    if ! docker info >/dev/null 2>&1; then
        echo "services: starting dockerd on $sock" >&2
        mkdir -p "$data" "$exec_root"
        if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            rm -f "$pidfile"
        fi
        rm -f "$sock"
        # vfs needs no kernel overlay support; no bridge and no iptables because the tests
        # need no container network and must leave the host's firewall alone.
        setsid dockerd --storage-driver=vfs --iptables=false --ip6tables=false --bridge=none \
            --data-root "$data" --exec-root "$exec_root" --pidfile "$pidfile" \
            --host "$DOCKER_HOST" --insecure-registry "$reg_addr" \
            </dev/null >"$root/pk-docker.log" 2>&1 &
        local _
        for _ in $(seq 1 120); do
            docker info >/dev/null 2>&1 && break
            sleep 0.5
        done
        if ! docker info >/dev/null 2>&1; then
            echo "services: dockerd did not answer; tail of $root/pk-docker.log:" >&2
            tail -n 20 "$root/pk-docker.log" >&2
            return 1
        fi
    fi

    if ! curl -fsS "http://$reg_addr/v2/" >/dev/null 2>&1; then
        echo "services: starting the registry on $reg_addr" >&2
        mkdir -p "$reg_root/data"
        cat >"$reg_root/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $reg_root/data
  delete:
    enabled: true
http:
  addr: $reg_addr
EOF
        setsid docker-registry serve "$reg_root/config.yml" \
            </dev/null >"$root/pk-registry.log" 2>&1 &
        echo $! >"$root/pk-registry.pid"
        local _
        for _ in $(seq 1 60); do
            curl -fsS "http://$reg_addr/v2/" >/dev/null 2>&1 && break
            sleep 0.5
        done
        if ! curl -fsS "http://$reg_addr/v2/" >/dev/null 2>&1; then
            echo "services: the registry did not answer; tail of $root/pk-registry.log:" >&2
            tail -n 20 "$root/pk-registry.log" >&2
            return 1
        fi
    fi

    printf 'export DOCKER_HOST=%s\nexport PK_REGISTRY=%s\n' "$DOCKER_HOST" "$reg_addr" >"$env_file"
    cat "$env_file"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    pk_services_main "$@"
else
    # Sourced: a subshell keeps `set -e` and a failure from ending the caller's shell.
    if (pk_services_main "$@"); then
        export DOCKER_HOST="unix://${PK_SERVICES_ROOT:-/tmp}/pk-docker.sock"
        export PK_REGISTRY="${PK_REGISTRY_ADDR:-127.0.0.1:5055}"
    else
        echo "services: not started" >&2
    fi
fi
