"""Your model, your batch: the memory plan for the model a script names in its own arguments, on recorded GPU and
CPU hosts, checked against an estimate written here and against the installed transformers' own parser.

The table: recorded GPU hosts (T4, A100, H100 NVML answers; 1, 2 and 8 cards) x local model configs (~125M, 1B,
7B, 13B: config.json directories written here) x a Trainer script under `train --auto --dry-run`. Each cell either
launches a job that fits by this file's estimate (bytes per parameter by dtype, optimizer and sharding, plus
activations) with arguments HfArgumentParser(TrainingArguments) accepts, or exits 3 before launch where this
file's estimate says no plan that keeps the training the same fits. No lever that changes the math (optimizer
family, batch, accumulation) is added unasked; where plain DDP fits, the job is the plain one plus the speed flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from cli_util import cli_env
from hosts import make_host

from cpuperf.plan.script_read import read_user_script
from cpuperf.plan.user_script import UserCommand
from cpuperf.probe.hf import script_model

# A run_clm.py-like script: its own dataclass for the model, TrainingArguments, both from the command line.
CLM_LIKE = """from dataclasses import dataclass, field
from typing import Optional
from transformers import HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default=None)
    config_name: Optional[str] = None
    model_type: Optional[str] = None
    config_overrides: Optional[str] = None
    block_size: Optional[int] = None


margs, targs = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
"""


def _named(args, source=CLM_LIKE):
    """The values a run_clm-like script's own parser reads from `args` (what train hands script_model)."""
    return read_user_script(UserCommand(("python", "s.py", *args), None, None, "s.py", tuple(args)), source).named()

GPUS = Path(__file__).parent / "fixtures" / "gpus"
GiB = float(1 << 30)
CUDA_STACK = json.dumps({"torch": "2.13.0+cu128"})

# The configs, as their families write them (GPT-2 small; a 1.1B, the 7B and the 13B Llama shapes).
CONFIGS: Dict[str, Dict[str, Any]] = {
    "125m": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257},
    "1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
           "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 2048, "vocab_size": 32000,
           "hidden_act": "silu", "tie_word_embeddings": False},
    "7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096, "vocab_size": 32000,
           "hidden_act": "silu", "tie_word_embeddings": False},
    "13b": {"model_type": "llama", "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 40, "max_position_embeddings": 4096, "vocab_size": 32000,
            "hidden_act": "silu", "tie_word_embeddings": False},
}
CARDS = {"t4": "t4.json", "a100": "a100-sxm4-80gb.json", "h100": "h100-80gb-hbm3.json"}
SCRIPT = '''from dataclasses import dataclass, field
from transformers import HfArgumentParser, TrainingArguments

@dataclass
class ModelArguments:
    model_name_or_path: str = field(default=None)

model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
'''
# Flags that change what is trained: never added unless you --set them.
CHANGES_THE_MATH = ("--per_device_train_batch_size", "--gradient_accumulation_steps", "--learning_rate",
                    "--num_train_epochs", "--weight_decay")
MEMORY_FLAGS = ("--fsdp", "--fsdp_config", "--deepspeed", "--gradient_checkpointing", "--activation_checkpointing")


# -- this file's own estimate ------------------------------------------------------------------------------------

def params_of(cfg: Dict[str, Any]) -> int:
    """Parameters counted from the config: attention, MLP (gated for Llama), embeddings (and GPT-2's positions)."""
    if cfg["model_type"] == "gpt2":
        d, layers, vocab = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
        return layers * (4 * d * d + 8 * d * d) + vocab * d + cfg["n_positions"] * d
    d, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    return layers * (4 * d * d + 3 * d * cfg["intermediate_size"]) + 2 * vocab * d


def shape_of(cfg: Dict[str, Any]) -> Tuple[int, int, int]:
    """(layers, width, sequence)."""
    if cfg["model_type"] == "gpt2":
        return cfg["n_layer"], cfg["n_embd"], cfg["n_positions"]
    return cfg["num_hidden_layers"], cfg["hidden_size"], min(cfg["max_position_embeddings"], 4096)


