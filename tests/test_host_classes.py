"""The host-class matrix: every path of cpuperf, in every host class, on whatever machine runs the suite.

A rule verified on one CPU is a guess for the others, and a test that reads "the right answer" from the host
running it covers one class only. Here each class is described, never inherited from the machine: a recorded
/proc + /sys tree (--sysroot) for the planning paths, and the same class's facts as overrides
(CPUPERF_OVERRIDE_ISA / MICROARCH / AMX_USABLE / GPUS) on the live host for the real runs. bf16 autocast runs,
emulated, on any x86 CPU, so every x86 class trains for real; Arm and POWER plans cannot execute on this
machine's instruction set and a GPU class stops at the launch: those cells are planned, not run, and say so.

Every cell runs the real command (real venvs, torchrun, mpirun, accelerate, real shells) and passes only when
it exits 0 and what ran inside matches the plan: the flags the script received, its dtype, its CPUs and threads
per rank. The measurement cache is a fresh directory: plans come from the rules, as on a host never measured.
The classes live in tests/host_classes.py. The matrix (classes x paths) is printed at the end of the run (conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from cli_util import cli_env
from host_classes import BY_NAME, CLASSES, HostClass, linked_venv

pytestmark = pytest.mark.full  # every path in every class, real runs (torchrun, mpirun, accelerate)

PY = sys.executable
BIN = os.path.dirname(PY)
SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
MATRIX: Dict[Tuple[str, str], str] = {}  # (class, path) -> "n/a: why" for a cell skipped here; conftest.py prints the table


# -- the machinery: real processes, an isolated measurement cache, a venv without torch --------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("classes")
    return {"root": root, "cache": root / "cache", "notorch": _venv_without_torch(root / "notorch")}


def _venv_without_torch(path: Path) -> str:
    """A venv whose interpreter cannot import torch: pkgscan and import alike see a host before `cpuperf install`."""
    python = linked_venv(path, ("torch", "functorch"))
    check = subprocess.run([python, "-c", "import cpuperf, typer\ntry:\n import torch\nexcept ImportError:\n print('no torch')"],
                           capture_output=True, text=True, timeout=60)
    assert check.stdout.strip() == "no torch", check.stderr
    return python


def _env(world, cls: Optional[HostClass], extra: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, str]:
    env = cli_env({"CPUPERF_CACHE_DIR": str(world["cache"]), "HF_HOME": str(world["root"] / "hf"),
                   "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false",
                   "PATH": BIN + os.pathsep + os.environ.get("PATH", "")})
    if cls is not None and cls.runs_here or cls is not None and cls.gpus:
        env.update(cls.overrides())
    for name, value in (extra or {}).items():  # None: not set at all
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _cpuperf(world, cls, args: List[str], python: str = PY, extra: Optional[Dict[str, Optional[str]]] = None,
             timeout: float = 300, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "cpuperf", *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(world, cls, extra), cwd=str(cwd) if cwd else None)


def _ok(proc: subprocess.CompletedProcess, what: str) -> Dict[str, Any]:
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout) if proc.stdout.lstrip().startswith("{") else {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _decisions(data: Dict[str, Any]) -> Dict[str, Any]:
    return {d["id"]: d["value"] for d in data["decisions"]}


def _where(cls: HostClass, world) -> List[str]:
    """How a planning path reaches the class: its recorded tree, or (x86 and GPU classes) the live host too."""
    return ["--sysroot", str(cls.tree(world["root"] / f"tree-{cls.name}"))]


@pytest.fixture
def cell(request):
    """The cell's (class, path) key; conftest.py records its outcome for the printed matrix."""
    params = request.node.callspec.params
    path = request.node.originalname.replace("test_", "").replace("_", "-")
    key = (params["cls"], f"{path}-{params['launcher']}" if "launcher" in params else path)
    MATRIX[key] = "FAIL"
    return key


