"""A user's own command under `cpuperf train -- ...`: find the script, read how it parses its
arguments, and add only Trainer speed flags it will accept. Pure planning; the caller reads the file.

First do no harm: hyperparameters (batch size, learning rate, optimizer family, epochs)
are the user's unless they `--set` them; a flag is added only where the script parses TrainingArguments
from its command line (HfArgumentParser), the installed transformers has it, the user gave neither it
nor its opposite, and it changes something (a value different from the Trainer's default).
When the user's command is itself a launcher (torchrun, accelerate launch, mpirun...), cpuperf adds
no launcher of its own: it runs that command directly with its environment, threads and pinning.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypedDict

from packaging.version import Version

from cpuperf.decide.records import compile_mode_of
from cpuperf.decide.workload import DataParallel
from cpuperf.errors import FieldError, verbatim
from cpuperf.jsonable import JsonValue
from cpuperf.knowledge.hf_flags import TRAINER_COMPILE_MODES
from cpuperf.knowledge.script_parsers import ScriptParser, hf_parser
from cpuperf.plan.script_args import UNREAD, ScriptArgError, ScriptArgs, bounded_int, read_script_args
from cpuperf.plan.script_read import ScriptRead
from cpuperf.versions import base_or_none

if TYPE_CHECKING:
    from cpuperf.decide.records import Levers, Recommendation
    from cpuperf.knowledge.tuning import Tuning
    from cpuperf.plan.command import CommandLine
    from cpuperf.plan.launch import LaunchPlan, RankObservation
    from cpuperf.plan.user_launcher import LauncherCommand, Wrapper

HF_MODES = ("auto", "always", "never")
# Flags that say the same thing in different words: one given by the user rules out the others.
_EXCLUSIVE = (("--bf16", "--fp16", "--half_precision_backend", "--bf16_full_eval", "--fp16_full_eval"),
              ("--use_cpu", "--no_cuda"), ("--activation_checkpointing", "--gradient_checkpointing"),
              ("--torch_compile", "--torch_compile_backend", "--torch_compile_mode"),
              ("--optim", "--optim_args"), ("--fsdp", "--fsdp_config", "--deepspeed"))
# Rejection by argparse (and HfArgumentParser, which is argparse): seconds within which it happens.
REJECT_WINDOW_S = 20.0


@dataclass(frozen=True)
class UserCommand:
    """The parts of the user's command: their launcher (if any), the script and its arguments."""

    argv: Tuple[str, ...]
    launcher: Optional[str]  # torchrun | accelerate | mpirun | srun | None
    nproc: Optional[int]  # processes the user's launcher starts on this node (None: unknown or 1 rank)
    script: Optional[str]
    script_args: Tuple[str, ...]
    module: Optional[str] = None  # `python -m pkg.train` (not a launcher)
    # What is in front of the command (`env X=1`, `nice -n 5`, `bash -c 'LINE'` and what is inside the line): argv
    # is the command behind the wrappers; flags go after it, inside a shell's line (rewrap). A line cpuperf does
    # not read through: `hidden` says why.
    wrappers: Tuple[Wrapper, ...] = ()
    hidden: str = ""

    def rewrap(self, argv: Sequence[str]) -> Tuple[str, ...]:
        """`argv` (this command, changed) inside the wrappers it was given in."""
        out = tuple(argv)
        for w in reversed(self.wrappers):
            out = w.around(out)
        return out


@dataclass(frozen=True)
class Flag:
    args: Tuple[str, ...]  # ("--bf16",) or ("--optim", "adamw_torch_fused")
    why: str
    file: Optional[Tuple[str, str]] = None  # (path, JSON text) the flag names: written in the run directory
    # keeps the global batch over cpuperf's ranks: it takes the place of the value your command gives, if any
    replaces: bool = False

    @property
    def name(self) -> str:
        return _norm(self.args[0])


class FlagReport(TypedDict):
    args: List[str]
    why: str


class LeftOut(TypedDict):
    flag: str
    why: str


class _ScriptReport(TypedDict):
    added: List[str]
    flags: List[FlagReport]
    kept_yours: List[str]
    not_added: List[LeftOut]
    why: str
    parser: str
    framework: str
    mode: str
    script: Optional[str]
    your_launcher: Optional[str]
    transformers: Optional[str]


class ScriptReport(_ScriptReport, total=False):
    """ScriptPlan's JSON (`train --dry-run --json` "hf_flags")."""

    files: Dict[str, JsonValue]  # the config files the flags name, as JSON
    env: Dict[str, str]  # variables the script's framework reads that carry a lever


@dataclass(frozen=True)
class ScriptPlan:
    """What cpuperf does to the user's command: the final argv, the flags added and those it left out."""

    argv: Tuple[str, ...]
    words: Tuple[str, ...]  # argv behind the user's wrappers (inside a shell line: the line's words)
    command: UserCommand
    parser: str  # hf | argparse | args-file | in-code | other | unknown | n/a
    mode: str
    added: Tuple[Flag, ...]
    not_added: Tuple[Tuple[str, str], ...]  # (flag, why)
    why: str
    transformers: Optional[str] = None
    notes: Tuple[str, ...] = field(default_factory=tuple)
    # the levers the Trainer's own default already carries (no flag needed): cpuperf.plan.applied says so
    by_default: Tuple[str, ...] = field(default_factory=tuple)
    # the script builds TrainingArguments: the Trainer's defaults (batch 8, no accumulation, 0 loader workers) are
    # what it runs with where it sets none; any other script's are its own code's. None: its source was not read
    trainer: Optional[bool] = None
    framework: str = ""  # the script's framework (cpuperf.plan.frameworks): hf-trainer | lightning | plain; '': not read
    env: Tuple[Tuple[str, str], ...] = ()  # variables the framework reads that carry a lever (PL_TRAINER_PRECISION)
    carried: Tuple[Tuple[str, str], ...] = ()  # (lever id, how) carried by the framework's own mechanism
    reading: Optional[ScriptRead] = field(default=None, compare=False)  # the script as read once

    @property
    def added_args(self) -> List[str]:
        return [a for f in self.added for a in f.args]

    @property
    def files(self) -> Tuple[Tuple[str, str], ...]:
        """The config files the added flags name (an FSDP or DeepSpeed JSON), to write before the script starts."""
        return tuple(f.file for f in self.added if f.file is not None)

    def to_json(self) -> ScriptReport:
        report = ScriptReport(added=self.added_args, flags=[FlagReport(args=list(f.args), why=f.why) for f in self.added],
                              kept_yours=[n for n, w in self.not_added if w.startswith("you ")],
                              not_added=[LeftOut(flag=n, why=w) for n, w in self.not_added], why=self.why,
                              parser=self.parser, framework=self.framework, mode=self.mode,
                              script=self.command.script,
                              your_launcher=self.command.launcher, transformers=self.transformers)
        if self.files:
            report["files"] = {path: json.loads(text) for path, text in self.files}
        if self.env:
            report["env"] = dict(self.env)
        return report


