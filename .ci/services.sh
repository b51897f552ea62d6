#!/usr/bin/env bash
# Starts what the image tests talk to, each on sockets and ports of its own:
#   - a Docker Engine (DOCKER_HOST), with arm64 emulation through qemu-user-static;
#   - a registry on 127.0.0.1:5055 (PK_REGISTRY);
#   - Podman serving its Docker-compatible API (PK_PODMAN_HOST): an engine whose image store
#     is containers-storage, not dockerd's;
#   - a second Docker Engine reachable only through a real sshd on 127.0.0.1:2222, as the
#     second node (PK_NODE2=ssh://pk-node2:2222; its socket is PK_NODE2_SOCKET, for tests that
#     look at it directly).  `ssh pk-node2` works through a marked Host block in root's
#     ~/.ssh/config, because the docker CLI and SDK reach ssh:// engines through the system ssh;
#   - a third Docker Engine made the same way behind its own sshd on 127.0.0.1:2223
#     (PK_NODE3=ssh://pk-node3:2223, PK_NODE3_SOCKET), for copies to two targets at once.
# Idempotent: whatever already answers is left alone.  Run it (`bash .ci/services.sh`) or
# source it; either way it writes $PK_SERVICES_ENV (default /tmp/pk-services.env) with the
# exports above, and when sourced it also exports them into the calling shell.
#
# Everything lives under $PK_SERVICES_ROOT (default /tmp) so that it never touches a system
# engine that may run on the same machine.  Nothing listens beyond 127.0.0.1.

PK_NODE2_ALIAS=pk-node2

# The marks around a node's Host block in ~/.ssh/config.
pk_ssh_begin() { echo "# >>> patchkit test services: $1 (written by .ci/services.sh) >>>"; }
pk_ssh_end() { echo "# <<< patchkit test services: $1 <<<"; }

pk_say() { echo "services: $*" >&2; }

