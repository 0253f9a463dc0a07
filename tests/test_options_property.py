"""Random values for every option of every command (issue 62): whatever a user types, the answer is a documented exit
code (docs/exit-codes.md, cpuperf.errors.ExitCode), one `error:` line where it is an error, no traceback and no
internal error, and no file written outside the run's own directory (the working directory here; HOME stays empty).

The CLI runs in-process (tests/cli_util.run_cli). `install` runs as `install --dry-run --yes --find-links <an
empty wheelhouse>`: pip's own dry run, offline, a few seconds a call, so fewer examples. Left out, each for a reason
of its own: `bench` (it measures for as long as its options say: its options have tests of their own), `train`
without `--dry-run` and `--tune` (a real run), install's `--venv` (a real venv a call) and `--index-url` (the
network), and the options that reach the network (`--master-addr`, `--probe-nodes`, doctor's
`--hostfile`/`--collectives`): a random host name waits on name resolution. Values never hold `/`, so a path given is inside the working directory.
The fast tier runs a few fixed examples per command (derandomized: the same every run); the full tier explores."""

from __future__ import annotations

import os
import tempfile

import pytest
from cli_util import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpuperf.errors import ExitCode

CODES = {int(c) for c in ExitCode}
FLAGS = {"--json", "--quiet", "--auto", "--dry-run", "--resume", "--replan", "--adapt-to-load", "--this-node",
         "--recover", "--allow-cuda-torch"}
LEFT_OUT = {"--master-addr", "--probe-nodes", "--tune", "--collectives", "--hostfile", "--dry-run", "--budget",
            "--venv", "--index-url", "--yes", "--find-links"}


def _options(command: str):
    import typer.main

    from cpuperf.cli import app

    params = typer.main.get_command(app).commands[command].params
    return [p.opts[0] for p in params if p.opts[0].startswith("--") and p.opts[0] not in LEFT_OUT]


COMMANDS = {name: _options(name) for name in ("doctor", "compat", "recommend", "train", "plot", "install")}
EXAMPLES = {"install": (2, 12)}  # (fast, explored): pip's dry run takes seconds a call
COMMANDS["ccl-env"] = ["--nproc-per-node", "--nnodes", "--master-port", "--shell", "--json", "--quiet", "--explain",
                       "--override", "--preload", "--require-ccl", "--python", "--sysroot", "--unit", "--plan",
                       "--replan"]

# Values of every type an option takes: whole numbers of every size and sign, numbers with a point, exponents, nan
# and inf, words, choices' neighbours, `--set` assignments, the empty string; never a `/`.
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\"), max_size=12)
VALUES = st.one_of(
    st.integers(-2 ** 70, 2 ** 70).map(str),
    st.integers(-3, 70000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "0", "-1", "1e21", "nan", "inf", "none", "auto", "cpu", "cuda", "bf16", "socket",
                     "numa", "tiny", "maybe", "torch==2.1", "==", "-", "--", "x" * 300]),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["dtype", "batch_size", "model.d_model", "seed", "lr",
                                                        "optimizer", "nproc_per_node", "bogus", ""]), _TEXT),
    _TEXT,
)


@st.composite
def command_lines(draw, command: str):
    options = draw(st.lists(st.sampled_from(COMMANDS[command]), min_size=1, max_size=3, unique=True))
    args = [command] + {"train": ["--dry-run"], "install": ["--dry-run", "--yes", "--find-links", "wheels"]}.get(command, [])
    for option in options:
        args += [option] if option in FLAGS else [option, draw(VALUES)]
    if command == "plot":
        args.insert(1, draw(st.sampled_from(["run", "", "missing"])))
    return args


def _check(args) -> None:
    with tempfile.TemporaryDirectory() as base:
        run, home = os.path.join(base, "run"), os.path.join(base, "home")
        os.mkdir(run)
        os.mkdir(home)
        os.mkdir(os.path.join(run, "wheels"))  # install's offline wheelhouse: empty
        # cpuperf's own cache (remembered answers, parsed data) is its documented place: kept apart from HOME, which
        # must stay empty
        cache = os.path.join(base, "cache")
        # pip's user agent asks `rustc --version`; where rustc is rustup's shim (this machine), the shim writes its
        # settings under RUSTUP_HOME (default ~/.rustup): a tool's, not cpuperf's, so kept beside the cache
        proc = run_cli(args, cwd=run, extra_env={"HOME": home, "CPUPERF_LOAD_WINDOW": "0", "CPUPERF_CACHE_DIR": cache,
                                                   "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": os.devnull,
                                                   "RUSTUP_HOME": os.path.join(cache, "rustup")})
        assert proc.returncode in CODES, (args, proc.returncode, proc.stderr[-1500:])
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, (args, proc.stderr[-1500:])
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        if proc.returncode not in (0, 1):
            assert len(errors) == 1, (args, proc.stderr[-1500:])
        assert set(os.listdir(base)) <= {"cache", "home", "run"} and os.listdir(home) == [], (args, os.listdir(home))


def _property(examples: int, derandomize: bool):
    return settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_option_values_get_a_documented_answer(command):
    @_property(EXAMPLES.get(command, (4, 60))[0], derandomize=True)
    @given(command_lines(command))
    def check(args):
        _check(args)

    check()


@pytest.mark.full
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_option_values_get_a_documented_answer_explored(command):
    @_property(EXAMPLES.get(command, (4, 60))[1], derandomize=False)
    @given(command_lines(command))
    def check(args):
        _check(args)

    check()
