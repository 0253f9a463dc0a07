"""The host classes every path of cpuperf is run in (tests/test_host_classes.py's matrix, the recorded plans of
tests/test_plan_golden.py, the transformers releases of tests/test_hf_releases.py), whatever machine runs the suite.

Each class is described, never inherited from the machine: a recorded /proc + /sys tree (--sysroot) for the planning
paths, and the same class's facts as overrides (CPUPERF_OVERRIDE_ISA / MICROARCH / AMX_USABLE / GPUS) on the live
host for real runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from cli_util import cli_env
from hosts import CPUINFO, make_host, write

PY = sys.executable
GPUS = Path(__file__).parent / "fixtures" / "gpus"



def _flags(fixture: str) -> List[str]:
    for line in (CPUINFO / fixture).read_text().splitlines():
        if line.startswith("flags"):
            return line.split(":", 1)[1].split()
    raise AssertionError(fixture)


ZEN3 = _flags("linux-ubuntu20.04-zen3")  # AVX2, no AVX-512
CASCADE = _flags("linux-centos7-cascadelake")  # AVX-512 without bf16
ZEN4 = ZEN3 + ["avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512ifma",
               "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "gfni"]
SAPPHIRE = CASCADE + ["avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8", "avx_vnni"]


@dataclass(frozen=True)
class HostClass:
    name: str
    what: str
    dtype: str  # the dtype every plan of this class must carry (from the rules: nothing is measured here)
    isa: Tuple[str, ...] = ()
    microarch: str = ""
    family: int = 6
    model: int = 85
    vendor: str = "GenuineIntel"
    amx_usable: Optional[bool] = None
    gpus: Optional[str] = None  # a recorded NVML answer (tests/fixtures/gpus)
    cpuinfo: Optional[Callable[[int], str]] = None  # non-x86: the recorded /proc/cpuinfo text for N CPUs
    runs_here: bool = True  # x86 classes train for real here
    why_not_here: str = ""
    trainer_bf16: bool = False  # the Trainer gets --bf16 from the rule alone (AMX: the case the rule is for)
    emulated: Tuple[str, ...] = ()  # paths the Arm tier runs for real under QEMU (tests/arm/tier.sh, docs/testing.md)
    device: str = "cpu"
    extra: Dict[str, str] = field(default_factory=dict)

    def overrides(self) -> Dict[str, str]:
        """The class on the live host: the facts that make it this class, nothing else."""
        env = {"CPUPERF_OVERRIDE_ISA": " ".join(self.isa), "CPUPERF_OVERRIDE_MICROARCH": self.microarch,
               "CPUPERF_OVERRIDE_GPUS": (GPUS / self.gpus).read_text() if self.gpus else "[]"}
        if self.amx_usable is not None:
            env["CPUPERF_OVERRIDE_AMX_USABLE"] = "1" if self.amx_usable else "0"
        env.update(self.extra)
        return env

    def tree(self, root: Path) -> Path:
        """The class as a recorded host: 2 cores like the machines this suite runs on (cgroup, NUMA, sysfs)."""
        if root.exists():
            return root
        host = make_host(root, sockets=1, cores_per_socket=2, flags=self.isa or ("avx2", "fma"), vendor=self.vendor,
                         family=self.family, model=self.model, name=f"{self.what} (recorded)")
        if self.cpuinfo is not None:
            write(host, "/proc/cpuinfo", self.cpuinfo(2))
        return host


def _arm_cpuinfo(n: int) -> str:
    block = (CPUINFO / "linux-amazon-neoverse_v1").read_text().split("\n\n")[0]
    lines = [ln for ln in block.splitlines() if not ln.startswith("processor")]
    return "".join(f"processor\t: {c}\n" + "\n".join(lines) + "\n\n" for c in range(n))


def _power10_cpuinfo(n: int) -> str:
    return "".join(f"processor\t: {c}\ncpu\t\t: POWER10 (architected), altivec supported\nclock\t\t: 3000.000000MHz\n"
                   "revision\t: 2.0 (pvr 0080 0200)\n\n" for c in range(n))


CLASSES = [
    HostClass("avx2", "x86 AVX2, no bf16 (Zen 3)", "fp32", tuple(ZEN3), "zen3", family=25, model=1, vendor="AuthenticAMD"),
    HostClass("avx2-vm", "x86 AVX2 cloud VM, one NUMA node (Zen 3 guest, `hypervisor` flag)", "fp32",
              tuple(ZEN3) + ("hypervisor",), "zen3", family=25, model=1, vendor="AuthenticAMD",
              extra={"CPUPERF_OVERRIDE_HYPERVISOR": "1"}),
    HostClass("avx512", "AVX-512 without bf16 (Cascade Lake)", "fp32", tuple(CASCADE), "cascadelake", model=85),
    HostClass("avx512-bf16", "avx512_bf16 (Zen 4 / Cooper Lake)", "bf16", tuple(ZEN4), "zen4", family=25, model=17,
              vendor="AuthenticAMD"),
    HostClass("amx", "AMX usable (Sapphire Rapids)", "bf16", tuple(SAPPHIRE), "sapphirerapids", model=143,
              amx_usable=True, trainer_bf16=True),
    HostClass("amx-denied", "AMX present, not permitted by the OS", "bf16", tuple(SAPPHIRE), "sapphirerapids",
              model=143, amx_usable=False),
    HostClass("neoverse", "Arm Neoverse V1 with BF16", "fp32", cpuinfo=_arm_cpuinfo, runs_here=False,
              why_not_here="an aarch64 plan does not execute on this instruction set",
              emulated=("builtin-run", "ddp-script-torchrun")),
    HostClass("power10", "POWER10 (MMA)", "fp32", cpuinfo=_power10_cpuinfo, runs_here=False,
              why_not_here="a ppc64le plan does not execute on this instruction set"),
    HostClass("gpu", "NVIDIA H100 host (recorded NVML)", "bf16", tuple(ZEN3), "zen3", family=25, model=1,
              vendor="AuthenticAMD", gpus="h100-80gb-hbm3.json", runs_here=False, device="cuda",
              why_not_here="no GPU on this machine: planned up to the launch",
              extra={"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cu128"})}),  # a GPU host's CUDA build
]
BY_NAME = {c.name: c for c in CLASSES}


def linked_venv(path: Path, leave_out: Tuple[str, ...]) -> str:
    """A real venv with the test venv's packages, less those whose names start with `leave_out`.

    Built offline in a second: the packages are linked in (a .pth file naming a folder of links), so pip and
    importlib.metadata see them as installed, and pip puts a release of its own in front where asked."""
    subprocess.run([PY, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    import sysconfig

    site_src = Path(sysconfig.get_paths()["purelib"])
    site_dst = Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    farm = path / "linked"
    farm.mkdir()
    for entry in site_src.iterdir():
        low = entry.name.lower()
        if low.startswith(leave_out + ("_cpuperf", "__editable__", "cpuperf")) or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)
    repo = Path(__file__).resolve().parent.parent
    (site_dst / "cpuperf_test_links.pth").write_text(f"{farm}\n{repo}\n")
    return str(path / "bin" / "python")


# -- the fixed inputs of a plan (tests/test_plan_golden.py, tests/test_levers_applied.py) ----------------------------

STACK = {"torch": "2.13.0+cpu", "transformers": "5.23.0", "accelerate": "1.15.0"}
PYTHON_VERSION = "3.11.9"
TRAINER_SCRIPT = (
    "from transformers import HfArgumentParser, TrainingArguments\n\n"
    "(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "print(args.output_dir)\n"
)


def planning_env(cls: HostClass, root: Path) -> Dict[str, str]:
    """The whole environment of a child: fixed. The caller's own variables are inputs of a plan (ccl-env and
    train keep an OMP_NUM_THREADS or MASTER_PORT already set), so none is inherited beyond finding Python."""
    stack = dict(STACK)
    if cls.runs_here or cls.gpus:  # as test_host_classes: the overrides that make the class, on its tree too
        overrides = cls.overrides()
        stack.update(json.loads(overrides.pop("CPUPERF_OVERRIDE_PACKAGES", "{}")))  # the GPU class's CUDA torch
    else:
        overrides = {}
    inherited = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}
    fixed = {k: v for k, v in cli_env().items() if k in ("NO_COLOR", "COLUMNS", "CPUPERF_MEASURE")}
    return {**inherited, **fixed, **overrides, "CPUPERF_OVERRIDE_PACKAGES": json.dumps(stack, sort_keys=True),
            "CPUPERF_OVERRIDE_PYTHON": PYTHON_VERSION, "CPUPERF_CACHE_DIR": str(root / "cache"),
            "HF_HOME": str(root / "hf"), "HOME": str(root / "home"), "PYTHONIOENCODING": "utf-8",
            "PYTHONWARNINGS": "ignore"}  # bytecode written: ~100 children compile cpuperf once, not each