@dataclass(frozen=True)
class Job:
    """What the job's arguments say it does, read from its argv (and the FSDP file it names)."""

    world: int
    batch: int
    shard: bool
    checkpointing: bool
    offload: bool
    half: bool


def estimate(cfg: Dict[str, Any], job: Job) -> Tuple[float, float]:
    """(bytes on each GPU, bytes of host RAM for the node): fp32 weights 4 + grads 4 + AdamW moments 8 per
    parameter, divided over the ranks when sharded, in host RAM when offloaded; activations per sample (16-bit:
    34 x seq x width per layer with a fused attention kernel, only block inputs when checkpointed), logits in fp32."""
    p = params_of(cfg)
    layers, d, seq = shape_of(cfg)
    vocab = cfg["vocab_size"]
    state = p * 16.0 / (job.world if job.shard else 1)
    scale = 1.0 if job.half else 2.0
    if job.checkpointing:
        per_sample = (layers * 2 * seq * d * 2 + seq * d * 34) * scale + seq * vocab * 4
    else:
        per_sample = layers * seq * d * 34 * scale + seq * vocab * 8
    gathered = 2 * p / layers * 2 if job.shard else 0.0
    device = (0.0 if job.offload else state) + gathered + job.batch * per_sample
    host = state * job.world if job.offload else 0.0
    return device, host


# -- the recorded hosts -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def place(tmp_path_factory):
    root = tmp_path_factory.mktemp("your-model")
    for name, cfg in CONFIGS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    (root / "script.py").write_text(SCRIPT)
    # an 8-GPU class server: 2 sockets, 2 NUMA nodes of 512 GiB each
    gpu_host = make_host(root / "gpu-host", sockets=2, cores_per_socket=16, node_mem_bytes=512 << 30)
    return {"root": root, "gpu_host": gpu_host}


def _gpus(card: str, count: int) -> str:
    row = json.loads((GPUS / CARDS[card]).read_text())[0]
    return json.dumps([dict(row, index=i, uuid=f"GPU-{card}-{i}") for i in range(count)])


def _dry_run(place, args: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--json", *args],
                          capture_output=True, text=True, timeout=120, cwd=str(place["root"]),
                          env=cli_env({"CPUPERF_CACHE_DIR": str(place["root"] / "cache"), **env}))


def _job_from(argv: List[str], world: int, half: bool, batch: int, root: Path) -> Job:
    fsdp_file = argv[argv.index("--fsdp_config") + 1] if "--fsdp_config" in argv else None
    fsdp = json.loads(Path(fsdp_file).read_text()) if fsdp_file and os.path.exists(fsdp_file) else {}
    value = argv[argv.index("--fsdp") + 1] if "--fsdp" in argv and argv.index("--fsdp") + 1 < len(argv) else ""
    return Job(world=world, batch=batch, shard="--fsdp" in argv,
               checkpointing=bool(fsdp.get("activation_checkpointing")) or "--gradient_checkpointing" in argv
               or "--activation_checkpointing" in argv,
               offload=bool(fsdp.get("cpu_offload")) or "offload" in value, half=half)


@pytest.fixture(scope="module")
def trainer_parser():
    """The installed transformers' own parser for the script's arguments (argparse level: names and values)."""
    from transformers import HfArgumentParser, TrainingArguments

    @dataclass
    class ModelArguments:
        model_name_or_path: Optional[str] = field(default=None)

    return HfArgumentParser((ModelArguments, TrainingArguments))


CELLS = [(card, n, model) for card in CARDS for n in (1, 2, 8) for model in CONFIGS]


