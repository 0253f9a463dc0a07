"""`cpuperf ccl-env`: sources, tuned variables, quoting, idempotence, in real bash, zsh and fish.

Fake environments are real venvs (python -m venv) whose site-packages hold distribution metadata
(dist-info RECORD) and env scripts, as the registry wheels and the bindings lay them out.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from cli_util import cli_env, run_cli
from fakeenv import SETVARS, add_dist, make_venv, parse_env0, site_packages
from hosts import make_host
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpuperf.decide import runtime_env as envplan
from cpuperf.decide.placement import plan_placement
from cpuperf.errors import UsageError
from cpuperf.probe import probe_host
from cpuperf.render import shell as cclenv
from cpuperf.run import vendor_env as envsources

SHELLS = {"bash": ["bash", "--norc", "--noprofile", "-c"], "zsh": ["zsh", "-f", "-c"],
          "dash": ["dash", "-c"], "sh": ["sh", "-c"], "fish": ["fish", "--no-config", "-c"]}
HOSTILE = ["two words", "it's", 'say "hi"', "$(touch {canary}/dollar)", "`touch {canary}/tick`",
           "line1\nline2", "back\\slash", "; touch {canary}/semi #", "'; touch {canary}/q; '", "$HOME ${HOME}",
           "tab\there", "glob * ?", "\\'", "'\\''"]


def need(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (apt-get install -y {shell})")
    return path


@pytest.fixture(scope="module")
def ccl_venv(tmp_path_factory) -> Path:
    """torch 2.7.0 + oneccl_bind_pt 2.7.0 (metadata and env script only): the matrix says ccl is usable."""
    venv = make_venv(tmp_path_factory.mktemp("cclvenv") / "venv")
    site = site_packages(venv)
    add_dist(site, "torch", "2.7.0+cpu", {"torch/__init__.py": ""})
    add_dist(site, "oneccl_bind_pt", "2.7.0+cpu", {
        "oneccl_bindings_for_pytorch/__init__.py": "raise ImportError('never imported by cpuperf')\n",
        "oneccl_bindings_for_pytorch/env/setvars.sh": SETVARS})
    return venv


@pytest.fixture()
def host2(tmp_path) -> str:
    return str(make_host(tmp_path / "host", sockets=2, cores_per_socket=16))


def ccl(args: List[str], env: Optional[Dict[str, str]] = None, *, rc: int = 0):
    proc = run_cli(["ccl-env", *args], extra_env=env)
    assert proc.returncode == rc, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    return proc


def ccl_json(args: List[str], env: Optional[Dict[str, str]] = None) -> dict:
    return json.loads(ccl([*args, "--json"], env).stdout)


# -- pure: the plan -----------------------------------------------------------------------------------

def test_backend_choice_names_the_reason():
    from cpuperf.knowledge.addons import cpu_ddp_backend

    gloo = cpu_ddp_backend("2.13.0+cpu", None)
    assert gloo.name == "gloo" and "oneccl_bind_pt is not installed" in gloo.reason \
        and "last CPU release 2.7.0" in gloo.reason and "2.13.0+cpu is newer" in gloo.reason
    assert cpu_ddp_backend("2.7.0+cpu", "2.7.0+cpu").name == "ccl"
    mismatch = cpu_ddp_backend("2.8.0", "2.7.0+cpu")
    assert mismatch.name == "gloo" and "built for torch 2.7" in mismatch.reason


def test_one_backend_rule_and_a_recorded_decision_read_back(tmp_path):
    """decide/backend.py: several CPU ranks get ccl only on x86 with bindings that fit (an Arm host never, even with
    them installed); a recorded decision is read back without the matrix, and a plan that recorded none (a GPU plan)
    gets the same rule, as ccl-env renders it."""
    import dataclasses

    from hosts import fixture_host

    from cpuperf.decide.backend import cpu_backend, recorded_backend
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import PRESETS
    from cpuperf.plan.environment import decisions_of

    fits = {"torch": "2.7.0+cpu", "oneccl_bind_pt": "2.7.0+cpu"}
    x86 = probe_host(sysroot=str(make_host(tmp_path / "x", sockets=2, cores_per_socket=4)), software=False)
    arm = probe_host(sysroot=str(fixture_host(tmp_path, "linux-amazon-neoverse_v1")), software=False)
    assert cpu_backend(x86, fits, "3.11").name == "ccl"
    assert cpu_backend(arm, fits, "3.11")[:2] == ("gloo", "gloo, PyTorch's built-in CPU backend: the oneCCL bindings "
                                                 "(oneccl_bind_pt) has no aarch64 build: it does not apply to this "
                                                 "aarch64 (neoverse_v1) host")
    assert recorded_backend("ccl", {}, "why").name == "ccl"
    assert recorded_backend(None, {"several_ranks": "gloo", "several_ranks_reason": "r"}, "one rank")[:2] == ("gloo", "r")
    assert recorded_backend("nccl", {}, "NCCL for NVIDIA GPUs") is None
    rec = recommend(arm, PRESETS["tiny"], RecommendRequest(nproc_per_node=2, device="cpu", overrides={"oversubscribe": True}))
    assert decisions_of(arm, rec).backend == cpu_backend(arm, rec.stack, None)
    nccl = dataclasses.replace(rec.levers.ddp_backend, value="nccl", evidence={})
    gpu_plan = dataclasses.replace(rec, levers=dataclasses.replace(rec.levers, ddp_backend=nccl))
    assert decisions_of(arm, gpu_plan).backend == cpu_backend(arm, rec.stack, None)
    # one rank records what several would use by the same rule, so ccl-env gives one reason on either count
    one = recommend(arm, PRESETS["tiny"], RecommendRequest(nproc_per_node=1, device="cpu"))
    assert decisions_of(arm, one).backend == cpu_backend(arm, one.stack, None)
    assert decisions_of(arm, gpu_plan).backend.name == "gloo"


def test_runtime_env_ccl_two_sockets_workers_domains_and_rendezvous(host2):
    facts = probe_host(sysroot=host2, software=False)
    placement = plan_placement(facts, 2, ccl=True)
    env = envplan.runtime_env(facts, placement, envplan.RuntimeEnvRequest(backend="ccl", mpi="intelmpi", environ={}, threads=placement.threads_per_rank))
    got = {v.name: v.value for v in env.vars}
    assert got["OMP_NUM_THREADS"] == "12" and got["CCL_WORKER_COUNT"] == "4"
    unset = envplan.runtime_env(facts, placement, envplan.RuntimeEnvRequest(backend="ccl", mpi="intelmpi", environ={}, threads=None))
    assert "OMP_NUM_THREADS" not in {v.name for v in unset.vars}  # no count decided: torch's own stands
    assert got["CCL_WORKER_AFFINITY"] == "0,1,2,3,16,17,18,19"
    assert got["I_MPI_PIN_DOMAIN"] == f"[{hex(0xfff0)},{hex(0xfff0 << 16)}]"
    assert got["MASTER_ADDR"] == "127.0.0.1" and got["MASTER_PORT"] == "29500"
    assert "KMP_AFFINITY" not in got and "LD_PRELOAD" not in got  # GNU OpenMP: no KMP_*; no preload unasked
    assert all(v.reason for v in env.vars)


def test_kmp_only_with_libiomp5_preloaded(host2):
    facts = probe_host(sysroot=host2, software=False)
    one = plan_placement(facts, 1)
    plain = envplan.runtime_env(facts, one, envplan.RuntimeEnvRequest(backend="gloo", environ={}))
    assert not any(v.name.startswith("KMP_") for v in plain.vars)
    iomp = envplan.runtime_env(facts, one, envplan.RuntimeEnvRequest(backend="gloo", environ={"LD_PRELOAD": "/opt/lib/libiomp5.so"}))
    assert {v.name for v in iomp.vars} >= {"KMP_AFFINITY", "KMP_BLOCKTIME"}
    libs = envplan.Libraries(openmp={"iomp": ("/x/libiomp5.so",)}, allocators={"tcmalloc": ("/x/libtcmalloc.so.4",)})
    pre = envplan.runtime_env(facts, one, envplan.RuntimeEnvRequest(backend="gloo", environ={}, preload=True, libraries=libs))
    got = {v.name: v for v in pre.vars}
    assert got["LD_PRELOAD"].value == "/x/libiomp5.so:/x/libtcmalloc.so.4" and got["LD_PRELOAD"].kind == "prepend"
    assert "KMP_AFFINITY" in got


def test_preload_without_a_decision_keeps_the_multi_rank_rule(host2):
    """--preload with no decided allocator falls back to one installed, never to one that aborts jobs of several ranks
    at exit (compat/tuning.toml [allocator] not_with_ranks): the rule recommend decides by, here too."""
    facts = probe_host(sysroot=host2, software=False)
    libs = envplan.Libraries(allocators={"mimalloc": ("/x/libmimalloc.so",)})
    one = envplan.runtime_env(facts, plan_placement(facts, 1), envplan.RuntimeEnvRequest(backend="gloo", environ={}, preload=True, libraries=libs))
    assert {v.name: v.value for v in one.vars}["LD_PRELOAD"] == "/x/libmimalloc.so"
    two = envplan.runtime_env(facts, plan_placement(facts, 2), envplan.RuntimeEnvRequest(backend="gloo", environ={}, preload=True, libraries=libs))
    assert "LD_PRELOAD" not in {v.name for v in two.vars}
    assert any("mimalloc aborted jobs of 2 ranks" in n for n in two.notes), two.notes
    both = envplan.Libraries(allocators={"mimalloc": ("/x/libmimalloc.so",), "jemalloc": ("/x/libjemalloc.so.2",)})
    two = envplan.runtime_env(facts, plan_placement(facts, 2), envplan.RuntimeEnvRequest(backend="gloo", environ={}, preload=True, libraries=both))
    assert {v.name: v.value for v in two.vars}["LD_PRELOAD"] == "/x/libjemalloc.so.2"


def test_multi_node_master_and_interface(host2):
    facts = probe_host(sysroot=host2, software=False)
    placement = plan_placement(facts, 2)
    hosts = envplan_hosts("node07 slots=2\nnode08 slots=2\n")
    env = envplan.runtime_env(facts, placement, envplan.RuntimeEnvRequest(backend="gloo", hosts=hosts, socket_ifname="eth1", environ={}))
    got = {v.name: v.value for v in env.vars}
    assert got["MASTER_ADDR"] == "node07" and got["GLOO_SOCKET_IFNAME"] == "eth1" and env.nnodes == 2
    unknown = envplan.runtime_env(facts, placement, envplan.RuntimeEnvRequest(backend="gloo", hosts=hosts, environ={}))
    assert "GLOO_SOCKET_IFNAME" not in {v.name for v in unknown.vars}
    assert any("GLOO_SOCKET_IFNAME" in n for n in unknown.notes)
    with pytest.raises(UsageError):
        envplan.runtime_env(facts, placement, envplan.RuntimeEnvRequest(backend="gloo", nnodes=2, environ={}))  # no address at all
    with pytest.raises(UsageError):
        envplan.runtime_env(facts, placement, envplan.RuntimeEnvRequest(backend="gloo", master_addr="$(reboot)", environ={}))
    with pytest.raises(UsageError):
        envplan.check_port(70000)


def envplan_hosts(text: str):
    from cpuperf.probe.hosts import parse_hostfile_text

    return parse_hostfile_text(text)


def test_merge_prepends_without_duplicates_or_empty_entries_and_is_idempotent():
    cur = {"PATH": "/usr/bin::/bin:", "OMP_NUM_THREADS": "7", "LD_LIBRARY_PATH": ""}
    wanted = [envplan.EnvVar("PATH", "/opt/a/bin:/usr/bin", "s", "r", "prepend"),
              envplan.EnvVar("LD_LIBRARY_PATH", "/opt/a/lib:", "s", "r", "prepend"),
              envplan.EnvVar("OMP_NUM_THREADS", "4", "cpuperf", "r"),
              envplan.EnvVar("BAD-NAME", "x", "s", "r"), envplan.EnvVar("SHLVL", "9", "s", "r")]
    first = envplan.merge_env(cur, wanted)
    assert first.final["PATH"] == "/opt/a/bin:/usr/bin:/bin"
    assert first.final["LD_LIBRARY_PATH"] == "/opt/a/lib"
    assert first.final["OMP_NUM_THREADS"] == "7" and [k.name for k in first.kept] == ["OMP_NUM_THREADS"]
    assert first.skipped == ("BAD-NAME", "SHLVL")
    again = envplan.merge_env({**cur, **first.final}, wanted)
    assert again.final == first.final
    assert envplan.merge_env(cur, wanted, override=True).final["OMP_NUM_THREADS"] == "4"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc/:", max_size=6), max_size=4), st.lists(st.text(alphabet="abc/:", max_size=6), max_size=4))
def test_merge_is_idempotent_for_any_path_lists(current, added):
    cur = {"PATH": ":".join(current)}
    wanted = [envplan.EnvVar("PATH", ":".join(added), "s", "r", "prepend"),
              envplan.EnvVar("PATH", ":".join(reversed(added)), "s", "r", "append")]
    once = envplan.merge_env(cur, wanted).final
    assert envplan.merge_env({**cur, **once}, wanted).final == once
    assert "" not in once["PATH"].split(":") or once["PATH"] == ""


def test_diff_env_drops_empty_and_duplicate_entries():
    before = {"PATH": "/usr/bin:/bin", "KEEP": "1"}
    after = {"PATH": "/opt/x/bin::/opt/x/bin:/usr/bin:/bin:/opt/tail", "KEEP": "1", "NEW": "v", "_": "/usr/bin/env"}
    found, notes = envsources.diff_env(before, after, "s.sh")
    got = {(v.name, v.kind): v.value for v in found}
    assert got == {("PATH", "prepend"): "/opt/x/bin", ("PATH", "append"): "/opt/tail", ("NEW", "set"): "v"}
    assert notes == []


def test_find_dists_from_metadata_directory_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, names in ((a, ["oneccl_cpu-2022.1.2.dist-info", "torch-2.7.1+cpu.dist-info", "numpy-2.0.dist-info"]),
                     (b, ["oneccl-2021.15.0.dist-info", "torch-2.8.0.dist-info",
                          "torch_ccl-1.10.0+cpu-py3.8-linux-x86_64.egg-info"])):
        for n in names:
            (d / n).mkdir(parents=True)
    found = envsources.find_dists([str(a), str(b)])
    assert found["torch"].version == "2.7.1+cpu"  # first on the path, as an import would pick
    assert found["oneccl"].name == "oneccl"  # the full runtime preferred over oneccl-cpu
    assert (found["bindings"].name, found["bindings"].version) == ("torch_ccl", "1.10.0+cpu")
    assert "impi" not in found


# -- pure: rendering ----------------------------------------------------------------------------------

def test_quoting_rules():
    assert cclenv.quote_posix("a b$(x)") == "'a b$(x)'" == cclenv.quote_fish("a b$(x)")
    assert cclenv.quote_dotenv("/usr/bin:/bin") == "/usr/bin:/bin"
    assert cclenv.quote_dotenv("two words") == "'two words'"
    assert cclenv.quote_dotenv("=ls") == "'=ls'" and cclenv.quote_dotenv("~") == "'~'"
    for unsafe in ("a'b", "a\\", "a\nb", "\x1b[31m", "\u2028"):  # no quoting means the same in sh and fish
        for quote in (cclenv.quote_posix, cclenv.quote_fish, cclenv.quote_dotenv):
            with pytest.raises(UsageError):
                quote(unsafe)
    assert cclenv.one_line("a\nb\rc") == "a?b?c"
    assert cclenv.comment("$(x) `y` 'z' \\") == "?(x) ?y? ?z? ?"


def test_default_shell_is_posix_and_unknown_shell_refused():
    assert cclenv.DEFAULT_SHELL == "sh"
    assert render_one("X", "v", "sh") == render_one("X", "v", "bash") == render_one("X", "v", "zsh")
    with pytest.raises(UsageError):
        cclenv.check_shell("csh")


def render_one(name: str, value: str, shell: str) -> str:
    env = cclenv.CclEnv(backend="gloo", backend_reason="", final={name: value},
                        vars=(envplan.EnvVar(name, value, "src\n$(touch x)", "why\nnot"),), kept=(), sources=(), notes=())
    return cclenv.render(env, shell)


def test_comments_cannot_break_out():
    text = render_one("X", "v", "bash")
    assert all(line.startswith(("#", "export ")) for line in text.splitlines())


# -- real shells: quoting round trip ------------------------------------------------------------------

VALUES = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Co"), blacklist_characters="\x00"),
                 max_size=40)


def _roundtrip(shell: str, value: str, tmp: Path, rendered_for: Optional[str] = None) -> Optional[str]:
    code = render_one("CPUPERF_T", value, rendered_for or shell)
    script = tmp / f"code.{shell}"
    script.write_text(code, encoding="utf-8")
    out = tmp / "env0"
    if shell == "fish":
        body = f"source {script}; env -0 > {out}"
    else:
        body = f'eval "$(cat {script})"; env -0 > {out}'
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8", "HOME": str(tmp)}
    proc = subprocess.run(SHELLS[shell] + [body], env=env, cwd=tmp, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return parse_env0(out).get("CPUPERF_T")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_quoting_round_trips_arbitrary_text_in_real_shell(shell, tmp_path_factory):
    need(shell)
    tmp = tmp_path_factory.mktemp(f"rt-{shell}")

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(VALUES)
    def check(value):
        assert _roundtrip(shell, value, tmp) == (value if envplan.shell_safe(value) is None else None)

    check()
    for value in HOSTILE:
        value = value.replace("{canary}", str(tmp))
        assert _roundtrip(shell, value, tmp) == (value if envplan.shell_safe(value) is None else None)
    assert list(tmp.glob("dollar")) == list(tmp.glob("tick")) == list(tmp.glob("semi")) == list(tmp.glob("q")) == []


# Hostile fragments glued together by hypothesis: quotes, substitutions, backticks, newlines,
# backslashes, fish's escapes, comment starters, non-ASCII text.
FRAGMENTS = ["'", '"', "\\", "\\'", "'\\''", "$(touch {canary}/dollar)", "`touch {canary}/tick`", "${HOME}",
             "\n", "\r", "\t", "; touch {canary}/semi #", "(touch {canary}/paren)", "{a,b}", "*", "~", "!",
             "%", "&", "|", "#", "\u00e9", "\u2028", "\U0001f600", "\x7f", "\x1b[31m", " "]
HOSTILE_VALUES = st.lists(st.one_of(st.sampled_from(FRAGMENTS), VALUES), max_size=8).map("".join)


@pytest.mark.parametrize("shell", ["bash", "zsh", "dash", "fish"])
def test_default_output_is_injection_safe_in_every_shell(shell, tmp_path_factory):
    """The default (POSIX sh) output in bash, zsh and dash, and --shell fish in fish: every hostile
    value comes back byte-identical and nothing runs (no canary file appears)."""
    need(shell)
    tmp = tmp_path_factory.mktemp(f"inj-{shell}")
    rendered_for = "fish" if shell == "fish" else cclenv.DEFAULT_SHELL
    canary = tmp / "canary"
    canary.mkdir()

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(HOSTILE_VALUES)
    def check(value):
        value = value.replace("{canary}", str(canary))
        got = _roundtrip(shell, value, tmp, rendered_for)
        assert got == (value if envplan.shell_safe(value) is None else None)  # written exactly, or refused
        assert list(canary.iterdir()) == []  # nothing in any value ran

    check()


def test_default_output_ignores_login_shell(tmp_path):
    """$SHELL=fish (the login shell) must not turn the default into fish syntax."""
    proc = run_cli(["ccl-env"], {"SHELL": "/usr/bin/fish", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert lines and all(line.startswith("export ") for line in lines), proc.stdout
    fish = run_cli(["ccl-env", "--shell", "fish"], {"HOME": str(tmp_path)})
    assert fish.returncode == 0 and "set -gx " in fish.stdout


# -- real shells: eval, the JSON's variables, idempotence ---------------------------------------------

def _eval_twice(shell: str, args: List[str], tmp: Path, env: Dict[str, str]) -> Dict[str, Dict[str, str]]:
    wrapper = tmp / "cpuperf-ccl-env"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m cpuperf ccl-env {' '.join(args)} \"$@\"\n")
    wrapper.chmod(0o755)
    if shell == "fish":
        body = (f"env -0 > {tmp}/before; {wrapper} --json > {tmp}/j.json; {wrapper} --shell fish | source; "
                f"env -0 > {tmp}/after1; {wrapper} --shell fish | source; env -0 > {tmp}/after2")
    else:
        body = (f'env -0 > {tmp}/before; {wrapper} --json > {tmp}/j.json; eval "$({wrapper} --shell {shell})"; '
                f'env -0 > {tmp}/after1; eval "$({wrapper} --shell {shell})"; env -0 > {tmp}/after2')
    proc = subprocess.run(SHELLS[shell] + [body], env=env, cwd=tmp, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {"before": parse_env0(tmp / "before"), "after1": parse_env0(tmp / "after1"),
            "after2": parse_env0(tmp / "after2"), "json": json.loads((tmp / "j.json").read_text())}


def _hostile_env(tmp: Path) -> Dict[str, str]:
    env = cli_env({"LC_ALL": "C.UTF-8", "HOME": str(tmp)})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PATH"] = env["PATH"] + ":/opt/$(touch " + str(tmp) + "/pathpwn):"  # a hostile entry, and a trailing ':'
    env["MASTER_PORT"] = "2950'0; touch " + str(tmp) + "/portpwn"  # kept (user's value), must stay inert
    env["CCL_WORKER_COUNT"] = "`touch " + str(tmp) + "/tick`\nnewline"
    return env


@pytest.mark.smoke("ccl-env")  # eval "$(cpuperf ccl-env)" in real shells, twice
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_eval_sets_exactly_the_json_env_and_is_idempotent(shell, tmp_path, ccl_venv, host2):
    need(shell)
    env = _hostile_env(tmp_path)
    run = _eval_twice(shell, ["--python", str(ccl_venv / "bin" / "python"), "--sysroot", host2,
                              "--nproc-per-node", "2"], tmp_path, env)
    before, after1, after2, js = run["before"], run["after1"], run["after2"], run["json"]
    assert js["schema"] == "cpuperf.ccl-env/1" and js["backend"] == "ccl"
    for name, value in js["env"].items():
        assert after1.get(name) == value, (name, after1.get(name), value)
    shell_owned = {"_", "SHLVL"}  # zsh -c execs its last command: SHLVL differs by itself
    changed = {k for k in after1 if before.get(k) != after1[k]} - shell_owned
    assert changed <= set(js["env"]), changed - set(js["env"])
    assert {k: v for k, v in after2.items() if k not in shell_owned} == \
        {k: v for k, v in after1.items() if k not in shell_owned}
    # the bindings' script was sourced (found through RECORD, never imported)
    root = str((site_packages(ccl_venv) / "oneccl_bindings_for_pytorch").resolve())
    assert after1["CCL_ROOT"] == root and after1["CCL_CONFIGURATION"] == "cpu"
    assert after1["LD_LIBRARY_PATH"] == root + "/lib"
    assert after1["FI_PROVIDER_PATH"] == root + "/lib/prov"
    assert after1["PATH"].startswith(root + "/bin:") and "" not in after1["PATH"].split(":")
    assert after1["CCL_WORKER_AFFINITY"] == "0,1,2,3,16,17,18,19" and after1["OMP_NUM_THREADS"] == "12"
    # the user's values are not valid for their variables: replaced, reported (never echoed), nothing ran
    assert after1["MASTER_PORT"] == "29500" and after1["CCL_WORKER_COUNT"] == js["env"]["CCL_WORKER_COUNT"] != \
        env["CCL_WORKER_COUNT"]
    assert js["kept"] == [] and {i["name"] for i in js["invalid"]} == {"MASTER_PORT", "CCL_WORKER_COUNT"}
    assert not any((tmp_path / f).exists() for f in ("pathpwn", "portpwn", "tick"))


def test_override_replaces_user_values(ccl_venv, host2):
    js = ccl_json(["--python", str(ccl_venv / "bin" / "python"), "--sysroot", host2, "--override"],
                  {"OMP_NUM_THREADS": "99", "MASTER_ADDR": "10.1.1.1"})
    assert js["env"]["OMP_NUM_THREADS"] != "99" and js["env"]["MASTER_ADDR"] == "127.0.0.1" and js["kept"] == []


HOSTILE_SCRIPT = textwrap.dedent('''\
    export EVIL1='$(touch {canary}/s1)'
    export EVIL2='`touch {canary}/s2`'
    export EVIL3="it's \\"quoted\\" ; touch {canary}/s3"
    export EVIL4="two
    lines'; touch {canary}/s4; '"
    export EVIL5='\\'"'"'\\\\'
    ''')


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_hostile_values_from_a_setvars_script_never_run(shell, tmp_path):
    need(shell)
    venv = make_venv(tmp_path / "venv")
    site = site_packages(venv)
    add_dist(site, "torch", "2.7.0", {"torch/__init__.py": ""})
    add_dist(site, "oneccl_bind_pt", "2.7.0+cpu", {
        "oneccl_bindings_for_pytorch/env/setvars.sh": HOSTILE_SCRIPT.format(canary=tmp_path)})
    env = cli_env({"LC_ALL": "C.UTF-8", "HOME": str(tmp_path)})
    run = _eval_twice(shell, ["--python", str(venv / "bin" / "python")], tmp_path, env)
    after1, js = run["after1"], run["json"]
    for name in ("EVIL1", "EVIL2"):  # inert in single quotes for every shell: written exactly
        assert after1[name] == js["env"][name]
    assert after1["EVIL1"] == f"$(touch {tmp_path}/s1)"
    for name in ("EVIL3", "EVIL4", "EVIL5"):  # a quote, a newline, a backslash: refused, not written
        assert name not in after1 and name not in js["env"]
    assert list(tmp_path.glob("s[0-9]")) == []


# -- the command: sources, errors, output modes -------------------------------------------------------

def test_failing_script_is_one_line_error_and_nothing_on_stdout(tmp_path):
    venv = make_venv(tmp_path / "venv")
    site = site_packages(venv)
    add_dist(site, "torch", "2.7.0", {"torch/__init__.py": ""})
    add_dist(site, "oneccl_bind_pt", "2.7.0+cpu", {
        "oneccl_bindings_for_pytorch/env/setvars.sh": "echo 'vars.sh: cannot find libccl' >&2\nreturn 3\n"})
    proc = ccl(["--python", str(venv / "bin" / "python")], rc=5)
    assert proc.stdout == ""
    assert "exit 3" in proc.stderr and "cannot find libccl" in proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 2  # message + hint
    exits = tmp_path / "exits"
    make_venv(exits)
    add_dist(site_packages(exits), "torch", "2.7.0", {"torch/__init__.py": ""})
    add_dist(site_packages(exits), "oneccl_bind_pt", "2.7.0", {"oneccl_bindings_for_pytorch/env/vars.sh": "exit 0\n"})
    proc = ccl(["--python", str(exits / "bin" / "python")], rc=5)
    assert proc.stdout == "" and "exited the shell" in proc.stderr


def test_registry_wheel_layout_conda_prefix_and_path(tmp_path):
    """impi-rt / oneccl wheels: etc/conda/activate.d scripts (listed in RECORD) read CONDA_PREFIX."""
    venv = make_venv(tmp_path / "venv")
    site = site_packages(venv)
    up = os.path.relpath(venv, site)
    add_dist(site, "impi_rt", "2021.18.1", {
        f"{up}/etc/conda/activate.d/mpivars.activate.sh":
            'export I_MPI_ROOT="${CONDA_PREFIX}"\nexport LD_LIBRARY_PATH="${I_MPI_ROOT}/lib:${LD_LIBRARY_PATH}"\n',
        f"{up}/bin/mpirun": "#!/bin/sh\n"}, executable=True)
    add_dist(site, "oneccl_cpu", "2022.1.2", {f"{up}/etc/conda/activate.d/onecclvars.activate.sh":
                                              'export CCL_ROOT="${CONDA_PREFIX}"\n'})
    js = ccl_json(["--python", str(venv / "bin" / "python"), "--nproc-per-node", "1"])
    prefix = str(venv.resolve())
    assert js["env"]["I_MPI_ROOT"] == prefix and js["env"]["CCL_ROOT"] == prefix
    assert js["env"]["LD_LIBRARY_PATH"].split(":")[0] == prefix + "/lib"
    assert js["env"]["PATH"].split(":")[0] == prefix + "/bin"
    assert "I_MPI_PIN_DOMAIN" in js["env"] and js["backend"] == "gloo"
    assert [s["label"] for s in js["sources"]] == ["impi-rt 2021.18.1", "oneccl-cpu 2022.1.2"]
    assert all(s["conda_prefix"] == prefix for s in js["sources"])


def test_no_bindings_says_why_on_stderr_and_require_ccl_fails(tmp_path):
    """The fallback to gloo is said once, not in every new shell (doctor and --explain say it every time); --quiet
    says nothing and does not count as having said it."""
    env = {"CPUPERF_CACHE_DIR": str(tmp_path / "cache")}
    assert ccl(["--shell", "bash", "--quiet"], env).stderr == ""
    proc = ccl(["--shell", "bash"], env)
    assert "the ccl backend is not available" in proc.stderr and "using gloo" in proc.stderr
    assert "MASTER_ADDR='127.0.0.1'" in proc.stdout and "CCL_WORKER" not in proc.stdout
    again = ccl(["--shell", "bash"], env)
    assert again.stdout == proc.stdout and "ccl backend" not in again.stderr
    assert "using gloo" in ccl(["--shell", "bash", "--explain"], env).stderr
    failed = ccl(["--require-ccl"], rc=3)
    assert failed.stdout == "" and failed.stderr.startswith("error: the ccl backend is not available")


def test_hostfile_first_host_is_master(tmp_path, host2):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\n127.0.0.1 slots=2\nnode02:2\n")
    js = ccl_json(["--hostfile", str(hostfile), "--sysroot", host2])
    assert js["env"]["MASTER_ADDR"] == "127.0.0.1" and js["nnodes"] == 2
    assert js["env"].get("GLOO_SOCKET_IFNAME") == "lo"  # the route to the master's address
    hostfile.write_text("node01 slots=2\nnode02:2\n")
    stale = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # from an earlier single-node eval
    js = ccl_json(["--hostfile", str(hostfile), "--sysroot", host2, "--master-port", "1234"], stale)
    assert js["env"]["MASTER_ADDR"] == "node01" and js["env"]["MASTER_PORT"] == "1234" and js["kept"] == []


@pytest.mark.parametrize("args", [
    ["--hostfile", "HOSTFILE"], ["--master-addr", "$(touch PWNED)"], ["--master-addr", "a;b"],
    ["--shell", "tcsh"], ["--master-port", "0"], ["--master-port", "65536"], ["--master-port", "x"],
    ["--nproc-per-node", "0"], ["--unit", "core"], ["--no-such-option"], ["--python", "/no/such/python"],
    ["--hostfile", "GOODHOSTS", "--nnodes", "3"], ["--nnodes", "2"],
])
def test_invalid_input_is_one_line_usage_error_with_empty_stdout(args, tmp_path):
    bad = tmp_path / "hosts"
    bad.write_text("node01\n`reboot`:2\n")
    good = tmp_path / "good"
    good.write_text("node01\nnode02\n")
    args = [str(bad) if a == "HOSTFILE" else str(good) if a == "GOODHOSTS" else a for a in args]
    proc = run_cli(["ccl-env", *args], cwd=str(tmp_path))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "PWNED").exists()


def test_json_error_object_and_quiet(tmp_path):
    proc = run_cli(["ccl-env", "--json", "--master-addr", "bad host"])
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == 2
    quiet = ccl(["--quiet"])
    assert quiet.stderr == "" and "export OMP_NUM_THREADS=" in quiet.stdout


def test_explain_table_on_stderr_and_dotenv(host2):
    proc = ccl(["--explain", "--sysroot", host2, "--shell", "dotenv"])
    assert "OMP_NUM_THREADS" in proc.stderr and "reason" in proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    assert "MASTER_ADDR=127.0.0.1" in lines and all("=" in ln and not ln.startswith("export") for ln in lines)


def test_unit_numa_and_preload_flag(tmp_path):
    host = str(make_host(tmp_path / "h", sockets=2, cores_per_socket=8, nodes_per_socket=2))
    js = ccl_json(["--sysroot", host, "--unit", "numa"])
    assert js["nproc_per_node"] == 4 and js["env"]["OMP_NUM_THREADS"] == "4"
    assert "LD_PRELOAD" not in ccl_json(["--sysroot", host])["env"]


def test_does_not_import_torch_typer_or_rich_or_importlib_metadata():
    # The installed stack is read the way every command reads it (dist-info listings, CPUPERF_OVERRIDE_PACKAGES),
    # so ccl-env and train agree on the backend; torch is never imported, nor the slow importlib.metadata.
    code = ("import sys, io, contextlib\nfrom cpuperf.entry import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['ccl-env', '-q'])\n"
            "bad = [m for m in ('torch', 'rich', 'typer', 'pydantic', 'importlib.metadata', 'psutil')"
            " if m in sys.modules]\n"
            "print(rc, bad)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.stdout.strip() == "0 []", proc.stdout + proc.stderr


# The decision engine and what only it reads: `recommend` decides, ccl-env renders what it decided.
ENGINE = ("cpuperf.decide.recommend", "cpuperf.decide.memory", "cpuperf.knowledge.matrix", "cpuperf.knowledge.resolve",
          "cpuperf.run.measure", "cpuperf.plan.job")
_RUN_MAIN = ("import json, sys, io, contextlib\nfrom cpuperf.entry import main\nout = io.StringIO()\n"
             "with contextlib.redirect_stdout(out):\n    rc = main(sys.argv[1:])\n"
             "print(json.dumps({'rc': rc, 'out': out.getvalue(), 'modules': sorted(sys.modules)}))\n")


def _main_in_child(args: List[str], env: Dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _RUN_MAIN, *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("saved", [False, True], ids=["deciding", "plan"])
def test_rendering_imports_no_decision_engine_once_decided(tmp_path, saved):
    """ccl-env runs in every new shell: the first run decides (the engine imported), later ones render what it
    decided without importing the engine, byte for byte the same."""
    env = cli_env({"CPUPERF_CACHE_DIR": str(tmp_path / "cache")})
    args = ["ccl-env", "-q"]
    if saved:
        plan = tmp_path / "plan.json"
        made = subprocess.run([sys.executable, "-m", "cpuperf", "recommend", "--save", str(plan), "--quiet"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert made.returncode == 0, made.stderr[-3000:]
        args += ["--plan", str(plan)]
    first, second, third = (_main_in_child(args, env) for _ in range(3))
    assert first["rc"] == second["rc"] == 0 and "export OMP_NUM_THREADS=" in first["out"]
    assert second["out"] == third["out"] == first["out"]
    assert "cpuperf.decide.recommend" in first["modules"]  # the first run decides: this test can tell
    assert [m for m in (*ENGINE, "tomllib", "argparse") if m in second["modules"]] == []  # nor data parsed again
    if not saved:  # nor what a rule that does not apply here reads (the tuning records), OpenSSL, or a resolver
        unused = WARM_UNUSED + (WARM_UNUSED_X86_GLOO if platform.machine() in ("x86_64", "AMD64")
                                and "backend gloo;" in first["out"] else ())
        assert [m for m in unused if m in second["modules"]] == []


# Not on the path of a remembered decision: hashlib (OpenSSL: SHA-256 comes from Python's own module), a resolver
# (probe.hosts, socket: one node, no hostfile) and datetime (no date-dependent finding). On x86 with gloo and no --preload neither tuning.toml's records (read
# where one of its rules applies: oneCCL's workers, libiomp5, load, the Arm levers) nor packaging (Arm levers).
WARM_UNUSED = ("hashlib", "_hashlib", "cpuperf.probe.hosts", "socket", "datetime")
WARM_UNUSED_X86_GLOO = ("cpuperf.knowledge.tuning", "packaging.version")


_ARG_TOKENS = ["--plan", "--shell", "--json", "--quiet", "-q", "p.json", "fish", "-x", "--plan=", "--plan=p.json",
               "--shell=sh", "--", "", "a=b", "--nproc-per-node", "2", "--json=1", "-", "--pla", "-h"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_ARG_TOKENS), min_size=1, max_size=6))
def test_the_start_up_line_reads_as_argparse_reads_it(argv):
    """A shell's start-up line (--plan FILE, --shell, --json, --quiet) is read without argparse: to the same options."""
    from cpuperf.commands import ccl_env

    fast = ccl_env._start_up_line(argv)
    if fast is not None:
        assert fast == ccl_env._parse_all(argv)


