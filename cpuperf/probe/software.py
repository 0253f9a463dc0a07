"""The software stack: Python, key packages (from metadata), MPI launchers, OpenMP, allocators."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from cpuperf.errors import FieldError, ProbeFailedError, UsageError, verbatim
from cpuperf.probe import parse, pkgscan
from cpuperf.probe.facts import ALLOCATOR_LIBS, HostFacts, MpiLauncher, PackageInfo, Software
from cpuperf.probe.sources import Sources
from cpuperf.versions import major_minor, split_local

OPENMP_LIBS = {
    "iomp": ["libiomp5.so*"],  # Intel OpenMP (oneAPI, pip intel-openmp)
    "gomp": ["libgomp.so*", "libgomp-*.so*"],  # GNU OpenMP (what pip's torch wheels link)
    "omp": ["libomp.so*"],  # LLVM OpenMP
}
# Folders inside site-packages where allocator wheels put their library: cmeel-mimalloc ships
# cmeel.prefix/lib/libmimalloc.so (its wheel's file list; `cpuperf install` adds it, no root needed).
WHEEL_LIB_DIRS = ("cmeel.prefix/lib",)
LAUNCHERS = ("mpirun", "mpiexec", "mpiexec.hydra", "srun", "torchrun")


def scan_interpreter(src: Sources, python: Optional[str]) -> pkgscan.Scanned:
    """Package metadata of this interpreter (in-process) or of another one (a child process)."""
    # abspath, not realpath: a venv's python is a symlink to the base interpreter, yet its own environment.
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return pkgscan.scan()
    if not os.path.exists(python):
        raise FieldError("python", python, f"no Python interpreter at {verbatim(python)}",
                         "pass {opt.python} PATH of an existing interpreter")
    runner = src if src.live else Sources(environ=src.environ)  # a real interpreter, even beside a sysroot
    result = runner.run([python, "-I", pkgscan.__file__], timeout=20.0)
    if result is None or result.returncode != 0:
        raise ProbeFailedError(f"could not inspect the packages of {python}",
                               hint=(result.stderr.strip().splitlines() or [""])[-1] if result else None)
    scanned: pkgscan.Scanned = json.loads(result.stdout)  # the output of pkgscan.scan(), our own script
    return scanned


def _launchers(src: Sources, bindir: str) -> Tuple[MpiLauncher, ...]:
    found = []
    for name in LAUNCHERS:
        path = src.which(name, extra_dirs=[bindir])
        if path is None:
            continue
        flavour: Optional[str]
        version: Optional[str] = None
        if name == "srun":
            flavour = "slurm"
        elif name == "torchrun":
            flavour = "torchrun"
        else:
            flavour, version = parse.parse_mpi_version(_version_text(src, path))
        found.append(MpiLauncher(name=name, path=path, flavour=flavour, version=version))
    return tuple(found)


def mpi_flavour(facts: HostFacts) -> Optional[Tuple[str, str]]:
    """(path, flavour) of the first mpirun/mpiexec the probe found (Open MPI, Intel MPI or MPICH), else None. The
    edge asks it once (cpuperf.run.edge.gather: `Found.mpi`, `EdgeFacts.mpi`) and hands the answer to the planner."""
    sw = facts.software
    for launcher in (sw.mpi if sw else ()):
        if launcher.name in ("mpirun", "mpiexec", "mpiexec.hydra") and launcher.flavour in ("openmpi", "intelmpi", "mpich"):
            return launcher.path, launcher.flavour
    return None


_VERSION_TEXT_MAX = 16384


def _version_text(src: Sources, path: str) -> str:
    """What `path --version` prints, remembered per binary (its real path, size, mtime, inode and device: the
    version is the binary's). Every probe ran it for each MPI launcher found, 10-30 ms of a child process each at
    every start of every command; a binary replaced is run again."""
    from cpuperf.fsutil import atomic_write_bytes, cache_root, sha256_hex
    from cpuperf.readback import read_json

    if not src.live:
        return ""  # a recorded host runs nothing
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        stamp: List[object] = [real, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
        where = cache_root(src.environ) / "launcher-versions" / f"{sha256_hex(real.encode())[:24]}.json"
    except (OSError, ValueError):
        stamp, where = [], None
    if where is not None:
        try:
            known = read_json(where)
            if isinstance(known, dict) and known.get("stamp") == stamp and isinstance(known.get("text"), str):
                return str(known["text"])
        except (OSError, ValueError):
            pass  # none yet, or unreadable: run it and remember again
    result = src.run([path, "--version"], timeout=5.0)
    text = (result.stdout + result.stderr) if result is not None else ""
    if where is not None and result is not None and result.returncode == 0 and len(text) <= _VERSION_TEXT_MAX:
        try:
            atomic_write_bytes(where, json.dumps({"stamp": stamp, "text": text}).encode("utf-8"))
        except (OSError, ValueError):
            pass  # a read-only cache costs the run, nothing else
    return text


def _libraries(src: Sources, own: Sources, table: Dict[str, List[str]],
               extra_dirs: List[str]) -> Dict[str, Tuple[str, ...]]:
    """Each runtime's library files: the system's library directories (`src`: none for a recorded host) and the
    interpreter's own (`extra_dirs`, read through `own`: this machine's files, where the interpreter is)."""
    out: Dict[str, Tuple[str, ...]] = {}
    for name, patterns in table.items():
        paths = src.find_libraries(patterns)
        for directory in extra_dirs:
            for pattern in patterns:
                paths.extend(own.glob(os.path.join(directory, pattern)))
        out[name] = tuple(sorted(dict.fromkeys(paths)))
    return out


# PEP 440 public version plus an optional local label (packaging's VERSION_PATTERN is the full form).
_VERSION = re.compile(r"^v?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?$")
_PYTHON = re.compile(r"^3\.\d{1,3}(\.\d{1,3})?t?$")


def _python_override(src: Sources) -> Optional[str]:
    """CPUPERF_OVERRIDE_PYTHON: 3.N, 3.N.M or 3.Nt, else a UsageError naming the variable."""
    text = src.override("python")
    if text is None or not text.strip():
        return None
    if not _PYTHON.match(text.strip()):
        raise UsageError(f"CPUPERF_OVERRIDE_PYTHON={text[:40]!r} is not a Python version",
                         hint="e.g. CPUPERF_OVERRIDE_PYTHON=3.11")
    return text.strip()


def apply_package_override(packages: Dict[str, Optional[PackageInfo]], text: str) -> Dict[str, Optional[PackageInfo]]:
    """CPUPERF_OVERRIDE_PACKAGES='{"torch": "2.8.0+cpu", "intel_extension_for_pytorch": null}'."""
    try:
        wanted = json.loads(text)
        if not isinstance(wanted, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"CPUPERF_OVERRIDE_PACKAGES is not a JSON object ({exc})",
                         hint='e.g. CPUPERF_OVERRIDE_PACKAGES=\'{"torch": "2.8.0+cpu"}\'') from exc
    merged = dict(packages)
    for name, version in wanted.items():
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", name):
            raise UsageError(f"CPUPERF_OVERRIDE_PACKAGES: {name!r:.40} is not a package name",
                             hint='e.g. CPUPERF_OVERRIDE_PACKAGES=\'{"torch": "2.8.0+cpu"}\'')
        if version is None or version == "":
            merged[name] = None
            continue
        if not isinstance(version, str) or not _VERSION.match(version):
            raise UsageError(f"CPUPERF_OVERRIDE_PACKAGES: {name!s:.40} = {version!r:.40} is not a version",
                             hint='e.g. CPUPERF_OVERRIDE_PACKAGES=\'{"torch": "2.8.0+cpu"}\'')
        public, local = split_local(str(version))
        build = None
        if name == "torch":
            build = "cuda" if (local or "").startswith("cu") else ("rocm" if (local or "").startswith("rocm") else "cpu")
        merged[name] = PackageInfo(version=str(version), local=local, build=build,
                                   cuda=parse.cuda_from_local(local))
    return merged


def probe_software(src: Sources, python: Optional[str] = None, runtimes: bool = True) -> Optional[Software]:
    """The stack of this (or another) interpreter; None for a snapshot unless overridden.

    An explicit `python` is a real interpreter on this machine: its stack is read even with a sysroot
    (the recorded tree describes the hardware, not the packages).
    """
    override = src.override("packages")
    if not src.live and python is None:
        from cpuperf.probe.recorded import recorded_software

        recorded = recorded_software(src)  # a snapshot taken by cpuperf records the stack beside the tree
        if recorded is not None:
            if override is None:
                return recorded
            return replace(recorded, packages=apply_package_override(recorded.packages, override),
                           python=_python_override(src) or recorded.python)
        if override is None:
            return None
        overridden = apply_package_override({k: None for k in pkgscan.PACKAGES}, override)
        return Software(python=_python_override(src) or "3.11.0", python_abi="cp311", executable="",
                        prefix="", packages=overridden, mpi=(), numactl=None, openmp={}, allocators={})
    scanned = scan_interpreter(src, python)
    # Here the interpreter is a real one on this machine (a recorded host reaches this only with --python): the
    # files of its own environment (its lib directory, torch's, an allocator wheel's) are read from this machine's
    # filesystem, never looked for inside the recorded tree; the system's library directories stay the host's.
    own = src if src.live else Sources(environ=src.environ)
    packages: Dict[str, Optional[PackageInfo]] = {
        name: (PackageInfo(**info) if info else None) for name, info in scanned["packages"].items()}
    if override is not None:
        packages = apply_package_override(packages, override)
    prefix = scanned["prefix"]
    extra = [os.path.join(prefix, "lib")]
    torch = packages.get("torch")
    if torch and torch.location:
        extra += [os.path.join(torch.location, "torch", "lib"), os.path.join(torch.location, "torch.libs")]
    python_version = _python_override(src) or scanned["python"]
    return Software(
        python=python_version,
        python_abi="cp" + major_minor(python_version).replace(".", ""),
        executable=scanned["executable"],
        prefix=prefix,
        packages=packages,
        # MPI launchers (each asked its --version) and the runtime libraries (dozens of globs): only for the
        # commands that launch, preload or report them (ccl-env without --preload needs neither).
        mpi=_launchers(src, scanned.get("bindir", "")) if runtimes else (),
        numactl=src.which("numactl"),
        openmp=_libraries(src, own, OPENMP_LIBS, extra) if runtimes else {},
        allocators=_libraries(src, own, ALLOCATOR_LIBS, extra + [os.path.join(site, sub) for site in scanned.get("site_dirs", [])
                                                            for sub in WHEEL_LIB_DIRS]) if runtimes else {},
    )


def torch_git_version(info: Optional[PackageInfo], src: Optional[Sources] = None) -> Optional[str]:
    """The git hash torch was built from (torch/version.py, read without importing torch); None if unknown."""
    if info is None or not info.location:
        return None
    text = (src or Sources()).read(os.path.join(info.location, "torch", "version.py"))
    return parse.torch_version_py(text).get("git_version")
