#!/usr/bin/env bash
# Stops what .ci/services.sh started, and nothing else:
#   .ci/services-stop.sh        every service of ours under $PK_SERVICES_ROOT, by its pid file;
#   .ci/services-stop.sh LIST   only what LIST names: the lines `NAME PID WORD` services.sh
#                               recorded as it started them (what `make test` does at its end).
# A process is ended only while its command line holds its WORD (a socket or config path of
# ours), so that a recycled pid is never taken for ours.  They are all asked at once (SIGTERM);
# whatever still runs after $PK_STOP_WAIT seconds (default 5) is killed.  With a LIST, a qemu
# binfmt entry (and the binfmt_misc mount) that run registered is taken away too.  Data
# (images, keys) stays for next time.
set -uo pipefail
root="${PK_SERVICES_ROOT:-/tmp/patchkit-tests}"
wait_s="${PK_STOP_WAIT:-5}"

ours() { # PID WORD: a live process (not a zombie) whose command line holds WORD
    [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] || return 1
    [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$2"
}

names=() pids=() words=() undo=()
if (($#)); then
    while read -r name pid word; do
        [ -n "${name:-}" ] || continue
        if [ "$pid" = - ]; then
            undo=("$name $word" "${undo[@]}")   # the last registered is the first taken away
        else
            names+=("$name") pids+=("$pid") words+=("$word")
        fi
    done <"$1"
else
    for entry in "pk-node2-sshd:$root/pk-node2-ssh/sshd_config" "pk-node2:$root/pk-node2.sock" \
                 "pk-node3-sshd:$root/pk-node3-ssh/sshd_config" "pk-node3:$root/pk-node3.sock" \
                 "pk-podman:$root/pk-podman/podman.sock" \
                 "pk-registry:$root/pk-registry/config.yml" "pk-docker:$root/pk-docker.sock"; do
        name="${entry%%:*}"
        [ -f "$root/$name.pid" ] || continue
        names+=("$name") pids+=("$(cat "$root/$name.pid")") words+=("${entry#*:}")
    done
fi

asked=()
for i in "${!pids[@]}"; do
    if ours "${pids[$i]}" "${words[$i]}"; then
        kill "${pids[$i]}" 2>/dev/null && asked+=("$i")
    fi
done
deadline=$((SECONDS + wait_s))
for i in "${asked[@]}"; do
    while ours "${pids[$i]}" "${words[$i]}" && ((SECONDS < deadline)); do
        sleep 0.1
    done
done
for i in "${asked[@]}"; do
    how=stopped
    if ours "${pids[$i]}" "${words[$i]}"; then
        kill -KILL "${pids[$i]}" 2>/dev/null || true
        how=killed
    fi
    echo "services: $how ${names[$i]} (pid ${pids[$i]})" >&2
done
if ((!$#)); then
    for name in "${names[@]}"; do rm -f "$root/$name.pid"; done
fi

# A dockerd that ended leaves behind what runs and is mounted beside it: the shims of containers
# still running (each with its container's processes) and, on overlay2, the mounts of its data
# root and of those containers.  Each stopped engine's are ended and unmounted here.
for i in "${asked[@]}"; do
    case "${names[$i]}" in pk-docker | pk-node2 | pk-node3) ;; *) continue ;; esac
    base="$root/${names[$i]}"
    for shim in $(pgrep -f "containerd-shim.* -address $base-exec/" || true); do
        pkill -KILL -P "$shim" 2>/dev/null || true
        kill -KILL "$shim" 2>/dev/null \
            && echo "services: killed a container's shim of ${names[$i]} (pid $shim)" >&2
    done
    awk -v a="$base" -v b="$base-exec/" \
        '$2 == a || index($2, a "/") == 1 || index($2, b) == 1 { print length($2), $2 }' \
        /proc/self/mounts | sort -rn | cut -d' ' -f2- | while read -r point; do
        { umount "$point" 2>/dev/null || umount -l "$point"; } \
            && echo "services: unmounted $point" >&2
    done
done

for entry in "${undo[@]}"; do
    case "${entry%% *}" in
        binfmt)
            if [ -e "${entry#* }" ] && echo -1 >"${entry#* }"; then
                echo "services: removed the binfmt entry ${entry#* }" >&2
            fi ;;
        binfmt_misc-mount)
            umount "${entry#* }" && echo "services: unmounted ${entry#* }" >&2 ;;
    esac
done
exit 0