@pytest.mark.parametrize("card, count, model", CELLS, ids=[f"{c}x{n}-{m}" for c, n, m in CELLS])
def test_gpu_table_fits_or_exits_3(place, trainer_parser, card, count, model):
    batch = 8
    user = ["--model_name_or_path", model, "--per_device_train_batch_size", str(batch), "--output_dir", "out"]
    proc = _dry_run(place, ["--sysroot", str(place["gpu_host"]), "--", "python", "script.py", *user],
                    {"CPUPERF_OVERRIDE_GPUS": _gpus(card, count), "CPUPERF_OVERRIDE_PACKAGES": CUDA_STACK})
    cfg = CONFIGS[model]
    card_bytes = json.loads((GPUS / CARDS[card]).read_text())[0]["memory_bytes"]
    host_bytes = 2 * (512 << 30)
    half = True  # bf16 (A100, H100) or fp16 (T4) autocast
    if proc.returncode == 3:
        assert "Traceback" not in proc.stderr
        error = json.loads(proc.stdout)["error"]
        assert "GiB" in error["message"] and error["hint"]
        # this file's estimate agrees: no plan that keeps the training the same fits (sharded, checkpointed,
        # offloaded where the host RAM holds the state)
        shard = count > 1
        best, _ = estimate(cfg, Job(count, batch, shard, True, False, half))
        parked, host = estimate(cfg, Job(count, batch, True, True, True, half))
        assert best > 0.9 * card_bytes and (parked > 0.9 * card_bytes or host > host_bytes), (best, parked, host)
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    added = plan["hf_flags"]["added"]
    decided = {d["id"]: d for d in plan["decisions"]}
    # the model planned for is the one the script names, with its own batch
    assert plan["workload"]["source"] == "script" and model in plan["workload"]["found"]
    assert decided["batch_size"]["value"] == batch and not decided["batch_size"]["overridden"]
    # nothing that changes the math, unasked
    assert not set(added) & set(CHANGES_THE_MATH), added
    assert decided["optimizer"]["value"] in ("adamw", "adamw_fused")
    assert "--optim" not in added or added[added.index("--optim") + 1] in ("adamw_torch", "adamw_torch_fused")
    # the installed transformers takes every argument (write the files the flags name, as the run does)
    for path, content in (plan["hf_flags"].get("files") or {}).items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_text(json.dumps(content))
    argv = user + added
    trainer_parser.parse_args(argv)
    job = _job_from(argv, count, half, batch, place["root"])
    device, host = estimate(cfg, job)
    assert device <= card_bytes, f"{device / GiB:.1f} GiB on a {card_bytes / GiB:.0f} GiB card: {argv}"
    assert host <= host_bytes
    assert job.shard == (decided["sharding"]["value"] == "fsdp")
    assert job.offload == decided["offload"]["value"] and job.checkpointing == decided["grad_checkpointing"]["value"]
    if model == "125m":  # plain DDP fits: the plain job plus the speed flags it always had
        assert not set(added) & set(MEMORY_FLAGS), added
        assert not job.shard and not job.checkpointing and not job.offload


# -- CPU hosts: a 1B model against the memory of each NUMA node ---------------------------------------------------

NODE_GIB = (8, 16, 32, 64)


