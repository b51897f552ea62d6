#!/usr/bin/env bash
# Starts what the image tests talk to, under a folder of the suite's own, $PK_SERVICES_ROOT
# (default /tmp/patchkit-tests): every socket, data root, key, config, pid file and log is
# there, and everything listens on 127.0.0.1 alone, on a port found free when it starts:
#   - a Docker Engine (DOCKER_HOST, a socket), with arm64 emulation through qemu-user-static;
#   - a registry (PK_REGISTRY=127.0.0.1:PORT);
#   - Podman serving its Docker-compatible API (PK_PODMAN_HOST, a socket): an engine whose
#     image store is containers-storage, not dockerd's;
#   - a second Docker Engine reachable through a real sshd of its own (PK_NODE2=
#     ssh://pk-node2:PORT; its socket is PK_NODE2_SOCKET, for tests that look at it directly);
#   - a third one made the same way (PK_NODE3, PK_NODE3_SOCKET), for copies to two targets.
# ssh reaches the nodes through the suite's own client config, ROOT/ssh_config, never the
# user's ~/.ssh/config: ROOT/bin/ssh runs the system's ssh with `-F ROOT/ssh_config`, and the
# environment written below puts ROOT/bin first on PATH, so that the docker CLI, the Docker
# SDK (use_ssh_client) and patchkit, which all run `ssh` from PATH, take it.
#
# Whatever of ours already answers is left alone.  Each process this run starts is recorded,
# one line `NAME PID WORD`, in $PK_SERVICES_STARTED when that is set: `make test`
# (.ci/test.sh) stops those at its end and nothing else (.ci/services-stop.sh).  Run it
# (`bash .ci/services.sh`) or source it; either way it writes $PK_SERVICES_ENV (default
# ROOT/services.env) with the exports above, and when sourced it also exports them into the
# calling shell.  It needs root: it installs Debian packages that are missing, registers qemu's
# binfmt entry, and starts dockerd and sshd.

pk_root() { echo "${PK_SERVICES_ROOT:-/tmp/patchkit-tests}"; }
pk_env_file() { echo "${PK_SERVICES_ENV:-$(pk_root)/services.env}"; }

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

# pk_free_port: a TCP port of 127.0.0.1 that nothing listens on now.  Whoever binds it next
# may be another program: each start below checks that its own process took it.
pk_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# pk_ours PIDFILE WORD: the pid file names a live process whose command line holds WORD.
# The word (a socket or config path of ours) keeps a recycled pid from being taken for ours.
pk_ours() {
    local pid
    [ -f "$1" ] || return 1
    pid="$(cat "$1" 2>/dev/null)" || return 1
    pk_is "$pid" "$2"
}

