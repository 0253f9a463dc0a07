"""One table of bounds on a run's sizes, read by every door a size enters by (issue 62, class 3): recommend's and
train's options, --set, the worker's own schema and a saved plan refuse the same values with exit 2 naming them
(cpuperf.worker_settings.BOUNDS). `recommend --sysroot <4 sockets> --batch-size 2**62` never returned, while train
refused anything above 1,048,576; --seed -1 was accepted where --set seed=-1 was refused."""

from __future__ import annotations

import random

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.errors import ExitCode
from cpuperf.worker_settings import BOUNDS, ConfigError, TrainSettings


@pytest.fixture(scope="module")
def four_sockets(tmp_path_factory) -> str:
    return str(make_host(tmp_path_factory.mktemp("h"), sockets=4, cores_per_socket=8))


def _refused(args, value: str) -> str:
    proc = run_cli(args)
    assert proc.returncode == ExitCode.USAGE, (args, proc.returncode, proc.stderr[-1500:])
    assert value[:40] in proc.stderr and "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") <= 2  # one line (and a hint)
    return proc.stderr


def test_recommend_on_four_sockets_refuses_a_batch_of_two_to_the_62_at_once(four_sockets):
    """The reproducer, as a real process with a deadline: it never returned (time grew with the batch)."""
    proc = run_cli(["recommend", "--sysroot", four_sockets, "--batch-size", str(2 ** 62)], process=True, timeout=60)
    assert proc.returncode == ExitCode.USAGE, proc.stderr[-1500:]
    assert f"--batch-size {2 ** 62}: at most {BOUNDS['batch_size'][1]}" in proc.stderr


@pytest.mark.parametrize("batch", [0, -3, BOUNDS["batch_size"][1] + 1, 10 ** 8, 2 ** 62, 10 ** 30])
def test_every_door_refuses_the_same_batch(four_sockets, batch):
    """recommend --batch-size, train --batch-size, --set batch_size (recommend and train): one bound, one verdict."""
    text = str(batch)
    for args in (["recommend", "--sysroot", four_sockets, "--batch-size", text],
                 ["recommend", "--sysroot", four_sockets, "--set", f"batch_size={text}"],
                 ["train", "--dry-run", "--sysroot", four_sockets, "--set", f"batch_size={text}"]):
        _refused(args, text)
    if batch >= 1:  # train's option itself stops below 1 (typer's min=1): the same code, click's words
        _refused(["train", "--dry-run", "--sysroot", four_sockets, "--batch-size", text], text)


def test_the_largest_batch_in_the_table_is_planned(four_sockets):
    top = str(BOUNDS["batch_size"][1])
    for args in (["recommend", "--sysroot", four_sockets, "--batch-size", top, "--json"],
                 ["train", "--dry-run", "--sysroot", four_sockets, "--batch-size", top, "--json"]):
        proc = run_cli(args)
        assert proc.returncode in (0, ExitCode.INCOMPATIBLE_HOST), proc.stderr[-1500:]  # planned, or too big to fit


@pytest.mark.parametrize("args,value", [
    (["recommend", "--steps", "1000000000000000000000"], "1000000000000000000000"),
    (["train", "--dry-run", "--max-steps", "1000000000000000000000"], "1000000000000000000000"),
    (["train", "--dry-run", "--set", "max_steps=1000000000000000000000"], "1000000000000000000000"),
    (["recommend", "--seq-len", "99999999999999"], "99999999999999"),
    (["recommend", "--seq-len", "0"], "0"),
    (["train", "--dry-run", "--set", "model.seq_len=99999999999999"], "99999999999999"),
    (["train", "--dry-run", "--set", "model.d_model=1000000000"], "1000000000"),
    (["train", "--dry-run", "--hf-flags", "maybe"], "maybe"),
    (["doctor", "--timeout", "-1"], "-1"),
    (["doctor", "--timeout", "nan"], "nan"),
    (["doctor", "--parallel", "0"], "0"),
])
def test_absurd_sizes_and_values_are_refused_naming_them(four_sockets, args, value):
    if args[0] in ("recommend", "doctor") or "--dry-run" in args:
        args = [*args, "--sysroot", four_sockets] if args[0] != "doctor" else args
    _refused(args, value)


@pytest.mark.parametrize("seed", ["-1", "-5", str(2 ** 32), "99999999999999999999999"])
def test_a_seed_is_one_rule_for_every_spelling(seed):
    """--seed -1 was accepted where --set seed=-1 was refused; --seed 10**23 overflowed inside the worker."""
    option = _refused(["train", "--dry-run", "--seed", seed], seed)
    setting = _refused(["train", "--dry-run", "--set", f"seed={seed}"], seed)
    assert option.split(": ", 2)[2] == setting.split(": ", 2)[2]  # the same words after the spelling
    with pytest.raises(ConfigError):
        TrainSettings(seed=int(seed)).validate()  # the worker's own schema: the same bound


@pytest.mark.parametrize("seed", ["0", str(2 ** 32 - 1)])
def test_seeds_at_the_bounds_are_taken_everywhere(seed):
    for args in (["train", "--dry-run", "--seed", seed, "--json"], ["train", "--dry-run", "--set", f"seed={seed}", "--json"]):
        proc = run_cli(args)
        assert proc.returncode == 0, proc.stderr[-1500:]
        assert f'"seed": {seed}' in proc.stdout
    TrainSettings(seed=int(seed)).validate()


def test_the_worker_schema_and_the_knobs_agree_on_random_values():
    """Random integers around each bound of the table: the worker's schema refuses exactly what --set refuses."""
    from cpuperf.errors import FieldError
    from cpuperf.knowledge.knobs import coerce

    rng = random.Random(62)
    worker_keys = [k for k in BOUNDS if k in TrainSettings.__dataclass_fields__]
    for key in worker_keys:
        low, high = BOUNDS[key]
        for value in {low - 1, low, high, high + 1, rng.randint(low, high), rng.randint(high, high * 4),
                      -rng.randint(1, 10 ** 20)}:
            ok = low <= value <= high
            try:
                coerce(key, str(value))
                set_ok = True
            except FieldError:
                set_ok = False
            try:
                TrainSettings(**{key: value}).validate()  # type: ignore[arg-type]
                schema_ok = True
            except ConfigError:
                schema_ok = False
            assert set_ok == schema_ok == ok, (key, value, set_ok, schema_ok)
