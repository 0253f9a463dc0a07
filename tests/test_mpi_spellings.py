"""Every Open MPI, MPICH (hydra) and Intel MPI option in compat/launchers.toml [mpirun], read as the launcher reads it.

For each option of the table (boolean and value-taking, optional values, two values, hydra's NAME VALUE pairs) and
each way it is spelled (one dash, two dashes, `--NAME=VALUE`), a line `mpirun OPTION... -np 4 python x.py` (and the
option after the count, and under mpiexec / mpiexec.hydra) is read once (cpuperf.plan.command.read_command) and its
ranks told (cpuperf.plan.user_launcher.launcher_ranks): 4 ranks, the script x.py, never an unknown count. The table
is read, not copied: an option added to it is tested here. Pure and fast: nothing is started; one line goes through
`train --dry-run` to show the count reaches the plan."""

from __future__ import annotations

import json
import shlex
from typing import List, Tuple

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.data import load_builtin
from cpuperf.plan.command import read_command
from cpuperf.plan.user_launcher import launcher_ranks

PY = "/usr/bin/python3"
RULE = load_builtin("launchers.toml")["mpirun"]
COUNTS = set(RULE["nproc"]) | set(RULE["per_node"])  # -np 4, -ppn 4: the count itself
# A value each option takes as its users write it (the launchers' own examples); any other: a file name.
VALUES = {"x": "K=V", "map-by": "core", "bind-to": "core", "rank-by": "core", "cpu-set": "0-3", "cpu-list": "0-3",
          "cpus-per-proc": "1", "cpus-per-rank": "1", "ppr": "2:package", "npersocket": "2", "H": "localhost",
          "host": "localhost", "hosts": "localhost", "hostlist": "localhost", "hosts-group": "node[01-02]",
          "binding": "map=spread", "timeout": "60", "genvlist": "K", "envlist": "K", "genvexcl": "K",
          "envexcl": "K", "iface": "eth0", "usize": "8", "umask": "022"}


def _spellings(name: str) -> List[str]:
    """Open MPI and hydra take a long option with one dash or two; a one-letter option with one."""
    return [f"-{name}"] if len(name) == 1 else [f"-{name}", f"--{name}"]


def _cases() -> List[Tuple[str, Tuple[str, ...]]]:
    cases: List[Tuple[str, Tuple[str, ...]]] = []
    for family in ("flags", "optional", "valued", "two_values", "env_pair"):
        for name in RULE[family]:
            for spelled in _spellings(name):
                if family == "flags":
                    forms: List[Tuple[str, ...]] = [(spelled,)]
                elif family == "optional":  # a value only when attached
                    forms = [(spelled,), (f"{spelled}=1",)] if spelled.startswith("--") else [(spelled,)]
                elif family == "valued":
                    value = "4" if name in COUNTS else VALUES.get(name, "hostfile.txt")
                    forms = [(spelled, value)] + ([(f"{spelled}={value}",)] if spelled.startswith("--") else [])
                elif family == "two_values":
                    forms = [(spelled, "btl", "tcp,self")]
                else:  # hydra -genv / -env: NAME VALUE or NAME=VALUE
                    forms = [(spelled, "K", "V"), (spelled, "K=V")]
                cases.extend((family, words) for words in forms)
    return cases


CASES = _cases()


def _ranks(argv: List[str]):
    cmd = read_command(argv).launcher
    assert cmd is not None, argv
    return cmd, launcher_ranks(cmd, logical_cpus=8, physical_cores=8, interpreter=PY)


def test_every_family_of_the_table_is_here():
    families = {family for family, _ in CASES}
    assert families == {"flags", "optional", "valued", "two_values", "env_pair"}
    assert len(CASES) > 300  # every option of Open MPI 4.1 and 5, MPICH hydra and Intel MPI, each spelling
    spelled = {words[0].split("=")[0] for _, words in CASES}
    for option in ("-genvall", "-genv", "-env", "--oversubscribe", "-x", "-np", "-n", "--np", "-ppn", "--map-by",
                   "--bind-to", "-hostfile", "-f", "-machinefile", "-perhost", "-grr", "-rr", "--mca", "-envnone"):
        assert option in spelled, option


@pytest.mark.parametrize("family, words", CASES, ids=[" ".join(words) for _, words in CASES])
def test_each_spelling_is_read_with_the_count_and_the_script(family, words):
    for launcher in ("mpirun", "mpiexec", "mpiexec.hydra"):
        for argv in ([launcher, *words, "-np", "4", "python", "x.py"], [launcher, "-np", "4", *words, "python", "x.py"]):
            cmd, ranks = _ranks(argv)
            line = shlex.join(argv)
            assert cmd.launcher == "mpirun" and cmd.target == ("python", "x.py"), line
            assert ranks.count == 4, (line, ranks.count, ranks.source, ranks.why)
            assert not cmd.unknown, (line, cmd.unknown)  # in the table: never "cpuperf's table lacks it"
            assert "None" not in f"{ranks.source} {ranks.why}", line


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_each_count_option_alone_is_the_count(name):
    for spelled in _spellings(name):
        for words in ([spelled, "4"], *([[f"{spelled}=4"]] if spelled.startswith("--") else [])):
            cmd, ranks = _ranks(["mpirun", *words, "python", "x.py"])
            assert (ranks.count, cmd.target) == (4, ("python", "x.py")), words
            assert ranks.source == " ".join(words)


@pytest.mark.parametrize("words, key, value", [
    (["-x", "K=V"], "K", "V"), (["--x", "K=V"], "K", "V"),
    (["-genv", "K", "V"], "K", "V"), (["-genv", "K=V"], "K", "V"), (["--genv", "K", "V"], "K", "V"),
    (["-env", "K", "V"], "K", "V"), (["-env", "K=V"], "K", "V"),
])
def test_variables_set_on_the_line_are_read_with_their_value(words, key, value):
    cmd, ranks = _ranks(["mpirun", *words, "-np", "4", "python", "x.py"])
    assert ranks.count == 4 and cmd.target == ("python", "x.py")
    assert [(k, v) for k, v, _ in cmd.line_env({})] == [(key, value)]


def test_the_count_reaches_the_plan_through_train(tmp_path):
    """One line with an option of every family, through `train --auto --dry-run --json` on an 8-core host."""
    host = make_host(tmp_path / "host", cores_per_socket=8)
    script = tmp_path / "x.py"
    script.write_text("print('x')\n")
    line = ["mpirun", "-genvall", "-genv", "K", "V", "-env", "A=B", "-x", "C=D", "--oversubscribe", "--mca", "btl",
            "self", "--report-bindings", "--output-filename", "out", "-np", "4", "python", str(script)]
    r = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(host), "--", *line],
                {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cpu"})})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert "None rank" not in r.stdout + r.stderr
    yours = plan["launch"]["yours"]
    assert (yours["launcher"], yours["ranks"], yours["from"]) == ("mpirun", 4, "-np 4"), yours
    assert plan["launch"]["nproc_per_node"] == 4 and plan["launch"]["world_size"] == 4