def _runs_here(name: str, key) -> HostClass:
    """The class, for a cell that trains for real: skipped (n/a, with why) where its plans cannot execute here."""
    c = BY_NAME[name]
    if not c.runs_here:
        _not_here(key, c)
    return c


def _not_here(key, cls: HostClass) -> None:
    if key[1] in cls.emulated:
        MATRIX[key] = "emu: run on an aarch64 userland under QEMU by the Arm tier (tests/arm/tier.sh)"
        pytest.skip(f"{cls.why_not_here}; {MATRIX[key][5:]}")
    MATRIX[key] = f"n/a: {cls.why_not_here}"
    pytest.skip(cls.why_not_here)


def _need(tool: str, key) -> str:
    path = shutil.which(tool, path=BIN + os.pathsep + os.environ.get("PATH", ""))
    if path is None:
        MATRIX[key] = f"n/a: {tool} not installed"
        pytest.skip(f"{tool} is not installed")
    return path


# -- planning paths: every class -------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_recommend_without_torch(world, cls, cell):
    c = BY_NAME[cls]
    for where in (_where(c, world), [] if (c.runs_here or c.gpus) else None):
        if where is None:
            continue
        data = _ok(_cpuperf(world, c, ["recommend", "--json", *where], python=world["notorch"],
                            extra={"CPUPERF_OVERRIDE_PACKAGES": None}), "recommend (no torch)")  # what is installed: none
        assert data["stack"].get("torch") is None
        decided = _decisions(data)
        assert decided["dtype"] == c.dtype
        dtype = next(d for d in data["decisions"] if d["id"] == "dtype")
        if c.dtype == "bf16" and c.device == "cpu":
            assert "not measured on this host" in dtype["reason"] and "cpuperf bench" in dtype["reason"]


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_recommend_with_torch(world, cls, cell):
    c = BY_NAME[cls]
    data = _ok(_cpuperf(world, c, ["recommend", "--json", *_where(c, world)]), "recommend")
    assert _decisions(data)["dtype"] == c.dtype
    if c.runs_here or c.gpus:
        live = _ok(_cpuperf(world, c, ["recommend", "--json"]), "recommend (live)")
        assert _decisions(live)["dtype"] == c.dtype and live["stack"].get("torch")
        hf = live["hf_args"]
        if "--bf16" in hf and c.device == "cpu":
            assert "--use_cpu" in hf  # transformers >= 4.52 refuses --bf16 on a CPU without it


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_dry_run(world, cls, cell):
    c = BY_NAME[cls]
    where = _where(c, world)
    plan = _ok(_cpuperf(world, c, ["train", "--auto", "--dry-run", "--json", *where]), "train --auto --dry-run")
    assert plan["settings"]["dtype"] == c.dtype == _decisions(plan)["dtype"] and plan["settings"]["device"] == c.device
    # that recommend, ccl-env and train --dry-run agree is test_one_plan.py's (in-process, every host shape)


SAVED_PLAN_RUNS = "avx512-bf16"  # the class whose saved plan is also run for real: what a run adds is class-free


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_saved_plan(world, cls, cell):
    """recommend --save, then ccl-env --plan and train --plan --dry-run: the saved plan, used as it stands. Every class
    trains for real in test_builtin_run; a saved plan's real run is the same launch, so one class runs it."""
    c = BY_NAME[cls]
    where = _where(c, world) if not c.runs_here else []
    plan_file = world["root"] / f"plan-{cls}.json"
    _ok(_cpuperf(world, c, ["recommend", "--model", "micro", "--save", str(plan_file), "--json", *where]),
        "recommend --save")  # the micro model: bf16 is emulated (slow) on CPUs without it
    _ok(_cpuperf(world, c, ["ccl-env", "--plan", str(plan_file), "--json", *where]), "ccl-env --plan")
    dry = _ok(_cpuperf(world, c, ["train", "--plan", str(plan_file), "--dry-run", "--json", *where]), "train --plan --dry-run")
    assert dry["settings"]["dtype"] == c.dtype
    # that the saved plan's commands render it alike is test_saved_plan.py's
    if cls != SAVED_PLAN_RUNS:
        return
    out = world["root"] / f"run-plan-{cls}"
    ran = _ok(_cpuperf(world, c, ["train", "--plan", str(plan_file), "--max-steps", "3", "--out", str(out), "--json"]),
              "train --plan (real)")
    assert ran["steps"] == 3 and ran["settings"]["dtype"] == c.dtype
    assert ran["settings"]["threads_per_rank"] == dry["settings"]["threads_per_rank"]


