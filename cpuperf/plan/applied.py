"""Decided means applied: each lever of a plan is in the job (argv, environment, per-rank CPUs and threads, the
built-in worker's settings, a Trainer flag) or listed as not applied, with why.

Pure: `lever_report(levers, job)` reads the typed decisions (cpuperf.decide.records.Levers) and the job as
rendered (`RenderedJob`, made from a JobPlan by `rendered_job`), and checks each lever against what the job
really carries, never against what the planner meant to do. The same report is printed by `train --dry-run`,
carried in `--json` and closes a real run, on every path: the built-in loop, a user's script, a user's launcher,
CPU and GPU hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.decide.allocator import ALLOCATORS, library_stem, missing_here
from cpuperf.decide.records import Decision, Levers
from cpuperf.jsonable import as_json
from cpuperf.knowledge.knobs import BY_ID, env_text
from cpuperf.worker_settings import SETTING_NAMES, TrainSettings

if TYPE_CHECKING:
    from cpuperf.plan.job import JobPlan

# Library names an allocator preload carries (decide/allocator.py: the names, their order and their stems).
_PRELOAD_STEM = {name: library_stem(name) for name in ALLOCATORS}  # decide/allocator.py owns names and stems
PLAIN = "plain run (no --auto): the baseline --auto is compared with"


@dataclass(frozen=True)
class RankView:
    """One local rank as the job starts it: its CPUs (empty: unpinned) and OMP thread count (None: not set)."""

    cpus: Tuple[int, ...]
    threads: Optional[int]


@dataclass(frozen=True)
class RenderedJob:
    """What the job gets, as rendered: the pure input of lever_report beside the decisions."""

    auto: bool
    nproc_per_node: int
    nnodes: int
    env: Mapping[str, str]
    ranks: Tuple[RankView, ...]
    pinned: Tuple[int, ...] = ()  # a direct launch: the CPUs the one process is pinned to
    settings: Optional[TrainSettings] = None  # the built-in worker's; None for a user's command
    flags: Tuple[Tuple[str, ...], ...] = ()  # the flags added to a user's command, each as its argv words
    flags_left: Tuple[Tuple[str, str], ...] = ()  # (flag, why) left out
    flags_why: str = ""  # why a user's command gets no Trainer flags at all (its parser), if it gets none
    your_launcher: Optional[str] = None  # torchrun | accelerate | mpirun | srun: the user's own launcher
    placement_why: str = ""  # why ranks are not placed by cpuperf (a user's launcher in a plain run)
    # the values a user's script's own parser reads from its arguments (option -> value: cpuperf.plan.script_args)
    own_values: Mapping[str, str] = field(default_factory=dict)
    # levers the script's framework carries by its own mechanism (lever id -> how: an environment default it reads)
    carried: Tuple[Tuple[str, str], ...] = ()
    by_default: Tuple[str, ...] = ()  # levers the user's Trainer carries by its own default (no flag needed)
    env_only: str = ""  # an environment alone (ccl-env): why what it cannot carry is not applied
    numa_binding: bool = False  # torchrun binds each GPU rank to its GPU's NUMA node (--numa-binding=node)
    # the launch options the plan has (knob rows marked `option`: numa_memory's memory policy), each as its
    # application reports it (cpuperf.plan.job JobPlan.launch_options): carried, and how, or why not
    options: Tuple[LeverState, ...] = ()
    # a user's script builds TrainingArguments, so the Trainer's defaults are what it runs with (False: it does not;
    # None: its source was not read)
    trainer: Optional[bool] = True
    # after a run: the OMP_NUM_THREADS each rank was read back running with (its /proc environ; None: it had none),
    # which a thread count's line then states instead of what the plan meant to give it
    ran_threads: Tuple[Optional[str], ...] = ()
    # the decided allocator's library is not found here, so none is preloaded: why, with the fix
    # (cpuperf.decide.allocator.missing_here; "" where it is found or none was decided)
    allocator_missing: str = ""


# How a lever's state begins where a variable you set yourself stands in for it (your value is the job's, on purpose).
YOURS_KEPT = "the job runs your "


@dataclass(frozen=True)
class LeverState:
    """One lever: its value, and where the job carries it (`applied`) or why it does not."""

    id: str
    value: object
    applied: bool
    how: str

    def to_json(self) -> Dict[str, object]:
        return as_json(self)


def lever_report(levers: Levers, job: RenderedJob) -> Tuple[LeverState, ...]:
    """Every lever, in the vocabulary's order, applied (where) or not (why): nothing is left unsaid. After a run
    (`job.ran_threads`), the thread count is held to what the ranks were read back running with."""
    return tuple(_read_back(_state(d, levers, job), job) if d.id == "threads_per_rank" else _state(d, levers, job)
                 for d in levers.all()) + job.options


def _read_back(state: LeverState, job: RenderedJob) -> LeverState:
    """The threads lever against the ranks' read-back OMP_NUM_THREADS: applied only where every rank ran the value,
    and no count named that the ranks did not run (the read-back value is said instead)."""
    if not job.ran_threads:
        return state
    ran = tuple("unset" if t is None else t for t in job.ran_threads)
    shown = "/".join(dict.fromkeys(ran))
    same = all(t == str(state.value) for t in ran)
    if state.applied:
        how = f"{state.how}; read back: every rank ran it" if same else \
            f"the ranks ran OMP_NUM_THREADS={shown} (read back), not the planned {show_value(state.value)}"
        return LeverState(state.id, state.value, same, how)
    if "OMP_NUM_THREADS=" in state.how and not re.search(rf"OMP_NUM_THREADS={re.escape(shown)}\b", state.how):
        return LeverState(state.id, state.value, False, f"the ranks ran OMP_NUM_THREADS={shown} (read back)")
    return LeverState(state.id, state.value, False, f"{state.how}; read back: the ranks ran OMP_NUM_THREADS={shown}")


def split(report: Sequence[LeverState]) -> Dict[str, List[Dict[str, object]]]:
    """The report as --json carries it: {"applied": [{id, value, how}], "not_applied": [{id, value, why}]}."""
    return {"applied": [{"id": s.id, "value": s.value, "how": s.how} for s in report if s.applied],
            "not_applied": [{"id": s.id, "value": s.value, "why": s.how} for s in report if not s.applied]}


def report_lines(report: Sequence[LeverState]) -> List[str]:
    """One line per lever: `applied: dtype=bf16 (worker setting)` / `not applied: batch_size=8 (why)`."""
    return [f"{'applied' if s.applied else 'not applied'}: {s.id}={show_value(s.value)} ({s.how})" for s in report]


def show_value(value: object) -> str:
    """A lever's value as a report line says it (none, true/false, {...} for a table)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{...}"
    return str(value)


