#!/usr/bin/env bash
# The test command: the README's second line, and what .ci/run calls. On a fresh machine it installs the
# system tools the real-process tests use (shells for ccl-env, MPI for multi-rank launches), a venv with
# cpuperf, the torch build cpuperf picks for this host and the test extras; then the layer, type and lint
# checks and the suite. CPUPERF_TEST_VENV picks the venv (default .venv); extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  need=()
  for pkg_cmd in zsh:zsh fish:fish dash:dash openmpi-bin:mpirun numactl:numactl iproute2:ip; do
    pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd##*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null) \
      || echo "tests/run.sh: could not install ${need[*]}; tests that need them will skip" >&2
  fi
elif [ "$(id -u)" != "0" ]; then
  echo "tests/run.sh: not root: install zsh fish dash openmpi-bin numactl iproute2 yourself, or tests that need them skip" >&2
fi

venv=${CPUPERF_TEST_VENV:-.venv}
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip install -q -e .
cpuperf install --yes          # the +cpu torch on a CPU host, never the registry's CUDA build
pip install -q -e '.[test]'

lint-imports                   # the layers contract in pyproject.toml
ruff check cpuperf tests benchmarks
mypy
vulture                        # dead code ([tool.vulture] in pyproject.toml; tools/vulture_whitelist.py)
python -m tools.regen_compat --check   # compat/ equals what the recorded inputs give (no network)
python -m pytest -q -p no:cacheprovider "$@"
