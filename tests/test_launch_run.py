"""`cpuperf train` for real on this machine: one process, two ranks (torchrun and Open MPI), a killed rank
and --resume, a Hugging Face Trainer script. Small configs (the `micro` preset) so each run takes seconds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from cli_util import cli_env, run_cli

MICRO = ["--model", "micro", "--set", "eval_every=0", "--set", "log_every=5"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def native_bf16_here() -> bool:
    """From this host's /proc/cpuinfo: AVX512-BF16 or AMX-BF16."""
    text = Path("/proc/cpuinfo").read_text()
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def train_json(args, tmp_path, expect_rc=0, timeout=180, process=False):
    proc = run_cli(["train", *args, "--out", str(tmp_path / "run"), "--json"], timeout=timeout, process=process)
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stdout
    return json.loads(proc.stdout), proc


@pytest.mark.smoke("train")
def test_auto_single_process_real_run(tmp_path):
    data, proc = train_json(["--auto", *MICRO, "--max-steps", "30"], tmp_path, process=True)
    assert data["schema"] == "cpuperf.train/1" and data["steps"] == 30 and data["world_size"] == 1
    assert data["loss_last"] < data["loss_first"]
    assert data["samples_per_s"] > 0 and data["tokens_per_s"] > 0
    expected = "bf16" if native_bf16_here() else "fp32"
    assert data["settings"]["dtype"] == expected
    assert data["launch"]["launcher"] == "direct"
    ncores = len(os.sched_getaffinity(0))
    # the worker recorded the settings it used and what it really ran with
    records = [json.loads(line) for line in Path(data["metrics_file"]).read_text().splitlines()]
    assert records[0]["type"] == "settings" and records[0]["settings"]["dtype"] == expected
    assert records[-1]["type"] == "summary"
    rank0 = data["verification"]["ranks"][0]
    assert rank0["omp_num_threads"] == str(data["settings"]["threads_per_rank"])
    assert len(rank0["allowed_cpus"]) <= ncores and data["verification"]["warnings"] == []
    assert Path(data["checkpoint"]).is_file()
    decisions = {d["id"]: d for d in data["decisions"]}
    assert decisions["dtype"]["value"] == expected


@pytest.mark.full  # a real run
def test_plain_run_without_auto_uses_defaults(tmp_path):
    data, _ = train_json([*MICRO, "--max-steps", "5", "--set", "dtype=fp32"], tmp_path)
    s = data["settings"]
    assert s["dtype"] == "fp32" and s["compile"] is False and s["threads_per_rank"] is None and data["world_size"] == 1
    assert data["launch"]["affinity"] is None and "OMP_NUM_THREADS" not in data["launch"]["env"]


@pytest.mark.full  # real ranks
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_two_ranks_keep_ddp_in_sync(tmp_path, launcher):
    if launcher == "mpirun" and not shutil.which("mpirun"):
        pytest.skip("no mpirun (apt-get install openmpi-bin)")
    port = str(free_port())
    data, _ = train_json(["--auto", *MICRO, "--max-steps", "10", "--nproc-per-node", "2", "--launcher", launcher,
                          "--master-port", port], tmp_path)
    assert data["world_size"] == 2 and data["steps"] == 10
    checks = data["param_checksums"]
    assert len(checks) == 2 and checks[0] == checks[1]
    assert data["launch"]["launcher"] == launcher
    ranks = {r["rank"]: r for r in data["verification"]["ranks"]}
    assert set(ranks) == {0, 1}
    plan = {r["local_rank"]: r for r in data["launch"]["per_rank"]}
    for rank, seen in ranks.items():
        assert seen["allowed_cpus"] == plan[rank]["cpus"]  # each rank pinned to its own slot
        assert seen["omp_num_threads"] == str(plan[rank]["threads"])
    logs = Path(data["launch"]["log_dir"])
    assert (logs / "rank0.log").is_file() and (logs / "rank1.log").is_file()
    # --master-port is the port the ranks really used (torchrun --standalone would pick its own)
    first = json.loads(Path(data["metrics_file"]).read_text().splitlines()[0])
    assert first["master"]["port"] == int(port), first["master"]
    assert data["launch"]["master_port"] == int(port)


