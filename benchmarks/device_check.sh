#!/usr/bin/env bash
# The GPU check (issue 56) as one command that fits one short loan of a machine: at most 8 minutes, a small results
# folder, no checkpoints.
#
#   bash benchmarks/device_check.sh [RESULTS_DIR]      (default: $OUT, else benchmarks/results/device-check)
#
# On a host without an NVIDIA GPU that torch can use it prints one line saying why and exits 0, having run nothing.
# Otherwise it runs, in this order, each step under its own time limit and all of them within the budget
# (DEVICE_CHECK_BUDGET_S, 480 s; a step that no longer fits is recorded as skipped):
#   info, doctor (--json and --save-snapshot), recommend    the host and the plan
#   trainer_plan      recommend for the 1.1B Llama shape at batch 8 x 1024: the plan's figure (per_rank_bytes)
#   builtin_auto      train --auto --model gpt2-small: MFU, attention kernel, the real GPU peak beside the plan's
#   trainer_auto      train --auto -- the Trainer script (benchmarks/scripts/trainer_llama.py): its own peak
#   builtin_compile   the same built-in run compiled: first step (compile) and steady tokens/s, for the crossover
#   trainer_plain     the Trainer script as typed, without cpuperf (auto against plain)
#   bench_gpu         python -m benchmarks --gpu, as many rounds (up to 3) as the budget still holds: auto against
#                     the sweep, MFU per configuration
# and writes RESULTS_DIR/summary.json (benchmarks/device_summary.py: the figures, from the steps' outputs), steps.tsv (each
# step's exit code and seconds) and each step's stdout and stderr. Runs write their checkpoints to a temporary folder
# that is removed at the end. PYTHON (default python3) is the interpreter with torch (a CUDA build), and for the
# Trainer steps transformers; a step whose package is missing is skipped with the reason.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-${OUT:-$ROOT/benchmarks/results/device-check}}
PY=${PYTHON:-python3}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-480}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export CPUPERF_MEASURE=0  # no CPU micro-benchmarks: the check's minutes are the card's

# -- skip cleanly where there is no GPU to check ---------------------------------------------------------------------
why=$("$PY" - <<'EOF' 2>/dev/null
from benchmarks.gpu import no_gpu_reason
from cpuperf.probe import probe_host

reason = no_gpu_reason(probe_host())
if reason is None:
    try:
        import torch
    except ImportError:
        reason = "torch cannot be imported: the GPU check needs a CUDA build of torch"
    else:
        if not torch.cuda.is_available():
            reason = f"torch {torch.__version__} sees no CUDA device: the GPU check needs one"
print(reason or "")
EOF
)
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "device_check: cannot probe this host with $PY (exit $rc); run from the repository with cpuperf's dependencies" >&2
    exit 1
fi
if [ -n "$why" ]; then
    echo "device_check: skipped: $why"
    exit 0
fi

# -- the steps -------------------------------------------------------------------------------------------------------
start=$(date +%s)
deadline=$((start + BUDGET_S))
mkdir -p "$DEST" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cpuperf-device-check.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
printf 'step\trc\tseconds\tnote\n' > "$DEST/steps.tsv"

step() {  # NAME LIMIT_S CMD...: stdout and stderr to DEST/NAME.out and .err; the exit code and seconds to steps.tsv
    local name=$1 limit=$2
    shift 2
    local left=$((deadline - $(date +%s) - 15))  # what the step may take, its 10 s to stop after a TERM included
    if [ "$left" -lt 20 ]; then
        printf '%s\tskipped\t0\tthe %s s budget is spent\n' "$name" "$BUDGET_S" >> "$DEST/steps.tsv"
        echo "device_check: $name skipped (the budget is spent)" >&2
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$DEST/$name.out" 2> "$DEST/$name.err"
    rc=$?
    printf '%s\t%s\t%s\tlimit %s s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$limit" >> "$DEST/steps.tsv"
    echo "device_check: $name exit $rc after $(($(date +%s) - t0)) s" >&2
}

skip() {  # NAME WHY
    printf '%s\tskipped\t0\t%s\n' "$1" "$2" >> "$DEST/steps.tsv"
    echo "device_check: $1 skipped ($2)" >&2
}

step info 20 bash -c '"$1" -c "import sys, torch; print(sys.version); print(torch.__version__, torch.version.cuda)"
    nvidia-smi; lscpu' _ "$PY"
step doctor 40 "$PY" -m cpuperf doctor --json
step snapshot 40 "$PY" -m cpuperf doctor --save-snapshot "$DEST/snapshot"
step recommend 30 "$PY" -m cpuperf recommend --model gpt2-small --json
# The 1.1B Llama shape of the recorded check (tests/fixtures/hosts/h100-emeraldrapids-16c/trainer/llama1b).
mkdir -p "$WORK/llama1b"
cat > "$WORK/llama1b/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
 "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
 "vocab_size": 32000, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float32", "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
EOF
step trainer_plan 30 "$PY" -m cpuperf recommend --model "$WORK/llama1b/config.json" --seq-len 1024 --batch-size 8 --json
step builtin_auto 100 "$PY" -m cpuperf train --auto --model gpt2-small --max-steps 200 --out "$WORK/builtin_auto" --json

TRAINER=("$ROOT/benchmarks/scripts/trainer_llama.py" --model_name_or_path llama1b --block_size 1024
         --per_device_train_batch_size 8 --max_steps 20 --logging_steps 5 --report_to none --save_strategy no)
has_transformers=$("$PY" -c 'import transformers; print(1)' 2>/dev/null)
if [ -n "$has_transformers" ]; then
    step trainer_auto 120 bash -c 'cd "$1" && shift && exec "$@"' _ "$WORK" "$PY" -m cpuperf train --auto -- \
        "$PY" "${TRAINER[@]}" --output_dir "$WORK/o_auto"
else
    skip trainer_auto "transformers is not installed in $PY"
fi
step builtin_compile 150 "$PY" -m cpuperf train --auto --model gpt2-small --set compile=true --max-steps 200 \
    --out "$WORK/builtin_compile" --json
if [ -n "$has_transformers" ]; then  # the same script as typed, without cpuperf: fp32, its own defaults
    step trainer_plain 90 bash -c 'cd "$1" && shift && exec "$@"' _ "$WORK" "$PY" "${TRAINER[@]}" \
        --output_dir "$WORK/o_plain"
else
    skip trainer_plain "transformers is not installed in $PY"
fi
# As many rounds (up to 3) as the budget still holds: a round is 7 fresh worker runs, about 22 s each on the recorded
# H100 (tests/fixtures/hosts/h100-emeraldrapids-16c), and the results file is written only when the rounds end.
per_round=${DEVICE_CHECK_ROUND_S:-180}
rounds=$(((deadline - $(date +%s) - 15) / per_round))
[ "$rounds" -gt 3 ] && rounds=3
if [ "$rounds" -ge 1 ]; then
    step bench_gpu $((rounds * per_round)) "$PY" -m benchmarks --gpu --rounds "$rounds" --steps 12 --out "$DEST/bench"
else
    skip bench_gpu "less than one round (${per_round} s) of the budget left"
fi

# -- the figures, from the steps' outputs ----------------------------------------------------------------------------
"$PY" -m benchmarks.device_summary "$DEST" "$BUDGET_S" "$(($(date +%s) - start))" \
    || echo "device_check: no summary.json" >&2
# Small enough to come back: no step's output over 1 MiB.
find "$DEST" -type f -size +1M -exec truncate -s 1M {} +
echo "device_check: done in $(($(date +%s) - start)) s; results in $DEST" >&2