def test_the_start_up_line_is_read_without_argparse():
    from cpuperf.commands import ccl_env

    for argv in (["--plan", "p.json"], ["--plan=p.json", "--shell", "fish", "-q"], ["--json"], ["--shell=dotenv", "--quiet"]):
        assert ccl_env._start_up_line(argv) == ccl_env._parse_all(argv), argv


def _remembered_entry(cache: Path) -> Path:
    entries = list((cache / "ccl-decisions").iterdir())
    assert len(entries) == 1, entries
    return entries[0]


def test_remembered_decisions_are_keyed_by_the_facts_and_end_with_their_measurement(tmp_path):
    host = make_host(tmp_path / "h", sockets=2, cores_per_socket=8)
    env = {"CPUPERF_CACHE_DIR": str(tmp_path / "cache")}
    assert ccl_json(["--sysroot", str(host), "--nproc-per-node", "2"], env)["env"]["OMP_NUM_THREADS"] == "8"
    entry = _remembered_entry(tmp_path / "cache")
    known = json.loads(entry.read_text())
    for slot in known["value"]["placement"]["slots"]:
        slot["threads"] = 3
    known["value"]["threads"] = 3  # the one count each rank runs with (decide.threads.rank_threads)
    entry.write_text(json.dumps(known))  # what a run remembered is what the next one renders
    assert ccl_json(["--sysroot", str(host), "--nproc-per-node", "2"], env)["env"]["OMP_NUM_THREADS"] == "3"
    entry.write_text(json.dumps({**known, "until": 1.0}))  # the measurement it was decided from has expired
    assert ccl_json(["--sysroot", str(host), "--nproc-per-node", "2"], env)["env"]["OMP_NUM_THREADS"] == "8"
    entry.write_text('{"until": null, "value": {"placement": []}}')  # not what a run writes: decided again
    assert ccl_json(["--sysroot", str(host), "--nproc-per-node", "2"], env)["env"]["OMP_NUM_THREADS"] == "8"
    shutil.rmtree(host)
    make_host(host, sockets=2, cores_per_socket=4)  # other facts: decided for them
    assert ccl_json(["--sysroot", str(host), "--nproc-per-node", "2"], env)["env"]["OMP_NUM_THREADS"] == "4"
    assert len(list((tmp_path / "cache" / "ccl-decisions").iterdir())) == 2