# -- the command -----------------------------------------------------------------------------------

def script_of(argv: Sequence[str], wrappers: Sequence[Wrapper], inner: Sequence[str], hidden: str,
              launcher: Optional[LauncherCommand]) -> UserCommand:
    """The script part of a command already unwrapped (cpuperf.plan.user_launcher.unwrap) and its launcher already
    read (`launcher_of`, with the launcher's own table): `argv` as given, its wrappers, the words behind them, why a
    shell line is not read through ('' where it is). The script is found in what the launcher starts per rank."""
    if hidden:
        return UserCommand(tuple(argv), None, None, None, (), None, hidden=hidden)
    words = tuple(inner) if wrappers else tuple(argv)
    if launcher is not None and launcher.hidden:
        return UserCommand(words, None, None, None, (), None, wrappers=tuple(wrappers))
    target = launcher.target if launcher is not None else words
    script, args, module = _script_in(target, launcher)
    name = launcher.launcher if launcher is not None else None
    return UserCommand(words, name, _nproc(launcher) if launcher is not None else None, script, args, module,
                       wrappers=tuple(wrappers))


def _script_in(target: Sequence[str], launcher: Optional[LauncherCommand]) -> Tuple[Optional[str], Tuple[str, ...],
                                                                                   Optional[str]]:
    """(script, its arguments, module) of what is started: `python [its options] script.py ...`, `python -m pkg ...`,
    `script.py ...`, or, behind a launcher that runs Python itself, `script.py ...` / `pkg ...` under its module
    option; (None, (), None) for a program that is no Python script."""
    from cpuperf.plan.user_launcher import PYTHON_VALUED, is_python, rules

    if not target:
        return None, (), None
    if is_python(target[0]):
        j = 1
        while j < len(target) and target[j].startswith("-") and not target[j].startswith(("-m", "-c")) \
                and target[j] != "-":
            j += 2 if target[j] in PYTHON_VALUED else 1
        if j < len(target) and (target[j].startswith("-c") or target[j] == "-"):
            # `python -c CODE ...` / `python - ...`: the program is the code (or stdin), no script file
            rest = target[j + 1:] if target[j] == "-" or target[j][2:] else target[j + 2:]
            return None, tuple(rest), None
        if j < len(target) and target[j].startswith("-m"):
            module = target[j][2:] or (target[j + 1] if j + 1 < len(target) else "")
            rest = target[j + 1:] if target[j][2:] else target[j + 2:]
            return None, tuple(rest), module or None
        return (target[j], tuple(target[j + 1:]), None) if j < len(target) else (None, (), None)
    if launcher is not None and launcher.launcher in ("torchrun", "accelerate", "deepspeed"):
        rule = rules()[launcher.launcher]
        if launcher.has(rule.get("module", ())):
            return None, tuple(target[1:]), target[0]
        if launcher.has(rule.get("no_python", ())):
            return None, (), None
        return target[0], tuple(target[1:]), None
    # a program cpuperf does not know in front (`sudo python t.py`): the first Python or script in its words
    at = next((i for i, w in enumerate(target) if is_python(w) or w.endswith(".py")), None)
    if at is None:
        return None, (), None
    if at > 0:
        return _script_in(target[at:], None)
    return target[0], tuple(target[1:]), None


def _nproc(launcher: LauncherCommand) -> Optional[int]:
    """The local processes the user's launcher starts, where its line says a number (None: unknown or its default)."""
    from cpuperf.plan.user_launcher import rules

    rule = rules().get(launcher.launcher, {})
    raw = launcher.option([*rule.get("per_node", ()), *rule.get("nproc", ())] if launcher.launcher == "srun"
                          else rule.get("nproc", ()))
    try:
        return int(raw) if raw else None
    except ValueError:
        return None  # torchrun's 'auto'/'cpu' or a host list: unknown


# -- the script's parser ---------------------------------------------------------------------------

def script_kind(read: Optional[ScriptRead]) -> Tuple[str, str]:
    """(kind, why): whether Trainer flags on the command line reach TrainingArguments, from the script as read once
    (cpuperf.plan.script_read): hf | args-file | in-code | argparse | lightning | lightning-cli | other | unknown."""
    if read is None:
        return "n/a", "no Python script"
    parser = read.parser
    if parser.kind == "args-file":
        return "args-file", (f"{parser.why}: flags after it would be rejected (the `script.py args.json` pattern)")
    if parser.kind == "unknown":
        return "unknown", f"{parser.why}: no Trainer flags"
    name = read.framework.name
    if name == "hf-trainer":
        if parser.kind == "hf":
            if not _parses_command_line(read):
                return "args-file", "HfArgumentParser reads a file, not the command line: no Trainer flags"
            return "hf", ("HfArgumentParser parses TrainingArguments from the command line"
                          + ("" if parser.complete else f" ({parser.why}: only options written in full are read)"))
        if parser.kind == "argparse":
            return "argparse", "the script parses its own arguments: Trainer flags would be rejected"
        return "in-code", "TrainingArguments is built in code: command-line flags would not reach it"
    if name == "lightning":
        return parser.kind if parser.kind == "lightning-cli" else "lightning", (
            "a Lightning script: LightningCLI reads --trainer.* options" if parser.kind == "lightning-cli" else
            "a Lightning script: its Trainer is built in code; the dtype reaches it through the environment Lightning reads")
    if parser.kind == "argparse":
        return "argparse", "the script parses its own arguments: Trainer flags would be rejected"
    return "other", "not a Hugging Face Trainer script"


_PARSE_CALLS = ("parse_args_into_dataclasses", "parse_known_args", "parse_args")


def _parses_command_line(read: ScriptRead) -> bool:
    """The script asks its parser for the command line (not only parse_json_file / parse_yaml_file)."""
    return any(c.rsplit(".", 1)[-1] in _PARSE_CALLS for c in read.source.calls)


# -- may cpuperf split it into ranks (issue 51) -----------------------------------------------------

_ACCELERATE = ("accelerate.Accelerator",)
_PROCESS_GROUP = ("torch.distributed.init_process_group", "torch.nn.parallel.DistributedDataParallel",
                  "torch.nn.parallel.distributed.DistributedDataParallel", "deepspeed.initialize")
_BATCH_IN_CODE = re.compile(r"\bper_device_train_batch_size\s*=|\bgradient_accumulation_steps\s*=")
TRAINER_DEFAULT_BATCH = 8  # TrainingArguments' per_device_train_batch_size default (transformers training_args.py)
BATCH_DESTS = ("per_device_train_batch_size", "gradient_accumulation_steps")


