""""Native bf16" and "AMX usable" have one owner (cpuperf.knowledge.bf16): every command that shows either says
what the owner answers, in every host class (avx2, avx512 without bf16, avx512_bf16, AMX usable, AMX refused by the
OS, Arm, POWER). A second derivation that drifted from the owner's would disagree in one of them."""

from __future__ import annotations

import pytest
from cli_util import run_json
from host_classes import BY_NAME

from cpuperf.knowledge.bf16 import amx_bf16, amx_bf16_in, amx_usable, bf16_native
from cpuperf.probe import probe_host

CLASSES = ("avx2", "avx512", "avx512-bf16", "amx", "amx-denied", "neoverse", "power10")
# (bf16 native, AMX usable) as the classes are described (tests/host_classes.py)
EXPECTED = {"avx2": (False, False), "avx512": (False, False), "avx512-bf16": (True, False), "amx": (True, True),
            "amx-denied": (True, False), "neoverse": (True, False), "power10": (True, False)}


def _env(cls):
    env = {"CPUPERF_OVERRIDE_GPUS": "[]"}
    if cls.amx_usable is not None:
        env["CPUPERF_OVERRIDE_AMX_USABLE"] = "1" if cls.amx_usable else "0"
    return env


@pytest.mark.parametrize("name", CLASSES)
def test_every_command_says_what_the_owner_answers(tmp_path, monkeypatch, name):
    cls = BY_NAME[name]
    root = cls.tree(tmp_path / name)
    env = _env(cls)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    facts = probe_host(sysroot=str(root), use_cache=False)
    assert (bf16_native(facts), amx_usable(facts)) == EXPECTED[name]

    doctor, _ = run_json(["doctor", "--sysroot", str(root)], env, expect_rc=None)
    assert doctor["host"]["cpu"]["bf16_native"] is bf16_native(facts)
    rec, _ = run_json(["recommend", "--sysroot", str(root)], env)
    dtype = next(d for d in rec["decisions"] if d["id"] == "dtype")
    if facts.cpu.arch == "x86_64":
        assert (dtype["value"] == "bf16") is bf16_native(facts), dtype
        assert ("(AMX)" in dtype["reason"]) is amx_bf16(facts), dtype
        assert amx_bf16_in(dtype["evidence"]) is amx_bf16(facts)  # a saved plan's reader gets the same answer
    dry, _ = run_json(["train", "--auto", "--dry-run", "--sysroot", str(root)], env)
    assert next(d for d in dry["decisions"] if d["id"] == "dtype")["reason"] == dtype["reason"]


@pytest.mark.parametrize("name", ["neoverse", "power10"])
def test_every_command_follows_the_owner_when_its_answer_changes(tmp_path, monkeypatch, name):
    """The owner's table says which unit runs bf16 off x86: take the unit away and doctor, recommend and
    train --dry-run must all say bf16 would be emulated (a command that looked at cpuinfo itself would not)."""
    from cpuperf.knowledge import bf16

    root = BY_NAME[name].tree(tmp_path / name)
    env = {"CPUPERF_OVERRIDE_GPUS": "[]"}

    def said():
        doctor, _ = run_json(["doctor", "--sysroot", str(root)], env, expect_rc=None)
        rec, _ = run_json(["recommend", "--sysroot", str(root)], env)
        dry, _ = run_json(["train", "--auto", "--dry-run", "--sysroot", str(root)], env)
        reasons = [next(d for d in out["decisions"] if d["id"] == "dtype")["reason"] for out in (rec, dry)]
        return doctor["host"]["cpu"]["bf16_native"], ["emulated" in r for r in reasons]

    assert said() == (True, [False, False])
    monkeypatch.setitem(bf16._NON_X86_UNIT, "aarch64" if name == "neoverse" else "ppc64le", "no-such-unit")
    assert said() == (False, [True, True])