# -- each lever against the job ----------------------------------------------------------------------

_Check = Callable[[Decision[object], Levers, RenderedJob], Optional[str]]


def _state(d: Decision[object], levers: Levers, job: RenderedJob) -> LeverState:
    """Where the job carries `d`, else why not: the job's own content first, then the path's reason."""
    not_split = d.evidence.get("not_split") if d.id == "nproc_per_node" and not d.overridden else None
    if isinstance(not_split, dict) and job.nproc_per_node == d.value:
        # the host's layout, not taken because it would change the job: the better value, not applied, and why
        return LeverState(d.id, not_split.get("ranks"), False, str(not_split.get("why")))
    carried = dict(job.carried).get(d.id)
    if carried is not None and carried.startswith("variable "):  # the framework's variable, unless yours stands
        name, _, wanted = carried[len("variable "):].partition("=")
        if job.env.get(name) != wanted:
            return LeverState(d.id, d.value, False, f"{YOURS_KEPT}{name}={job.env.get(name)} (cpuperf would set "
                                                    f"{wanted}): a variable you set is kept")
    where = carried or _carrier(d.id)(d, levers, job)
    if where is not None:
        return LeverState(d.id, d.value, True, where)
    if not job.auto and not d.overridden:
        return LeverState(d.id, d.value, False, PLAIN)
    if d.id == "allocator" and job.allocator_missing:
        return LeverState(d.id, d.value, False, job.allocator_missing)
    if job.env_only:
        return LeverState(d.id, d.value, False, job.env_only)
    return LeverState(d.id, d.value, False, _why_not(d, levers, job))


