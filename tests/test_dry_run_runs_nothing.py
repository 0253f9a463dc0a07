"""`train --dry-run` starts no program of the user's (issue 53, case 5): a script's Python that is the user's own
wrapper, or the interpreter on a launcher's `#!` line, ran under --dry-run to read transformers' defaults for
--model_type. Each writes a marker when it runs; the dry run leaves none and says what it assumed instead."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from cli_util import run_cli

MARKER_CODE = '#!/bin/sh\necho ran >> "{marker}"\nexec {python} "$@"\n'


def _program(path: Path, marker: Path) -> Path:
    path.write_text(MARKER_CODE.format(marker=marker, python=sys.executable))
    path.chmod(0o755)
    return path


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "script.py"
    script.write_text("from transformers import HfArgumentParser, TrainingArguments\n")
    return script


def test_a_dry_run_starts_no_wrapper_named_python(tmp_path):
    marker = tmp_path / "ran"
    wrapper = _program(tmp_path / "python3-wrapper", marker)
    argv = ["train", "--auto", "--dry-run", "--", str(wrapper), str(_script(tmp_path)), "--model_type", "gpt2"]
    proc = run_cli(argv, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert not marker.exists(), "the dry run started the user's program"
    assert "# assumed: --model_type gpt2: a dry run starts no program of yours" in proc.stdout
    got = json.loads(run_cli([*argv[:3], "--json", *argv[3:]], cwd=str(tmp_path)).stdout)
    assert "a dry run starts no program of yours" in got["workload"]["found"]
    assert not marker.exists()


def test_a_dry_run_starts_no_interpreter_a_launchers_shebang_names(tmp_path):
    marker = tmp_path / "ran"
    interpreter = _program(tmp_path / "my-interpreter", marker)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "torchrun"
    launcher.write_text(f"#!{interpreter}\nimport sys\n")
    launcher.chmod(0o755)
    proc = run_cli(["train", "--auto", "--dry-run", "--", "torchrun", "--nproc-per-node", "1",
                    str(_script(tmp_path)), "--model_type", "gpt2"],
                   extra_env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert not marker.exists(), "the dry run started the interpreter on the launcher's #! line"
    assert "# assumed:" in proc.stdout
