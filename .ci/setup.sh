#!/usr/bin/env bash
# Everything the test suite needs that pip does not bring: system tools, then the services
# (Docker Engine, registry, arm64 emulation) through .ci/services.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
# a C compiler, the aarch64 cross compiler and ninja: the compiled-code tests build real shared
# objects and run ninja with FlashInfer's rule
for tool in git:git patch:patch shellcheck:shellcheck unzip:unzip gcc:gcc \
        aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu ninja:ninja-build; do
    command -v "${tool%%:*}" >/dev/null || need+=("${tool##*:}")
done
if ((${#need[@]})); then
    echo "setup: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash .ci/services.sh