def trainer_batch(read: ScriptRead) -> Tuple[Optional[int], int, str]:
    """(per-device batch, accumulation, where) the script's own parser reads from its arguments; (None, 1, why) where
    cpuperf cannot tell it (an option it cannot place may be one of them) or no run can take it (0, -4)."""
    args = read.args
    for dest in BATCH_DESTS:
        doubt = args.could_be(dest) if not args.has(dest) or not args.parser.complete else ""
        if doubt:
            return None, 1, doubt
    per, why = bounded_int(args, "per_device_train_batch_size")
    acc, why_acc = bounded_int(args, "gradient_accumulation_steps", "grad_accum_steps")
    if why or why_acc:
        return None, 1, why or why_acc
    where = (f"your {args.spelled('per_device_train_batch_size')}" if per is not None
             else f"the Trainer's default per_device_train_batch_size {TRAINER_DEFAULT_BATCH}")
    return per or TRAINER_DEFAULT_BATCH, acc or 1, where


def data_parallel(cmd: UserCommand, read: Optional[ScriptRead], mode: str, source_text: Optional[str] = None
                  ) -> DataParallel:
    """Whether the user's one-process command runs data-parallel when a launcher starts it several times, and
    whether cpuperf can keep its global batch: the signs read from its source, each said. Only a Trainer whose
    arguments come from the command line (HfArgumentParser) gets its batch passed by cpuperf; an accelerate or
    Lightning script, or one that forms its own process group, runs data-parallel with a batch of its own code's."""
    if cmd.hidden:
        return DataParallel("unread", f"{cmd.hidden}: its script is not read")
    if read is None or not read.source.read:
        what = f"python -m {cmd.module}: its source was not read" if cmd.module else "the script could not be read"
        return DataParallel("unread", what)
    src = read.source
    parser, why = script_kind(read)
    if parser == "hf":
        if mode == "never":
            return DataParallel("trainer", why, where="--hf-flags never: cpuperf passes no flag to it")
        if not read.args.has("per_device_train_batch_size") and source_text and _BATCH_IN_CODE.search(source_text):
            return DataParallel("trainer", why, where="its code sets the batch or accumulation")
        per, acc, where = trainer_batch(read)
        return DataParallel("trainer", why, per, acc, where)
    if read.framework.name == "hf-trainer":
        return DataParallel("trainer", "the script builds TrainingArguments", where=why)
    if read.framework.name == "lightning":
        return DataParallel("process-group", "a Lightning script (its Trainer forms the process group under a "
                            "launcher)")
    if src.calls_any(*_ACCELERATE):
        return DataParallel("accelerate", "the script runs under accelerate's Accelerator")
    if src.calls_any(*_PROCESS_GROUP):
        return DataParallel("process-group", "the script forms its own process group")
    return DataParallel("plain", f"{cmd.script or 'the script'} forms no process group (no Trainer, Accelerator, "
                        "Lightning or init_process_group in its source)")


@dataclass(frozen=True)
class BatchRan:
    """The global batch a Trainer's ranks trained with, read back from the ranks themselves: the world size in each
    rank's environment and the per-device batch and accumulation on the command line its script parsed."""

    world_size: int
    per_device: int
    grad_accum: int
    planned: int  # the plan's global batch: world x per-device x accumulation as planned
    ranks_read: int

    @property
    def global_batch(self) -> int:
        return self.world_size * self.per_device * self.grad_accum

    def to_json(self) -> Dict[str, Any]:
        return {"world_size": self.world_size, "per_device": self.per_device, "grad_accum": self.grad_accum,
                "global_batch": self.global_batch, "planned": self.planned, "ranks_read": self.ranks_read}


def _rank_batch(argv: Sequence[str], parser: ScriptParser) -> Tuple[Optional[int], Optional[int]]:
    """(per-device batch, accumulation) a rank's script read from its own command line (its words after the first
    `.py`), by the script's parser; None where a value is not a whole number of at least 1."""
    at = next((i for i, w in enumerate(argv) if w.endswith(".py")), -1)
    try:
        args = read_script_args(argv[at + 1:], parser)
    except ScriptArgError:
        return None, None
    per, why = bounded_int(args, "per_device_train_batch_size")
    acc, why_acc = bounded_int(args, "gradient_accumulation_steps", "grad_accum_steps")
    return (None if why else per or TRAINER_DEFAULT_BATCH), (None if why_acc else acc or 1)


def batch_ran(rec: Recommendation, observed: Sequence[RankObservation], reading: Optional[ScriptRead] = None
              ) -> Tuple[Optional[BatchRan], Optional[str]]:
    """(what the ranks trained, a mismatch with the plan) for a Trainer whose batch the plan knows; (None, None)
    where there is nothing to compare (not such a script, or no rank was read while it ran)."""
    dp = rec.workload.parallel
    if dp.kind != "trainer" or dp.per_device is None:
        return None, None
    parser = reading.parser if reading is not None and reading.parser.kind == "hf" else trainer_parser()
    split = rec.split
    per, acc = (split.per_device, split.grad_accum) if split is not None else (dp.per_device, dp.grad_accum)
    planned = rec.levers.world * per * acc
    read = [o for o in observed if o.argv]
    if not read:
        return None, None
    worlds = {o.world_size or 1 for o in read}
    batches = {_rank_batch(o.argv, parser) for o in read}
    if len(worlds) > 1 or len(batches) > 1 or None in next(iter(batches)):
        return None, (f"the ranks did not agree on the job: world sizes {sorted(worlds)}, per-device batch and "
                      f"accumulation {sorted(batches, key=str)}; the plan's global batch is {planned}")
    (b, a), = batches
    ran = BatchRan(worlds.pop(), int(b or 0), int(a or 0), planned, len(read))
    if ran.global_batch != planned:
        return ran, (f"the ranks trained a global batch of {ran.global_batch} ({ran.world_size} rank(s) x {ran.per_device} "
                     f"per device x {ran.grad_accum} accumulation), the plan {planned}")
    return ran, None


# -- the flags -------------------------------------------------------------------------------------

def _norm(flag: str) -> str:
    """'--per-device-train-batch-size=8' -> '--per_device_train_batch_size'."""
    return "--" + flag.split("=", 1)[0].lstrip("-").replace("-", "_")


def _at_least(text: Optional[str], minimum: str) -> bool:
    v = base_or_none(text)
    return v is not None and v >= Version(minimum)


def trainer_default_fused(transformers_version: Optional[str], torch_version: Optional[str],
                          tuning: Tuning) -> bool:
    """Whether TrainingArguments' default optim is already adamw_torch_fused (compat/tuning.toml [hf_trainer])."""
    rule = tuning.hf_trainer
    return (_at_least(transformers_version, rule.default_fused_min_transformers)
            and _at_least(torch_version, rule.default_fused_min_torch))