def test_oneapi_components_sourced_unless_the_environment_provides_them(tmp_path):
    root = tmp_path / "oneapi"
    for comp, var in (("ccl", "CCL_ROOT"), ("mpi", "I_MPI_ROOT")):
        script = root / comp / "latest" / "env" / "vars.sh"
        script.parent.mkdir(parents=True)
        script.write_text(f'export {var}="{root}/{comp}/latest"\nexport LD_LIBRARY_PATH="{root}/{comp}/lib:$LD_LIBRARY_PATH"\n')
    venv = make_venv(tmp_path / "venv")
    js = ccl_json(["--python", str(venv / "bin" / "python")], {"ONEAPI_ROOT": str(root)})
    assert js["env"]["CCL_ROOT"] == f"{root}/ccl/latest" and js["env"]["I_MPI_ROOT"] == f"{root}/mpi/latest"
    assert js["env"]["LD_LIBRARY_PATH"].split(":")[:2] == [f"{root}/mpi/lib", f"{root}/ccl/lib"]
    assert "I_MPI_PIN_DOMAIN" in js["env"]  # Intel MPI is the launcher now
    site = site_packages(venv)
    up = os.path.relpath(venv, site)
    add_dist(site, "impi_rt", "2021.18.1", {f"{up}/etc/conda/activate.d/mpivars.activate.sh":
                                            'export I_MPI_ROOT="${CONDA_PREFIX}"\n'})
    js = ccl_json(["--python", str(venv / "bin" / "python")], {"ONEAPI_ROOT": str(root)})
    assert js["env"]["I_MPI_ROOT"] == str(venv.resolve()) and js["env"]["CCL_ROOT"] == f"{root}/ccl/latest"
    assert any("oneAPI mpi not sourced" in n for n in js["notes"])


