#!/usr/bin/env bash
# Installs what the emulated cross tier (make test-cross) needs on Debian/Ubuntu: qemu-user, and the
# cross C compilers and C libraries that build tests/cross/harness.c statically for aarch64,
# riscv64, ppc64le and s390x (binutils come with them: the tier disassembles vector variants).
# Needs root or sudo; does nothing when every package is already installed.
set -euo pipefail
packages=(qemu-user
          gcc-aarch64-linux-gnu libc6-dev-arm64-cross
          gcc-riscv64-linux-gnu libc6-dev-riscv64-cross
          gcc-powerpc64le-linux-gnu libc6-dev-ppc64el-cross
          gcc-s390x-linux-gnu libc6-dev-s390x-cross)
need=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${need[@]}"
