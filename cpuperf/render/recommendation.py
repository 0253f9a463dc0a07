"""Pasteable renderings of a recommendation: env exports, HF Trainer flags, accelerate config, launch line."""

from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional

from cpuperf.boundary import DEFAULT_MASTER_PORT
from cpuperf.decide.records import Recommendation
from cpuperf.decide.threads import rank_threads


def hf_notes(rec: Recommendation) -> List[str]:
    """Why some renderings are empty: the installed transformers/accelerate is newer than cpuperf's data."""
    from cpuperf.knowledge.hf_flags import data_note

    notes = [data_note(pkg, rec.stack.get(pkg)) for pkg in ("transformers", "accelerate")]
    return [n for n in notes if n]


def hf_flags(rec: Recommendation, transformers_version: Optional[str]) -> List[str]:
    """TrainingArguments speed flags the installed transformers understands; hyperparameters only when --set."""
    from cpuperf.plan.user_script import recommended_speed_flags

    return [a for f in recommended_speed_flags(rec, transformers_version)[0] for a in f.args]


def accelerate_launch_args(rec: Recommendation, accelerate_version: Optional[str] = None) -> List[str]:
    """`accelerate launch` flags for the plan: threads per rank (a launch flag: config files reject it)."""
    from cpuperf.knowledge.accelerate import launch_flag_ok

    version = accelerate_version if accelerate_version is not None else rec.stack.get("accelerate")
    threads = rank_threads(rec.levers, True)  # what recommend renders is the --auto plan
    if threads and launch_flag_ok("--num_cpu_threads_per_process", version):
        return ["--num_cpu_threads_per_process", str(threads)]
    return []


def accelerate_config(rec: Recommendation, main_address: str = "127.0.0.1", main_port: int = DEFAULT_MASTER_PORT,
                      accelerate_version: Optional[str] = None) -> str:
    """An accelerate config file (YAML) with only the keys the installed accelerate's loader accepts."""
    from cpuperf.knowledge.accelerate import config_keys, data_note

    version = accelerate_version if accelerate_version is not None else rec.stack.get("accelerate")
    keys = config_keys(version)
    if not keys:
        return f"# {data_note('accelerate', version) or 'no accelerate config keys are known'}\n"
    lv = rec.levers
    nnodes = lv.nnodes.value
    world = lv.world
    if lv.on_gpu:
        dist = "MULTI_GPU" if world > 1 else "NO"
    else:
        dist = "MULTI_CPU" if world > 1 else "NO"
    mp = {"bf16": "bf16", "fp16": "fp16"}.get(lv.dtype.value, "no")
    entries = [
        ("compute_environment", "LOCAL_MACHINE"),
        ("distributed_type", dist),
        ("mixed_precision", mp),
        ("num_machines", str(nnodes)),
        ("num_processes", str(world)),
        ("machine_rank", "0"),
        ("main_process_ip", main_address if nnodes > 1 else "null"),
        ("main_process_port", str(main_port) if nnodes > 1 else "null"),
        ("use_cpu", "true" if lv.device.value == "cpu" else "false"),
        ("rdzv_backend", "static"),
        ("same_network", "true"),
    ]
    note = data_note("accelerate", version)
    lines = [f"# {note}"] if note else []  # a release past the data: say the keys were carried over
    launch = accelerate_launch_args(rec, version)
    if launch:
        lines.append(f"# threads per rank: accelerate launch {' '.join(launch)} (a launch flag, not a config key)")
    lines += [f"{key}: {value}" for key, value in entries if key in keys]
    if lv.compile.value and "dynamo_config" in keys:
        lines += ["dynamo_config:", "  dynamo_backend: INDUCTOR"]
    if lv.ipex.value and "ipex_config" in keys:
        lines += ["ipex_config:", "  ipex: true"]
    if lv.sharding.value:  # not silently dropped: said where it is applied instead
        lines.insert(0, f"# the memory plan shards the model ({lv.sharding.value}"
                     f"{', CPU offload' if lv.offload.value else ''}): "
                     "a Trainer script gets it as Trainer flags (cpuperf recommend --format hf); accelerate's own "
                     "fsdp_config keys are not in cpuperf's checked data, so this file leaves them out")
    return "\n".join(lines) + "\n"


def launch_line(launch: Dict[str, Any]) -> str:
    argv = launch.get("argv") or []
    env = launch.get("env") or {}
    prefix = " ".join(f"{k}={shlex.quote(str(val))}" for k, val in env.items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in argv)


def env_exports(env: Dict[str, str]) -> str:
    """`export NAME='value'` lines, inert in sh, bash, zsh, dash and fish alike (render/shell.py's rule): a
    value no single quoting writes the same for all of them is left out with a comment saying why."""
    from cpuperf.decide.runtime_env import shell_safe, valid_name

    lines = []
    for k, val in env.items():
        why = shell_safe(str(val)) if valid_name(k) else "not a valid variable name"
        lines.append(f"export {k}='{val}'\n" if why is None else
                     f"# {k if valid_name(k) else 'a variable'} not written: {why}\n")
    return "".join(lines)