def _setting(d: Decision[object], job: RenderedJob) -> Optional[str]:
    """The built-in worker's setting of the same id, when it holds the decided value."""
    if job.settings is None or d.id not in SETTING_NAMES:
        return None
    value = getattr(job.settings, d.id)
    mode = job.settings.compile_mode if d.id == "compile" and value is True else "default"  # the mode it runs in
    return (f"worker setting {d.id}={show_value(value)}" + (f", compile_mode={mode}" if mode != "default" else "")
            if value == d.value else None)


def _flag(d: Decision[object], job: RenderedJob) -> Optional[str]:
    """The flag added to a user's command that carries `d`."""
    from cpuperf.knowledge.hf_flags import FLAG_LEVERS

    added = [" ".join(args) for args in job.flags if FLAG_LEVERS.get(args[0].split("=", 1)[0]) == d.id]
    return ("flag " + ", ".join(added)) if added else None


def _worker_or_flag(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    return _setting(d, job) or _flag(d, job) or _own(d, job) or _default(d, levers, job)


# A script's own arguments that carry a lever as they are: its batch and accumulation (TrainingArguments' names,
# either spelling), with the Trainer's defaults where it gives none.
_OWN = {"batch_size": ("--per_device_train_batch_size", 8), "grad_accum_steps": ("--gradient_accumulation_steps", 1)}


def _own(d: Decision[object], job: RenderedJob) -> Optional[str]:
    """The decided value is the script's own argument (or the Trainer's default where it gives none)."""
    known = _OWN.get(d.id)
    if known is None or job.settings is not None:
        return None
    name, default = known
    given = job.own_values.get(name[2:])
    if given is not None:
        return f"your command's own {name} {given}" if given == str(d.value) else None
    # The Trainer's default stands only where the script builds TrainingArguments: other code has its own.
    return f"default: the Trainer's {name[2:]} {default}" if d.value == default and job.trainer else None


def _default(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    """The decided value is what the job does without being told: said as such."""
    script = job.settings is None and not job.env_only
    trainer = script and job.trainer is True  # the Trainer's defaults hold only where the script builds TrainingArguments
    if d.id == "device" and script:
        if levers.on_gpu:
            return "default: the Trainer uses the visible GPUs"
        alone = [why for flag, why in job.flags_left if flag == "--use_cpu" and not why.startswith("you ")]
        return f"default: {alone[0]}" if alone else None
    defaults: Dict[str, Tuple[bool, str]] = {
        "dtype": (d.value == "fp32", "fp32 is the default precision"),
        "tf32": (d.value is False, "TF32 off is the default"),
        "fp32_math_mode": (d.value is None, "fp32 matmuls stay fp32 by default"),
        "ddp_backend": (d.value is None, "one rank: no process group"),
        "ipex": (d.value is False, "no IPEX by default"),
        "compile": (d.value is False, "eager by default"),
        "grad_checkpointing": (d.value is False, "no recomputation by default"),
        "dataloader_workers": (d.value == 0 and trainer, "the Trainer's default is 0 workers"),
        "pin_memory": ((d.value is False and not levers.on_gpu) or (trainer and d.value is True),
                       "no device copies on CPU training" if not levers.on_gpu else "the Trainer pins by default"),
        "zero": (d.value is None, "no DeepSpeed ZeRO plan"),
        "sharding": (d.value is None, "no sharding: the model's state fits each rank whole"),
        "offload": (d.value is False, "no offload"),
        "grad_accum_steps": (d.value == 1 and trainer, "one step per batch: the Trainer's default"),
        "optimizer": (d.value == "adamw_fused" and d.id in job.by_default, "the Trainer's default is fused AdamW"),
    }
    hit = defaults.get(d.id)
    return f"default: {hit[1]}" if hit is not None and hit[0] else None


def _ranks(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    if job.nproc_per_node == d.value and not job.env_only:
        return (f"your {job.your_launcher} starts {d.value} rank(s) per node" if job.your_launcher
                else f"the launch starts {d.value} rank(s) per node")
    return None


def _nodes(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    return f"the launch spans {d.value} node(s)" if job.nnodes == d.value and not job.env_only else None


def _own_counts(job: RenderedJob) -> Optional[Tuple[str, ...]]:
    """The thread count each rank starts with where the per-rank step gives each its own (several ranks: it sets
    the count inside the rank, over the environment's value), else None (one process gets the environment's)."""
    if len(job.ranks) > 1 and all(r.threads is not None for r in job.ranks):
        return tuple(str(r.threads) for r in job.ranks)
    return None


def _threads(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    counts = _own_counts(job)
    if counts is not None:
        return f"each rank starts with OMP_NUM_THREADS={d.value}" if all(c == str(d.value) for c in counts) else None
    theirs = job.env.get("OMP_NUM_THREADS")
    if theirs is not None and theirs != str(d.value):  # the command gets another count (_why_not says whose)
        return None
    if job.ranks and all(r.threads == d.value for r in job.ranks):
        return f"each rank starts with OMP_NUM_THREADS={d.value}"
    if job.env.get("OMP_NUM_THREADS") == str(d.value):
        return f"env OMP_NUM_THREADS={d.value}"
    return _setting(d, job)


def _affinity(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    pinned = bool(job.pinned) or (bool(job.ranks) and all(r.cpus for r in job.ranks))
    if d.value == "auto" and pinned:
        return "each rank pinned to its CPUs"
    if d.value is None and not pinned and not any(r.cpus for r in job.ranks):
        if job.numa_binding:  # cpuperf pins nothing; torchrun places each rank near its GPU
            return "torchrun binds each rank to its GPU's NUMA node (--numa-binding=node); cpuperf pins no cores"
        return "ranks left to the OS scheduler"
    return None


def _allocator(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    preload = job.env.get("LD_PRELOAD", "")
    entries = [e.rsplit("/", 1)[-1] for e in preload.replace(" ", ":").split(":") if e]
    if d.value is None:
        ours = [e for e in entries if e.startswith(tuple(_PRELOAD_STEM.values()))]
        return None if ours else "default: the C library's allocator"
    stem = _PRELOAD_STEM.get(str(d.value), str(d.value))
    return "env LD_PRELOAD " + preload if any(e.startswith(stem) for e in entries) else None


def _checkpointing(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    """A flag, the worker's setting, or FSDP's own activation checkpointing in the --fsdp_config file it names."""
    in_config = d.value is True and levers.sharding.value == "fsdp" and any(a[0] == "--fsdp_config" for a in job.flags)
    return "activation_checkpointing in the --fsdp_config file" if in_config else _worker_or_flag(d, levers, job)


def _offload(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    """CPU offload rides on the sharding form: the --fsdp_config file, the --fsdp value, or the DeepSpeed file."""
    if d.value is False:
        return _default(d, levers, job)
    for args in job.flags:
        if args[0] in ("--fsdp_config", "--deepspeed") or (args[0] == "--fsdp" and any(
                word == "offload" for a in args[1:] for word in a.split())):
            return f"in {' '.join(args)}"
    return None


def _attention(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    if job.settings is not None and d.value == "sdpa":
        return "the built-in model calls scaled_dot_product_attention"
    return None


def _env_names(lever: str) -> Tuple[str, ...]:
    """The variables that carry a lever whose knob row says `env` (the variables table's rows naming it)."""
    from cpuperf.knowledge.variables import variables

    return variables().names(lever=lever)


def _env(d: Decision[object], levers: Levers, job: RenderedJob) -> Optional[str]:
    """A lever carried by its variable (knob row `env`): the job's environment holds the decided value (none: the
    variable is unset, the runtime's default)."""
    names = _env_names(d.id)
    if d.value is None:
        return None if any(n in job.env for n in names) else f"default: {', '.join(names)} unset"
    held = [f"{n}={job.env[n]}" for n in names if job.env.get(n) == env_text(d.value)]
    return f"env {' '.join(held)}" if held else None


# The levers whose check is their own; every other is checked as its knob row says it is carried (_carrier).
_CARRIED: Mapping[str, _Check] = {
    "nproc_per_node": _ranks, "nnodes": _nodes, "threads_per_rank": _threads, "affinity": _affinity,
    "allocator": _allocator, "attention": _attention, "grad_checkpointing": _checkpointing, "offload": _offload,
}


def _carrier(lever: str) -> _Check:
    """How the job is checked for a lever: its own check, else by its knob row (`env`: its variable; otherwise the
    worker's setting, a flag added to your command, your command's own value or a default that holds it)."""
    own = _CARRIED.get(lever)
    if own is not None:
        return own
    return _env if BY_ID[lever].env else _worker_or_flag


def _why_not(d: Decision[object], levers: Levers, job: RenderedJob) -> str:
    """Why the job does not carry `d` (its value differs from what the job gets, or nothing can carry it)."""
    script = job.settings is None
    from cpuperf.knowledge.hf_flags import FLAG_LEVERS

    left = [f"{flag}: {why}" for flag, why in job.flags_left if FLAG_LEVERS.get(flag.split(" ", 1)[0]) == d.id]
    if left:
        return "; ".join(left)
    counts = _own_counts(job) if d.id == "threads_per_rank" else None
    if counts is not None:
        return f"the launch starts each rank with OMP_NUM_THREADS={'/'.join(dict.fromkeys(counts))}"
    theirs = job.env.get("OMP_NUM_THREADS")
    if d.id == "threads_per_rank" and theirs is not None and theirs != str(d.value):
        return f"the job runs your OMP_NUM_THREADS={theirs}: a thread count you set is kept"  # cpuperf sets only its own
    if d.id in ("threads_per_rank", "affinity"):
        if job.placement_why:
            return job.placement_why
        if levers.on_gpu:
            return "GPU ranks: threads and CPUs are left to torch and the launcher"
        return "the launch does not carry it"
    if d.id == "nproc_per_node":
        return f"the launch starts {job.nproc_per_node} rank(s) per node"
    if d.id == "nnodes":
        return f"the launch spans {job.nnodes} node(s)"
    if d.id == "allocator":
        return "no allocator preload in the job's environment"
    if BY_ID[d.id].env:
        return _env_why(d, job)
    if not script:
        return _builtin_why(d)
    return _script_why(d, job)


def _env_why(d: Decision[object], job: RenderedJob) -> str:
    """Why a lever carried by its variable is not in the job: a value of yours stands, or nothing sets it."""
    for name in _env_names(d.id):
        if name in job.env:
            return f"{YOURS_KEPT}{name}={job.env[name]} (cpuperf would set {env_text(d.value)}): a " \
                   "variable you set is kept"
    return f"the job's environment does not set {', '.join(_env_names(d.id)) or 'its variable'}"


def _builtin_why(d: Decision[object]) -> str:
    return {"attention": "the built-in loop runs SDPA's dispatcher, which picks the kernel (the worker reports it)",
            "pin_memory": "the built-in loop has no DataLoader: its batches are built in memory",
            "zero": "the built-in loop has no sharding", "sharding": "the built-in loop has no sharding",
            "offload": "the built-in loop has no offload"}.get(d.id, "the built-in worker's settings do not carry it")


# What a script that is no Trainer decides in its own code: no default of the Trainer's stands for it.
_ITS_OWN_CODE = {"batch_size": "its batch", "grad_accum_steps": "its accumulation", "dataloader_workers": "its data loading"}


def _script_why(d: Decision[object], job: RenderedJob) -> str:
    if job.trainer is not True and d.id in _ITS_OWN_CODE:
        what = "the script's own code decides it" if job.trainer is False else "the script was not read"
        return (f"{what}: {_ITS_OWN_CODE[d.id]} is its own code's, which cpuperf leaves alone; {show_value(d.value)} is "
                "the plan's figure, not passed to it")
    if job.flags_why and not job.flags:
        what = "no Trainer flags for this command" if job.trainer is not False else \
            "no flag or variable of this command carries it"
        return f"{what}: {job.flags_why}"
    return {
        "batch_size": "your script's own per-device batch: a hyperparameter cpuperf sets only when you --set it",
        "grad_accum_steps": "your script's own accumulation: a hyperparameter cpuperf sets only when you --set it",
        "optimizer": "your script's own optimizer: the family changes only when you --set it",
        "attention": "your model chooses its attention kernel: no Trainer flag carries it",
        "fp32_math_mode": "no Trainer flag sets oneDNN's fp32 math mode (the built-in loop applies it)",
        "zero": "no DeepSpeed config is rendered for your script unless you --set sharding=zero3",
        "sharding": "this command takes no sharding form cpuperf has checked",
        "offload": "offload rides on a sharding form this command does not take",
        "grad_checkpointing": "this command takes no activation checkpointing flag",
    }.get(d.id, "no flag or variable of this command carries it")


def flag_groups(args: Sequence[str]) -> Tuple[Tuple[str, ...], ...]:
    """A rendered flag line (`--bf16 --optim adamw_torch_fused`) as one argv group per flag."""
    groups: List[List[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return tuple(tuple(g) for g in groups)


def rendered_job(jp: JobPlan) -> RenderedJob:
    """The job a JobPlan starts, as lever_report reads it."""
    plan = jp.launch
    script = jp.script
    yours = plan.yours
    ranks = tuple(RankView(tuple(r.cpus), r.threads) for r in plan.per_rank)
    placement_why = "" if yours is None or yours.place else yours.why
    # The environment the user's command gets: `env OMP_NUM_THREADS=4 python s.py` runs with 4 whatever the
    # plan's own variables say, and the report says what the command gets.
    command = jp.request.asked.command
    env = command.environ(plan.env) if command is not None else dict(plan.env)
    return RenderedJob(
        auto=jp.request.auto, nproc_per_node=plan.nproc_per_node, nnodes=plan.nnodes, env=env, ranks=ranks,
        pinned=tuple(plan.affinity or ()), settings=jp.settings,
        flags=tuple(f.args for f in script.added) if script is not None else (),
        flags_left=tuple(script.not_added) if script is not None else (),
        flags_why=script.why if script is not None else "",
        your_launcher=(script.command.launcher if script is not None else None) or (yours.launcher if yours is not None else None),
        placement_why=placement_why,
        own_values=script.reading.args.values() if script is not None and script.reading is not None else {},
        carried=script.carried if script is not None else (),
        by_default=script.by_default if script is not None else (), numa_binding="--numa-binding=node" in plan.argv,
        options=jp.launch_options(),
        trainer=script.trainer if script is not None else True,
        allocator_missing=missing_here(jp.rec.levers.allocator.value,
                                       jp.facts.software.allocators if jp.facts.software is not None else {}) or "")

