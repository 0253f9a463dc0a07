"""cpuperf writes only its own files in its run directory (issue 53, cases 1-3): never through a link that stands
where its file goes, never over a file it did not write there (a project's own fsdp_config.json under `--out .`).
Files under a temp dir; a victim file outside the run directory that must keep its bytes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from cli_util import run_cli

from cpuperf.commands.train import _write_config_files
from cpuperf.errors import ExitCode, FilesystemError
from cpuperf.render import plot

METRICS = "\n".join(json.dumps({"type": "step", "step": s, "loss": 6.0 - s / 10, "samples_per_s": 90.0 + s})
                    for s in range(1, 6)) + "\n"
VICTIM = b"the user's own bytes\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    return victim


@pytest.mark.parametrize("name", ["plot.svg", "plot.png"])
def test_the_plot_replaces_a_link_and_never_writes_through_it(tmp_path, name):
    """`ln -s victim proj/plot.png`: the PNG's bytes went to the victim (plot.svg was already safe)."""
    if name == "plot.png":
        pytest.importorskip("matplotlib")
    victim = _victim(tmp_path)
    run = tmp_path / "proj"
    run.mkdir()
    (run / "metrics.jsonl").write_text(METRICS)
    (run / name).symlink_to(victim)
    got = plot.plot_run(str(run))
    assert str(run / name) in got["files"]
    assert victim.read_bytes() == VICTIM
    assert not (run / name).is_symlink() and (run / name).stat().st_size > 100


def test_a_config_file_is_created_new(tmp_path):
    path = tmp_path / "o" / "fsdp_config.json"
    _write_config_files(((str(path), '{"a": 1}'),))
    assert path.read_text() == '{"a": 1}\n'
    _write_config_files(((str(path), '{"a": 1}'),))  # an earlier run of the same plan into the same --out
    assert path.read_text() == '{"a": 1}\n'


@pytest.mark.parametrize("there", ["link", "dangling-link", "own-file", "directory"])
def test_a_config_file_never_overwrites_what_cpuperf_did_not_write(tmp_path, there):
    """A link to a file outside was written through; a project's own fsdp_config.json under `--out .` was
    overwritten silently with exit 0. Both are refused (exit 10), and what was there keeps its bytes."""
    victim = _victim(tmp_path)
    path = tmp_path / "o" / "fsdp_config.json"
    path.parent.mkdir()
    if there == "link":
        path.symlink_to(victim)
    elif there == "dangling-link":
        path.symlink_to(tmp_path / "not-yet")
    elif there == "own-file":
        path.write_bytes(VICTIM)
    else:
        path.mkdir()
    with pytest.raises(FilesystemError) as err:
        _write_config_files(((str(path), '{"a": 1}'),))
    assert str(path) in err.value.message and err.value.code == ExitCode.FILESYSTEM
    assert victim.read_bytes() == VICTIM and not (tmp_path / "not-yet").exists()
    if there == "own-file":
        assert path.read_bytes() == VICTIM


@pytest.mark.full  # a real run of a user's command
@pytest.mark.parametrize("where", ["link", "own-file"])
def test_train_with_fsdp_flags_keeps_a_users_file(tmp_path, where):
    """Case 1 and 2 through the CLI: `--set sharding=fsdp --hf-flags always --out o` with o/fsdp_config.json a link
    to a victim, or the project's own file under `--out .`: refused before the command starts, the file kept."""
    victim = _victim(tmp_path)
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = tmp_path / "o" if where == "link" else tmp_path
    out.mkdir(exist_ok=True)
    if where == "link":
        (out / "fsdp_config.json").symlink_to(victim)
    else:
        (out / "fsdp_config.json").write_bytes(VICTIM)
    proc = run_cli(["train", "--auto", "--set", "sharding=fsdp", "--hf-flags", "always", "--out",
                    "o" if where == "link" else ".", "--", sys.executable, str(script)], cwd=str(tmp_path))
    if "--fsdp_config" not in proc.stderr + proc.stdout:
        pytest.skip(f"no --fsdp_config flag added here: {proc.stderr[-500:]}")
    assert proc.returncode == ExitCode.FILESYSTEM, proc.stderr[-1500:]
    assert "cpuperf does not overwrite it" in proc.stderr
    assert victim.read_bytes() == VICTIM and not marker.exists()
    assert os.path.islink(out / "fsdp_config.json") == (where == "link")