@pytest.mark.full  # real ranks
def test_killed_rank_is_named_and_resume_finishes(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--auto", *MICRO, "--max-steps", "200", "--nproc-per-node", "2", "--set", "ckpt_every=20",
            "--out", str(out), "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "cpuperf", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 120
        pidfile = out / "logs" / "rank1.pid"
        while time.monotonic() < deadline and not ((out / "checkpoint.pt").is_file() and pidfile.is_file()):
            time.sleep(0.1)
        assert pidfile.is_file(), "rank 1 never started"
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, (stdout[-2000:], stderr[-2000:])
    err = json.loads(stdout)["error"]
    assert "rank 1" in err["message"] and "rank1.log" in err["message"] and "SIGKILL" in err["message"]
    assert "rank 1 failed first" in stderr
    # the last checkpoint is intact and loads
    import torch

    ckpt = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    saved = ckpt["step"]
    assert saved >= 20 and saved % 20 == 0
    data, _ = train_json(["--auto", *MICRO, "--max-steps", "200", "--nproc-per-node", "2", "--set", "ckpt_every=20",
                          "--resume"], tmp_path)
    assert data["resumed_from"] == saved and data["steps"] == 200
    assert data["param_checksums"][0] == data["param_checksums"][1]


def _descendants(pid: int) -> List[int]:
    """Every live process below `pid` (through /proc's parent links)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.full  # real ranks, a real SIGINT
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130)])
def test_signal_exits_128_plus_n_ranks_stopped_checkpoint_kept(tmp_path, sig, code):
    """Ctrl-C (SIGINT, 130 in docs/exit-codes.md) stops a two-rank run: the ranks are gone and the last checkpoint is on
    disk and resumable. SIGTERM and SIGHUP take the same handler: their codes are test_exit_codes.py's unit test of
    the map, and test_run_dir.py stops real runs with them."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "cpuperf", "train", "--auto", *MICRO, "--max-steps", "100000",
                             "--nproc-per-node", "2", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    ranks: List[int] = []
    try:
        deadline = time.monotonic() + 90
        metrics = out / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.is_file() and '"type": "step"' in metrics.read_text()):
            time.sleep(0.1)
        ranks = _descendants(proc.pid)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr[-2000:]
    assert ranks and not [p for p in ranks if os.path.exists(f"/proc/{p}") and
                          open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    assert (out / "checkpoint.pt").is_file() and "the last checkpoint is" in stderr
    assert stderr.count("error:") == 1 and "Traceback" not in stderr


HF_SCRIPT = '''
import json, sys
from pathlib import Path
from typing import Dict, List
Path(sys.argv[0]).with_suffix(".argv.json").write_text(json.dumps(sys.argv[1:]))
import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments

(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
g = torch.Generator().manual_seed(0)
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (32, 16), generator=g)]
Trainer(model=model, args=args, train_dataset=data).train()
print("trained", args.per_device_train_batch_size, args.use_cpu)
'''


@pytest.mark.full  # a real Trainer run
def test_hf_trainer_script_gets_only_flags_its_transformers_accepts(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # Trainer needs it
    script = tmp_path / "hf_train.py"
    script.write_text(HF_SCRIPT)
    user = ["python", str(script), "--output_dir", str(tmp_path / "hf"), "--max_steps", "3",
            "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no"]
    proc = run_cli(["train", "--auto", "--out", str(tmp_path / "run"), "--json", "--", *user], timeout=240,
                   extra_env={"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    data = json.loads(proc.stdout)
    argv = json.loads(script.with_suffix(".argv.json").read_text())
    assert argv[:len(user) - 2] == user[2:]
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        assert "--use_ipex" not in argv and "--no_cuda" not in argv and "ccl" not in argv
        # one process: --use_cpu only where GPUs are visible (without them it changes nothing and cost 5%)
        from cpuperf.probe import probe_host

        # ... and where --bf16 is added: transformers >= 4.52 refuses it on a CPU without --use_cpu
        assert ("--use_cpu" in argv) == (bool(probe_host().gpus) or "--bf16" in argv)
    # the user's batch size is kept, never duplicated
    assert argv.count("--per_device_train_batch_size") == 1
    assert argv[argv.index("--per_device_train_batch_size") + 1] == "2"
    assert "--per_device_train_batch_size" not in data["hf_flags"]["added"]  # a hyperparameter: never ours
    assert data["launch"]["launcher"] == "direct"


def test_single_node_dry_run_shows_the_port_it_launches_with(tmp_path):
    port = str(free_port())
    proc = run_cli(["train", *MICRO, "--nproc-per-node", "2", "--master-port", port, "--dry-run", "--json",
                    "--out", str(tmp_path / "r")])
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)["launch"]
    assert f"--master-port={port}" in launch["argv"] and "--standalone" not in launch["argv"]
    assert launch["master_port"] == int(port) and launch["env"]["MASTER_PORT"] == port
    # no port asked: torchrun picks one, and the plan says so instead of showing one it will not use
    proc = run_cli(["train", *MICRO, "--nproc-per-node", "2", "--dry-run", "--json", "--out", str(tmp_path / "r")])
    launch = json.loads(proc.stdout)["launch"]
    assert "--standalone" in launch["argv"] and launch["master_port"] is None
    assert "MASTER_PORT" not in launch["env"]


@pytest.mark.full  # real ranks
@pytest.mark.parametrize("ranks", [1, 2])
def test_failing_rank_is_one_error_line_with_one_hint(tmp_path, ranks):
    proc = run_cli(["train", *MICRO, "--max-steps", "5", "--nproc-per-node", str(ranks),
                    "--set", "model.vocab_size=10", "--out", str(tmp_path / "run"), "--json"], timeout=120)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "vocab_size 10" in errors[0], proc.stderr
    assert "--resume" not in proc.stderr and "Traceback" not in proc.stderr and "=====" not in proc.stderr
    assert "vocab_size 10" in json.loads(proc.stdout)["error"]["message"]


@pytest.mark.full  # a real run
def test_full_disk_at_checkpoint_is_named(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    try:
        # metrics fit in 1 MiB, the ~1.8 MB checkpoint does not (the tokenizer cache lives elsewhere)
        proc = run_cli(["train", *MICRO, "--max-steps", "5", "--set", f"tokenizer_cache={tmp_path / 'tok'}",
                        "--out", str(mnt / "run")], timeout=120)
        assert proc.returncode == 10, proc.stderr  # docs/exit-codes.md: a file cannot be written
        assert f"no space left on device ({mnt / 'run' / 'checkpoint.pt'})" in proc.stderr
        assert "inline_container" not in proc.stderr and "Traceback" not in proc.stderr
        assert not list((mnt / "run").glob(".checkpoint.pt.*"))  # no half-written temp file left
    finally:
        subprocess.run(["umount", str(mnt)])