@pytest.mark.parametrize("node_gib", NODE_GIB)
@pytest.mark.parametrize("path", ["builtin", "trainer"])
def test_cpu_hosts_1b_fits_each_numa_node_or_exits_3(place, trainer_parser, node_gib, path):
    tree = place["root"] / f"cpu-{node_gib}"
    if not tree.exists():
        make_host(tree, sockets=2, cores_per_socket=2, node_mem_bytes=node_gib << 30,
                  flags=("avx2", "fma", "avx512f", "avx512_bf16"), vendor="AuthenticAMD", family=25, model=17)
    cfg = CONFIGS["1b"]
    if path == "builtin":
        args = ["--sysroot", str(tree), "--model", str(place["root"] / "1b" / "config.json")]
    else:
        args = ["--sysroot", str(tree), "--", "python", "script.py", "--model_name_or_path", "1b",
                "--per_device_train_batch_size", "2", "--output_dir", "out"]
    proc = _dry_run(place, args, {"CPUPERF_OVERRIDE_GPUS": "[]"})
    node_bytes = node_gib * float(1 << 30)
    ranks_per_node = 1  # one rank per socket, one socket per NUMA node
    if proc.returncode == 3:
        error = json.loads(proc.stdout)["error"]
        assert "GiB" in error["message"] and "NUMA node" in error["message"]
        world = 2  # neither path shards on a CPU: the built-in loop has no sharding, the Trainer runs DDP there
        best, _ = estimate(cfg, Job(world, 1 if path == "builtin" else 2, False, True, False, True))
        assert best * ranks_per_node > 0.85 * node_bytes, best / GiB
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    decided = {d["id"]: d["value"] for d in plan["decisions"]}
    world = decided["nproc_per_node"] * decided["nnodes"]
    if path == "builtin":
        settings = plan["settings"]
        job = Job(world, settings["batch_size"], False, settings["grad_checkpointing"], False,
                  settings["dtype"] != "fp32")
        assert settings["batch_size"] * settings["grad_accum_steps"] * world == plan["workload"]["batch_size"]
        assert settings["optimizer"] in ("adamw", "adamw_fused")
    else:
        argv = ["--model_name_or_path", "1b", "--per_device_train_batch_size", "2", "--output_dir", "out",
                *plan["hf_flags"]["added"]]
        for file, content in (plan["hf_flags"].get("files") or {}).items():
            os.makedirs(os.path.dirname(file), exist_ok=True)
            Path(file).write_text(json.dumps(content))
        ns = trainer_parser.parse_args(argv)
        # the math is the user's: the only batch flags are those that keep the one process's global batch of 2
        # over the ranks (issue 51), and nothing else that changes it
        keeps_batch = {"--per_device_train_batch_size", "--gradient_accumulation_steps"}
        assert not set(plan["hf_flags"]["added"]) & (set(CHANGES_THE_MATH) - keeps_batch)
        assert world * ns.per_device_train_batch_size * ns.gradient_accumulation_steps == 2
        job = _job_from(argv, world, "--bf16" in argv, ns.per_device_train_batch_size, place["root"])
    device, _ = estimate(cfg, job)
    assert device * ranks_per_node <= node_bytes, (device / GiB, node_gib)


# -- where the model comes from ------------------------------------------------------------------------------------

def test_script_arguments_in_every_spelling():
    args = ["--model-name-or-path=./m", "--per_device_train_batch_size", "4", "--gradient-accumulation-steps=2",
            "--optim", "adafactor", "--block_size", "512", "--learning_rate", "1e-4", "--max_steps", "900"]
    named = _named(args)
    assert {k: named[k] for k in named if k != "learning_rate"} == {
        "model_name_or_path": "./m", "per_device_train_batch_size": "4", "gradient_accumulation_steps": "2",
        "optim": "adafactor", "block_size": "512", "max_steps": "900"}
    # prefixes and repeats as HfArgumentParser reads them: the last occurrence wins
    assert _named(["--per_device_train_batch", "16", "--per-device-train-batch-size=3"])[
        "per_device_train_batch_size"] == "3"


def test_a_local_directory_the_hf_cache_and_a_hub_only_name(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(CONFIGS["125m"]))
    found = script_model(_named(["--model_name_or_path", "m", "--per_device_train_batch_size", "4"]), str(tmp_path), {})
    assert found.config == CONFIGS["125m"] and found.per_device_batch == 4 and "m/config.json" in found.where
    # the local Hugging Face cache (huggingface_hub's layout), found without the network
    snap = tmp_path / "hf" / "hub" / "models--org--small" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(CONFIGS["1b"]))
    env = {"HF_HOME": str(tmp_path / "hf")}
    found = script_model(_named(["--model_name_or_path", "org/small"]), str(tmp_path), env)
    assert found.config == CONFIGS["1b"] and "cache" in found.where
    # --config_name comes first, as in Hugging Face's example scripts
    found = script_model(_named(["--model_name_or_path", "org/small", "--config_name", "m"]), str(tmp_path), env)
    assert found.config == CONFIGS["125m"]
    # only on the hub: cpuperf cannot tell, and says so (it never downloads)
    found = script_model(_named(["--model_name_or_path", "org/elsewhere"]), str(tmp_path), env)
    assert found.config is None and "never downloads" in found.why_not
    assert script_model(_named([]), str(tmp_path), env).why_not.startswith("the script names no model")