TRAINER_FUSED = "the Trainer's default is already fused AdamW (adamw_torch_fused)"
_OPTIM_NAMES = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adafactor": "adafactor",
                "adamw_8bit": "adamw_bnb_8bit"}


def _option(flag_id: str) -> str:
    """The option a flag id is written as (its row of knowledge/hf_flags.TRAINER_FLAGS)."""
    from cpuperf.knowledge.hf_flags import FLAG_OPTIONS

    return FLAG_OPTIONS[flag_id]


def _optim_flag(lv: Levers, ok: Set[str], tf_v: Optional[str],
                torch_v: Optional[str], tuning: Tuning) -> Tuple[Optional[Flag], Optional[str]]:
    """The same family (AdamW) in its fastest implementation; another family only when --set."""
    if "optim" not in ok:
        return None, "--optim: not in the installed transformers"
    if lv.optimizer.overridden:
        name = _OPTIM_NAMES.get(lv.optimizer.value)
        return (Flag((_option("optim"), name), "you set optimizer") if name else None), None
    if trainer_default_fused(tf_v, torch_v, tuning):
        return None, "--optim: " + TRAINER_FUSED
    on_cuda = lv.on_gpu
    minimum = tuning.optimizer.fused_cuda_min_torch if on_cuda else tuning.optimizer.fused_cpu_min_torch
    if not _at_least(torch_v, minimum) or "optim_fused" not in ok:
        return None, f"--optim: fused AdamW needs torch >= {minimum} and transformers with adamw_torch_fused"
    return Flag((_option("optim"), "adamw_torch_fused"), f"same family as the default adamw_torch, fused kernel "
                f"(torch >= {minimum} on {'CUDA' if on_cuda else 'CPU'})"), None


@dataclass(frozen=True)
class FlagContext:
    """What decides which Trainer flags a plan's levers become: the installed transformers and torch, the ranks,
    compat/tuning.toml, the flags this transformers takes (None: read from compat/hf.toml), the measured bf16 GEMM
    ratio, whether GPUs are visible, and where config files the flags name are written."""

    transformers_version: Optional[str]
    torch_version: Optional[str]
    world: int
    tuning: Tuning
    supported: Optional[Set[str]] = None
    bf16_gemm_ratio: Optional[float] = None
    gpus_visible: bool = True
    config_dir: str = ""


def speed_flags(lv: Levers, context: FlagContext) -> Tuple[List[Flag], List[Tuple[str, str]]]:
    """(Trainer flags that only change speed, candidates left out with why); hyperparameters only when --set.

    gpus_visible False (a CPU-only host): one process is on the CPU anyway, and --use_cpu cost 5% there
    (Trainer, one process, 2-core zen3: 16.8-17.6 vs 17.9-18.6 samples/s): it is added only where it
    decides something, GPUs to stay off or several ranks to join one DDP job."""
    from cpuperf.knowledge.hf_flags import FLAG_ROWS, spelling, supported_flags
    from cpuperf.knowledge.hf_flags import why_not as flag_why_not

    transformers_version, torch_version, world, tuning = (context.transformers_version, context.torch_version,
                                                          context.world, context.tuning)
    supported, bf16_gemm_ratio, gpus_visible, config_dir = (context.supported, context.bf16_gemm_ratio,
                                                            context.gpus_visible, context.config_dir)
    if supported is None:
        supported = set(supported_flags(transformers_version))
    ok = supported
    out: List[Flag] = []
    skipped: List[Tuple[str, str]] = []

    def want(flag_id: str, values: Tuple[str, ...], why: str) -> None:
        # the option is the flag's row of knowledge/hf_flags.TRAINER_FLAGS; the current spelling for the installed
        # release: a renamed option is emitted under its new name
        args = (_option(flag_id), *values)
        chosen = spelling(flag_id, ok, transformers_version)
        if chosen is None:
            skipped.append((args[0], flag_why_not(flag_id, transformers_version)))
        elif chosen == FLAG_ROWS.get(flag_id, flag_id):
            out.append(Flag(args, why))
        else:
            out.append(Flag(("--" + chosen, *args[1:]), f"{why} ({args[0]} is deprecated: renamed --{chosen})"))

    _device_flags(lv, ok, world, gpus_visible, want, skipped)
    if lv.on_gpu:
        skipped.append(("attention", f"{lv.attention.value} is decided, but the attention kernel is the model's "
                        "(attn_implementation where your script loads it; transformers' default is sdpa, which "
                        "dispatches to it): no TrainingArguments flag sets it"))
    _precision_flags(lv, tuning, bf16_gemm_ratio, want, skipped)
    _runtime_flags(lv, ok, world, want, skipped)
    _hyperparameter_flags(lv, want, out)
    _memory_flags(lv, transformers_version, config_dir, want, out, skipped)
    opt, why_not = _optim_flag(lv, ok, transformers_version, torch_version, tuning)
    if opt is not None:
        out.append(opt)
    elif why_not:
        skipped.append(("--optim", why_not.split(": ", 1)[-1]))
    _add_companions(out, skipped, want, transformers_version, on_gpu=lv.on_gpu)
    return out, skipped


_Want = Callable[[str, Tuple[str, ...], str], None]  # speed_flags' want(flag id, the option's values, why)


def _device_flags(lv: Levers, ok: Set[str], world: int, gpus_visible: bool, want: _Want,
                  skipped: List[Tuple[str, str]]) -> None:
    """--use_cpu (or the older --no_cuda) only where it decides something."""
    if not lv.on_gpu and not gpus_visible and world <= 1:
        skipped.append(("--use_cpu", "one process on a host without GPUs runs on the CPU anyway (measured slower with it)"))
    elif not lv.on_gpu:
        if "use_cpu" in ok or "no_cuda" not in ok:
            want("use_cpu", (), "device: cpu")
        else:
            want("no_cuda", (), "device: cpu")


def _precision_flags(lv: Levers, tuning: Tuning,
                     bf16_gemm_ratio: Optional[float], want: _Want, skipped: List[Tuple[str, str]]) -> None:
    """--bf16/--fp16 where autocast pays (or you set dtype), --tf32 on CUDA."""
    gain = tuning.hf_trainer.cpu_bf16_min_gemm_ratio
    dtype = lv.dtype.value
    if dtype in ("bf16", "fp16") and not lv.on_gpu and not lv.dtype.overridden \
            and (bf16_gemm_ratio or 0.0) < gain:
        skipped.append(("--" + dtype, f"on CPU only where bf16 GEMM measured >= {gain}x fp32 (AMX) or "
                        "you --set dtype: autocast costs more than it gains on small models"))
    elif dtype in ("bf16", "fp16"):
        want(dtype, (), f"dtype: {dtype} autocast")
    if lv.tf32.value and lv.on_gpu:
        want("tf32", ("true",), "TF32 matmuls on Ampere and newer")


