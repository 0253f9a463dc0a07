"""Which TrainingArguments flags an installed transformers version accepts (data: compat/hf.toml).

Only rows marked verified count, and only for releases up to the newest one the data was checked
against: for a newer (or unparsable) release no flag is offered, since any guess could be rejected.
"""

from __future__ import annotations

from typing import FrozenSet, Optional

from packaging.version import InvalidVersion, Version

from cpuperf.knowledge.matrix import ENV_DIR, Matrix

# cpuperf's flag ids -> the option names in compat/hf.toml
FLAG_ROWS = {
    "use_ipex": "use_ipex", "no_cuda": "no_cuda", "use_cpu": "use_cpu", "ddp_backend": "ddp_backend",
    "ddp_backend_ccl": "ddp_backend=ccl", "ddp_backend_gloo": "ddp_backend=gloo",
    "ddp_backend_xccl": "ddp_backend=xccl",
    "ddp_backend_nccl": "ddp_backend=nccl", "ddp_backend_mpi": "ddp_backend=mpi", "bf16": "bf16", "fp16": "fp16", "tf32": "tf32",
    "gradient_checkpointing": "gradient_checkpointing", "optim": "optim",
    "optim_adamw": "optim=adamw_torch", "optim_fused": "optim=adamw_torch_fused",
    "optim_adafactor": "optim=adafactor", "optim_8bit": "optim=adamw_bnb_8bit",
    "torch_compile": "torch_compile", "jit_mode_eval": "jit_mode_eval",
    "half_precision_backend": "half_precision_backend",
    "per_device_train_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "dataloader_num_workers": "dataloader_num_workers", "dataloader_pin_memory": "dataloader_pin_memory",
}


def _matrix(matrix: Optional[Matrix]) -> Matrix:
    from cpuperf.knowledge.matrix import default_matrix

    return matrix if matrix is not None else default_matrix()


def data_note(package: str, version: Optional[str], matrix: Optional[Matrix] = None) -> Optional[str]:
    """Why nothing is rendered for this `package` release (newer than the data, or unparsable); None if known."""
    if not version:
        return None
    m = _matrix(matrix)
    through = m.hf_through(package)
    try:
        v = Version(version)
    except InvalidVersion:
        return f"{package} {version} is not a PEP 440 version: no {package} options rendered"
    if through is None:
        return f"no {package} release is covered by cpuperf's data: no {package} options rendered"
    if Version(v.base_version) > through:
        return (f"{package} {version} is newer than cpuperf's data (data ends at {package} {through}; "
                f"extend with {ENV_DIR}): no {package} options rendered")
    return None


def effective_version(package: str, version: Optional[str], matrix: Optional[Matrix] = None) -> Optional[Version]:
    """The release to check options against: the installed one, or the newest checked when none is installed;
    None when the installed release is outside the data (see data_note)."""
    m = _matrix(matrix)
    if not version:
        return m.hf_through(package)
    if data_note(package, version, m) is not None:
        return None
    return Version(version)


def supported_flags(transformers_version: Optional[str], matrix: Optional[Matrix] = None) -> FrozenSet[str]:
    """Flag ids valid for that version; with no transformers installed, those of the newest checked release."""
    m = _matrix(matrix)
    version = effective_version("transformers", transformers_version, m)
    if version is None:
        return frozenset()
    rows = {row.name: row for row in m.hf if row.package == "transformers"}
    ok = set()
    for flag, name in FLAG_ROWS.items():
        row = rows.get(name)
        if row is not None and row.valid_in(version):
            ok.add(flag)
    if "use_cpu" in ok:
        ok.discard("no_cuda")  # a deprecated flag still works, but its replacement is preferred
    return frozenset(ok)
