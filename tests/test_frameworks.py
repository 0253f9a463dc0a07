"""Issue 61: a user's command read as its own parser reads it, and one adapter per training framework.

The planning paths run on recorded multi-socket trees (--sysroot) through the real CLI; what the script's parser reads
of the launched command is checked with the real parser (transformers' HfArgumentParser), never with cpuperf's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Tuple

import pytest
from cli_util import run_cli
from host_classes import SAPPHIRE, ZEN3, ZEN4
from hosts import make_host

from cpuperf.knowledge.script_parsers import hf_parser
from cpuperf.plan import script_args as grammar
from cpuperf.plan.script_args import ScriptArgError, read_script_args

HF_SCRIPT = """from transformers import HfArgumentParser, Trainer, TrainingArguments

(args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
"""

LIGHTNING_SCRIPT = """import lightning as L
import torch

class Model(L.LightningModule):
    def training_step(self, batch, i):
        return torch.zeros(())

trainer = L.Trainer(max_epochs=1{extra})
trainer.fit(Model())
"""

LIGHTNING_CLI = """from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

LightningCLI(BoringModel)
"""


def _tree(tmp_path: Path, name: str, sockets: int, flags: List[str], vendor: str = "GenuineIntel",
          family: int = 6, model: int = 143) -> Path:
    return make_host(tmp_path / name, sockets=sockets, cores_per_socket=4, flags=flags, vendor=vendor, family=family,
                     model=model)


def _dry(tree: Path, cwd: Path, *command: str) -> Tuple[int, dict, str]:
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), "--", *command], cwd=str(cwd))
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        return proc.returncode, {}, proc.stderr


# -- the grammar -------------------------------------------------------------------------------------------------

TRAINER = hf_parser((), "TrainingArguments", (), True, "")


@pytest.mark.parametrize("args, per_device", [
    (["--per_device_train_batch_size", "16"], "16"),
    (["--per_device_train_batch", "16"], "16"),  # a prefix that begins one option
    (["--per-device-train-batch-size=16"], "16"),  # the dash alias, = attached
    (["--per-device-train=16"], "16"),
    (["--per_device_train_batch_size=16", "--per_device_train_batch", "4"], "4"),  # the last occurrence wins
])
def test_the_batch_is_what_the_real_parser_reads(args, per_device):
    from transformers import HfArgumentParser, TrainingArguments

    real = HfArgumentParser((TrainingArguments,)).parse_args(["--output_dir", "o", *args])
    read = read_script_args(args, TRAINER)
    assert read.value("per_device_train_batch_size") == per_device == str(real.per_device_train_batch_size)


@pytest.mark.parametrize("args, says", [
    (["--per_device_train_batch_size", "abc"], "not a valid whole number"),
    (["--per_device_train_batch_size", "8.0"], "not a valid whole number"),
    (["--gradient", "4"], "ambiguous option"),
    (["--per_device_train_batch_size"], "expected one argument"),
    (["--bf16", "maybe"], "not a valid bool"),
])
def test_what_the_real_parser_refuses_is_refused(args, says):
    from transformers import HfArgumentParser, TrainingArguments

    with pytest.raises(SystemExit) as refused:
        HfArgumentParser((TrainingArguments,)).parse_args(["--output_dir", "o", *args])
    assert refused.value.code == 2
    with pytest.raises(ScriptArgError, match=says):
        read_script_args(args, TRAINER)


def test_a_table_that_is_not_the_whole_parser_reads_no_abbreviation():
    partial = hf_parser((), "TrainingArguments", (), False, "HfArgumentParser over LoraArguments, not read")
    read = read_script_args(["--per_device_train_batch", "16", "--lora_r", "8"], partial)
    assert read.value("per_device_train_batch_size") is None
    assert "may be --per_device_train_batch_size" in read.could_be("per_device_train_batch_size")
    assert grammar.bounded_int(read, "lora_r")[0] is None  # a guessed option never decides anything


# -- the same global batch on multi-socket trees, every spelling -----------------------------------------------

SPELLINGS = [
    ["--per_device_train_batch_size", "16"],
    ["--per_device_train_batch", "16"],
    ["--per-device-train-batch-size=16"],
    ["--per_device_train_batch_size=16", "--per_device_train_batch", "4"],
    ["--gradient_accum", "4"],
    ["--per-device-train-batch-size", "6", "--gradient-accumulation-steps=2"],
    ["--gradient_accumulation_steps", "3", "--gradient_accumulation_steps=4", "--per_device_train_batch", "8"],
]


def _global_batch(argv: List[str], ranks: int) -> int:
    from transformers import HfArgumentParser, TrainingArguments

    args = HfArgumentParser((TrainingArguments,)).parse_args(argv)
    return ranks * args.per_device_train_batch_size * args.gradient_accumulation_steps


@pytest.mark.parametrize("sockets", [2, 4])
@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda s: " ".join(s))
def test_the_launched_command_trains_the_users_global_batch(tmp_path, sockets, spelling):
    (tmp_path / "train.py").write_text(HF_SCRIPT)
    tree = _tree(tmp_path, f"spr{sockets}", sockets, SAPPHIRE)
    code, plan, err = _dry(tree, tmp_path, "python", "train.py", "--output_dir", "o", *spelling)
    assert code == 0, err[-1500:]
    argv = plan["launch"]["argv"]
    script_args = argv[argv.index("train.py") + 1:]
    ranks = plan["launch"]["nproc_per_node"]
    assert _global_batch(script_args, ranks) == _global_batch(["--output_dir", "o", *spelling], 1), (argv, ranks)
    if plan["global_batch"] is not None:
        assert plan["global_batch"]["global_batch"] == _global_batch(["--output_dir", "o", *spelling], 1)


@pytest.mark.parametrize("value, code", [("abc", 2), ("8.0", 2), ("0", 0), ("-4", 0), (str(2 ** 62), 0)])
def test_an_invalid_batch_is_refused_or_passed_on_unchanged(tmp_path, value, code):
    (tmp_path / "train.py").write_text(HF_SCRIPT)
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    got, plan, err = _dry(tree, tmp_path, "python", "train.py", "--output_dir", "o",
                          "--per_device_train_batch_size", value)
    assert got == code, err[-1500:]
    if code == 2:
        assert f"--per_device_train_batch_size '{value}'" in err and "Traceback" not in err
    else:  # the script's own to refuse: one process, its value as given, no batch built on it
        argv = plan["launch"]["argv"]
        assert plan["launch"]["nproc_per_node"] == 1 and argv[argv.index("train.py") + 1:][:4] == [
            "--output_dir", "o", "--per_device_train_batch_size", value]


def test_the_users_arguments_are_walked_once(tmp_path, monkeypatch):
    """One function walks the script's words; the dry run asks it once for the user's own arguments."""
    from cpuperf.plan import script_read

    (tmp_path / "train.py").write_text(HF_SCRIPT)
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    user = ("--output_dir", "o", "--per_device_train_batch", "16")
    walks: List[Tuple[str, ...]] = []
    real = grammar.read_script_args

    def counted(args, parser):
        walks.append(tuple(args))
        return real(args, parser)

    monkeypatch.setattr(script_read, "read_script_args", counted)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), "--", "python", "train.py", *user],
                   cwd=str(tmp_path))
    assert proc.returncode == 0 and walks.count(user) == 1, (walks, proc.stderr[-800:])


# -- Lightning ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, bf16", [(SAPPHIRE, True), (ZEN4, True), (ZEN3, False)])
def test_a_lightning_script_gets_bf16_through_what_lightning_reads(tmp_path, flags, bf16):
    (tmp_path / "lit.py").write_text(LIGHTNING_SCRIPT.format(extra=""))
    amd = flags is not SAPPHIRE
    tree = _tree(tmp_path, "host", 2, flags, vendor="AuthenticAMD" if amd else "GenuineIntel",
                 family=25 if amd else 6, model=17 if amd else 143)
    code, plan, err = _dry(tree, tmp_path, "python", "lit.py")
    assert code == 0, err[-1500:]
    env = plan["launch"]["env"]
    assert plan["launch"]["nproc_per_node"] == 1  # its batch is in its code: one process with the whole host
    assert plan["hf_flags"]["framework"] == "lightning" and plan["hf_flags"]["added"] == []
    text = json.dumps(plan) + err
    assert "TrainingArguments" not in text and "Trainer script" not in text
    if bf16:  # native bf16 (AMX or avx512_bf16): the plan's dtype, as Lightning reads it
        assert env.get("PL_TRAINER_PRECISION") == "bf16-mixed"
        dtype = next(i for i in plan["levers"]["applied"] if i["id"] == "dtype")
        assert "PL_TRAINER_PRECISION=bf16-mixed" in dtype["how"]
    else:
        assert "PL_TRAINER_PRECISION" not in env


def test_a_precision_the_script_passes_stays_its_own(tmp_path):
    (tmp_path / "lit.py").write_text(LIGHTNING_SCRIPT.format(extra=", precision='32-true'"))
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    code, plan, err = _dry(tree, tmp_path, "python", "lit.py")
    assert code == 0 and "PL_TRAINER_PRECISION" not in plan["launch"]["env"]
    assert any("passes precision=" in i["why"] for i in plan["hf_flags"]["not_added"])


def test_a_lightning_cli_script_gets_the_option_its_cli_reads(tmp_path):
    (tmp_path / "cli.py").write_text(LIGHTNING_CLI)
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    code, plan, err = _dry(tree, tmp_path, "python", "cli.py", "fit", "--trainer.max_steps", "3")
    assert code == 0, err[-1500:]
    assert plan["launch"]["argv"][-2:] == ["--trainer.precision", "bf16-mixed"]
    code, plan, err = _dry(tree, tmp_path, "python", "cli.py", "fit", "--trainer.precision=32-true")
    assert code == 0 and "--trainer.precision" not in plan["launch"]["argv"][-2:]


def test_a_plain_script_is_told_the_autocast_line_not_given_it(tmp_path):
    (tmp_path / "loop.py").write_text("import torch\nmodel = torch.nn.Linear(4, 4)\nmodel(torch.zeros(1, 4)).sum()\n")
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    code, plan, err = _dry(tree, tmp_path, "python", "loop.py")
    assert code == 0 and "PL_TRAINER_PRECISION" not in plan["launch"]["env"]
    said = [i["why"] for i in plan["hf_flags"]["not_added"] if i["flag"].startswith("dtype")]
    assert said and "torch.autocast" in said[0]


# -- the DeepSpeed launcher --------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, ranks", [(["--num_gpus", "2"], 2), (["--num_acc=2"], 2), ([], None),
                                            (["--num_gpus", "-1"], None)])
def test_deepspeed_is_read_as_the_users_launcher_never_wrapped_in_another(tmp_path, options, ranks):
    (tmp_path / "train.py").write_text(HF_SCRIPT)
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    code, plan, err = _dry(tree, tmp_path, "deepspeed", *options, "train.py", "--output_dir", "o")
    assert code == 0, err[-1500:]
    argv = plan["launch"]["argv"]
    assert argv[0] == "deepspeed" and "torchrun" not in argv and "cpuperf.run.rankexec" not in " ".join(argv)
    assert plan["launch"]["launcher"] == "direct" and plan["hf_flags"]["your_launcher"] == "deepspeed"
    yours = plan["launch"]["yours"]
    assert yours["ranks"] == ranks and not yours["placed_by_cpuperf"] and "DeepSpeed's runner" in yours["why"]
    # the script's flags go after the script, the launcher's options stay before it
    assert argv[argv.index("train.py") - len(options):argv.index("train.py")] == options


def test_a_deepspeed_option_its_runner_refuses_is_refused(tmp_path):
    (tmp_path / "train.py").write_text(HF_SCRIPT)
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    for bad, says in ((["--num_gpus", "two"], "invalid int"), (["--no_such_option"], "has no option")):
        code, _, err = _dry(tree, tmp_path, "deepspeed", *bad, "train.py")
        assert code == 2 and says in err and "Traceback" not in err, err[-800:]


def test_a_precision_variable_of_the_users_stays_theirs(tmp_path):
    (tmp_path / "lit.py").write_text(LIGHTNING_SCRIPT.format(extra=""))
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), "--", "python", "lit.py"],
                   extra_env={"PL_TRAINER_PRECISION": "32-true"}, cwd=str(tmp_path))
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0 and plan["launch"]["env"]["PL_TRAINER_PRECISION"] == "32-true"
    assert any("PL_TRAINER_PRECISION='32-true'" in n for n in plan["notes"]), plan["notes"]
    dtype = next(i for i in plan["levers"]["not_applied"] if i["id"] == "dtype")
    assert "your PL_TRAINER_PRECISION=32-true" in dtype["why"]


@pytest.mark.parametrize("value", ["0", "-2", str(2 ** 40)])
def test_an_accumulation_no_run_can_take_is_passed_on_and_never_built_on(tmp_path, value):
    """Issue 62's unbounded Trainer values: `--gradient_accumulation_steps 0` and `-2` were reported as 1 accumulation."""
    (tmp_path / "train.py").write_text(HF_SCRIPT)
    tree = _tree(tmp_path, "spr2", 2, SAPPHIRE)
    code, plan, err = _dry(tree, tmp_path, "python", "train.py", "--output_dir", "o", "--gradient_accumulation_steps", value)
    assert code == 0, err[-1500:]
    argv = plan["launch"]["argv"]
    assert plan["launch"]["nproc_per_node"] == 1 and plan["global_batch"] is None
    assert argv[argv.index("train.py") + 1:][:4] == ["--output_dir", "o", "--gradient_accumulation_steps", value]


@pytest.mark.parametrize("name, edit", [
    ("frameworks.toml", ('bf16 = "bf16-mixed"', 'bf16 = "bf16 mixed; rm -rf ~"')),
    ("frameworks.toml", ('schema = "cpuperf.frameworks/1"', 'schema = "other"')),
    ("frameworks.toml", ('precision_env = "PL_TRAINER_PRECISION"', 'precision_env = "LD_PRELOAD"')),
    ("trainer_args.toml", ('arity = "one"', 'arity = 7')),
    ("trainer_args.toml", ('names = ["--output_dir", "--output-dir"]', 'names = "output_dir"')),
])
def test_a_malformed_framework_table_is_refused_naming_it(name, edit):
    """compat/ is data too: a row that is not what its header says is a BadDataError naming the file (exit BAD_DATA at
    the CLI), never a value reaching the job."""
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib

    from cpuperf.data import builtin_compat_dir
    from cpuperf.errors import BadDataError
    from cpuperf.knowledge.frameworks import parse_lightning
    from cpuperf.knowledge.script_parsers import parse_trainer_table

    text = (builtin_compat_dir() / name).read_text()
    assert edit[0] in text
    parse = parse_lightning if name == "frameworks.toml" else parse_trainer_table
    parse(tomllib.loads(text))  # as shipped: good
    with pytest.raises(BadDataError, match=f"compat/{name}"):
        parse(tomllib.loads(text.replace(edit[0], edit[1], 1)))