# pk_wait TRIES CMD...: runs CMD every half second until it succeeds, TRIES times at most.
pk_wait() {
    local tries="$1" _
    shift
    for _ in $(seq 1 "$tries"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    "$@" >/dev/null 2>&1
}

pk_log_tail() {
    pk_say "$1 did not answer; tail of $2:"
    tail -n 20 "$2" >&2 2>/dev/null || true
    return 1
}

# pk_ours PIDFILE WORD: the pid file names a live process whose command line holds WORD.
# The word (a socket or config path of ours) keeps a recycled pid from being taken for ours.
pk_ours() {
    local pid
    [ -f "$1" ] || return 1
    pid="$(cat "$1" 2>/dev/null)" || return 1
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}

# pk_stop_ours PIDFILE WORD: ends that process (and only it), then forgets the pid file.
pk_stop_ours() {
    local pid _
    if pk_ours "$1" "$2"; then
        pid="$(cat "$1")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
    fi
    rm -f "$1"
}

# pk_write FILE: stdin becomes FILE's content; succeeds when the content changed.
pk_write() {
    local tmp="$1.new.$$"
    cat >"$tmp"
    if [ -f "$1" ] && cmp -s "$tmp" "$1"; then
        rm -f "$tmp"
        return 1
    fi
    mv -f "$tmp" "$1"
}

# pk_install PACKAGE... [-- PACKAGE...]: from Debian's archive, those after `--` without their
# recommends (Podman's and openssh-server's would bring systemd), and with no service started
# by the packages (openssh-server would start an sshd on 0.0.0.0:22, docker-registry one on
# :5000).
pk_install() {
    local policy=/usr/sbin/policy-rc.d made="" rc=0 full=() lean=()
    while (($#)) && [ "$1" != -- ]; do full+=("$1"); shift; done
    (($#)) && shift
    lean=("$@")
    local all=("${full[@]}" "${lean[@]}")
    pk_say "installing ${all[*]}"
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# no daemons while .ci/services.sh installs packages\nexit 101\n' \
            >"$policy"
        chmod 755 "$policy"
        made=1
    fi
    apt-get update -qq || rc=$?
    if [ "$rc" = 0 ] && ((${#full[@]})); then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${full[@]}" >/dev/null || rc=$?
    fi
    if [ "$rc" = 0 ] && ((${#lean[@]})); then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${lean[@]}" \
            >/dev/null || rc=$?
    fi
    [ -z "$made" ] || rm -f "$policy"
    return "$rc"
}

pk_start_dockerd() { # NAME DATA EXEC_ROOT PIDFILE SOCKET REGISTRY LOG [extra flags...]
    local name="$1" data="$2" exec_root="$3" pidfile="$4" host="$5" reg="$6" log="$7"
    shift 7
    mkdir -p "$data" "$exec_root"
    pk_stop_ours "$pidfile" "$host"
    rm -f "${host#unix://}"
    # vfs needs no kernel overlay support; no bridge and no iptables because the tests need
    # no container network and must leave the host's firewall alone.
    setsid dockerd --storage-driver=vfs --iptables=false --ip6tables=false --bridge=none \
        --data-root "$data" --exec-root "$exec_root" --pidfile "$pidfile" \
        --host "$host" --insecure-registry "$reg" "$@" \
        </dev/null >"$log" 2>&1 &
    pk_wait 120 docker -H "$host" version || pk_log_tail "$name" "$log"
}

# pk_hard_limit PID WHAT: a process's hard limit ("open files", "processes") from /proc.
pk_hard_limit() {
    awk -v what="$2" 'index($0, "Max " what " ") == 1 { print $(NF - 1) }' "/proc/$1/limits"
}

pk_podman_conf() { # DIR REGISTRY NOFILE NPROC: writes Podman's config; succeeds when it changed
    local dir="$1" reg="$2" changed=1
    # Containers get the limits podman itself has: by default Podman asks for 1048576 open
    # files and processes, and where root cannot raise its hard limits (no CAP_SYS_RESOURCE;
    # here nofile stops at 20000) every container then fails with "error setting rlimit type
    # 7" (6 for processes): "operation not permitted".
    pk_write "$dir/containers.conf" <<EOF && changed=0
[containers]
default_ulimits = ["nofile=$3:$3", "nproc=$4:$4"]
netns = "none"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$dir/tmp"
EOF
    pk_write "$dir/registries.conf" <<EOF && changed=0
[[registry]]
location = "$reg"
insecure = true
EOF
    return "$changed"
}

pk_podman() { # ROOT REGISTRY
    local root="$1" reg="$2"
    local dir="$root/pk-podman"
    local sock="$dir/podman.sock" pidfile="$root/pk-podman.pid" log="$dir/service.log"
    local host="unix://$dir/podman.sock" changed="" nofile nproc pid_max
    mkdir -p "$dir/root" "$dir/run" "$dir/tmp"
    nofile="$(ulimit -Hn)"
    nproc="$(ulimit -Hu)"
    pid_max="$(cat /proc/sys/kernel/pid_max)"
    [ "$nofile" != unlimited ] && [ "$nofile" -le 1048576 ] || nofile=1048576
    [ "$nproc" != unlimited ] && [ "$nproc" -le "$pid_max" ] || nproc="$pid_max"
    if pk_ours "$pidfile" "$sock"; then
        # What the running service found it could have (see below) stays the truth.
        nofile="$(pk_hard_limit "$(cat "$pidfile")" "open files")"
        nproc="$(pk_hard_limit "$(cat "$pidfile")" processes)"
    fi
    pk_podman_conf "$dir" "$reg" "$nofile" "$nproc" && changed=1
    # Its /_ping answers in milliseconds, its version in a good part of a second.
    if [ -z "$changed" ] && pk_ours "$pidfile" "$sock" \
            && curl -fsS --unix-socket "$sock" http://podman/_ping >/dev/null 2>&1; then
        return 0
    fi
    local t0=$SECONDS try
    for try in 1 2; do
        pk_say "starting Podman's API on $sock"
        pk_stop_ours "$pidfile" "$sock"
        rm -f "$sock"
        CONTAINERS_CONF="$dir/containers.conf" CONTAINERS_REGISTRIES_CONF="$dir/registries.conf" \
            setsid podman --root "$dir/root" --runroot "$dir/run" --storage-driver vfs \
            system service --time=0 "$host" </dev/null >"$log" 2>&1 &
        echo $! >"$pidfile"
        pk_wait 120 curl -fsS --unix-socket "$sock" http://podman/_ping \
            || pk_log_tail "Podman" "$log"
        docker -H "$host" version >/dev/null || pk_log_tail "Podman's Docker API" "$log"
        # Podman lowers its own process limit (to 32768 here) as it starts; its containers
        # cannot have more than it has.
        nofile="$(pk_hard_limit "$(cat "$pidfile")" "open files")"
        nproc="$(pk_hard_limit "$(cat "$pidfile")" processes)"
        pk_podman_conf "$dir" "$reg" "$nofile" "$nproc" || break
        if [ "$try" = 2 ]; then
            pk_say "Podman's limits do not settle; see $dir/containers.conf"
            return 1
        fi
    done
    pk_say "Podman answers ($((SECONDS - t0)) s)"
}

# pk_node ROOT REGISTRY N PORT ORDINAL: node N (alias pk-nodeN) is a dockerd of its own on
# $ROOT/pk-nodeN.sock, reachable through an sshd of its own on 127.0.0.1:PORT; ORDINAL
# ("second") is how its messages and config comments name it.
pk_node() {
    local root="$1" reg="$2" n="$3" port="$4" ordinal="$5"
    local alias="pk-node$n"
    local d2="$root/$alias" d2_exec="$root/$alias-exec" d2_pid="$root/$alias.pid"
    local d2_host="unix://$root/$alias.sock" d2_log="$root/$alias.log"
    local ssh_dir="$root/$alias-ssh" ssh_pid="$root/$alias-sshd.pid"
    local url="ssh://$alias:$port" t0=$SECONDS started=""

    if ! docker -H "$d2_host" version >/dev/null 2>&1; then
        pk_say "starting the $ordinal node's dockerd on ${d2_host#unix://}"
        started=1
        # Before 23.0 a dockerd takes its ID from a key file, /etc/docker/key.json unless its
        # config names another: without one of its own this engine would share the first
        # one's ID.  Later versions keep the ID in the data root and know no such key.
        local extra=() major
        major="$(dockerd --version | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')"
        if [ -n "$major" ] && [ "$major" -lt 23 ]; then
            mkdir -p "$d2"
            printf '{"deprecated-key-path": "%s"}\n' "$d2/key.json" \
                | pk_write "$root/$alias.json" || true
            extra+=(--config-file "$root/$alias.json")
        fi
        pk_start_dockerd "the $ordinal node's dockerd" "$d2" "$d2_exec" "$d2_pid" "$d2_host" \
            "$reg" "$d2_log" "${extra[@]}"
    fi

    # Keys: made once, kept across runs (the client key must stay what authorized_keys says).
    mkdir -p "$ssh_dir"
    chmod 700 "$ssh_dir"
    local key
    for key in host_key id; do
        [ -f "$ssh_dir/$key" ] || ssh-keygen -q -t ed25519 -N '' -C "$alias $key" \
            -f "$ssh_dir/$key"
    done
    pk_write "$ssh_dir/authorized_keys" <"$ssh_dir/id.pub" || true
    chmod 600 "$ssh_dir/authorized_keys"

    local changed=""
    pk_write "$ssh_dir/sshd_config" <<EOF && changed=1
# The $ordinal node: key auth only, on 127.0.0.1 alone; every session talks to its dockerd.
Port $port
ListenAddress 127.0.0.1
HostKey $ssh_dir/host_key
PidFile $ssh_pid
AuthorizedKeysFile $ssh_dir/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
X11Forwarding no
AllowAgentForwarding no
AllowTcpForwarding no
PrintMotd no
SetEnv DOCKER_HOST=$d2_host
EOF

    # The client side: ssh's first match wins, so the block goes ahead of any other entry.
    # ssh reads the config of the user's home in the password database, whatever $HOME says.
    local home
    home="$(pk_home)"
    mkdir -p "$home/.ssh"
    chmod 700 "$home/.ssh"
    local cfg="$home/.ssh/config"
    local begin end
    begin="$(pk_ssh_begin "$alias")"
    end="$(pk_ssh_end "$alias")"
    local block
    block="$(
        printf '%s\n' "$begin"
        printf 'Host %s\n' "$alias"
        printf '    HostName 127.0.0.1\n    Port %s\n    User root\n' "$port"
        printf '    IdentityFile %s\n    IdentitiesOnly yes\n' "$ssh_dir/id"
        printf '    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n'
        printf '    BatchMode yes\n    LogLevel ERROR\n'
        printf '%s\n' "$end"
    )"
    # Left alone when the block is there as it should be, so that runs do not reorder blocks.
    if [ "$(pk_ssh_config_block "$begin" "$end" 2>/dev/null <"$cfg")" != "$block" ]; then
        {
            printf '%s\n' "$block"
            if [ -f "$cfg" ]; then
                pk_ssh_config_without_block "$begin" "$end" <"$cfg"
            fi
        } | pk_write "$cfg" || true
    fi
    chmod 600 "$cfg"

    # The docker CLI dials the far side's `docker system dial-stdio` through the system ssh.
    if [ -z "$changed$started" ] && pk_ours "$ssh_pid" "$ssh_dir/sshd_config" \
            && DOCKER_HOST="$url" docker version >/dev/null 2>&1; then
        return 0
    fi
    if [ -n "$changed" ] || ! pk_ours "$ssh_pid" "$ssh_dir/sshd_config" \
            || ! ssh -o ConnectTimeout=5 "$alias" true >/dev/null 2>&1; then
        pk_say "starting sshd on 127.0.0.1:$port for the $ordinal node"
        started=1
        mkdir -p /run/sshd  # its privilege separation directory
        chmod 755 /run/sshd
        /usr/sbin/sshd -t -f "$ssh_dir/sshd_config"
        pk_stop_ours "$ssh_pid" "$ssh_dir/sshd_config"
        # A clean environment: sessions get only what sshd_config gives them.
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            /usr/sbin/sshd -f "$ssh_dir/sshd_config" -E "$ssh_dir/sshd.log"
        pk_wait 60 ssh -o ConnectTimeout=5 "$alias" true \
            || pk_log_tail "sshd" "$ssh_dir/sshd.log"
    fi

    if ! DOCKER_HOST="$url" docker version >/dev/null 2>&1; then
        pk_say "DOCKER_HOST=$url docker version failed:"
        DOCKER_HOST="$url" docker version >&2 || true
        pk_log_tail "the $ordinal node through ssh" "$ssh_dir/sshd.log" || true
        pk_log_tail "the $ordinal node's dockerd" "$d2_log"
        return 1
    fi
    [ -z "$started" ] || pk_say "the $ordinal node answers through $url ($((SECONDS - t0)) s)"
}

pk_home() { getent passwd "$(id -u)" | cut -d: -f6; }

# pk_ssh_config_block BEGIN END: prints the marked block of stdin.
pk_ssh_config_block() {
    awk -v b="$1" -v e="$2" '
        $0 == b { keep = 1 }
        keep { print }
        keep && $0 == e { keep = 0 }'
}

# pk_ssh_config_without_block BEGIN END: prints stdin without the marked block.
pk_ssh_config_without_block() {
    awk -v b="$1" -v e="$2" '
        $0 == b { skip = 1; next }
        skip && $0 == e { skip = 0; next }
        skip { next }
        { print }'
}

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
    command -v curl >/dev/null || missing+=(curl)
    local lean=()
    command -v podman >/dev/null || lean+=(podman)
    [ -x /usr/sbin/sshd ] || lean+=(openssh-server)
    command -v ssh >/dev/null || lean+=(openssh-client)
    if ((${#missing[@]} + ${#lean[@]})); then
        pk_install "${missing[@]}" -- "${lean[@]}"
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

    pk_podman "$root" "$reg_addr"
    pk_node "$root" "$reg_addr" 2 "${PK_NODE2_SSH_PORT:-2222}" second
    pk_node "$root" "$reg_addr" 3 "${PK_NODE3_SSH_PORT:-2223}" third

    {
        printf 'export DOCKER_HOST=%s\nexport PK_REGISTRY=%s\n' "$DOCKER_HOST" "$reg_addr"
        printf 'export PK_PODMAN_HOST=unix://%s\n' "$root/pk-podman/podman.sock"
        printf 'export PK_NODE2=ssh://%s:%s\n' "$PK_NODE2_ALIAS" "${PK_NODE2_SSH_PORT:-2222}"
        printf 'export PK_NODE2_SOCKET=unix://%s\n' "$root/pk-node2.sock"
        printf 'export PK_NODE3=ssh://pk-node3:%s\n' "${PK_NODE3_SSH_PORT:-2223}"
        printf 'export PK_NODE3_SOCKET=unix://%s\n' "$root/pk-node3.sock"
    } >"$env_file"
    cat "$env_file"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    pk_services_main "$@"
else
    # Sourced: a subshell keeps `set -e` and a failure from ending the caller's shell.
    if (pk_services_main "$@"); then
        # shellcheck disable=SC1090
        . "${PK_SERVICES_ENV:-/tmp/pk-services.env}"
    else
        echo "services: not started" >&2
    fi
fi