# -- real runs: every class whose plans execute here -------------------------------------------------------

def _check_ranks(reports: List[Dict[str, Any]], applied: Dict[str, Any], n: int, launcher_binds: bool = False) -> None:
    """What each rank really ran with is what the plan placed: its CPUs, OMP_NUM_THREADS, torch's threads."""
    assert len(reports) == n, reports
    if applied["placement"]["placed_by_cpuperf"]:
        planned = {r["local_rank"]: r for r in applied["ranks"]}
        for rep in reports:
            mine = planned[rep.get("local_rank", rep.get("rank", 0))]
            if mine["cpus"]:
                assert sorted(rep["cpus"]) == sorted(mine["cpus"]), (rep, mine)
            elif not launcher_binds:  # placed without pinning (a VM's ranks on one NUMA node): every CPU
                assert sorted(rep["cpus"]) == sorted(os.sched_getaffinity(0)), (rep, mine)
            if mine["threads"]:
                assert rep["omp_num_threads"] == str(mine["threads"]) and rep["torch_threads"] == mine["threads"]
    elif applied.get("cpus"):
        assert all(sorted(r["cpus"]) == sorted(applied["cpus"]) for r in reports)


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_builtin_run(world, cls, cell):
    c = _runs_here(cls, cell)
    out = world["root"] / f"run-{cls}"
    data = _ok(_cpuperf(world, c, ["train", "--auto", "--model", "micro", "--max-steps", "5", "--set", "eval_every=0",
                                   "--out", str(out), "--json"]), "train --auto")
    assert data["steps"] == 5 and data["settings"]["dtype"] == c.dtype == _decisions(data)["dtype"]
    records = [json.loads(line) for line in Path(data["metrics_file"]).read_text().splitlines()]
    assert records[0]["settings"]["dtype"] == c.dtype  # what the worker ran with
    rank0 = data["verification"]["ranks"][0]
    assert rank0["omp_num_threads"] == str(data["settings"]["threads_per_rank"])
    assert data["verification"]["warnings"] == []


def _hf_args(tmp: Path) -> List[str]:
    return ["--output_dir", str(tmp / "o"), "--max_steps", "2", "--per_device_train_batch_size", "2",
            "--report_to", "none", "--save_strategy", "no", "--logging_strategy", "no"]


def _user_run(world, c: HostClass, key, argv: List[str], sets: Tuple[str, ...] = ()) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    seen = world["root"] / f"seen-{key[0]}-{key[1]}"
    shutil.rmtree(seen, ignore_errors=True)
    seen.mkdir()
    args = ["train", "--auto", *[a for s in sets for a in ("--set", s)], "--out", str(world["root"] / f"u-{key[0]}-{key[1]}"),
            "--json", "--", *argv]
    proc = _cpuperf(world, c, args, extra={"FIXTURE_OUT_DIR": str(seen), "DDP_PORT": str(_free_port())},
                    timeout=400, cwd=SCRIPTS)
    data = _ok(proc, " ".join(argv[:3]))
    return data, [json.loads(p.read_text()) for p in sorted(seen.glob("rank*.json"))]


