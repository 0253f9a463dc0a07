"""Installed package metadata, without importing any of the packages.

Self-contained (standard library only) so that it can also run as a script inside ANOTHER
interpreter (`python pkgscan.py`), which is how cpuperf inspects a target venv.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import TYPE_CHECKING, Dict, List, Optional

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
    "cmeel-mimalloc": ["cmeel-mimalloc", "cmeel_mimalloc"],  # ships libmimalloc.so (an allocator without root)
}


def canonical_name(name: str) -> str:
    """PEP 503 normalisation ('Intel_Extension.for-PyTorch' -> 'intel-extension-for-pytorch'): the one
    package-name normaliser of cpuperf (standard library only, so it also runs inside another interpreter)."""
    return re.sub(r"[-_.]+", "-", name).lower()



def key_for(name: str) -> str | None:
    """The PACKAGES key a distribution name (any spelling) is scanned under, or None."""
    want = canonical_name(name)
    for key, names in PACKAGES.items():
        if any(canonical_name(n) == want for n in names):
            return key
    return None


def _index(paths: list[str]) -> dict[str, tuple[str, str]]:
    """normalised name -> (site dir, metadata dir), first on the path wins (as importlib.metadata does).

    One listing per sys.path entry instead of one full scan per name asked: ccl-env runs in every new
    shell, so this is on its critical path."""
    found: dict[str, tuple[str, str]] = {}
    for entry in paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for fname in names:
            if fname.endswith(".dist-info") or fname.endswith(".egg-info"):
                stem = fname.rsplit(".", 1)[0]
                name = stem.split("-", 1)[0]
                found.setdefault(canonical_name(name), (entry, os.path.join(entry, fname)))
    return found


def _version(meta_dir: str) -> str | None:
    """The Version: header of METADATA (dist-info) or PKG-INFO (egg-info)."""
    for leaf in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(meta_dir, leaf), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break  # end of the headers
        except OSError:
            continue
    return None


def _torch_version_py(site: str) -> dict[str, str | None]:
    try:
        with open(os.path.join(site, "torch", "version.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return {}
    out: dict[str, str | None] = {}
    for key in ("cuda", "hip", "xpu"):
        match = re.search(r"^%s\s*(?::\s*[^=]+)?=\s*(.+)$" % key, text, re.M)
        if match:
            raw = match.group(1).strip()
            out[key] = None if raw in ("None", "''", '""') else raw.strip("'\"")
    return out


def _torch_build(local: str | None, meta: dict[str, str | None]) -> str:
    if meta.get("cuda"):
        return "cuda"
    if meta.get("hip"):
        return "rocm"
    if meta.get("xpu") or (local or "").startswith("xpu"):
        return "xpu"
    if local and local.startswith("cu"):
        return "cuda"
    return "cpu"


# The shapes scan() reports: for the type checker only (this script runs in any interpreter a user names).
if TYPE_CHECKING:
    from typing import TypedDict

    class PackageRow(TypedDict):
        """One installed package as scanned (the fields of probe.facts.PackageInfo)."""

        version: str
        local: Optional[str]
        build: Optional[str]
        cuda: Optional[str]
        location: Optional[str]

    class Scanned(TypedDict):
        """An interpreter's packages as scan() reports them (printed as JSON where it runs in another interpreter)."""

        python: str
        python_abi: str
        executable: str
        prefix: str
        bindir: str
        packages: Dict[str, Optional[PackageRow]]  # PACKAGES' keys; None: not installed
        site_dirs: List[str]


def scan(paths: list[str] | None = None) -> Scanned:
    index = _index(sys.path if paths is None else paths)
    packages: Dict[str, Optional[PackageRow]] = {}
    for key, names in PACKAGES.items():
        info: Optional[PackageRow] = None
        for name in names:
            hit = index.get(canonical_name(name))
            version = _version(hit[1]) if hit else None
            if hit is None or version is None:
                continue
            local = version.partition("+")[2] or None
            info = {"version": version, "local": local, "build": None, "cuda": None, "location": hit[0]}
            if key == "torch":
                meta = _torch_version_py(hit[0])
                info["cuda"] = meta.get("cuda")
                info["build"] = _torch_build(local, meta)
            break
        packages[key] = info
    return {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "python_abi": "cp%d%d" % sys.version_info[:2],
        "executable": sys.executable,
        "prefix": sys.prefix,
        "bindir": os.path.dirname(sys.executable),
        "packages": packages,
        # Where wheels put their files: an allocator wheel ships its .so there (cmeel.prefix/lib).
        "site_dirs": [p for p in (sys.path if paths is None else paths)
                      if os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages") and os.path.isdir(p)],
    }


if __name__ == "__main__":
    print(json.dumps(scan()))