def test_an_args_file_names_the_model(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(CONFIGS["125m"]))
    (tmp_path / "args.json").write_text(json.dumps({"model_name_or_path": "m", "per_device_train_batch_size": 2}))
    found = script_model(_named(["args.json"]), str(tmp_path), {})
    assert found.config == CONFIGS["125m"] and found.per_device_batch == 2


@pytest.mark.full  # the installed transformers read in a child
def test_model_type_with_overrides_from_the_installed_transformers(tmp_path):
    found = script_model(_named(["--model_type", "gpt2", "--config_overrides", "n_embd=256,n_layer=4,n_head=4"]),
                         str(tmp_path), {}, python=sys.executable)
    assert found.config is not None, found.why_not
    assert (found.config["n_embd"], found.config["n_layer"], found.config["vocab_size"]) == (256, 4, 50257)
    bad = script_model(_named(["--model_type", "no-such-family"]), str(tmp_path), {}, python=sys.executable)
    assert bad.config is None and "does not know it" in bad.why_not


def test_an_unknown_model_is_said_and_planned_for_nothing(place):
    proc = _dry_run(place, ["--", "python", "script.py", "--model_name_or_path", "org/not-here", "--output_dir", "o"],
                    {"CPUPERF_OVERRIDE_GPUS": "[]"})
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["workload"]["source"] == "unknown" and "never downloads" in plan["workload"]["found"]
    decided = {d["id"]: d for d in plan["decisions"]}
    for lever in ("grad_checkpointing", "sharding", "offload"):
        assert "cannot tell your script's model" in decided[lever]["reason"]
    assert not set(plan["hf_flags"]["added"]) & set(MEMORY_FLAGS)


def test_a_set_batch_against_the_scripts_own_is_refused(place):
    proc = _dry_run(place, ["--set", "batch_size=2", "--", "python", "script.py", "--model_name_or_path", "125m",
                            "--per_device_train_batch_size", "8", "--output_dir", "o"], {"CPUPERF_OVERRIDE_GPUS": "[]"})
    assert proc.returncode == 2 and "per_device_train_batch_size" in proc.stderr


# -- real runs on this CPU ------------------------------------------------------------------------------------------

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64, "vocab_size": 512}


def _tiny(root: Path) -> Path:
    (root / "tiny").mkdir(exist_ok=True)
    (root / "tiny" / "config.json").write_text(json.dumps(TINY))
    return root / "tiny"


@pytest.mark.full  # real torchrun ranks
def test_the_trainer_does_not_shard_on_cpu(tmp_path):
    """Why a CPU plan never gives a Trainer script --fsdp: with --use_cpu the Trainer wraps the model in DDP anyway
    (accelerate's MULTI_CPU). If a release ever shards there, this fails and the lever can open on CPUs."""
    _tiny(tmp_path)
    (tmp_path / "fsdp.json").write_text(json.dumps({"activation_checkpointing": True}))
    env = cli_env({"PYTHONPATH": str(SCRIPTS), "FIXTURE_OUT": str(tmp_path / "rec.json"), "OMP_NUM_THREADS": "1"})
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--standalone", str(SCRIPTS / "hf_model_path.py"),
                           "--model_name_or_path", "tiny", "--fsdp", "--fsdp_config", "fsdp.json", "--use_cpu",
                           "--ddp_backend", "gloo", "--max_steps", "2", "--per_device_train_batch_size", "2",
                           "--output_dir", "o", "--report_to", "none", "--save_strategy", "no"],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrapped=DistributedDataParallel" in proc.stdout, proc.stdout[-1000:]


