"""Which TrainingArguments flags an installed transformers version accepts (data: compat/hf.toml)."""

from __future__ import annotations

from typing import FrozenSet, Optional

from packaging.version import InvalidVersion, Version

# cpuperf's flag ids -> the option names in compat/hf.toml
FLAG_ROWS = {
    "use_ipex": "use_ipex", "no_cuda": "no_cuda", "use_cpu": "use_cpu", "ddp_backend": "ddp_backend",
    "ddp_backend_ccl": "ddp_backend=ccl", "bf16": "bf16", "fp16": "fp16", "tf32": "tf32",
    "gradient_checkpointing": "gradient_checkpointing", "optim": "optim",
    "optim_fused": "optim=adamw_torch_fused", "torch_compile": "torch_compile",
    "per_device_train_batch_size": "per_device_train_batch_size",
    "dataloader_num_workers": "dataloader_num_workers", "dataloader_pin_memory": "dataloader_pin_memory",
}


def supported_flags(transformers_version: Optional[str]) -> FrozenSet[str]:
    """Flag ids valid for that version; with no transformers installed, those of current releases."""
    from cpuperf.knowledge.matrix import default_matrix

    rows = {row.name: row for row in default_matrix().hf if row.package == "transformers"}
    version: Optional[Version] = None
    if transformers_version:
        try:
            version = Version(transformers_version)
        except InvalidVersion:
            version = None
    ok = set()
    for flag, name in FLAG_ROWS.items():
        row = rows.get(name)
        if row is None:
            continue
        if version is None:
            accepted = row.removed is None  # current releases: anything not yet removed
        else:
            accepted = (row.introduced is None or version >= row.introduced) and \
                       (row.removed is None or version < row.removed)
        # A deprecated flag still works, but its replacement is preferred by the renderer.
        if accepted and not (flag == "no_cuda" and "use_cpu" in ok):
            ok.add(flag)
    return frozenset(ok)