def _runtime_flags(lv: Levers, ok: Set[str], world: int, want: _Want, skipped: List[Tuple[str, str]]) -> None:
    """DDP backend, data loading, torch.compile, IPEX."""
    backend = lv.ddp_backend.value
    if backend and world > 1 and (backend != "ccl" or "ddp_backend_ccl" in ok):
        want("ddp_backend", (str(backend),), f"DDP backend {backend} over {world} ranks")
    workers = lv.dataloader_workers.value
    if workers > 0:  # the Trainer's default is 0; only a different value changes anything
        want("dataloader_num_workers", (str(workers),), "data loading off the training thread")
    if lv.on_gpu and lv.pin_memory.value is False:
        want("dataloader_pin_memory", ("false",), "pinned memory does not help here")
    # torch.compile costs minutes of warm-up: when you asked (--set), or where recommend found it paying back
    # within the run (compile time / per-step saving < the script's --max_steps; the plan shows the figure), in the
    # mode it measured best (--torch_compile_mode where that is not the default); else said with the figures.
    if lv.compile.value:
        why = ("you set compile" if lv.compile.overridden
               else "torch.compile measured or estimated to pay back within this run")
        want("torch_compile", (), why)
        mode = compile_mode_of(lv.compile)
        if mode in TRAINER_COMPILE_MODES and mode != "default":
            want("torch_compile_mode", (mode,), f"{why}: the {mode} mode, measured best here")
        elif mode != "default":
            skipped.append(("--torch_compile_mode", f"{mode}: no TrainingArguments option compiles each block alone"))
    else:
        skipped.append(("--torch_compile", lv.compile.reason))
    if lv.ipex.value:  # installed by you, and recommend found it compatible
        want("use_ipex", (), "IPEX installed and compatible: its CPU kernels")


def _hyperparameter_flags(lv: Levers, want: _Want, out: List[Flag]) -> None:
    """Hyperparameters and memory trade-offs: the script's own unless you set them."""
    if lv.batch_size.overridden:
        want("per_device_train_batch_size", (str(lv.batch_size.value),), "you set batch_size")
    if lv.grad_accum_steps.overridden:
        out.append(Flag((_option("gradient_accumulation_steps"), str(lv.grad_accum_steps.value)), "you set grad_accum_steps"))
    elif lv.batch_size.overridden and lv.grad_accum_steps.value > 1:
        out.append(Flag((_option("gradient_accumulation_steps"), str(lv.grad_accum_steps.value)),
                        "keeps your global batch with the batch_size you set"))


def _memory_flags(lv: Levers, transformers_version: Optional[str], config_dir: str, want: _Want,
                  out: List[Flag], skipped: List[Tuple[str, str]]) -> None:
    """The memory plan's levers that keep the math, in the form the installed Trainer takes (compat/hf.toml):
    sharding (--fsdp, or --deepspeed with a ZeRO-3 file), offload, activation checkpointing."""
    from cpuperf.knowledge.hf_flags import sharding_form

    sharding, offload, ckpt = lv.sharding.value, lv.offload.value, lv.grad_checkpointing.value
    form = sharding_form(transformers_version)
    in_config = False
    if sharding == "fsdp" and form["fsdp"] == "switch":
        text = json.dumps({"cpu_offload": offload, "activation_checkpointing": ckpt}, sort_keys=True)
        path = os.path.join(config_dir, "fsdp_config.json")
        out.append(Flag(("--fsdp",), "the memory plan shards the model over the ranks (FSDP full shard)"))
        out.append(Flag(("--fsdp_config", path), "FSDP's options" + (": CPU offload" if offload else "")
                        + (", activation checkpointing inside FSDP" if ckpt else ""), (path, text)))
        in_config = True
    elif sharding == "fsdp" and form["fsdp"] == "value":
        value = "full_shard auto_wrap" + (" offload" if offload else "")
        out.append(Flag(("--fsdp", value), "the memory plan shards the model over the ranks (FSDP full shard)"
                        + (" with CPU offload" if offload else "")))
    elif sharding == "zero3" and form["deepspeed"]:
        zero: Dict[str, Any] = {"stage": 3}
        if offload:
            zero.update(offload_optimizer={"device": "cpu", "pin_memory": True},
                        offload_param={"device": "cpu", "pin_memory": True})
        # "auto": the Trainer fills these from its own arguments, so the file never contradicts them.
        text = json.dumps({"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
                           "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
                           "fp16": {"enabled": "auto"}}, sort_keys=True)
        path = os.path.join(config_dir, "ds_config.json")
        out.append(Flag(("--deepspeed", path), "the memory plan shards the model over the ranks (DeepSpeed ZeRO-3"
                        + (" with CPU offload)" if offload else ")"), (path, text)))
    elif sharding:
        skipped.append(("--fsdp", f"the memory plan needs sharding, but {form['why'] or 'this release has no form for it'}"))
    if ckpt and not in_config:
        want("gradient_checkpointing", (), "you set grad_checkpointing"
             if lv.grad_checkpointing.overridden else "the memory plan recomputes activations "
             "(activation checkpointing: the same training, more compute)")


def _add_companions(out: List[Flag], skipped: List[Tuple[str, str]], want: _Want, transformers_version: Optional[str],
                    on_gpu: bool) -> None:
    """Flags the installed release refuses alone get their companion (compat/couplings.toml): --bf16 on a
    CPU needs --use_cpu in transformers >= 4.52, whatever the one-process rule said about --use_cpu."""
    from cpuperf.knowledge.hf_couplings import companions

    ids = {f.name[2:] for f in out}
    for c in companions("transformers", transformers_version, ids, gpu_bf16=on_gpu):
        skipped[:] = [(flag, why) for flag, why in skipped if flag != "--" + c.requires]
        want(c.requires, (), f"--{c.flag} on a CPU needs it: transformers {c.since}+ refuses "
             f"--{c.flag} without --{c.requires} where no GPU has bf16")


def _sets_optim(read: Optional[ScriptRead]) -> bool:
    """The script passes the Trainer an optimizer of its own (TrainingArguments(optim=...), Trainer(optimizers=...))."""
    if read is None or not read.source.read:
        return False
    src = read.source
    kinds = [c for c in src.calls if c.startswith("transformers.")]
    return any("optim" in src.keywords_of(c) or "optimizers" in src.keywords_of(c) for c in kinds)


