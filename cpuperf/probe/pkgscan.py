"""Installed package metadata, without importing any of the packages.

Self-contained (standard library only) so that it can also run as a script inside ANOTHER
interpreter (`python pkgscan.py`), which is how cpuperf inspects a target venv.
"""

from __future__ import annotations

import json
import os
import re
import sys

# distribution name -> names it has been published under
PACKAGES = {
    "torch": ["torch"],
    "torchvision": ["torchvision"],
    "intel_extension_for_pytorch": ["intel_extension_for_pytorch", "intel-extension-for-pytorch"],
    "oneccl_bind_pt": ["oneccl_bind_pt", "oneccl-bind-pt"],
    "torch_ccl": ["torch_ccl", "torch-ccl"],
    "transformers": ["transformers"],
    "accelerate": ["accelerate"],
    "deepspeed": ["deepspeed"],
    "mpi4py": ["mpi4py"],
    "intel-openmp": ["intel-openmp", "intel_openmp"],
    "oneccl": ["oneccl"],
    "oneccl-cpu": ["oneccl-cpu", "oneccl_cpu"],
    "impi-rt": ["impi-rt", "impi_rt"],
    "bitsandbytes": ["bitsandbytes"],
    "numpy": ["numpy"],
    "nvidia-ml-py": ["nvidia-ml-py", "pynvml"],
}


def _torch_version_py(dist) -> dict:
    try:
        path = dist.locate_file("torch/version.py")
        with open(str(path), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return {}
    out = {}
    for key in ("cuda", "hip", "xpu"):
        match = re.search(r"^%s\s*(?::\s*[^=]+)?=\s*(.+)$" % key, text, re.M)
        if match:
            raw = match.group(1).strip()
            out[key] = None if raw in ("None", "''", '""') else raw.strip("'\"")
    return out


def scan() -> dict:
    from importlib import metadata

    packages = {}
    for key, names in PACKAGES.items():
        info = None
        for name in names:
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue
            version = dist.version
            local = version.partition("+")[2] or None
            info = {"version": version, "local": local, "build": None, "cuda": None,
                    "location": str(dist.locate_file(""))}
            if key == "torch":
                meta = _torch_version_py(dist)
                info["cuda"] = meta.get("cuda")
                if meta.get("cuda"):
                    info["build"] = "cuda"
                elif meta.get("hip"):
                    info["build"] = "rocm"
                elif meta.get("xpu") or (local or "").startswith("xpu"):
                    info["build"] = "xpu"
                elif local and local.startswith("cu"):
                    info["build"] = "cuda"
                else:
                    info["build"] = "cpu"
            break
        packages[key] = info
    return {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "python_abi": "cp%d%d" % sys.version_info[:2],
        "executable": sys.executable,
        "prefix": sys.prefix,
        "bindir": os.path.dirname(sys.executable),
        "packages": packages,
    }


if __name__ == "__main__":
    print(json.dumps(scan()))
