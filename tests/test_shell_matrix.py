"""ccl-env's output in every shell that may read it: format x shell x hostile value, in real shells.

Any format may be evaluated by any shell (a fish user sources the default output; a bash job script
sources a dotenv file). Hostile values enter through every channel that reaches the output: the user's
own variables that cpuperf manages (kept when valid), list variables cpuperf prepends to (PATH,
LD_LIBRARY_PATH), a vendor env script's exports, the --python path in the header comment. The
properties: nothing runs in any (format, shell) pair; where the format is the shell's own, every
variable the JSON lists comes back byte-identical and nothing else changes; a value that cannot be
written for every shell is refused (absent from the output and the JSON), never mangled.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Dict

import pytest
from fakeenv import SETVARS, add_dist, make_venv, parse_env0, site_packages
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cpuperf.commands import ccl_env
from cpuperf.decide import runtime_env as envplan
from cpuperf.render import shell as cclenv

SHELLS = {"bash": ["bash", "--norc", "--noprofile", "-c"], "zsh": ["zsh", "-f", "-c"],
          "dash": ["dash", "-c"], "fish": ["fish", "--no-config", "-c"]}
FORMATS = ("sh", "bash", "zsh", "fish", "dotenv")
NATIVE = {("sh", "bash"), ("sh", "zsh"), ("sh", "dash"), ("bash", "bash"), ("bash", "zsh"), ("bash", "dash"),
          ("zsh", "bash"), ("zsh", "zsh"), ("zsh", "dash"), ("fish", "fish"), ("sh", "fish"),
          ("dotenv", "bash"), ("dotenv", "zsh"), ("dotenv", "dash")}

FRAGMENTS = ["'", '"', "\\", "\\'", "'\\''", "$(touch {c}/d)", "`touch {c}/t`", "${HOME}", "$HOME",
             "\n", "\r", "\t", "; touch {c}/s #", "(touch {c}/p)", "{a,b}", "*", "~", "!", "%self", "&",
             "|", "#", "=", "\u00e9", "\u2028", "\U0001f600", "\x7f", "\x1b[31m", " ", "1", "29500", "node01"]
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Co"), blacklist_characters="\x00"), max_size=12)
HOSTILE = st.lists(st.one_of(st.sampled_from(FRAGMENTS), TEXT), min_size=1, max_size=6).map("".join)
USER_VARS = ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "CCL_WORKER_COUNT", "CCL_WORKER_AFFINITY",
             "CCL_CONFIGURATION", "CCL_ROOT")


def need_all() -> None:
    for shell in SHELLS:
        if shutil.which(shell) is None:
            pytest.skip(f"{shell} is not installed (apt-get install -y {shell})")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A venv whose oneCCL bindings ship an env script (rewritten per example) and a 2-socket host."""
    from hosts import make_host

    root = tmp_path_factory.mktemp("matrix")
    venv = make_venv(root / "venv")
    site = site_packages(venv)
    add_dist(site, "torch", "2.7.0+cpu", {"torch/__init__.py": ""})
    add_dist(site, "oneccl_bind_pt", "2.7.0+cpu", {"oneccl_bindings_for_pytorch/env/setvars.sh": SETVARS})
    script = site / "oneccl_bindings_for_pytorch" / "env" / "setvars.sh"
    return {"root": root, "python": str(venv / "bin" / "python"), "script": script,
            "host": str(make_host(root / "host", sockets=2, cores_per_socket=4))}


def _evaluate(shell: str, code_file: Path, tmp: Path, export_all: bool = False) -> Dict[str, str]:
    """Evaluate the code as users do (eval / source); `export_all`: `set -a` first, as a dotenv is read."""
    out = tmp / f"env0.{shell}"
    out.unlink(missing_ok=True)
    body = f"source {code_file}; env -0 > {out}" if shell == "fish" else \
        ("set -a; " if export_all else "") + f'eval "$(cat {code_file})"; env -0 > {out}'
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(tmp)}
    subprocess.run(SHELLS[shell] + [body], env=env, cwd=tmp, capture_output=True, timeout=60)
    return parse_env0(out) if out.exists() else {}