def _merge(args: ScriptArgs, ours: Sequence[Flag], sets_optim: bool) -> Tuple[List[Flag], List[Tuple[str, str]]]:
    """(flags to add, (flag, why) left out): never one the user gave (in any spelling the parser reads), its opposite
    or a synonym."""
    # an option the parser's table does not hold counts too (written for an older release, or a synonym): never
    # added beside it
    given = {"--" + g.dest for g in args.given} | {_norm(w) for w in args.unread}
    add: List[Flag] = []
    left: List[Tuple[str, str]] = []
    for flag in ours:
        name = flag.name
        clash = name in given or ("--no_" + name[2:]) in given
        clash = clash or any(name in fam and given & set(fam) for fam in _EXCLUSIVE)
        mine = args.value(name[2:])
        if clash and flag.why.startswith("you set") and name in given and (mine,) != tuple(flag.args[1:2]) \
                and not (mine == "" and len(flag.args) == 1):
            raise FieldError("set", None, f"{{opt.set}} says {verbatim(' '.join(flag.args))}, your command says "
                             f"otherwise ({verbatim(args.spelled(name[2:]) or name)})", "change it in your command, "
                             "or drop the {opt.set}: one value per setting")
        if clash:
            left.append((" ".join(flag.args), "you decided (your command has it or its opposite)"))
        elif name == "--optim" and sets_optim and not flag.why.startswith("you set"):
            left.append((" ".join(flag.args), "the script chooses its optimizer in code"))
        else:
            add.append(flag)
    return add, left


def launcher_flags(launcher: Optional[LauncherCommand], ours: Sequence[Flag]) -> List[Flag]:
    """Speed flags for the user's own launcher (as read once with its own table): `accelerate launch
    --mixed_precision bf16` where the same rule gave a Trainer `--bf16` (autocast in Accelerator), unless the
    user's launcher options already choose (--mixed_precision, or a --config_file that may)."""
    if launcher is None or launcher.launcher != "accelerate":
        return []
    from cpuperf.plan.user_launcher import rules

    if launcher.has(("--mixed_precision", "--mixed-precision", *rules()["accelerate"]["config"])):
        return []
    for flag in ours:
        if flag.args[0] in ("--bf16", "--fp16"):
            return [Flag(("--mixed_precision", flag.args[0][2:]), f"{flag.why} (accelerate launch: Accelerator autocast)")]
    return []


def _with_launcher_flags(argv: Sequence[str], flags: Sequence[Flag]) -> Tuple[str, ...]:
    """The user's command with `flags` right after `accelerate launch`."""
    args = list(argv)
    if flags and "launch" in args:
        at = args.index("launch") + 1
        args[at:at] = [a for f in flags for a in f.args]
    return tuple(args)


def plan_command(command: CommandLine, ours: Sequence[Flag], mode: str, read: Optional[ScriptRead],
                 transformers: Optional[str] = None, skipped: Sequence[Tuple[str, str]] = (),
                 dtype: Tuple[str, str] = ("fp32", "")) -> ScriptPlan:
    """The plan of the user's command as read once (cpuperf.plan.command.read_command) with its script as read once
    (cpuperf.plan.script_read.read_user_script: None where the command runs no script cpuperf read). `dtype`: the
    plan's dtype lever and why (what a framework that takes no Trainer flags gets by its own mechanism)."""
    if mode not in HF_MODES:
        raise FieldError("hf_flags", mode, "{flag} {value!r}: use auto, always or never")
    cmd = command.script
    user_argv = command.given
    parser, why = script_kind(read) if (cmd.script or cmd.module) else ("n/a", "no Python script")
    if cmd.module and (read is None or not read.source.read):
        parser, why = "unknown", f"python -m {cmd.module}: the module's parser is unknown"
    words = cmd.argv  # inside `bash -c 'LINE'`: the line's words
    framework = read.framework.name if read is not None and read.source.read else ""

    def made(argv: Sequence[str], added: Sequence[Flag], left: Sequence[Tuple[str, str]], why_: str,
             env: Tuple[Tuple[str, str], ...] = (), carried: Tuple[Tuple[str, str], ...] = ()) -> ScriptPlan:
        final = tuple(user_argv) if tuple(argv) == tuple(words) else cmd.rewrap(argv)
        return ScriptPlan(argv=final, words=tuple(argv), command=cmd, parser=parser, mode=mode, added=tuple(added),
                          not_added=tuple(left), why=why_, transformers=transformers,
                          trainer=None if read is None or not read.source.read else framework == "hf-trainer",
                          framework=framework, env=env, carried=carried, reading=read)

    if mode == "never":
        return made(words, (), (), "--hf-flags never")
    if cmd.hidden:  # after the line a flag would be the shell's $0 or $1, never the script's: even --hf-flags always
        return made(words, (), (), f"{cmd.hidden}: a flag after the line would reach the shell, not your script")
    launch = launcher_flags(command.launcher, ours)
    base = _with_launcher_flags(words, launch)
    if mode == "auto" and parser != "hf":
        return _framework_plan(made, read, base, launch, why, dtype)
    args = read.args if read is not None else read_script_args(cmd.script_args, trainer_parser())
    n_args = len(cmd.script_args)
    head = base[:len(base) - n_args] if n_args else base
    tail, ours = _replace_values(args, ours)
    base = (*head, *tail)
    add, left = _merge(args, [f for f in ours if not f.replaces], _sets_optim(read))
    add = [*[f for f in ours if f.replaces], *add]
    argv = base + tuple(a for f in add if not f.replaces or f.args[0] not in base for a in f.args)
    plan = made(argv, [*launch, *add], [*left, *skipped], why if mode == "auto" else "--hf-flags always")
    # fused AdamW without a flag: the Trainer's default, where neither your command nor your code picks another
    fused = ("--optim", TRAINER_FUSED) in skipped and not args.has("optim") and not _sets_optim(read)
    return replace(plan, by_default=("optimizer",)) if fused else plan


def _framework_plan(made: Callable[..., ScriptPlan], read: Optional[ScriptRead], base: Tuple[str, ...],
                    launch: Sequence[Flag], why: str, dtype: Tuple[str, str]) -> ScriptPlan:
    """A script that takes no Trainer flags: the dtype by the mechanism its framework reads (an environment default,
    a flag of its own CLI) or said where none reaches it."""
    reach = read.framework.dtype(read.source, read.args, dtype[0], dtype[1]) \
        if read is not None and read.source.read else None
    if reach is None:
        return made(base, launch, (), why + " (--hf-flags always adds them anyway)" if read is None or
                    read.framework.name == "hf-trainer" or not read.source.read else why)
    if not reach.applied:
        return made(base, launch, [(f"dtype {reach.value}", reach.why)], why)
    flags = [Flag(reach.flags, reach.why)] if reach.flags else []
    argv = (*base, *(a for f in flags for a in f.args))
    how = "; ".join([*(f"variable {k}={v}" for k, v in reach.env), *(f"flag {' '.join(f.args)}" for f in flags)])
    return made(argv, [*launch, *flags], (), why, env=reach.env, carried=((reach.lever, how),))


