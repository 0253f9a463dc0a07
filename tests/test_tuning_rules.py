"""compat/tuning.toml is read in one module (cpuperf.knowledge.tuning) into typed, checked records; every other
module asks the record. A wrong row is refused with the file and the row named."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from cpuperf.data import load_builtin
from cpuperf.errors import BadDataError
from cpuperf.knowledge.tuning import Tuning, parse, tuning

PKG = Path(__file__).resolve().parent.parent / "cpuperf"
RAW_READ = re.compile(r"""load_builtin\(\s*["']tuning\.toml["']\s*\)""")


def test_every_section_of_the_file_is_a_typed_record():
    raw = load_builtin("tuning.toml")
    typed = tuning()
    assert isinstance(typed, Tuning)
    assert set(raw) - {"schema"} == set(Tuning.__dataclass_fields__)
    assert typed.judge.confidence == raw["judge"]["confidence"]
    assert typed.allocator.not_with_ranks == tuple(raw["allocator"]["not_with_ranks"])
    assert dict(typed.memory.bytes_per_param)["adamw"] == raw["memory"]["bytes_per_param_adamw"]
    assert [r.multiple for r in typed.tensor_core] == [r["multiple"] for r in raw["tensor_core"]]
    assert [r.env for r in typed.arm_lever] == [r["env"] for r in raw["arm_lever"]]
    with pytest.raises(AttributeError):
        typed.judge.confidence = 0.5  # type: ignore[misc]  # frozen


def test_the_file_is_read_raw_in_one_module():
    # probe/load.py, below knowledge/ in the layers, is handed its sampling window by its callers
    readers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if RAW_READ.search(p.read_text()))
    assert readers == ["knowledge/tuning.py"]
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    assert [p.name for p in bench.rglob("*.py") if RAW_READ.search(p.read_text())] == []


def _broken(section, key, value, row=None):
    data = copy.deepcopy(load_builtin("tuning.toml"))
    target = data[section][row] if row is not None else data[section]
    if value is KeyError:
        del target[key]
    else:
        target[key] = value
    return data


@pytest.mark.parametrize("change, said", [
    (("judge", "confidence", "high"), "compat/tuning.toml [judge] confidence: 'high' is not a number"),
    (("judge", "confidence", 1.5), "compat/tuning.toml [judge] confidence: 1.5 is outside"),
    (("tune", "passes", 1.5), "compat/tuning.toml [tune] passes: 1.5 is not a whole number"),
    (("tune", "passes", 0), "compat/tuning.toml [tune] passes: 0 is outside 1"),
    (("placement", "pin_ranks_sharing_a_vm_numa_node", "no"), "[placement] pin_ranks_sharing_a_vm_numa_node: 'no' is "
     "not true or false"),
    (("allocator", "not_with_ranks", "mimalloc"), "[allocator] not_with_ranks: 'mimalloc' is not a list of strings"),
    (("allocator", "min_speedup", KeyError), "[allocator] min_speedup: missing"),
    (("load", "busy_cpu_fraction", 2), "[load] busy_cpu_fraction: 2 is outside 0..1"),
    (("measure", "min_round", 3), "[measure] min_round: not a key this table has"),
    (("tensor_core", "multiple", "8", 2), "compat/tuning.toml [[tensor_core]] row 3 multiple: '8' is not a whole number"),
    (("arm_lever", "training", 1, 0), "[[arm_lever]] row 1 training: 1 is not true or false"),
    (("memory", "bytes_per_param_adamw", -1), "[memory] bytes_per_param_adamw: -1 is outside"),
])
def test_a_wrong_row_is_refused_with_the_file_and_the_row_named(change, said):
    with pytest.raises(BadDataError) as err:
        parse(_broken(*change))
    assert said in err.value.message, err.value.message


def test_a_missing_section_is_named():
    data = copy.deepcopy(load_builtin("tuning.toml"))
    del data["judge"]
    with pytest.raises(BadDataError) as err:
        parse(data)
    assert "compat/tuning.toml [judge]: missing" in err.value.message


# -- every command follows the record (a rule re-derived elsewhere would not) --------------------------------


@pytest.fixture
def edited_rules(monkeypatch):
    """compat/tuning.toml as the typed record gives it, with `changes` applied: the record is the one place every
    command reads, so a command that derives the rule on its own shows the file's value instead."""
    import cpuperf.knowledge.tuning as owner

    def apply(changes):
        data = copy.deepcopy(load_builtin("tuning.toml"))
        for (section, key), value in changes.items():
            data[section][key] = value
        owner.tuning.cache_clear()
        monkeypatch.setattr(owner, "load_builtin", lambda name: data if name == "tuning.toml" else load_builtin(name))

    yield apply
    owner.tuning.cache_clear()


def test_every_command_that_plans_the_builtin_model_follows_the_record(tmp_path, edited_rules):
    from cli_util import run_json
    from hosts import make_host

    root = str(make_host(tmp_path, cores_per_socket=2, flags=("avx2", "fma", "avx512f", "avx512_bf16")))
    env = {"CPUPERF_OVERRIDE_GPUS": "[]"}

    def planned():
        rec, _ = run_json(["recommend", "--sysroot", root], env)
        dry, _ = run_json(["train", "--auto", "--dry-run", "--sysroot", root], env)
        return rec["workload"]["name"], dry["workload"]["name"], dry["settings"]["preset"]

    assert planned() == ("tiny", "tiny", "tiny")  # 2 cores: small's reference run is over the 5-minute budget
    edited_rules({("builtin_model", "run_budget_s"): 10 ** 9})
    assert planned() == ("small", "small", "small")


def test_every_command_that_places_ranks_on_a_vm_follows_the_record(tmp_path, edited_rules):
    from cli_util import run_json
    from hosts import make_host

    root = str(make_host(tmp_path, cores_per_socket=4, flags=("avx2", "fma", "hypervisor")))
    env = {"CPUPERF_OVERRIDE_GPUS": "[]", "CPUPERF_OVERRIDE_HYPERVISOR": "1"}
    args = ["--sysroot", root, "--set", "nproc_per_node=2"]

    def affinity():
        rec, _ = run_json(["recommend", *args], env)
        dry, _ = run_json(["train", "--auto", "--dry-run", *args], env)
        return [next(d["value"] for d in out["decisions"] if d["id"] == "affinity") for out in (rec, dry)]

    assert affinity() == [None, None]  # ranks sharing a VM's NUMA node are left to the OS scheduler
    edited_rules({("placement", "pin_ranks_sharing_a_vm_numa_node"): True})
    assert affinity() == ["auto", "auto"]


def test_doctor_and_recommend_say_the_allocator_records_install_command(tmp_path, edited_rules):
    from cli_util import run_json
    from hosts import make_host

    root = str(make_host(tmp_path))
    env = {"CPUPERF_OVERRIDE_GPUS": "[]", "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cpu"})}
    edited_rules({("allocator", "system_install"): "apt-get install -y libexample-alloc"})
    doctor, _ = run_json(["doctor", "--sysroot", root], env, expect_rc=None)
    finding = next(f for f in doctor["findings"] if f["id"] == "no-fast-allocator")
    assert "apt-get install -y libexample-alloc" in finding["message"]
    refused, _ = run_json(["recommend", "--sysroot", root, "--set", "allocator=tcmalloc"], env, expect_rc=2)
    assert "apt-get install -y libexample-alloc" in json.dumps(refused)