@pytest.mark.parametrize("libs, finding", [(["libccl.so.1"], True), (["libccl.so.1", "libccl.so.2"], False)])
def test_doctor_oneccl_cpu_finding_in_another_venv(tmp_path, libs, finding):
    """doctor --python VENV inspects that venv (a venv's python is a symlink to the base one)."""
    venv = make_venv(tmp_path / "venv")
    add_dist(site_packages(venv), "oneccl_cpu", "2022.1.2", {})
    (venv / "lib").mkdir(exist_ok=True)
    for lib in libs:
        (venv / "lib" / lib).write_text("")
    proc = run_cli(["doctor", "--json", "--python", str(venv / "bin" / "python")])
    ids = [f["id"] for f in json.loads(proc.stdout)["findings"]]
    assert ("oneccl-cpu-incomplete" in ids) is finding, ids


# -- slow: the registry's wheels, a real Intel MPI mpirun ---------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CPUPERF_SLOW") != "1", reason="downloads oneccl-cpu and impi-rt; CPUPERF_SLOW=1")
def test_registry_oneccl_cpu_and_impi_rt_mpirun_two_ranks(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "oneccl-cpu", "impi-rt"],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    wrapper = tmp_path / "w"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m cpuperf ccl-env --python {venv}/bin/python "
                       f"--nproc-per-node 2 \"$@\"\n")
    wrapper.chmod(0o755)
    body = (f'eval "$({wrapper} --shell bash)" && command -v mpirun && '
            "mpirun -n 2 bash -c 'echo \"rank=$PMI_RANK ccl=$CCL_ROOT impi=$I_MPI_ROOT\"'")
    env = cli_env({"HOME": str(tmp_path)})
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", body], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    prefix = str(venv.resolve())
    assert lines[0] == f"{prefix}/bin/mpirun"  # Intel MPI's, ahead of any system mpirun
    ranks = sorted(ln for ln in lines[1:] if ln.startswith("rank="))
    assert ranks == [f"rank={r} ccl={prefix} impi={prefix}" for r in (0, 1)], proc.stdout + proc.stderr