@functools.lru_cache(maxsize=1)
def trainer_parser() -> ScriptParser:
    """HfArgumentParser over TrainingArguments alone: what a Trainer script parses where its own source was not
    read into a table (built when first asked: compat/trainer_args.toml is not read at import)."""
    return hf_parser((), "TrainingArguments", (), True, "HfArgumentParser over TrainingArguments")


def _replace_values(args: ScriptArgs, ours: Sequence[Flag]) -> Tuple[Tuple[str, ...], List[Flag]]:
    """The script's arguments with each replacing flag in place of every occurrence the script's parser reads as
    that option (prefixes, `=`, dashes and repeats alike: the first occurrence's place keeps it, the later go), and
    the flags: those that replaced come back marked so, so the argv carries each once."""
    kept: List[Flag] = []
    for flag in ours:
        if not flag.replaces:
            kept.append(flag)
            continue
        dest = flag.name[2:]
        hit = args.has(dest)
        args = read_script_args(args.with_value(dest, flag.args), args.parser)
        kept.append(flag if not hit else replace(flag, why=flag.why + " (in place of your value)"))
    return args.args, kept


# -- what was applied, and a rejection ---------------------------------------------------------------

def applied(plan: LaunchPlan, script: ScriptPlan) -> Dict[str, Any]:
    """Everything cpuperf applies to the user's command: launcher, every variable it sets, CPUs and threads (of
    the process it starts and of each rank), flags, and what a flag changes beyond speed."""
    launcher: Dict[str, Any]
    yours = plan.yours
    if script.command.launcher:
        launcher = {"name": "direct", "yours": script.command.launcher,
                    "why": f"your command is a launcher ({script.command.launcher}): cpuperf adds none on top"}
    else:
        launcher = {"name": plan.launcher, "yours": None, "why": (plan.notes[0] if plan.notes else "")}
    spec = plan.per_rank[0] if plan.per_rank else None
    ranks = [{"local_rank": r.local_rank, "cpus": list(r.cpus) or None, "threads": r.threads} for r in plan.per_rank]
    # Placed: pinned, or given thread counts (each rank's, or the user's own kept for every rank).
    placed = yours.place and bool(plan.affinity or any(r.threads for r in plan.per_rank)
                                                           or "OMP_NUM_THREADS" in plan.env) \
        if yours is not None \
        else bool(plan.affinity or (spec and spec.threads))
    why = None if yours is None else yours.why if placed or not yours.place else "plain run (no --auto): your launcher's own"
    if yours is not None and placed and not plan.affinity:
        from cpuperf.plan.launch import UNPINNED_RANKS

        why = UNPINNED_RANKS
    per_rank = len(plan.per_rank) > 1 and placed
    yours_env = _wrapped_env(plan.env, script.command)
    return {"launcher": launcher, "env": {k: v for k, v in plan.env.items() if k not in yours_env},
            **({"env_yours": yours_env} if yours_env else {}),  # only where a wrapper changes one of them
            "env_per_rank": {"OMP_NUM_THREADS": [r.threads for r in plan.per_rank]} if per_rank else {},
            "cpus": list(plan.affinity) if plan.affinity else (list(spec.cpus) if spec and spec.cpus else None),
            "threads": spec.threads if spec and spec.threads and "OMP_NUM_THREADS" not in yours_env else None,
            "ranks": ranks, "placement": {"placed_by_cpuperf": placed, "ranks": len(plan.per_rank),
                                          "from": yours.source if yours is not None else None, "why": why},
            "flags": script.added_args, "flags_why": {" ".join(f.args): f.why for f in script.added},
            "flags_not_added": [{"flag": n, "why": w} for n, w in script.not_added],
            "behaviour": behaviour_notes(script, len(plan.per_rank) if yours is not None else 1),
            "parser": script.parser, "hf_flags_mode": script.mode, "why_flags": script.why}


def _wrapped_env(env: Mapping[str, str], command: UserCommand) -> Dict[str, Optional[str]]:
    """The variables of cpuperf's `env` that the wrappers in front of the command change (`env OMP_NUM_THREADS=4
    python s.py` runs with 4 whatever cpuperf sets; `env -u X` removes X): {name: the value the command gets, or
    None where it gets none}."""
    seen = dict(env)
    for w in command.wrappers:
        seen = w.environ(seen)
    return {k: seen.get(k) for k, v in env.items() if seen.get(k) != v}


def behaviour_notes(script: ScriptPlan, ranks: int) -> List[str]:
    """What an added flag changes beyond speed (the user's intent, but it must be said)."""
    notes = []
    added = {f.name for f in script.added}
    if ranks > 1 and added & {"--use_cpu", "--no_cuda"}:
        flag = "--use_cpu" if "--use_cpu" in added else "--no_cuda"
        notes.append(f"{flag} makes your launcher's {ranks} ranks one DDP job on this CPU host instead of {ranks} "
                     f"independent copies: gradients are averaged and the global batch is {ranks}x the per-device batch")
    return notes


_TRAINER_KINDS = ("hf", "args-file", "in-code")


def applied_lines(a: Mapping[str, Any]) -> List[str]:
    """The applied list as text lines (stderr before the script starts; # comments in --dry-run)."""
    from cpuperf.probe.parse import format_cpulist

    lines = [f"applied: launcher {a['launcher']['name']}"
             + (f" (your {a['launcher']['yours']} starts the ranks)" if a["launcher"]["yours"] else "")]
    own = [str(r["threads"]) for r in a.get("ranks") or [] if r.get("threads") is not None]
    for k, v in a["env"].items():
        if k == "OMP_NUM_THREADS" and own and len(own) == len(a["ranks"]) and set(own) != {v}:
            # the environment's value (yours, kept) is not what runs: each rank is started with its own count
            lines.append(f"not applied: env {k}={v} (each rank is started with {k}={'/'.join(dict.fromkeys(own))} instead)")
            continue
        lines.append(f"applied: env {k}={v}")
    for k, v in (a.get("env_yours") or {}).items():
        gets = f"gets {k}={v}" if v is not None else f"gets no {k}"
        lines.append(f"not applied: env {k} (the command behind your wrappers {gets})")
    place = a.get("placement") or {}
    if a["launcher"]["yours"]:
        if a["cpus"]:
            lines.append(f"applied: your {a['launcher']['yours']} runs on CPUs {format_cpulist(a['cpus'])}")
        for r in (a.get("ranks") or []) if place.get("placed_by_cpuperf") else ():
            where = f"CPUs {format_cpulist(r['cpus'])}" if r["cpus"] else "unpinned"
            threads = r["threads"] if r["threads"] is not None else f"{a['env'].get('OMP_NUM_THREADS')} (yours, kept)"
            lines.append(f"applied: rank {r['local_rank']}: {where}, OMP_NUM_THREADS={threads}")
        if not place.get("placed_by_cpuperf"):
            lines.append(f"not applied: pinning and thread counts ({place.get('why') or 'plain run: the launcher decides'})")
    else:
        if a["cpus"]:
            lines.append(f"applied: pinned to CPUs {format_cpulist(a['cpus'])}")
        if a["threads"]:
            lines.append(f"applied: {a['threads']} thread(s) per process")
    for flag, why in a["flags_why"].items():
        lines.append(f"applied: flag {flag} ({why})")
    if not a["flags"]:
        what = "Trainer flags" if a["parser"] in _TRAINER_KINDS else "flags on your script's command line"
        lines.append(f"applied: no {what} ({a['why_flags']})")
    for item in a["flags_not_added"]:
        lines.append(f"not applied: {item['flag']} ({item['why']})")
    for note in a.get("behaviour") or ():
        lines.append(f"note: {note}")
    return lines


