"""Before launch, the plan checks what the built-in worker will allocate (issue 62): `--set model.*` sizes the model
the memory plan counts (the worker's own shapes and parameter count), and weights + grads + optimizer state that fit
no rank are refused with exit 3 naming the figure and the memory, in --dry-run, plain and --auto alike.
`--set model.d_model=...` within cpuperf's bounds planned the preset's 3M parameters (exit 0), then the worker died
allocating terabytes (exit 1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.errors import ExitCode
from cpuperf.knowledge.models import make_config, non_embedding_params

GIB = 2 ** 30
HEADROOM = 0.85  # compat/tuning.toml [memory] headroom


def _params(**shape: int) -> int:
    cfg = make_config("tiny", shape)
    return non_embedding_params(cfg) + cfg.vocab_size * cfg.d_model + cfg.seq_len * cfg.d_model


def _sets(shape: dict) -> list:
    return [w for k, v in shape.items() for w in ("--set", f"model.{k}={v}")]


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> str:
    """A recorded 4-core host without a cgroup limit: its memory is the one the test gives."""
    return str(make_host(tmp_path_factory.mktemp("h")))


def _train(host: str, shape: dict, memory_gib: int, auto: bool, json_out: bool = False):
    args = ["train", "--dry-run", "--sysroot", host, "--nproc-per-node", "1", *_sets(shape)] \
        + (["--auto"] if auto else []) + (["--json"] if json_out else [])
    return run_cli(args, extra_env={"CPUPERF_OVERRIDE_MEMORY_TOTAL": str(memory_gib * GIB)})


# (shape, memory in GiB): each far on one side of weights + grads + AdamW state (16 bytes a parameter) against the
# memory a rank may use, so the verdict does not hang on the activations' estimate.
TOO_BIG = [({"d_model": 262144}, 64), ({"d_model": 16384, "n_layer": 8}, 64), ({"d_model": 4096, "n_layer": 8}, 8),
           ({"vocab_size": 16777216, "d_model": 1024}, 128), ({"n_layer": 4096, "d_model": 1024}, 256)]
FITS = [({"d_model": 64}, 8), ({"d_model": 512, "n_layer": 6}, 8), ({"n_head": 8, "d_model": 128}, 4)]


@pytest.mark.parametrize("auto", [False, True], ids=["plain", "auto"])
@pytest.mark.parametrize("shape,memory_gib", TOO_BIG)
def test_a_model_whose_state_fits_no_rank_is_refused_before_launch(host, shape, memory_gib, auto):
    params = _params(**shape)
    assert params * 16 > memory_gib * GIB * HEADROOM  # the case is what it says
    proc = _train(host, shape, memory_gib, auto)
    assert proc.returncode == ExitCode.INCOMPATIBLE_HOST, proc.stderr[-1500:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(("error:", "  hint:"))]
    assert len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    error = lines[0]
    assert f"{params / 1e9:.2f}B parameters" in error  # the figure: the model the worker would build
    # the bound: the memory a rank may use, from the memory given
    assert f"{memory_gib * HEADROOM:.1f} GiB usable per rank" in error, error
    needs = re.search(r"needs ([0-9.]+) GiB per rank", error)
    assert needs is not None and float(needs.group(1)) >= params * 16 / GIB * 0.99, error
    assert proc.stdout.strip() == ""  # nothing planned, nothing to run


@pytest.mark.parametrize("shape,memory_gib", FITS)
def test_a_model_that_fits_is_planned_with_the_shape_the_worker_builds(host, shape, memory_gib):
    proc = _train(host, shape, memory_gib, auto=False, json_out=True)
    assert proc.returncode == 0, proc.stderr[-1500:]
    plan = json.loads(proc.stdout)
    assert plan["workload"]["params"] == _params(**shape)  # not the preset's count
    assert plan["settings"]["model"] == shape  # every --set model.* reaches the worker (repeats kept, not the last)


def test_the_planned_parameter_count_is_the_count_torch_builds(host):
    """The planner's count (knowledge.models) against the module the worker builds, for a shape set by --set."""
    torch = pytest.importorskip("torch")
    from cpuperf.train.model import build_model

    shape = {"d_model": 96, "n_head": 3, "n_layer": 3, "mlp_ratio": 2, "seq_len": 48}
    proc = _train(host, shape, 8, auto=False, json_out=True)
    assert proc.returncode == 0, proc.stderr[-1500:]
    plan = json.loads(proc.stdout)
    with torch.device("meta"):
        model = build_model(make_config(plan["settings"]["preset"], plan["settings"]["model"]))
    assert plan["workload"]["params"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape", [{"d_model": 7}, {"n_head": 5}, {"d_model": 100, "n_head": 3}])
def test_heads_that_do_not_divide_the_width_are_refused(host, shape):
    proc = _train(host, shape, 64, auto=False)
    assert proc.returncode == ExitCode.USAGE, proc.stderr[-1500:]
    assert "is not divisible by its" in proc.stderr and "--set model." in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_cgroup_limit_below_the_memory_is_the_bound_named(tmp_path):
    """In a container the limit, not the installed memory, is what a rank may use: named in the refusal."""
    root = str(make_host(tmp_path, cgroup={"memory.max": str(4 * GIB)}))
    shape = {"d_model": 2048, "n_layer": 4}  # 0.2B parameters: 3 GiB of state, over 4 GiB x 0.85 with 2 ranks
    proc = run_cli(["train", "--dry-run", "--sysroot", root, "--nproc-per-node", "2", *_sets(shape)],
                   extra_env={"CPUPERF_OVERRIDE_MEMORY_TOTAL": str(64 * GIB)})
    assert proc.returncode == ExitCode.INCOMPATIBLE_HOST, proc.stderr[-1500:]
    assert "cgroup memory limit 4.0 GiB" in proc.stderr and f"{_params(**shape) / 1e9:.2f}B parameters" in proc.stderr
    fits = run_cli(["train", "--dry-run", "--sysroot", root, "--nproc-per-node", "1", *_sets({"d_model": 512})],
                   extra_env={"CPUPERF_OVERRIDE_MEMORY_TOTAL": str(64 * GIB)})
    assert fits.returncode == 0, fits.stderr[-1500:]


@pytest.mark.parametrize("shape", [{"d_model": 262144}, {"d_model": 8192, "n_layer": 64}])
def test_a_real_run_is_refused_before_any_rank_starts(host, tmp_path, shape):
    """The reproducer without --dry-run: exit 3 before launch (the worker died allocating, exit 1); no rank's log."""
    out = tmp_path / "run"
    proc = run_cli(["train", "--out", str(out), "--max-steps", "2", *_sets(shape)],
                   extra_env={"CPUPERF_OVERRIDE_MEMORY_TOTAL": str(16 * GIB)})
    assert proc.returncode == ExitCode.INCOMPATIBLE_HOST, proc.stderr[-1500:]
    assert "GiB usable per rank" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "logs").exists() and not (out / "metrics.jsonl").exists()


GPUS = Path(__file__).parent / "fixtures" / "gpus"


@pytest.mark.parametrize("card,shape,refused", [("t4.json", {"d_model": 8192, "n_layer": 8}, True),
                                                ("h100-80gb-hbm3.json", {"d_model": 8192, "n_layer": 8}, True),
                                                ("t4.json", {"d_model": 1024}, False)])
def test_on_a_gpu_the_card_is_the_bound(card, shape, refused):
    """A recorded card (NVML's answer) with a CUDA torch: the card's memory, not the host's, is what a rank may use."""
    env = {"CPUPERF_OVERRIDE_GPUS": (GPUS / card).read_text(),
           "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cu128"})}
    proc = run_cli(["train", "--dry-run", "--device", "cuda", *_sets(shape)], extra_env=env)
    if not refused:
        assert proc.returncode == 0, proc.stderr[-1500:]
        return
    assert proc.returncode == ExitCode.INCOMPATIBLE_HOST, proc.stderr[-1500:]
    assert f"{_params(**shape) / 1e9:.2f}B parameters" in proc.stderr and "x 0.9)" in proc.stderr
    assert "more GPU memory" in proc.stderr
