"""The flags the user typed, named at the edge (issue 54): pure layers raise `FieldError` about a field (a knob id
of `--set`, or an option's field) and never name a flag; the error boundary (cli._report, which ccl-env's fast
path hands its errors to as well) renders the message with the flag of this table. A `--set` key renders as
`--set key=value`; an option as `--flag value`."""

from __future__ import annotations

from typing import Dict, Optional

from cpuperf.errors import CpuperfError, FieldError, UsageError

# An option's field (what the pure layers call the value) -> the flag the commands declare (cli.py, ccl_env.py).
OPTION_FLAGS: Dict[str, str] = {
    "batch_size": "--batch-size",
    "device": "--device",
    "dry_run": "--dry-run",
    "hf_flags": "--hf-flags",
    "hostfile": "--hostfile",
    "launcher": "--launcher",
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "max_steps": "--max-steps",
    "model": "--model",
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "nproc_per_node": "--nproc-per-node",
    "out_dir": "--out",
    "params": "--params",
    "plan": "--plan",
    "ppn": "--ppn",
    "python": "--python",
    "rdzv_timeout": "--rdzv-timeout",
    "replan": "--replan",
    "resume": "--resume",
    "save": "--save",
    "seed": "--seed",
    "seq_len": "--seq-len",
    "set": "--set",
    "steps": "--steps",
    "time_budget": "--time-budget",
    "sysroot": "--sysroot",
    "unit": "--unit",
}


def flag_of(field: str, setting: bool, value: Optional[str]) -> str:
    """How the user typed `field` (with `value`; None: the flag alone): `--set dtype=bf16`, `--nnodes 2`."""
    if setting:
        return f"--set {field}" if value is None else f"--set {field}={value}"
    flag = OPTION_FLAGS[field]
    return flag if value is None else f"{flag} {value}"


def with_flags(exc: CpuperfError) -> CpuperfError:
    """The error as the user reads it: a FieldError's fields named by the flags they typed; any other unchanged."""
    if not isinstance(exc, FieldError):
        return exc
    message, hint = exc.render(flag_of)
    return UsageError(message, hint, exc.code)