def rejected_flags(code: int, wall_s: float, output: str, script: Optional[ScriptPlan]) -> Optional[Tuple[str, str]]:
    """(message, hint) when the script refused the flags cpuperf added ("unrecognized arguments"), else None."""
    if script is None or not script.added or code != 2 or wall_s > REJECT_WINDOW_S:
        return None
    if "unrecognized arguments" not in output and "error: argument" not in output:
        return None
    rerun = ["cpuperf", "train", "--auto", "--hf-flags", "never", "--", *script.command.rewrap(script.command.argv)]
    return (f"the script rejected the Trainer flags cpuperf added: {' '.join(script.added_args)}",
            "run it without them: " + " ".join(shlex.quote(a) for a in rerun))



# -- tuning on the command itself (cpuperf train --tune) ----------------------------------------------

def script_digest(script_text: Optional[str]) -> Optional[str]:
    """sha256 of the script's text (None: no script read): an edited script is another command."""
    from cpuperf.fsutil import sha256_hex  # hashlib's digest, without loading OpenSSL on every plan's way

    return None if script_text is None else sha256_hex(script_text.encode("utf-8", "replace"))


_RUN_LENGTH = ("max_steps", "num_train_epochs", "output_dir")


def _script_args(cmd: UserCommand, read: Optional[ScriptRead]) -> ScriptArgs:
    return read.args if read is not None and read.args.args == tuple(cmd.script_args) else \
        read_script_args(cmd.script_args, UNREAD)


def key_of_command(cmd: UserCommand, read: Optional[ScriptRead], script_text: Optional[str]) -> str:
    """The key a tuning of this command is cached under, from the command and script as read once: its words in
    order (the script's path resolved), without the run length and the output directory in any spelling the script's
    parser reads as them (`--max_steps=5`, `--max_st 5`; a tuning run sets both, and a later run of any length is the
    same command), with the script's content."""
    import json

    from cpuperf.fsutil import sha256_hex

    head = [*(a for w in cmd.wrappers for a in w.argv), *cmd.argv[:len(cmd.argv) - len(cmd.script_args)]]
    if cmd.script:
        head = [os.path.realpath(t) if t == cmd.script else t for t in head]
    kept = list(_script_args(cmd, read).without(_RUN_LENGTH))
    return sha256_hex(json.dumps([head, kept, script_digest(script_text)]).encode())[:16]


def tuning_argv(cmd: UserCommand, read: Optional[ScriptRead], steps: int, out_dir: str) -> List[str]:
    """The user's command (as read once) for one short tuning run: --max_steps `steps` and --output_dir `out_dir`
    in place of its own (every spelling of them its parser reads)."""
    head = list(cmd.argv[:len(cmd.argv) - len(cmd.script_args)])
    rest = _script_args(cmd, read).without(_RUN_LENGTH)
    return list(cmd.rewrap([*head, *rest, "--max_steps", str(steps), "--output_dir", out_dir]))


def cpu_only_host(rec: Recommendation) -> bool:
    """No GPU visible to the job: one Trainer process is on the CPU whatever the flags say. Read from the facts
    the plan was made from (live, recorded or overridden alike), so recommend and train give the same flags;
    a recorded host whose GPUs were not recorded may have some: --use_cpu keeps them off."""
    evidence = rec.levers.device.evidence
    return bool(evidence.get("gpus_known", True)) and not evidence.get("gpus")


def recommended_speed_flags(rec: Recommendation, transformers_version: Optional[str] = None, config_dir: str = ""
                            ) -> Tuple[List[Flag], List[Tuple[str, str]]]:
    """(Trainer speed flags for this recommendation, candidates left out with why): `speed_flags` over its values."""
    from cpuperf.knowledge.tuning import tuning

    lv = rec.levers
    world = lv.world
    ratio = bf16_gemm_ratio(rec)
    flags, skipped = speed_flags(lv, FlagContext(transformers_version or rec.stack.get("transformers"), rec.stack.get("torch"),
                                 world, tuning(), bf16_gemm_ratio=ratio,
                                 gpus_visible=not cpu_only_host(rec), config_dir=config_dir))
    return [*batch_split_flags(rec), *flags], skipped


def bf16_gemm_ratio(rec: Recommendation) -> Optional[float]:
    """bf16 GEMM over fp32 GEMM as measured on this host (inf: AMX usable, not measured; None: neither)."""
    from cpuperf.decide.records import measured_gemm
    from cpuperf.knowledge.bf16 import amx_bf16_in

    ev = rec.levers.dtype.evidence
    gemm = measured_gemm(ev)
    ratio = gemm[1] / gemm[0] if gemm else None
    if ratio is None and amx_bf16_in(ev):
        ratio = float("inf")  # AMX, not measured: the case the bf16 rule is for
    return ratio


def dtype_why(rec: Recommendation) -> str:
    """Why the plan's dtype pays here, in words: the measured GEMM ratio, AMX, or the rule's reason."""
    lv = rec.levers.dtype
    if lv.value != "bf16" or lv.overridden:
        return f"dtype: {lv.value} ({lv.reason})"
    ratio = bf16_gemm_ratio(rec)
    if ratio is None:
        return f"dtype: bf16 autocast ({lv.reason})"
    if ratio == float("inf"):
        return "dtype: bf16 autocast (AMX: native bf16 matrix units)"
    return f"dtype: bf16 autocast (bf16 GEMM measured {ratio:.1f}x fp32 on this host)"


def batch_split_flags(rec: Recommendation) -> List[Flag]:
    """The per-device batch and accumulation that keep a Trainer's global batch over the ranks cpuperf starts."""
    split = rec.split
    if split is None:
        return []
    why = split.describe()
    out = [Flag(("--per_device_train_batch_size", str(split.per_device)), why, replaces=True)]
    if split.grad_accum != split.was_grad_accum:
        out.append(Flag(("--gradient_accumulation_steps", str(split.grad_accum)), why, replaces=True))
    return out
