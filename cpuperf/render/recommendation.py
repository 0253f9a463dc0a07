"""Pasteable renderings of a recommendation: env exports, HF Trainer flags, accelerate config, launch line."""

from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional

from packaging.version import InvalidVersion, Version

from cpuperf.decide.recommend import Recommendation


def _v(text: Optional[str]) -> Optional[Version]:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def hf_notes(rec: Recommendation) -> List[str]:
    """Why some renderings are empty: the installed transformers/accelerate is newer than cpuperf's data."""
    from cpuperf.knowledge.hf_flags import data_note

    notes = [data_note(pkg, rec.stack.get(pkg)) for pkg in ("transformers", "accelerate")]
    return [n for n in notes if n]


def hf_flags(rec: Recommendation, transformers_version: Optional[str]) -> List[str]:
    """TrainingArguments flags the installed transformers has (verified rows only; none past the data)."""
    from cpuperf.knowledge.hf_flags import supported_flags

    flags_ok = supported_flags(transformers_version)
    v = rec.values()
    out: List[str] = []
    cpu = v["device"] == "cpu"
    if cpu:
        if "use_cpu" in flags_ok:
            out.append("--use_cpu")
        elif "no_cuda" in flags_ok:
            out.append("--no_cuda")
    if v["dtype"] == "bf16" and "bf16" in flags_ok:
        out.append("--bf16")
    if v["dtype"] == "fp16" and "fp16" in flags_ok:
        out.append("--fp16")
    if v["tf32"] and "tf32" in flags_ok:
        out += ["--tf32", "true"]
    if v["ipex"] and "use_ipex" in flags_ok:
        out.append("--use_ipex")
    backend = v["ddp_backend"]
    if backend and "ddp_backend" in flags_ok and f"ddp_backend_{backend}" in flags_ok:
        out += ["--ddp_backend", backend]
    if "per_device_train_batch_size" in flags_ok:
        out += ["--per_device_train_batch_size", str(v["batch_size"])]
    if v["grad_accum_steps"] > 1 and "gradient_accumulation_steps" in flags_ok:
        out += ["--gradient_accumulation_steps", str(v["grad_accum_steps"])]
    if v["grad_checkpointing"] and "gradient_checkpointing" in flags_ok:
        out.append("--gradient_checkpointing")
    optim = {"adamw": ("adamw_torch", "optim_adamw"), "adamw_fused": ("adamw_torch_fused", "optim_fused"),
             "adafactor": ("adafactor", "optim_adafactor"), "adamw_8bit": ("adamw_bnb_8bit", "optim_8bit")
             }.get(v["optimizer"])
    if optim and "optim" in flags_ok and optim[1] in flags_ok:
        out += ["--optim", optim[0]]
    if "dataloader_num_workers" in flags_ok:
        out += ["--dataloader_num_workers", str(v["dataloader_workers"])]
    if v["device"] == "cuda" and "dataloader_pin_memory" in flags_ok:
        out += ["--dataloader_pin_memory", "true" if v["pin_memory"] else "false"]
    if v["compile"] and "torch_compile" in flags_ok:
        out.append("--torch_compile")
    return out


def accelerate_launch_args(rec: Recommendation, accelerate_version: Optional[str] = None) -> List[str]:
    """`accelerate launch` flags for the plan: threads per rank (a launch flag: config files reject it)."""
    from cpuperf.knowledge.accelerate import launch_flag_ok

    version = accelerate_version if accelerate_version is not None else rec.stack.get("accelerate")
    v = rec.values()
    threads = v.get("threads_per_rank")
    if v["device"] == "cpu" and threads and launch_flag_ok("--num_cpu_threads_per_process", version):
        return ["--num_cpu_threads_per_process", str(threads)]
    return []


def accelerate_config(rec: Recommendation, main_address: str = "127.0.0.1", main_port: int = 29500,
                      accelerate_version: Optional[str] = None) -> str:
    """An accelerate config file (YAML) with only the keys the installed accelerate's loader accepts."""
    from cpuperf.knowledge.accelerate import config_keys, data_note

    version = accelerate_version if accelerate_version is not None else rec.stack.get("accelerate")
    keys = config_keys(version)
    if not keys:
        return f"# {data_note('accelerate', version) or 'no accelerate config keys are known'}\n"
    v = rec.values()
    nproc, nnodes = v["nproc_per_node"], v["nnodes"]
    world = nproc * nnodes
    if v["device"] == "cuda":
        dist = "MULTI_GPU" if world > 1 else "NO"
    else:
        dist = "MULTI_CPU" if world > 1 else "NO"
    mp = {"bf16": "bf16", "fp16": "fp16"}.get(v["dtype"], "no")
    entries = [
        ("compute_environment", "LOCAL_MACHINE"),
        ("distributed_type", dist),
        ("mixed_precision", mp),
        ("num_machines", str(nnodes)),
        ("num_processes", str(world)),
        ("machine_rank", "0"),
        ("main_process_ip", main_address if nnodes > 1 else "null"),
        ("main_process_port", str(main_port) if nnodes > 1 else "null"),
        ("use_cpu", "true" if v["device"] == "cpu" else "false"),
        ("rdzv_backend", "static"),
        ("same_network", "true"),
    ]
    lines = []
    launch = accelerate_launch_args(rec, version)
    if launch:
        lines.append(f"# threads per rank: accelerate launch {' '.join(launch)} (a launch flag, not a config key)")
    lines += [f"{key}: {value}" for key, value in entries if key in keys]
    if v["compile"] and "dynamo_config" in keys:
        lines += ["dynamo_config:", "  dynamo_backend: INDUCTOR"]
    if v["ipex"] and "ipex_config" in keys:
        lines += ["ipex_config:", "  ipex: true"]
    return "\n".join(lines) + "\n"


def launch_line(launch: Dict[str, Any]) -> str:
    argv = launch.get("argv") or []
    env = launch.get("env") or {}
    prefix = " ".join(f"{k}={shlex.quote(str(val))}" for k, val in env.items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in argv)


def env_exports(env: Dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(str(val))}\n" for k, val in env.items())