@pytest.mark.full  # real training runs
def test_a_real_trainer_run_with_a_local_model_directory(tmp_path):
    """`cpuperf train -- python script.py --model_name_or_path DIR`, plain and --auto, on this CPU: both train the
    model the directory names; --auto plans memory for it and adds no lever that changes the math."""
    _tiny(tmp_path)
    common = ["python", str(SCRIPTS / "hf_model_path.py"), "--model_name_or_path", "tiny", "--max_steps", "3",
              "--per_device_train_batch_size", "4", "--output_dir", "o", "--report_to", "none",
              "--save_strategy", "no"]
    env = cli_env({"PYTHONPATH": str(SCRIPTS), "FIXTURE_OUT": str(tmp_path / "rec.json"),
                   "CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "CPUPERF_OVERRIDE_GPUS": "[]",
                   "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    runs = {}
    for mode in ("plain", "auto"):
        args = [sys.executable, "-m", "cpuperf", "train", "--json", "--out", str(tmp_path / mode)]
        args += ["--auto"] if mode == "auto" else []
        proc = subprocess.run([*args, "--", *common], capture_output=True, text=True, timeout=600,
                              cwd=str(tmp_path), env=env)
        assert proc.returncode == 0, (mode, proc.stderr[-3000:])
        runs[mode] = proc
        record = json.loads((tmp_path / "rec.json").read_text())
        assert record["hyper"]["per_device_train_batch_size"] == 4 and record["hyper"]["max_steps"] == 3
    dry = _dry_run({"root": tmp_path}, ["--", *common], {"PYTHONPATH": str(SCRIPTS), "CPUPERF_OVERRIDE_GPUS": "[]"})
    plan = json.loads(dry.stdout)
    assert plan["workload"]["source"] == "script" and plan["workload"]["n_layer"] == 2
    assert not set(plan["hf_flags"]["added"]) & set(CHANGES_THE_MATH + MEMORY_FLAGS)


# -- GPU hosts: each rank on its GPU's NUMA node -------------------------------------------------------------------

def _gpu_plan(place, gpus: str, torch: str = "2.13.0+cu128", extra: Tuple[str, ...] = ()) -> Dict[str, Any]:
    proc = _dry_run(place, ["--sysroot", str(place["gpu_host"]), "--", "python", "script.py", "--model_name_or_path",
                            "125m", "--output_dir", "o", *extra],
                    {"CPUPERF_OVERRIDE_GPUS": gpus, "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": torch})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_gpu_ranks_sit_on_their_gpus_numa_node(place):
    """8 GPUs, 4 on each of 2 NUMA nodes of 16 cores: each rank pinned to 4 cores of its GPU's node, its compute
    threads and its data loader workers splitting them."""
    row = json.loads((GPUS / CARDS["h100"]).read_text())[0]
    gpus = json.dumps([dict(row, index=i, numa_node=i // 4) for i in range(8)])
    plan = _gpu_plan(place, gpus)
    node_cpus = {0: set(range(0, 16)), 1: set(range(16, 32))}  # make_host: socket-major, one node per socket
    ranks = plan["launch"]["per_rank"]
    assert len(ranks) == 8
    for r in ranks:
        assert len(r["cpus"]) == 4 and set(r["cpus"]) <= node_cpus[r["local_rank"] // 4], r
    assert len({c for r in ranks for c in r["cpus"]}) == 32  # no two ranks share a core
    decided = {d["id"]: d["value"] for d in plan["decisions"]}
    assert decided["affinity"] == "auto" and all(r["threads"] == decided["threads_per_rank"] for r in ranks)
    assert decided["threads_per_rank"] + decided["dataloader_workers"] == 4
    added = plan["hf_flags"]["added"]
    assert added[added.index("--dataloader_num_workers") + 1] == str(decided["dataloader_workers"])
    assert plan["launch"]["env"]["OMP_NUM_THREADS"] == str(decided["threads_per_rank"])
    assert "--numa-binding=node" not in plan["launch"]["argv"]  # cpuperf pinned them itself


def test_torchrun_binds_gpu_ranks_where_cpuperf_cannot_tell_their_node(place):
    plan = _gpu_plan(place, _gpus("h100", 2))  # the recorded answer has no PCI locality
    assert "--numa-binding=node" in plan["launch"]["argv"]
    decided = {d["id"]: d for d in plan["decisions"]}
    assert decided["affinity"]["value"] is None and "NUMA nodes are unknown" in decided["affinity"]["reason"]
    assert plan["launch"]["env"]["OMP_NUM_THREADS"] == str(decided["threads_per_rank"]["value"])  # not torchrun's 1
    older = _gpu_plan(place, _gpus("h100", 2), torch="2.8.0+cu128")  # no --numa-binding before torch 2.9
    assert "--numa-binding=node" not in older["launch"]["argv"]


def test_compile_reaches_a_gpu_trainer_script_and_attention_is_said(place):
    long = _gpu_plan(place, _gpus("h100", 1), extra=("--max_steps", "100000"))
    decided = {d["id"]: d["value"] for d in long["decisions"]}
    assert decided["compile"] is True and "--torch_compile" in long["hf_flags"]["added"]
    unknown = _gpu_plan(place, _gpus("h100", 1))  # no --max_steps: the run length is unknown, no compile
    assert "--torch_compile" not in unknown["hf_flags"]["added"]
    assert any(n["flag"] == "attention" for n in unknown["hf_flags"]["not_added"])


def test_doctor_on_a_gpu_host_gives_no_cpu_bf16_advice(place):
    env = cli_env({"CPUPERF_OVERRIDE_GPUS": (GPUS / CARDS["a100"]).read_text(), "CPUPERF_OVERRIDE_ISA": "avx2 fma",
                   "CPUPERF_OVERRIDE_MICROARCH": "zen3", "CPUPERF_OVERRIDE_PACKAGES": CUDA_STACK})
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "doctor", "--json"], capture_output=True, text=True,
                          timeout=120, env=env)
    finding = next(f for f in json.loads(proc.stdout)["findings"] if f["id"] == "bf16-not-native")
    assert "do not pass --bf16" not in finding["message"] and "A100" in finding["message"]


def test_a_model_types_defaults_are_read_once_per_install(tmp_path, monkeypatch):
    """--model_type's defaults cost a child that imports transformers (and torch): seconds before every run.
    The answer is kept per interpreter and install; a later run starts no program, an install into that
    environment (its transformers rewritten) reads them again."""
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "site-packages"
    (site / "transformers").mkdir(parents=True)
    init = site / "transformers" / "__init__.py"
    init.write_text("# v1\n")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    ran: List[List[str]] = []

    def run(argv, timeout):
        ran.append(list(argv))
        out = json.dumps({"config": {"model_type": "gpt2", "n_layer": 12 + len(ran)}, "from": str(init)})
        return subprocess.CompletedProcess(argv, 0, stdout=out, stderr="")

    from cpuperf.probe.hf import _type_defaults

    first, _ = _type_defaults("gpt2", str(python), run)
    again, _ = _type_defaults("gpt2", str(python), run)
    assert first == again == {"model_type": "gpt2", "n_layer": 13} and len(ran) == 1
    assert _type_defaults("llama", str(python), run)[0] == {"model_type": "gpt2", "n_layer": 14}  # per type
    init.write_text("# v2, another release\n")
    assert _type_defaults("gpt2", str(python), run)[0] == {"model_type": "gpt2", "n_layer": 15} and len(ran) == 3
    other = tmp_path / "venv-python"  # another environment's interpreter: its own entry
    other.write_text("#!/bin/sh\n")
    assert _type_defaults("gpt2", str(other), run)[0] == {"model_type": "gpt2", "n_layer": 16}
