"""Pure layers raise domain errors about a field; commands name the flag.

decide/, knowledge/, plan/ and probe/ raise `FieldError` (cpuperf/errors.py) about a knob id or an option's field, with a
message that names no flag; the error boundary (cli._report) renders it with the flag the user typed
(cpuperf/commands/flags.py), so what the user reads is unchanged."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer

from cpuperf.cli import app
from cpuperf.commands.flags import OPTION_FLAGS, flag_of, with_flags
from cpuperf.decide.nodes import job_nodes
from cpuperf.decide.workload import parse_count
from cpuperf.errors import FieldError, UsageError
from cpuperf.knowledge.knobs import coerce, split_assignment
from cpuperf.plan.request import check_saved_plan_options, check_sysroot
from cpuperf.probe.sources import check_python
from cpuperf.probe.sources import check_sysroot as check_tree

PKG = Path(__file__).resolve().parent.parent / "cpuperf"
PURE = ("decide", "knowledge", "plan")
# Where the options become a request (plan/request.py) raises FieldError too: none is exempt.
AT_THE_EDGE: tuple = ()
# The user's own launcher's options (torchrun's, accelerate's, setsid's): flags of their command, not of cpuperf's.
THEIR_FLAGS = ("plan/user_launcher.py",)
# A hint that is a whole command line to run (another cpuperf command with its own flags) is not a flag the user typed.
COMMAND_LINE = re.compile(r"cpuperf (install|compat|recommend) [^,\"]*--[^,\"]*")


def _flag_raises():
    for layer in PURE:
        for path in sorted((PKG / layer).glob("*.py")):
            if str(path.relative_to(PKG)) in AT_THE_EDGE + THEIR_FLAGS:
                continue
            text = path.read_text()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    src = ast.get_source_segment(text, node) or ""
                    if re.search(r"--[a-z]", COMMAND_LINE.sub("", src)):
                        yield f"{path.relative_to(PKG)}:{node.lineno}"


def test_no_raise_in_the_pure_layers_names_a_flag():
    # decide/tune.py, decide/measurement_schema.py and knowledge/{hf_flags,matrix,resolve,cuda}.py included.
    assert list(_flag_raises()) == []


def _cli_flags():
    flags = set()
    for command in typer.main.get_command(app).commands.values():
        for param in command.params:
            flags.update(o for o in param.opts if o.startswith("--"))
    return flags


def test_every_flag_the_table_names_is_one_a_command_declares():
    ccl = (PKG / "commands" / "ccl_env.py").read_text()
    declared = _cli_flags() | set(re.findall(r'add_argument\("(--[a-z-]+)"', ccl))  # ccl-env declares its own
    assert sorted(f for f in OPTION_FLAGS.values() if f not in declared) == []


@pytest.mark.parametrize(("raise_it", "plain", "flagged"), [
    (lambda: coerce("dtype", "bf17"), "dtype=bf17: expected one of", "--set dtype=bf17: expected one of"),
    (lambda: coerce("nope", "1"), "unknown setting 'nope' in set", "unknown setting 'nope' in --set"),
    (lambda: coerce("out_dir", "x"), "out_dir: set it with out_dir", "--set out_dir: set it with --out"),
    (lambda: split_assignment("dtype"), "set 'dtype': expected KEY=VALUE", "--set 'dtype': expected KEY=VALUE"),
    (lambda: job_nodes(0, None, None), "nnodes 0 must be at least 1", "--nnodes 0 must be at least 1"),
    (lambda: parse_count("7Q"), "params '7Q' is not a count", "--params '7Q' is not a count"),
    (lambda: check_tree(" "), "sysroot is empty", "--sysroot is empty"),
    (lambda: check_tree("/nonexistent-cpuperf"), "sysroot /nonexistent-cpuperf: no such directory",
     "--sysroot /nonexistent-cpuperf: no such directory"),
    (lambda: check_python(""), "python is empty", "--python is empty"),
    (lambda: check_sysroot("/r", False), "sysroot describes a recorded host", "--sysroot describes a recorded host"),
    (lambda: check_saved_plan_options("p.json", ["nproc_per_node"], "auto", "socket"),
     "plan p.json fixes the decisions; nproc_per_node would change them",
     "--plan p.json fixes the decisions; --nproc-per-node would change them"),
    (lambda: check_saved_plan_options("p.json", ["sets"], "auto", "socket"),
     "plan p.json fixes the decisions; set would change them", "--plan p.json fixes the decisions; --set would"),
])
def test_a_field_error_names_no_flag_until_the_command_does(raise_it, plain, flagged):
    with pytest.raises(FieldError) as err:
        raise_it()
    assert err.value.message.startswith(plain) and "--" not in err.value.message
    named = with_flags(err.value)
    assert isinstance(named, UsageError) and named.code == err.value.code
    assert named.message.startswith(flagged), named.message


def test_a_value_read_from_an_option_is_said_with_that_option():
    with pytest.raises(FieldError) as err:
        coerce("batch_size", "0")
    assert with_flags(err.value).message.startswith("--set batch_size=0: must be at least 1")
    assert with_flags(err.value.as_option()).message.startswith("--batch-size 0: must be at least 1")


def test_braces_in_the_users_text_reach_the_message_as_typed():
    with pytest.raises(FieldError) as err:
        coerce("dtype", "{typed}")
    assert with_flags(err.value).message.startswith("--set dtype={typed}: expected one of")
    assert flag_of("seq_len", False, None) == "--seq-len" and flag_of("dtype", True, "bf16") == "--set dtype=bf16"


# plan/ and probe/ are pure layers too: a message or hint they raise names none of cpuperf's own options (the
# error boundary adds the flag to a FieldError: `{flag}`, `{typed}`, `{opt.FIELD}`, `{set.KEY}`). A whole command
# line to run (`cpuperf doctor --save-snapshot DIR`, `cpuperf recommend --save FILE`) names that command's options,
# not one the user typed, and is left as it is. Any other exception: (file, flag) -> why, here.
OWN_FLAG_ALLOWED: dict = {}
COMMAND_TO_RUN = re.compile(r"cpuperf [a-z][a-z-]* [^,\"]*")


def _own_flags():
    ccl = (PKG / "commands" / "ccl_env.py").read_text()
    return (_cli_flags() | set(re.findall(r'add_argument\("(--[a-z-]+)"', ccl))) - {"--help"}


def _own_flags_in(rel, text, own):
    """(line, flag) for each of cpuperf's own options spelled in a string constant a raise statement carries (or a
    `hint` named before raising), outside a command line to run."""
    spelled = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?!\w)")  # never --model_name_or_path (a script's)
    for node in ast.walk(ast.parse(text)):
        carried = node.exc if isinstance(node, ast.Raise) else None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "hint" for t in node.targets):
            carried = node.value
        for c in ast.walk(carried) if carried is not None else ():
            if isinstance(c, ast.Constant) and isinstance(c.value, str):
                for flag in spelled.findall(COMMAND_TO_RUN.sub("", c.value)):
                    if flag in own and (rel, flag) not in OWN_FLAG_ALLOWED:
                        yield c.lineno, flag


def test_plan_and_probe_raise_no_flag_of_cpuperf():
    own = _own_flags()
    found = [f"{path.relative_to(PKG)}:{line}: {flag}" for layer in ("plan", "probe")
             for path in sorted((PKG / layer).rglob("*.py"))
             for line, flag in _own_flags_in(str(path.relative_to(PKG)), path.read_text(), own)]
    assert found == []


def test_the_scan_finds_cpuperfs_flags_and_only_those():
    own = _own_flags()
    assert {"--sysroot", "--nproc-per-node", "--plan", "--python", "--set", "--save-facts"} <= own
    text = """
def f(path):
    hint = "pass --python PATH"
    if path:
        raise UsageError(f"--sysroot {path} is empty", hint="add --dry-run, or see cpuperf doctor --save-snapshot DIR")
    raise FieldError("sysroot", path, "{typed}: give torchrun --nnodes=2 or mpirun --oversubscribe",
                     "add {opt.dry_run}; the script reads --model_name_or_path")
"""
    assert sorted(_own_flags_in("x.py", text, own)) == [(3, "--python"), (5, "--dry-run"), (5, "--sysroot"),
                                                        (6, "--nnodes")]
    for (rel, flag), why in OWN_FLAG_ALLOWED.items():
        assert why and flag in (PKG / rel).read_text(), f"{rel}: {flag} is allowed but no longer spelled there"
