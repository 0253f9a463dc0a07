#!/usr/bin/env bash
# The test command: the README's second line, and what .ci/run calls (docs/testing.md).
#   bash tests/run.sh            everything: the checks and the whole suite (the full tier)
#   bash tests/run.sh --fast     the fast tier: the tests not marked full, after each change
# Extra arguments go to pytest. On a fresh machine it installs the system tools the real-process tests use (shells
# for ccl-env, MPI for multi-rank launches) and a venv of the suite's own (CPUPERF_TEST_VENV, default .venv-test:
# never the user's .venv, whose packages a saved plan records) with cpuperf, the torch build cpuperf picks for this
# host and the test extras. The venv is set up again only when pyproject.toml or the Python changed.
set -euo pipefail
cd "$(dirname "$0")/.."

tier=full
if [ "${1:-}" = "--fast" ]; then tier=fast; shift; fi

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

venv=${CPUPERF_TEST_VENV:-.venv-test}
stamp="$venv/.cpuperf-test-setup"
want="$(python3 -V 2>&1) $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  python3 -m venv "$venv"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  pip install -q -e .
  cpuperf install --yes        # the +cpu torch on a CPU host, never the registry's CUDA build
  pip install -q -e '.[test]'
  echo "$want" > "$stamp"
else
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  # A venv made for another checkout (CPUPERF_TEST_VENV shared, or this one moved) runs the other code: install
  # this checkout's cpuperf into it, and say which one it held.
  python tests/venv_cpuperf.py "$PWD" || pip install -q -e '.[test]'
fi

lint-imports                   # the layers contract in pyproject.toml
ruff check cpuperf tests benchmarks
if [ "$tier" = full ]; then
  mypy
  vulture                      # dead code ([tool.vulture] in pyproject.toml; tools/vulture_whitelist.py)
  python -m tools.regen_compat --check   # compat/ equals what the recorded inputs give (no network)
  # Two workers: most of the suite waits on the processes it starts. Tests go out one by one (a long module is
  # shared); a worker builds the session's venvs and indexes once for all the tests it runs.
  python -m pytest -q -p no:cacheprovider -n 2 --dist load "$@"
else
  python -m pytest -q -p no:cacheprovider -n 2 --dist load --fast "$@"
fi
