#!/bin/bash
# The Arm tier's steps, run by tests/arm/tier.sh inside the arm64 rootfs (chroot, private mount namespace): every
# binary here is aarch64 under QEMU. Installs cpuperf and torch as a user would, then runs each path; each step's
# stdout/stderr go to $OUT/<step>.out/.err, its exit code and seconds to $OUT/steps.txt. tests/arm/check.py reads
# them and says what passed.
set -uo pipefail
SRC=/opt/cpuperf-src
OUT=/opt/arm-tier-out
VENV=/opt/arm-venv
TREES=/opt/arm-trees
# cpuperf's cache (its first `train --auto` measures the host: GEMM rates and allocators, alternating rounds, the
# longest step under emulation) stays in the rootfs between runs, like pip's: a second run on this machine reuses it.
export HOME=/root LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 CPUPERF_CACHE_DIR=/root/.cache/cpuperf-tier PYTHONUNBUFFERED=1
rm -rf "$OUT" "$VENV" "$TREES"
mkdir -p "$OUT"

step() {  # step NAME CMD...: run it, record rc and seconds; never stops the tier
  local name=$1 t0=$SECONDS rc
  shift
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  rc=$?
  echo "$name $rc $((SECONDS - t0))" >>"$OUT/steps.txt"
  echo "$(date +%H:%M:%S) $name: exit $rc in $((SECONDS - t0)) s" >&2
  return $rc
}

uname -m >"$OUT/uname.txt"
python3 -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])' >"$OUT/python.txt"

# 1. cpuperf from the source tree into a fresh venv, then the torch `cpuperf install` picks (PyPI: the only
#    registry this machine reaches; download.pytorch.org's CPU index is not, as for many users behind a proxy).
step venv python3 -m venv "$VENV"
step pip-install-cpuperf "$VENV/bin/pip" install "$SRC"
step install-plan "$VENV/bin/cpuperf" install --dry-run --json
step install "$VENV/bin/cpuperf" install --yes
step torch-import "$VENV/bin/python" -c 'import torch, platform; print(torch.__version__, platform.machine(), torch.backends.mkldnn.is_available())'

# 2. The recorded Neoverse trees (V1 = the recorded Graviton3 file; V2, N1 from it): --sysroot for planning.
step trees "$VENV/bin/python" "$SRC/tests/arm/trees.py" "$TREES"
for kind in neoverse_v1 neoverse_v2 neoverse_n1; do
  step "doctor-$kind" "$VENV/bin/cpuperf" doctor --sysroot "$TREES/$kind"
  step "doctor-json-$kind" "$VENV/bin/cpuperf" doctor --json --sysroot "$TREES/$kind"
  step "recommend-$kind" "$VENV/bin/cpuperf" recommend --json --sysroot "$TREES/$kind"
done
step recommend-n1-fastmath "$VENV/bin/cpuperf" recommend --json --sysroot "$TREES/neoverse_n1" --set fp32_math_mode=bf16
step dry-run-v1 "$VENV/bin/cpuperf" train --auto --dry-run --json --sysroot "$TREES/neoverse_v1" --model micro

# 3. Real runs. `train` plans a recorded host only with --dry-run (a plan for another machine never runs), and
#    QEMU hands the aarch64 processes the host's x86 /proc/cpuinfo: the V1 tree's cpuinfo is bind-mounted over it
#    (the OS edge, as LXCFS does), while /sys stays this machine's (its real CPUs and NUMA node).
mount --bind "$TREES/neoverse_v1/proc/cpuinfo" /proc/cpuinfo
step doctor-live "$VENV/bin/cpuperf" doctor --json
step train-fp32 "$VENV/bin/cpuperf" train --auto --model micro --max-steps 3 --set eval_every=0 --out "$OUT/run-fp32" --json
step train-bf16 "$VENV/bin/cpuperf" train --auto --model micro --max-steps 3 --set eval_every=0 --set dtype=bf16 \
  --out "$OUT/run-bf16" --json
step train-fastmath "$VENV/bin/cpuperf" train --auto --model micro --max-steps 2 --set eval_every=0 \
  --set fp32_math_mode=bf16 --out "$OUT/run-fastmath" --json
mkdir -p "$OUT/seen-script" "$OUT/seen-ddp"
cd "$SRC/tests/fixtures/scripts" || exit 1
step user-script env FIXTURE_OUT_DIR="$OUT/seen-script" "$VENV/bin/cpuperf" train --auto --out "$OUT/run-script" \
  --json -- "$VENV/bin/python" plain_loop.py --steps 3
step torchrun-ddp env FIXTURE_OUT_DIR="$OUT/seen-ddp" "$VENV/bin/cpuperf" train --auto --out "$OUT/run-ddp" --json \
  -- "$VENV/bin/torchrun" --nproc-per-node 2 --master-port 29517 ddp_loop.py
cd / || exit 1
umount /proc/cpuinfo
exit 0
