#!/usr/bin/env bash
# The Arm tier: cpuperf on a real aarch64 userland, on an x86 machine, under QEMU user-mode emulation.
#
#   bash tests/arm/tier.sh            # rootfs (cached), install, then every path; about 40 minutes
#   bash tests/arm/tier.sh rootfs     # only build (or find) the cached arm64 rootfs
#
# Python, pip, torch and every rank are really aarch64; the kernel is the host's, and QEMU passes the host's x86
# /proc/cpuinfo and /sys through, so cpuperf is given a recorded Neoverse tree with --sysroot (tests/arm/sysroot.py).
# Root only (debootstrap, chroot, binfmt_misc). Too slow for CI: its own tier (docs/testing.md).
# CPUPERF_ARM_CACHE: where the rootfs and pip's cache stay between runs (default /var/cache/cpuperf-arm).
# CPUPERF_ARM_LOG: the directory for each step's output and the summary (default: a new temporary directory).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CPUPERF_ARM_CACHE:-/var/cache/cpuperf-arm}
rootfs=$cache/bookworm-arm64
log=${CPUPERF_ARM_LOG:-$(mktemp -d /tmp/cpuperf-arm.XXXXXX)}
mkdir -p "$cache" "$log"
say() { printf '%s arm-tier: %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$log/summary.txt" >&2; }

[ "$(id -u)" = 0 ] || { echo "tests/arm/tier.sh: needs root (debootstrap, chroot, binfmt_misc)" >&2; exit 2; }

host_tools() {
  local need=()
  command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
  command -v update-binfmts >/dev/null || need+=(binfmt-support)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  # A container may start without binfmt_misc mounted; the 'F' flag (fix-binary) lets a chroot run the
  # interpreter without a copy inside the rootfs.
  [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64 2>/dev/null || true
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || { echo "tests/arm/tier.sh: qemu-aarch64 is not registered with binfmt_misc" >&2; exit 1; }
}

build_rootfs() {
  if [ -f "$rootfs/.cpuperf-rootfs" ]; then
    say "rootfs: cached at $rootfs"
    return
  fi
  local t0=$SECONDS
  rm -rf "$rootfs.partial"
  # debootstrap's default mirror; CPUPERF_ARM_MIRROR names another.
  debootstrap --arch=arm64 --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,procps,numactl \
    bookworm "$rootfs.partial" ${CPUPERF_ARM_MIRROR:+"$CPUPERF_ARM_MIRROR"} >"$log/debootstrap.log" 2>&1
  date -u +%FT%TZ >"$rootfs.partial/.cpuperf-rootfs"
  mv "$rootfs.partial" "$rootfs"
  say "rootfs: built in $((SECONDS - t0)) s"
}

host_tools
build_rootfs
[ "${1:-all}" = rootfs ] && exit 0

stage_source() {
  # The working tree as a user's checkout would have it (tracked and new files, nothing git ignores).
  rm -rf "$rootfs/opt/cpuperf-src"
  mkdir -p "$rootfs/opt/cpuperf-src"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) \
    | tar -xf - -C "$rootfs/opt/cpuperf-src"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  # This machine's trust store: where TLS to the registry passes a proxy with its own CA, the rootfs trusts it too.
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
}

run_inside() {
  # A private mount namespace: the rootfs's /proc, /sys, /dev and /tmp (and the cpuinfo bind mount inside.sh
  # makes) vanish with it, whatever happens.
  unshare --mount --propagation private -- bash -euc '
    r=$1
    mount -t proc proc "$r/proc" 2>/dev/null || mount --rbind /proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs -o size=4g tmpfs "$r/tmp"
    # A clean environment, as a fresh login on the Arm machine: no pip or Python setting of this shell.
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
      chroot "$r" /bin/bash /opt/cpuperf-src/tests/arm/inside.sh
  ' _ "$rootfs"
}

t0=$SECONDS
stage_source
say "inside the rootfs: install, doctor, recommend, train (log: $log)"
run_inside 2>&1 | tee -a "$log/inside.log" >&2
rm -rf "$log/out"
cp -a "$rootfs/opt/arm-tier-out" "$log/out"
say "inside: $((SECONDS - t0)) s"
python3 "$repo/tests/arm/check.py" "$log/out" | tee -a "$log/summary.txt"
