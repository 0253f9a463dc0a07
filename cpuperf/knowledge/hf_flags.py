"""Which TrainingArguments flags an installed transformers version accepts (data: compat/hf.toml).

Only rows marked verified count. A release the data does not list is placed against the newest
release it was checked against (`through`, from [[hf_data]]):

- a patch of that minor (through 5.23.0, installed 5.23.4) inherits the minor's rows unchanged;
- a newer minor of the same major (5.24.0) inherits every option valid at `through` that is not
  recorded as deprecated or removed, with the note "data ends at X";
- a new major (6.0.0), or an unparsable version, gets nothing: any guess could be rejected.

A deprecated option whose replacement (`replacement = "--name"`, a rename) exists in the release is
never offered: the current spelling is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Dict, FrozenSet, NamedTuple, Optional, Tuple

from packaging.version import Version

from cpuperf.knowledge.matrix import ENV_DIR, HfOption, Matrix
from cpuperf.versions import base_of, version_or_none


class TrainerFlag(NamedTuple):
    """One option cpuperf adds to a user's command: its id in cpuperf (None: not checked against compat/hf.toml),
    its row in compat/hf.toml (the releases that accept it), the option as written, the lever it carries."""

    id: Optional[str]
    row: Optional[str]
    option: str
    lever: Optional[str]


# THE table of the Trainer (and accelerate launch) options cpuperf adds: `FLAG_ROWS` (flag id -> compat/hf.toml
# row) and `FLAG_LEVERS` (option -> the lever it carries, cpuperf.plan.applied) are read from it.
TRAINER_FLAGS: Tuple[TrainerFlag, ...] = (
    TrainerFlag("use_ipex", "use_ipex", "--use_ipex", "ipex"),
    TrainerFlag("no_cuda", "no_cuda", "--no_cuda", "device"),
    TrainerFlag("use_cpu", "use_cpu", "--use_cpu", "device"),
    TrainerFlag("ddp_backend", "ddp_backend", "--ddp_backend", "ddp_backend"),
    *(TrainerFlag(f"ddp_backend_{b}", f"ddp_backend={b}", "--ddp_backend", "ddp_backend")
      for b in ("ccl", "gloo", "xccl", "nccl", "mpi")),
    TrainerFlag("bf16", "bf16", "--bf16", "dtype"),
    TrainerFlag("fp16", "fp16", "--fp16", "dtype"),
    TrainerFlag("tf32", "tf32", "--tf32", "tf32"),
    TrainerFlag("gradient_checkpointing", "gradient_checkpointing", "--gradient_checkpointing", "grad_checkpointing"),
    TrainerFlag("activation_checkpointing", "activation_checkpointing", "--activation_checkpointing",
                "grad_checkpointing"),
    TrainerFlag("optim", "optim", "--optim", "optimizer"),
    TrainerFlag("optim_adamw", "optim=adamw_torch", "--optim", "optimizer"),
    TrainerFlag("optim_fused", "optim=adamw_torch_fused", "--optim", "optimizer"),
    TrainerFlag("optim_adafactor", "optim=adafactor", "--optim", "optimizer"),
    TrainerFlag("optim_8bit", "optim=adamw_bnb_8bit", "--optim", "optimizer"),
    TrainerFlag("torch_compile", "torch_compile", "--torch_compile", "compile"),
    TrainerFlag("torch_compile_mode", "torch_compile_mode", "--torch_compile_mode", "compile"),
    TrainerFlag("jit_mode_eval", "jit_mode_eval", "--jit_mode_eval", None),
    TrainerFlag("half_precision_backend", "half_precision_backend", "--half_precision_backend", None),
    TrainerFlag("per_device_train_batch_size", "per_device_train_batch_size", "--per_device_train_batch_size",
                "batch_size"),
    TrainerFlag("gradient_accumulation_steps", "gradient_accumulation_steps", "--gradient_accumulation_steps",
                "grad_accum_steps"),
    TrainerFlag("dataloader_num_workers", "dataloader_num_workers", "--dataloader_num_workers", "dataloader_workers"),
    TrainerFlag("dataloader_pin_memory", "dataloader_pin_memory", "--dataloader_pin_memory", "pin_memory"),
    # checked elsewhere: accelerate launch's autocast (plan/user_script.launcher_flags), sharding (sharding_form)
    TrainerFlag(None, None, "--mixed_precision", "dtype"),
    TrainerFlag(None, None, "--fsdp", "sharding"),
    TrainerFlag(None, None, "--fsdp_config", "sharding"),
    TrainerFlag(None, None, "--deepspeed", "sharding"),
)
# The torch.compile modes (worker_settings.COMPILE_MODES) a Trainer script can be given: the whole model, in inductor's
# default mode (--torch_compile) or another (--torch_compile_mode, which the Trainer hands to torch.compile through
# accelerate). Regional compile is no TrainingArguments field (transformers 5.24.0): the built-in worker's alone.
TRAINER_COMPILE_MODES: Tuple[str, ...] = ("default", "max-autotune")
# cpuperf's flag ids -> the option names in compat/hf.toml
FLAG_ROWS: Dict[str, str] = {f.id: f.row for f in TRAINER_FLAGS if f.id is not None and f.row is not None}
# an option cpuperf adds -> the lever it carries (what plan/applied reports as applied by a flag)
FLAG_LEVERS: Dict[str, str] = {f.option: f.lever for f in TRAINER_FLAGS if f.lever is not None}
# cpuperf's flag ids -> the option as written (plan/user_script.speed_flags writes each flag from its id)
FLAG_OPTIONS: Dict[str, str] = {f.id: f.option for f in TRAINER_FLAGS if f.id is not None}
_FLAG_OF_ROW = {row: flag for flag, row in FLAG_ROWS.items()}


def _matrix(matrix: Optional[Matrix]) -> Matrix:
    from cpuperf.knowledge.matrix import default_matrix

    return matrix if matrix is not None else default_matrix()


@dataclass(frozen=True)
class Coverage:
    """Where an installed release stands against the data.

    kind: 'known' (inside the data), 'patch' (a patch of the newest checked minor), 'minor' (a newer minor
    of a known major: options carried over), 'major' (a new major: nothing rendered), 'invalid', 'none'
    (no data for the package). `at`: the release the rows are evaluated at (None = render nothing).
    """

    package: str
    installed: Optional[str]
    kind: str
    at: Optional[Version]
    through: Optional[Version]
    note: Optional[str]

    @property
    def inherited(self) -> bool:
        """True when options are carried over from `through` to a newer minor (deprecated/removed ones dropped)."""
        return self.kind == "minor"


def coverage(package: str, version: Optional[str], matrix: Optional[Matrix] = None) -> Coverage:
    """Place an installed `package` release against the data (see the module docstring)."""
    m = _matrix(matrix)
    through = m.hf_through(package)
    if not version:
        return Coverage(package, None, "known", through, through, None)
    v = version_or_none(version)
    if v is None:
        return Coverage(package, version, "invalid", None, through,
                        f"{package} {version} is not a PEP 440 version: no {package} options rendered")
    if through is None:
        return Coverage(package, version, "none", None, None,
                        f"no {package} release is covered by cpuperf's data: no {package} options rendered")
    base = base_of(v)
    if base <= through:
        return Coverage(package, version, "known", base, through, None)
    ends = f"data ends at {package} {through}"
    if base.release[:2] == through.release[:2]:
        return Coverage(package, version, "patch", base, through,
                        f"{package} {version} is a patch release of {through.major}.{through.minor} newer than "
                        f"cpuperf's data ({ends}): the {through.major}.{through.minor} options apply")
    if base.major == through.major:
        return Coverage(package, version, "minor", through, through,
                        f"{package} {version} is newer than cpuperf's data ({ends}; extend with {ENV_DIR}): "
                        f"options of {package} {through} carried over, except those recorded deprecated or removed")
    return Coverage(package, version, "major", None, through,
                    f"{package} {version} is a new major release, newer than cpuperf's data ({ends}; extend with "
                    f"{ENV_DIR}): no {package} options rendered")


def data_note(package: str, version: Optional[str], matrix: Optional[Matrix] = None) -> Optional[str]:
    """Why the rendering for this `package` release is reduced or extrapolated; None if the data covers it."""
    return coverage(package, version, matrix).note


def option_valid(row: HfOption, cov: Coverage) -> bool:
    """True when `row` applies to the installed release placed by `cov`."""
    if cov.at is None or not row.valid_in(cov.at):
        return False
    if cov.inherited and (row.deprecated is not None or row.removed is not None):
        return False  # a newer minor may already have dropped what the data calls deprecated
    return True


def renamed_to(row: HfOption) -> Optional[str]:
    """The option a deprecated row was renamed to (`replacement = "--name"`), or None for advice text."""
    text = row.replacement.strip()
    if text.startswith("--") and " " not in text:
        return text[2:]
    return None


def _rows(m: Matrix, package: str = "transformers") -> Dict[str, HfOption]:
    return {row.name: row for row in m.hf if row.package == package}


def _superseded(row: HfOption, cov: Coverage, rows: Dict[str, HfOption]) -> bool:
    """Deprecated at the installed release, with a replacement that the release has."""
    if row.deprecated is None or cov.at is None or base_of(cov.at) < row.deprecated:
        return False
    new = renamed_to(row)
    if new is None:
        return True  # deprecated with advice only (e.g. use_ipex): not offered; why_not() says what instead
    return new in rows and option_valid(rows[new], cov)


def supported_flags(transformers_version: Optional[str], matrix: Optional[Matrix] = None) -> FrozenSet[str]:
    """Flag ids to offer for that version (never a deprecated spelling); with no transformers installed, those of
    the newest checked release."""
    m = _matrix(matrix)
    cov = coverage("transformers", transformers_version, m)
    rows = _rows(m)
    ok = set()
    for flag, name in FLAG_ROWS.items():
        row = rows.get(name)
        if row is not None and option_valid(row, cov) and not _superseded(row, cov, rows):
            ok.add(flag)
    return frozenset(ok)


def spelling(flag: str, ok: AbstractSet[str], transformers_version: Optional[str] = None,
             matrix: Optional[Matrix] = None) -> Optional[str]:
    """The option name that says cpuperf's `flag` in that release: its own when `flag` is in `ok`
    (supported_flags), else the option it was renamed to (followed through the data's `replacement = "--name"`
    rows, also to options cpuperf has no id for) when the release has it; None if neither."""
    m = _matrix(matrix)
    rows = _rows(m)
    cov = coverage("transformers", transformers_version, m)
    name = FLAG_ROWS.get(flag, flag)
    seen = set()
    while name not in seen:
        seen.add(name)
        known = _FLAG_OF_ROW.get(name)
        row = rows.get(name)
        if known is not None and known in ok:
            return name
        if known is None and row is not None and option_valid(row, cov) and not _superseded(row, cov, rows):
            return name  # a rename target only the data knows
        new = renamed_to(row) if row is not None else None
        if new is None:
            return None
        name = new
    return None


def why_not(flag: str, transformers_version: Optional[str], matrix: Optional[Matrix] = None) -> str:
    """Why `flag` is not offered for that release: not yet in it, removed, deprecated (and what instead)."""
    m = _matrix(matrix)
    cov = coverage("transformers", transformers_version, m)
    release = f"transformers {transformers_version or cov.through or '(not installed)'}"
    row = _rows(m).get(FLAG_ROWS.get(flag, ""))
    if cov.at is None:
        return cov.note or f"not in {release}"
    if row is None or not row.verified:
        return f"not in {release} (no verified data)"
    instead = f": use {row.replacement}" if row.replacement else ""
    if row.removed is not None and base_of(cov.at) >= row.removed:
        return f"removed in transformers {row.removed}{instead}"
    if row.introduced is not None and base_of(cov.at) < row.introduced:
        return f"not in {release} (added in {row.introduced})"
    if row.deprecated is not None:
        gone = f", removed in {row.removed}" if row.removed is not None else ""
        return f"deprecated since transformers {row.deprecated}{gone}{instead}"
    return f"not in {release}"


def sharding_form(transformers_version: Optional[str], matrix: Optional[Matrix] = None) -> Dict[str, Optional[str]]:
    """How the installed Trainer takes sharding (compat/hf.toml, kind sharding-arg): {'fsdp': 'switch' (a bare --fsdp
    with a --fsdp_config file holding cpu_offload and activation_checkpointing) | 'value' (--fsdp "full_shard
    auto_wrap [offload]") | None, 'deepspeed': 'file' (--deepspeed FILE) | None, 'why': why FSDP is not offered}."""
    m = _matrix(matrix)
    cov = coverage("transformers", transformers_version, m)
    rows = {row.name: row for row in m.hf if row.package == "transformers" and row.kind == "sharding-arg"}

    def has(name: str) -> bool:
        row = rows.get(name)
        return row is not None and option_valid(row, cov)

    release = f"transformers {transformers_version or cov.through}"
    fsdp: Optional[str] = None
    if has("fsdp=true") and has("fsdp_config=cpu_offload,activation_checkpointing"):
        fsdp = "switch"
    elif has("fsdp"):
        fsdp = "value"
    why = None if fsdp else (cov.note or f"{release} has no FSDP option cpuperf's data has checked")
    return {"fsdp": fsdp, "deepspeed": "file" if has("deepspeed") else None, "why": why}
