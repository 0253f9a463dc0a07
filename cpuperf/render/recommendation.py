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


def hf_flags(rec: Recommendation, transformers_version: Optional[str]) -> List[str]:
    """TrainingArguments flags the installed transformers understands (none it removed)."""
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
    if v["ddp_backend"] and "ddp_backend" in flags_ok and (v["ddp_backend"] != "ccl" or "ddp_backend_ccl" in flags_ok):
        out += ["--ddp_backend", v["ddp_backend"]]
    if "per_device_train_batch_size" in flags_ok:
        out += ["--per_device_train_batch_size", str(v["batch_size"])]
    if v["grad_accum_steps"] > 1:
        out += ["--gradient_accumulation_steps", str(v["grad_accum_steps"])]
    if v["grad_checkpointing"] and "gradient_checkpointing" in flags_ok:
        out.append("--gradient_checkpointing")
    optim = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adafactor": "adafactor",
             "adamw_8bit": "adamw_bnb_8bit"}.get(v["optimizer"])
    if optim and "optim" in flags_ok and (optim != "adamw_torch_fused" or "optim_fused" in flags_ok):
        out += ["--optim", optim]
    if "dataloader_num_workers" in flags_ok:
        out += ["--dataloader_num_workers", str(v["dataloader_workers"])]
    if v["device"] == "cuda" and "dataloader_pin_memory" in flags_ok:
        out += ["--dataloader_pin_memory", "true" if v["pin_memory"] else "false"]
    if v["compile"] and "torch_compile" in flags_ok:
        out.append("--torch_compile")
    return out


def accelerate_config(rec: Recommendation, main_address: str = "127.0.0.1", main_port: int = 29500) -> str:
    """An accelerate config file (YAML) for these decisions."""
    v = rec.values()
    nproc, nnodes = v["nproc_per_node"], v["nnodes"]
    world = nproc * nnodes
    if v["device"] == "cuda":
        dist = "MULTI_GPU" if world > 1 else "NO"
    else:
        dist = "MULTI_CPU" if world > 1 else "NO"
    mp = {"bf16": "bf16", "fp16": "fp16"}.get(v["dtype"], "no")
    lines = [
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: {dist}",
        f"mixed_precision: {mp}",
        f"num_machines: {nnodes}",
        f"num_processes: {world}",
        "machine_rank: 0",
        f"main_process_ip: {main_address}" if nnodes > 1 else "main_process_ip: null",
        f"main_process_port: {main_port}" if nnodes > 1 else "main_process_port: null",
        f"use_cpu: {'true' if v['device'] == 'cpu' else 'false'}",
        "rdzv_backend: static",
        "same_network: true",
    ]
    if v["compile"]:
        lines += ["dynamo_config:", "  dynamo_backend: INDUCTOR"]
    if v["ipex"]:
        lines += ["ipex_config:", "  ipex: true"]
    return "\n".join(lines) + "\n"


def launch_line(launch: Dict[str, Any]) -> str:
    argv = launch.get("argv") or []
    env = launch.get("env") or {}
    prefix = " ".join(f"{k}={shlex.quote(str(val))}" for k, val in env.items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in argv)


def env_exports(env: Dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(str(val))}\n" for k, val in env.items())
