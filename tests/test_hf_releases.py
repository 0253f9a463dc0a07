"""Trainer and accelerate arguments that the real releases accept, in every host class.

For each transformers release below, the flags cpuperf would pass (recommend's hf_args for that release, in
every CPU class, one rank and two, with and without --set dtype=bf16) are parsed by that release's own
HfArgumentParser into TrainingArguments, which runs its __post_init__ checks (the couplings between flags:
compat/couplings.toml). The release is installed for real into a throwaway venv, next to the test venv's torch,
from a wheelhouse on this machine (~/.cache/cpuperf-tests/wheelhouse): the registry is asked once per release, on
the first run here.

CI checks the releases where the rules change: either side of the bf16 -> use_cpu coupling (4.51.3, 4.52.1),
the last 4.x, the first 5.x and the installed newest (through the host-class matrix). CPUPERF_SLOW=1 adds the newest patch of every minor from 4.46 on.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from cli_util import cli_env, run_in_process
from host_classes import CLASSES, linked_venv

PY = sys.executable
WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cpuperf-tests" / "wheels"
CORE = ["4.51.3", "4.52.1", "4.57.6", "5.0.0"]  # the last without the bf16 -> use_cpu coupling, its first, the last 4.x, the first 5.x
SLOW = ["4.46.3", "4.47.1", "4.48.3", "4.49.0", "4.50.3", "4.52.4", "4.53.3", "4.54.1", "4.55.4", "4.56.2",
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


def _wheelhouse(version: str) -> Path:
    """That release and its requirements as wheels in a folder on this machine: fetched from the registry once
    (the first run here), read from the folder with --no-index ever after."""
    house = WHEELS.parent / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    with open(house / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two xdist workers fetch one at a time
        if not list(house.glob(f"transformers-{version}-*.whl")):
            proc = subprocess.run([PY, "-m", "pip", "--disable-pip-version-check", "-q", "download", "--only-binary=:all:",
                                   "--dest", str(house), f"transformers=={version}"], capture_output=True, text=True,
                                  timeout=900, env={**os.environ, "PIP_CACHE_DIR": str(WHEELS)})
            if proc.returncode != 0 and ("Could not find" in proc.stderr or "connection" in proc.stderr.lower()):
                pytest.skip(f"transformers=={version}: the registry could not be reached ({proc.stderr.strip()[-200:]})")
            assert proc.returncode == 0, proc.stderr[-2000:]
    return house


def _release(version: str, tmp: Path) -> str:
    """A throwaway venv with that transformers release installed by pip from the local wheelhouse, beside the test
    venv's torch (linked in): pip adds the release and whatever of its requirements the linked packages do not
    satisfy."""
    house = _wheelhouse(version)
    python = linked_venv(tmp / f"venv-{version}", ("transformers", "huggingface_hub", "tokenizers"))
    proc = subprocess.run([PY, "-m", "pip", "--disable-pip-version-check", "-q", "--python", python, "install",
                           "--no-index", "--find-links", str(house), f"transformers=={version}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return python


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _flags(version: str, cls, variant: List[str]) -> List[str]:
    """What cpuperf passes a Trainer script for this release, class and request (recommend's hf_args)."""
    env = cli_env({**cls.overrides(), "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"transformers": version}),
                   "CPUPERF_CACHE_DIR": os.devnull + "-none"})
    proc = run_in_process(["recommend", "--json", *variant], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["hf_args_for"] == version
    return data["hf_args"]


@pytest.mark.full  # installs transformers releases
@pytest.mark.parametrize("version", RELEASES)
def test_every_class_flag_set_builds_training_arguments(version, tmp_path):
    pytest.importorskip("transformers")
    python = _release(version, tmp_path)
    cases: Dict[str, List[str]] = {f"{cls.name}, {name}": _flags(version, cls, variant)
                                   for cls in CPU_CLASSES for name, variant in VARIANTS.items()}
    by_argv: Dict[str, Dict[str, object]] = {}
    for ranks in (False, True):
        # A rank of a two-rank job parses its arguments inside the launcher's environment: a gloo group of its
        # own (world 1) stands in for it, so --ddp_backend and --use_cpu are checked as the rank checks them.
        argvs = list(dict.fromkeys(json.dumps(a) for case, a in cases.items() if case.endswith("two ranks") == ranks))
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
        if ranks:
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        proc = subprocess.run([python, "-c", PARSE, json.dumps([json.loads(a) for a in argvs])], capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["version"] == version  # that release, not the venv's
        by_argv.update({json.dumps(r["argv"]): r for r in got["results"]})
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
            proc = run_in_process(["recommend", "--json", *variant], env)
            assert proc.returncode == 0, proc.stderr[-2000:]
            data = json.loads(proc.stdout)
            args = data["accelerate_launch_args"]
            if "--bf16" in data["hf_args"]:
                args = [*args, "--mixed_precision", "bf16"]
            parsed = parser.parse_args([*args, "train.py"])
            assert parsed.training_script == "train.py"
            if "--num_cpu_threads_per_process" in args:
                assert parsed.num_cpu_threads_per_process == int(args[args.index("--num_cpu_threads_per_process") + 1])


@pytest.mark.parametrize("version, gpu_bf16, needed", [("4.51.3", False, False), ("4.52.1", False, True),
                                                        ("5.23.0", False, True), ("5.23.0", True, False),
                                                        (None, False, True), ("not.a.version", False, True)])
def test_the_bf16_coupling_holds_from_its_first_release_on_a_cpu(version, gpu_bf16, needed):
    """compat/couplings.toml: --bf16 needs --use_cpu from 4.52 where no GPU has bf16; an unknown release gets the
    companion (harmless where the check is absent, a crash where it is present and missing)."""
    from cpuperf.knowledge.hf_couplings import companions

    got = companions("transformers", version, {"bf16"}, gpu_bf16=gpu_bf16)
    assert [c.requires for c in got] == (["use_cpu"] if needed else [])
    assert not companions("transformers", version, {"bf16", "use_cpu"}, gpu_bf16=gpu_bf16)
