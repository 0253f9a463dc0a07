"""Trainer and accelerate arguments that the real releases accept, in every host class.

For each transformers release below, the flags cpuperf would pass (recommend's hf_args for that release, in
every CPU class, one rank and two, with and without --set dtype=bf16) are parsed by that release's own
HfArgumentParser into TrainingArguments, which runs its __post_init__ checks (the couplings between flags:
compat/couplings.toml). The release is installed for real from the registry into a throwaway directory
(wheels cached under ~/.cache/cpuperf-tests/wheels, a few per release), next to the test venv's torch.

CI checks the releases where the rules change: the last 4.x, the first release of each coupling (5.0.0) and
the installed newest. CPUPERF_SLOW=1 adds the newest patch of every minor from 4.46 on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
from cli_util import cli_env
from test_host_classes import CLASSES

PY = sys.executable
WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cpuperf-tests" / "wheels"
CORE = ["4.57.6", "5.0.0"]  # the last 4.x; the first release of the bf16 -> use_cpu coupling
SLOW = ["4.46.3", "4.47.1", "4.48.3", "4.49.0", "4.50.3", "4.51.3", "4.52.4", "4.53.3", "4.54.1", "4.55.4", "4.56.2",
        "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1", "5.9.0", "5.10.4", "5.11.0", "5.12.1",
        "5.13.1", "5.14.1", "5.15.1", "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2"]
RELEASES = CORE + (SLOW if os.environ.get("CPUPERF_SLOW") == "1" else [])
CPU_CLASSES = [c for c in CLASSES if c.runs_here]
VARIANTS = {"one rank": [], "two ranks": ["--nproc-per-node", "2"], "dtype=bf16": ["--set", "dtype=bf16"]}

PARSE = r"""
import json, sys, tempfile, warnings
warnings.simplefilter("ignore")
import transformers
from transformers import HfArgumentParser, TrainingArguments
out = {"version": transformers.__version__, "results": []}
for argv in json.loads(sys.argv[1]):
    try:
        (args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses(
            args=[*argv, "--output_dir", tempfile.mkdtemp(), "--report_to", "none"])
        out["results"].append({"argv": argv, "ok": True, "bf16": bool(args.bf16), "use_cpu": bool(getattr(args, "use_cpu", False))})
    except BaseException as exc:  # argparse exits; __post_init__ raises ValueError
        out["results"].append({"argv": argv, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
print(json.dumps(out))
"""


def _installed(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _requirements(wheel: Path) -> List[str]:
    """The release's own requirements on the packages whose range moved across releases (hub, tokenizers)
    that the test venv's versions do not satisfy: those are installed beside it."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    need = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None or req.name.lower() not in ("huggingface-hub", "tokenizers", "safetensors"):
            continue
        if not req.specifier.contains(_installed(req.name), prereleases=True):
            need.append(str(req))
    return need


def _pip(*args: str) -> None:
    proc = subprocess.run([PY, "-m", "pip", "--disable-pip-version-check", "-q", *args], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"pip {' '.join(args[:3])}: the registry could not be reached ({proc.stderr.strip()[-200:]})")


def _release(version: str, tmp: Path) -> Path:
    """The release (and the hub/tokenizers it requires) unpacked into a fresh directory, wheels cached."""
    cache = WHEELS / f"transformers-{version}"
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob("transformers-*.whl")):
        _pip("download", "--no-deps", "-d", str(cache), f"transformers=={version}")
    wheel = next(cache.glob("transformers-*.whl"))
    extra = _requirements(wheel)
    have = {p.name.split("-")[0].lower() for p in cache.glob("*.whl")}
    missing = [r for r in extra if r.split("<")[0].split(">")[0].split("=")[0].replace("-", "_").lower() not in have]
    if missing:
        _pip("download", "--no-deps", "--only-binary", ":all:", "-d", str(cache), *missing)
    target = tmp / f"site-{version}"
    wanted = [str(wheel)] + [str(w) for w in cache.glob("*.whl") if not w.name.startswith("transformers-")
                             and any(w.name.lower().startswith(r.split("<")[0].split(">")[0].split("=")[0].replace("-", "_").lower())
                                     for r in extra)]
    _pip("install", "--no-deps", "--no-index", "--target", str(target), *wanted)
    return target


def _flags(version: str, cls, variant: List[str]) -> List[str]:
    """What cpuperf passes a Trainer script for this release, class and request (recommend's hf_args)."""
    env = cli_env({**cls.overrides(), "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"transformers": version}),
                   "CPUPERF_CACHE_DIR": os.devnull + "-none"})
    proc = subprocess.run([PY, "-m", "cpuperf", "recommend", "--json", *variant], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["hf_args_for"] == version
    return data["hf_args"]


@pytest.mark.parametrize("version", RELEASES)
def test_every_class_flag_set_builds_training_arguments(version, tmp_path):
    pytest.importorskip("transformers")
    site = _release(version, tmp_path)
    cases: Dict[str, List[str]] = {f"{cls.name}, {name}": _flags(version, cls, variant)
                                   for cls in CPU_CLASSES for name, variant in VARIANTS.items()}
    argvs = list(dict.fromkeys(json.dumps(a) for a in cases.values()))
    env = {**os.environ, "PYTHONPATH": str(site), "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([PY, "-c", PARSE, json.dumps([json.loads(a) for a in argvs])], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["version"] == version  # that release, not the venv's
    by_argv = {json.dumps(r["argv"]): r for r in got["results"]}
    failures = {case: by_argv[json.dumps(argv)]["error"] for case, argv in cases.items() if not by_argv[json.dumps(argv)]["ok"]}
    assert not failures, failures
    for case, argv in cases.items():
        parsed = by_argv[json.dumps(argv)]
        assert parsed["bf16"] == ("--bf16" in argv), case
    # the coupling the data records, and the case that broke: --set dtype=bf16 on a CPU host
    assert any("--bf16" in argv for case, argv in cases.items() if case.endswith("dtype=bf16"))


def test_accelerate_launch_accepts_what_cpuperf_adds(tmp_path):
    """The installed accelerate's own launch parser takes every option cpuperf adds to `accelerate launch`."""
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    for cls in CPU_CLASSES:
        for variant in VARIANTS.values():
            env = cli_env({**cls.overrides(), "CPUPERF_CACHE_DIR": str(tmp_path / "none")})
            proc = subprocess.run([PY, "-m", "cpuperf", "recommend", "--json", *variant], capture_output=True, text=True,
                                  env=env, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            data = json.loads(proc.stdout)
            args = data["accelerate_launch_args"]
            if "--bf16" in data["hf_args"]:
                args = [*args, "--mixed_precision", "bf16"]
            parsed = parser.parse_args([*args, "train.py"])
            assert parsed.training_script == "train.py"
            if "--num_cpu_threads_per_process" in args:
                assert parsed.num_cpu_threads_per_process == int(args[args.index("--num_cpu_threads_per_process") + 1])
