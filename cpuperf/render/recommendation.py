"""Pasteable renderings of a recommendation: env exports, HF Trainer flags, accelerate config, launch line."""

from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional, Tuple

from cpuperf.decide.recommend import Recommendation


def speed_flags(rec: Recommendation, transformers_version: Optional[str] = None
                ) -> Tuple[List[Any], List[Tuple[str, str]]]:
    """(Trainer speed flags for this recommendation, candidates left out with why): cpuperf.plan.user_script."""
    from cpuperf.data import load_builtin
    from cpuperf.plan.user_script import speed_flags as plan_flags

    v = rec.values()
    overridden = {d.id for d in rec.decisions if d.overridden}
    world = int(v["nproc_per_node"]) * int(v.get("nnodes") or 1)
    ev = rec.decision("dtype").evidence
    ratio = (ev["gemm_bf16_gflops"] / ev["gemm_fp32_gflops"]) if ev.get("gemm_bf16_gflops") and ev.get("gemm_fp32_gflops") \
        else None
    if ratio is None and ev.get("amx_bf16") and ev.get("amx_usable") is not False:
        ratio = float("inf")  # AMX, not measured: the case the bf16 rule is for
    return plan_flags(v, overridden, transformers_version or rec.stack.get("transformers"), rec.stack.get("torch"),
                      world, load_builtin("tuning.toml"), bf16_gemm_ratio=ratio)


def hf_flags(rec: Recommendation, transformers_version: Optional[str]) -> List[str]:
    """TrainingArguments speed flags the installed transformers understands; hyperparameters only when --set."""
    return [a for f in speed_flags(rec, transformers_version)[0] for a in f.args]


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
