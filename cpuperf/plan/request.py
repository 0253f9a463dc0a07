"""What the user asked `cpuperf train` for, typed once at the edge: the planner's request (cpuperf.plan.build).

The command parses its options into a `PlanRequest`; the option combinations that can be refused without
looking at the host are refused here (exit 2), before anything is probed or measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Tuple

from cpuperf.errors import FieldError, verbatim

if TYPE_CHECKING:
    from cpuperf.knowledge.knobs import Overrides, SetValue
    from cpuperf.plan.command import CommandLine

# The built-in run length when neither --max-steps nor --time-budget is given (recommend plans the same job).
DEFAULT_STEPS = 400


@dataclass(frozen=True)
class PlanRequest:
    """One `train` request: the user's constraints and where to run, never changed once made."""

    auto: bool = False
    dry_run: bool = False
    decided: Mapping[str, SetValue] = field(default_factory=dict)  # --set values recommend decides (and a script's --batch-size)
    # --batch-size of the built-in loop: its global batch (samples per optimizer step), which its ranks share
    global_batch: Optional[int] = None
    worker: Mapping[str, SetValue] = field(default_factory=dict)  # --set values of the built-in loop itself
    has_sets: bool = False
    model: Optional[str] = None
    max_steps: Optional[int] = None
    time_budget: Optional[float] = None
    seed: Optional[int] = None
    resume: bool = False
    out_dir: Optional[str] = None
    nproc: Optional[int] = None  # --nproc-per-node, else --ppn
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    launcher: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    rdzv_timeout: Optional[float] = None
    device: str = "auto"
    unit: str = "socket"
    hf_flags: str = "auto"
    user_argv: Tuple[str, ...] = ()
    plan: Optional[str] = None  # a saved plan to run as it stands
    replan: bool = False
    # user_argv read once (cpuperf.plan.command.read_command, by `with_command`); None: no command, or not yet read
    command: Optional[CommandLine] = None

    @property
    def steps(self) -> Optional[int]:
        """The run length the workload is planned for."""
        if self.max_steps is not None:
            return self.max_steps
        return None if self.time_budget else DEFAULT_STEPS


def with_command(request: PlanRequest) -> PlanRequest:
    """The request with the user's command read, once: a request that carries it already is returned as it is."""
    if request.command is not None or not request.user_argv:
        return request
    from dataclasses import replace

    from cpuperf.plan.command import read_command

    return replace(request, command=read_command(request.user_argv))


def split_constraints(sets: Sequence[str], batch_size: Optional[int],
                      user_argv: Sequence[str]) -> Tuple[Overrides, Overrides]:
    """--set values, typed by the one vocabulary: (decisions for recommend, the built-in loop's own settings)."""
    from cpuperf.knowledge.knobs import BY_ID, coerce, parse_assignments

    constraints = parse_assignments(list(sets))
    decided = {k: v for k, v in constraints.items() if BY_ID[k].decided or BY_ID[k].option}
    worker = {k: v for k, v in constraints.items() if k not in decided}
    if worker and user_argv:
        key = sorted(worker)[0]
        raise FieldError(key, None, "{flag}: a setting of the built-in training loop; your script sets its own",
                         "pass it to your script as its own argument", setting=True)
    if batch_size is not None:  # --batch-size: typed and bounded as --set batch_size is
        try:
            typed = coerce("batch_size", str(batch_size))
        except FieldError as exc:  # said about --batch-size (cpuperf.commands.flags)
            raise exc.as_option() from None
        if user_argv:  # a script's: its per-device batch, as --set batch_size (the built-in loop's is its global batch)
            decided.setdefault("batch_size", typed)
    return decided, worker


def check_option_values(request: PlanRequest) -> None:
    """train's options that no later step reads before it is too late, checked as the request is made (exit 2,
    the value named): --max-steps and --seed by the one table of bounds (--set max_steps / seed the same rule), and
    --hf-flags even where no script would read it (`--hf-flags maybe` was accepted silently)."""
    from cpuperf.knowledge.knobs import bounded
    from cpuperf.plan.user_script import HF_MODES

    if request.max_steps is not None:
        bounded("max_steps", request.max_steps)
    if request.seed is not None:
        bounded("seed", request.seed)
    if request.hf_flags not in HF_MODES:
        raise FieldError("hf_flags", request.hf_flags, "{flag} {value!r}: use auto, always or never")


# train's options of the built-in loop alone: with a command of yours they would be dropped, so they are refused.
BUILTIN_ONLY = (("max_steps", "run length"), ("time_budget", "run length"), ("seed", "seed"),
                ("resume", "checkpoint to continue from"))


def check_builtin_only(request: PlanRequest) -> None:
    """An option of the built-in loop given with a command of yours (`--max-steps 3 -- python x.py`): refused (exit 2),
    never dropped; the hint says where it goes instead."""
    if not request.user_argv:
        return
    from cpuperf.decide.workload import PRESETS

    if request.model in PRESETS:  # a config.json sizes your command's memory plan; a preset is the built-in model's
        raise FieldError("model", request.model,
                         "{typed}: a shape of the built-in loop's model; your command trains its own",
                         "drop {flag} (your script's own arguments name its model), or give {flag} the config.json "
                         "of the model your script trains, to size its memory plan")
    for name, what in BUILTIN_ONLY:
        value = getattr(request, name)
        if value is not None and value is not False:
            raise FieldError(name, value, "{flag} sets the built-in loop's " + what + "; your command after `--` "
                             "decides its own", "drop {flag}, and give your script its own option for it (after `--`)")


def check_saved_plan_options(plan: str, given: Sequence[str], device: str, unit: str) -> None:
    """--plan fixes the decisions: an option that decides something (named in `given`) is refused (exit 2)."""
    if given or device != "auto" or unit != "socket":
        what = (list(given) or ["device" if device != "auto" else "unit"])[0]
        raise FieldError("plan", plan, f"{{typed}} fixes the decisions; {{opt.{'set' if what == 'sets' else what}}} "
                         "would change them", "drop it, or make a new plan: cpuperf recommend ... {opt.save} FILE")


def check_sysroot(sysroot: Optional[str], dry_run: bool) -> None:
    """A recorded host can be planned for, never trained on."""
    if sysroot and not dry_run:
        raise FieldError("sysroot", sysroot, "{flag} describes a recorded host: it can be planned for, not trained on",
                         "add {opt.dry_run}")


def check_own_launcher(command: Optional[CommandLine], nproc: Optional[int], launcher: Optional[str]) -> None:
    """A command that starts its own launcher gets none from cpuperf on top (exit 2)."""
    if command is None or ((nproc or 1) <= 1 and not launcher):
        return
    cmd = command.launcher
    if cmd is not None:
        raise FieldError("launcher" if launcher else "nproc_per_node", launcher or nproc,
                         f"your command starts its own launcher ({verbatim(cmd.launcher)}): cpuperf adds none on top",
                         "drop {opt.nproc_per_node}/{opt.ppn}/{opt.launcher}, or run your script without its launcher")