@pytest.mark.full  # hundreds of real shells
def test_every_format_in_every_shell_runs_nothing_and_writes_exactly_or_refuses(stack):
    need_all()
    tmp: Path = stack["root"]
    canary = tmp / "canary"
    canary.mkdir()

    # No shrinking: one example runs 20 shells; the failing example is printed as generated.
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(st.dictionaries(st.sampled_from(USER_VARS), HOSTILE, max_size=4), HOSTILE, HOSTILE, HOSTILE)
    def check(user: Dict[str, str], path_entry: str, vendor_value: str, ld_entry: str):
        fill = lambda v: v.replace("{c}", str(canary))  # noqa: E731
        user = {k: fill(v) for k, v in user.items()}
        stack["script"].write_text(SETVARS + f"export VENDOR_VALUE={shlex.quote(fill(vendor_value))}\n")
        environ = dict(os.environ, PATH=os.environ["PATH"] + ":" + fill(path_entry),
                       LD_LIBRARY_PATH=fill(ld_entry), **user)
        opts = ccl_env.Options(python=stack["python"], sysroot=stack["host"], nproc_per_node=2)
        env = ccl_env.build(opts, environ)
        js = cclenv.to_json(env)
        for name, value in js["env"].items():  # everything written can be written for every shell
            assert envplan.shell_safe(value) is None, (name, value)
        for name, value in user.items():  # a user's value is kept exactly when it is valid for its variable
            if name in env.final and envplan.user_value_problem(name, value) is not None:
                assert js["env"].get(name) != value
        for fmt in FORMATS:
            code_file = tmp / f"code.{fmt}"
            code_file.write_text(cclenv.render(env, fmt), encoding="utf-8")
            for shell in SHELLS:
                got = _evaluate(shell, code_file, tmp, export_all=fmt == "dotenv")
                assert list(canary.iterdir()) == [], (fmt, shell)  # nothing ran
                if (fmt, shell) in NATIVE:
                    for name, value in js["env"].items():
                        if name == "PATH" and shell == "fish":
                            continue  # fish's export splits PATH into a list; `env` joins it back
                        assert got.get(name) == value, (fmt, shell, name, got.get(name), value)

    check()


@pytest.mark.parametrize("shell", list(SHELLS))
def test_default_output_sourced_by_fish_style_breakout_stays_inert(shell, stack):
    """The attack the POSIX quoting allowed under fish: a backslash ending one value, code in the next."""
    need_all()
    tmp: Path = stack["root"] / f"breakout-{shell}"
    tmp.mkdir()
    stack["script"].write_text(SETVARS + "export A='x\\'\nexport B=\"; touch " + str(tmp) + "/pwned; #\"\n")
    env = ccl_env.build(ccl_env.Options(python=stack["python"], sysroot=stack["host"]), dict(os.environ))
    for fmt in FORMATS:
        code_file = tmp / f"code.{fmt}"
        code_file.write_text(cclenv.render(env, fmt), encoding="utf-8")
        _evaluate(shell, code_file, tmp)
        assert not (tmp / "pwned").exists(), fmt
    assert "A" not in env.final or "A" not in cclenv.to_json(env)["env"]
    assert any(n.startswith("refused A:") for n in env.notes)


@pytest.mark.parametrize("shell", list(SHELLS))
def test_recommend_env_exports_are_inert_in_every_shell(shell, tmp_path):
    """`cpuperf recommend --format env` prints export lines too: the same rule (written exactly, or refused)."""
    need_all()
    from cpuperf.render.recommendation import env_exports

    env = {"A": "x\\", "B": f"; touch {tmp_path}/pwned #", "C": "it's", "D": f"$(touch {tmp_path}/pwned)",
           "E": "line\nbreak", "OK": "0-3,8"}
    code = tmp_path / "code.sh"
    code.write_text(env_exports(env))
    got = _evaluate(shell, code, tmp_path)
    assert not (tmp_path / "pwned").exists()
    assert got.get("OK") == "0-3,8" and got.get("B") == env["B"] and got.get("D") == env["D"]
    assert "A" not in got and "C" not in got and "E" not in got