# pk_is PID WORD: PID is a live process (not a zombie) whose command line holds WORD.
pk_is() {
    [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] || return 1
    [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$2"
}

# pk_stop_ours PIDFILE WORD: ends that process (and only it), then forgets the pid file.
pk_stop_ours() {
    local pid _
    if pk_ours "$1" "$2"; then
        pid="$(cat "$1")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            pk_is "$pid" "$2" || break
            sleep 0.25
        done
    fi
    rm -f "$1"
}

# pk_started NAME PID WORD: this run started PID (NAME says what it is); see the header.
pk_started() {
    [ -z "${PK_SERVICES_STARTED:-}" ] || echo "$1 $2 $3" >>"$PK_SERVICES_STARTED"
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

# pk_storage ROOT: the engines' storage driver, $PK_STORAGE_DRIVER when set, else overlay2 where
# the kernel mounts an overlay on ROOT's filesystem (a layer is stored once and a container
# starts without a copy of its image), else vfs (which needs no kernel support, and copies the
# whole image for each layer and each container).  Sets PK_STORAGE.
pk_storage() {
    local root="$1" probe
    PK_STORAGE="${PK_STORAGE_DRIVER:-}"
    [ -z "$PK_STORAGE" ] || return 0
    PK_STORAGE=vfs
    probe="$(mktemp -d "$root/overlay-probe.XXXXXX")" || return 0
    mkdir -p "$probe/l" "$probe/u" "$probe/w" "$probe/m"
    if mount -t overlay overlay -o "lowerdir=$probe/l,upperdir=$probe/u,workdir=$probe/w" \
            "$probe/m" 2>/dev/null; then
        umount "$probe/m" && PK_STORAGE=overlay2
    fi
    rm -rf "$probe"
}

# pk_dockerd WHAT ROOT BASE [extra flags...]: a dockerd of ours (WHAT names it in messages) on
# unix://ROOT/BASE.sock, its data in ROOT/BASE, left alone when it answers.
pk_dockerd() {
    local name="$1" root="$2" base="$3"
    shift 3
    local host="unix://$root/$base.sock" pidfile="$root/$base.pid" log="$root/$base.log"
    if pk_ours "$pidfile" "$host" && docker -H "$host" version >/dev/null 2>&1; then
        return 0
    fi
    pk_say "starting $name on ${host#unix://}"
    mkdir -p "$root/$base" "$root/$base-exec"
    pk_stop_ours "$pidfile" "$host"
    rm -f "${host#unix://}"
    # The storage driver is pk_storage's; no bridge and no iptables because the tests need
    # no container network and must leave the host's firewall alone.  A registry on 127.0.0.1
    # is plain HTTP to dockerd without a flag (127.0.0.0/8 is insecure by default).  Containers
    # get 2 s to stop when it stops, so that a stop at the end of a run is quick.
    setsid dockerd --storage-driver="${PK_STORAGE:-vfs}" --iptables=false --ip6tables=false \
        --bridge=none --data-root "$root/$base" --exec-root "$root/$base-exec" --pidfile "$pidfile" \
        --host "$host" --shutdown-timeout 2 "$@" </dev/null >"$log" 2>&1 &
    pk_started "$base" $! "$host"
    pk_wait 120 docker -H "$host" version || pk_log_tail "$name" "$log"
}

# pk_registry ROOT: our registry, on the port it already has, else on one found free; sets
# PK_REG_ADDR.
pk_registry() {
    local root="$1"
    local dir="$root/pk-registry" pidfile="$root/pk-registry.pid" log="$root/pk-registry.log"
    local cfg="$root/pk-registry/config.yml" try pid port
    mkdir -p "$dir/data"
    if pk_ours "$pidfile" "$cfg"; then
        PK_REG_ADDR="$(sed -n 's/^  addr: //p' "$cfg")"
        curl -fsS "http://$PK_REG_ADDR/v2/" >/dev/null 2>&1 && return 0
        pk_stop_ours "$pidfile" "$cfg"
    fi
    for try in 1 2 3; do
        port="$(pk_free_port)"
        PK_REG_ADDR="127.0.0.1:$port"
        pk_say "starting the registry on $PK_REG_ADDR"
        cat >"$cfg" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $PK_REG_ADDR
EOF
        setsid docker-registry serve "$cfg" </dev/null >"$log" 2>&1 &
        pid=$!
        echo "$pid" >"$pidfile"
        pk_started registry "$pid" "$cfg"
        # it answers once it listens, or ends when the port was taken in the meantime
        local _
        for _ in $(seq 1 60); do
            pk_is "$pid" "$cfg" || break
            if curl -fsS "http://$PK_REG_ADDR/v2/" >/dev/null 2>&1; then
                return 0
            fi
            sleep 0.5
        done
        pk_stop_ours "$pidfile" "$cfg"
        [ "$try" = 3 ] || pk_say "the registry did not start on $PK_REG_ADDR; another port"
    done
    pk_log_tail "the registry" "$log"
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
    # the registry's port is in registries.conf: a new port is a new config, and a restart
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
        pk_started podman $! "$sock"
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

# pk_ssh_client ROOT: the suite's ssh client config (every node's Host block) and the `ssh`
# on PATH that reads it instead of ~/.ssh/config.
pk_ssh_client() {
    local root="$1" real
    mkdir -p "$root/bin"
    # the system's ssh: the first on PATH that is not ours
    real="$(PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$root/bin" | paste -sd:)" \
        command -v ssh)"
    cat "$root"/pk-node*-ssh/client_config 2>/dev/null | pk_write "$root/ssh_config" || true
    chmod 600 "$root/ssh_config"
    pk_write "$root/bin/ssh" <<EOF || true
#!/bin/sh
# ssh with the test suite's own client config (written by .ci/services.sh), which names the
# test nodes; ~/.ssh/config is not read.
exec '$real' -F '$root/ssh_config' "\$@"
EOF
    chmod 755 "$root/bin/ssh"
}

# pk_node ROOT N ORDINAL: node N (alias pk-nodeN) is a dockerd of its own on
# ROOT/pk-nodeN.sock, reachable through an sshd of its own on 127.0.0.1 (its port kept while
# it runs, else found free); ORDINAL ("second") is how its messages and comments name it.
# Sets PK_NODE_PORT.
pk_node() {
    local root="$1" n="$2" ordinal="$3"
    local alias="pk-node$n"
    local d_host="unix://$root/$alias.sock" d_log="$root/$alias.log"
    local ssh_dir="$root/$alias-ssh" ssh_pid="$root/$alias-sshd.pid"
    local t0=$SECONDS started=""

    # Before 23.0 a dockerd takes its ID from a key file, /etc/docker/key.json unless its
    # config names another: without one of its own this engine would share the first one's
    # ID.  Later versions keep the ID in the data root and know no such key.
    local extra=() major
    major="$(dockerd --version | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')"
    if [ -n "$major" ] && [ "$major" -lt 23 ]; then
        mkdir -p "$root/$alias"
        printf '{"deprecated-key-path": "%s"}\n' "$root/$alias/key.json" \
            | pk_write "$root/$alias.json" || true
        extra+=(--config-file "$root/$alias.json")
    fi
    pk_dockerd "the $ordinal node's dockerd" "$root" "$alias" "${extra[@]}"

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

    local cfg="$ssh_dir/sshd_config" port="" try
    if pk_ours "$ssh_pid" "$cfg"; then
        port="$(sed -n 's/^Port //p' "$cfg")"
        pk_node_client "$root" "$n" "$port"
        if ssh -o ConnectTimeout=5 "$alias" true >/dev/null 2>&1; then
            PK_NODE_PORT="$port"
            return 0
        fi
        pk_stop_ours "$ssh_pid" "$cfg"
    fi
    mkdir -p /run/sshd  # its privilege separation directory
    chmod 755 /run/sshd
    for try in 1 2 3; do
        port="$(pk_free_port)"
        pk_write "$cfg" <<EOF || true
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
SetEnv DOCKER_HOST=$d_host
EOF
        pk_node_client "$root" "$n" "$port"
        /usr/sbin/sshd -t -f "$cfg"
        pk_say "starting sshd on 127.0.0.1:$port for the $ordinal node"
        started=1
        # In the foreground (-D) of a session of its own, so that its pid is the one started;
        # a clean environment: sessions get only what sshd_config gives them.
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            setsid /usr/sbin/sshd -D -f "$cfg" -E "$ssh_dir/sshd.log" </dev/null &
        local pid=$!
        echo "$pid" >"$ssh_pid"
        pk_started "$alias-sshd" "$pid" "$cfg"
        local _ up=""
        for _ in $(seq 1 60); do
            pk_is "$pid" "$cfg" || break
            if ssh -o ConnectTimeout=5 "$alias" true >/dev/null 2>&1; then
                up=1
                break
            fi
            sleep 0.5
        done
        [ -z "$up" ] || break
        pk_stop_ours "$ssh_pid" "$cfg"
        if [ "$try" = 3 ]; then
            pk_log_tail "sshd" "$ssh_dir/sshd.log"
            return 1
        fi
        pk_say "sshd did not start on 127.0.0.1:$port; another port"
    done

    # The docker CLI dials the far side's `docker system dial-stdio` through ssh.
    if ! DOCKER_HOST="ssh://$alias:$port" docker version >/dev/null 2>&1; then
        pk_say "DOCKER_HOST=ssh://$alias:$port docker version failed:"
        DOCKER_HOST="ssh://$alias:$port" docker version >&2 || true
        pk_log_tail "the $ordinal node through ssh" "$ssh_dir/sshd.log" || true
        pk_log_tail "the $ordinal node's dockerd" "$d_log"
        return 1
    fi
    PK_NODE_PORT="$port"
    [ -z "$started" ] || pk_say "the $ordinal node answers through ssh://$alias:$port ($((SECONDS - t0)) s)"
}

# pk_node_client ROOT N PORT: node N's Host block in the suite's ssh client config.
pk_node_client() {
    local root="$1" alias="pk-node$2" port="$3"
    local ssh_dir="$root/$alias-ssh"
    {
        printf 'Host %s\n' "$alias"
        printf '    HostName 127.0.0.1\n    Port %s\n    User root\n' "$port"
        printf '    IdentityFile %s\n    IdentitiesOnly yes\n' "$ssh_dir/id"
        printf '    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n'
        printf '    BatchMode yes\n    LogLevel ERROR\n'
    } | pk_write "$ssh_dir/client_config" || true
    pk_ssh_client "$root"
}

pk_services_main() {
    set -euo pipefail
    local root env_file
    root="$(pk_root)"
    env_file="$(pk_env_file)"
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

    mkdir -p "$root"
    chmod 700 "$root"

    # arm64 binaries run through qemu; the F flag opens the interpreter when it is registered,
    # so it also works inside containers whose root has no qemu.  What this run registers is
    # recorded, and taken away again with the rest.
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        pk_started binfmt_misc-mount - /proc/sys/fs/binfmt_misc
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        sed 's#:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:.*#:/usr/bin/qemu-aarch64-static:F#' \
            /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
        pk_started binfmt - /proc/sys/fs/binfmt_misc/qemu-aarch64
    fi

    # ssh on PATH is ours from here on, as for the tests (see the header)
    pk_ssh_client "$root"
    export PATH="$root/bin:$PATH"

    pk_storage "$root"
    pk_registry "$root"
    local reg="$PK_REG_ADDR"
    pk_dockerd dockerd "$root" pk-docker
    # what the engine says it uses (one left running from before keeps the driver it had)
    pk_say "the engines store images with the" \
        "$(docker -H "unix://$root/pk-docker.sock" info -f '{{.Driver}}' 2>/dev/null) driver"
    pk_podman "$root" "$reg"
    pk_node "$root" 2 second
    local port2="$PK_NODE_PORT"
    pk_node "$root" 3 third
    local port3="$PK_NODE_PORT"

    {
        printf 'export PK_SERVICES_ROOT=%s\n' "$root"
        # shellcheck disable=SC2016  # $PATH is the sourcing shell's
        printf 'export PATH="%s:$PATH"\n' "$root/bin"
        printf 'export DOCKER_HOST=unix://%s\nexport PK_REGISTRY=%s\n' "$root/pk-docker.sock" "$reg"
        printf 'export PK_PODMAN_HOST=unix://%s\n' "$root/pk-podman/podman.sock"
        printf 'export PK_NODE2=ssh://pk-node2:%s\n' "$port2"
        printf 'export PK_NODE2_SOCKET=unix://%s\n' "$root/pk-node2.sock"
        printf 'export PK_NODE3=ssh://pk-node3:%s\n' "$port3"
        printf 'export PK_NODE3_SOCKET=unix://%s\n' "$root/pk-node3.sock"
    } | pk_write "$env_file" || true
    cat "$env_file"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    pk_services_main "$@"
else
    # Sourced: a subshell keeps `set -e` and a failure from ending the caller's shell.
    if (pk_services_main "$@"); then
        # shellcheck disable=SC1090
        . "$(pk_env_file)"
    else
        echo "services: not started" >&2
    fi
fi