def _check_trainer(c: HostClass, data: Dict[str, Any], reports: List[Dict[str, Any]], forced_bf16: bool) -> None:
    flags = data["applied"]["flags"]
    bf16 = forced_bf16 or c.trainer_bf16
    assert ("--bf16" in flags) == bf16, flags
    for rep in reports:
        assert rep["speed"]["bf16"] == str(bf16)  # what TrainingArguments really held
        if bf16:
            assert rep["speed"]["use_cpu"] == "True"  # the companion transformers >= 4.52 requires on a CPU
        assert all(a in rep["argv"] for a in flags)


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_trainer_script(world, cls, cell):
    c = _runs_here(cls, cell)
    data, reports = _user_run(world, c, cell, [PY, "hf_parser.py", *_hf_args(world["root"] / cell[0])])
    _check_trainer(c, data, reports, forced_bf16=False)
    _check_ranks(reports, data["applied"], 1)


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_trainer_script_set_bf16(world, cls, cell):
    c = _runs_here(cls, cell)
    data, reports = _user_run(world, c, cell, [PY, "hf_parser.py", *_hf_args(world["root"] / cell[0])], ("dtype=bf16",))
    _check_trainer(c, data, reports, forced_bf16=True)


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_trainer_torchrun_x2(world, cls, cell):
    c = _runs_here(cls, cell)
    torchrun = _need("torchrun", cell)
    data, reports = _user_run(world, c, cell, [torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port()),
                                               "hf_parser.py", *_hf_args(world["root"] / cell[0])])
    _check_trainer(c, data, reports, forced_bf16=False)
    for rep in reports:
        rep["local_rank"] = rep["rank"]
    _check_ranks(reports, data["applied"], 2)


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_lightning_script(world, cls, cell):
    """A Lightning script gets the class's dtype through the variable Lightning's Trainer reads: read back from the
    Trainer inside the real run; one process (its batch is in its code)."""
    c = _runs_here(cls, cell)
    pytest.importorskip("lightning")
    data, reports = _user_run(world, c, cell, [PY, "lightning_loop.py"])
    want = "bf16-mixed" if c.dtype == "bf16" else "32-true"
    assert data["applied"]["env"].get("PL_TRAINER_PRECISION") == (want if c.dtype == "bf16" else None), data["applied"]
    assert len(reports) == 1 and reports[0]["speed"]["precision"] == want, reports
    _check_ranks(reports, data["applied"], 1)


@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_accelerate_launch(world, cls, cell):
    c = _runs_here(cls, cell)
    accelerate = _need("accelerate", cell)
    data, reports = _user_run(world, c, cell, [accelerate, "launch", "--num_processes", "1", "--num_machines", "1",
                                               "--dynamo_backend", "no", "accelerate_loop.py", "--steps", "3"])
    launched = data["applied"]["flags"]
    want = launched[launched.index("--mixed_precision") + 1] if "--mixed_precision" in launched else "no"
    assert want == ("bf16" if c.trainer_bf16 else "no"), launched  # autocast where the Trainer gets --bf16
    assert reports and reports[0]["speed"]["mixed_precision"] == want, (launched, reports)
    _check_ranks(reports, data["applied"], 1)


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
@pytest.mark.parametrize("cls", [c.name for c in CLASSES])
def test_ddp_script(world, cls, launcher, cell):
    c = _runs_here(cls, cell)
    tool = _need(launcher, cell)
    argv = [tool, "--nproc-per-node", "2", "--master-port", str(_free_port()), "ddp_loop.py"] if launcher == "torchrun" \
        else [tool, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", "2", PY, "ddp_loop.py"]
    data, reports = _user_run(world, c, cell, argv)
    assert {r["world"] for r in reports} == {2}
    assert len({round(r["checksum"], 5) for r in reports}) == 1  # DDP kept the replicas in sync
    _check_ranks(reports, data["applied"], 2, launcher_binds=launcher == "mpirun")  # Open MPI binds by default
    planned = [r["cpus"] for r in data["applied"]["ranks"]]
    if launcher == "torchrun":  # a VM's two ranks on one node: unpinned; bare metal: disjoint CPUs
        assert planned == [None, None] if "hypervisor" in c.isa else not set(planned[0]) & set(planned[1]), planned
