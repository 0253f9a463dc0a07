"""The Arm server levers (compat/tuning.toml [[arm_lever]], cpuperf.decide.arm_levers) decided like any lever, on
recorded Neoverse hosts: fast math (DNNL_DEFAULT_FPMATH_MODE=BF16) changes fp32 results, so it is named and left to
the user where the CPU has BF16 and not planned where it has none; THP allocation is applied; ideep's primitive
cache is listed with why not. Real `cpuperf` processes with --sysroot; the plan's env is what the job would get."""

from __future__ import annotations

import json

import pytest
from cli_util import run_cli, run_json
from hosts import make_arm_host, make_host

from cpuperf.decide.arm_levers import arm_levers
from cpuperf.probe import probe_host

FAST, THP, CACHE = "DNNL_DEFAULT_FPMATH_MODE", "THP_MEM_ALLOC_ENABLE", "LRU_CACHE_CAPACITY"
TORCH = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.9.1"})}  # the registry's aarch64 CPU build


def _mode(rec):
    return next(d for d in rec["decisions"] if d["id"] == "fp32_math_mode")


@pytest.mark.parametrize("kind", ["neoverse_v1", "neoverse_v2"])
def test_bf16_neoverse_names_fast_math_and_leaves_it_to_the_user(tmp_path, kind):
    rec, _ = run_json(["recommend", "--sysroot", str(make_arm_host(tmp_path, kind))], TORCH)
    mode = _mode(rec)
    assert mode["value"] is None and f"{FAST}=BF16" in mode["reason"]
    assert "changes fp32 results" in mode["reason"] and "--set fp32_math_mode=bf16" in mode["reason"]
    assert rec["env"].get(THP) == "1" and FAST not in rec["env"] and CACHE not in rec["env"]
    assert any(n.startswith(f"not applied: {CACHE}=1024") and "inference" in n for n in rec["notes"])


def test_neoverse_n1_does_not_plan_fast_math(tmp_path):
    root = make_arm_host(tmp_path, "neoverse_n1")
    rec, _ = run_json(["recommend", "--sysroot", str(root)], TORCH)
    mode = _mode(rec)
    assert mode["value"] is None and "no Arm BF16 extension" in mode["reason"]
    assert FAST not in rec["env"] and rec["env"].get(THP) == "1"
    proc = run_cli(["recommend", "--sysroot", str(root), "--set", "fp32_math_mode=bf16"], TORCH)
    assert proc.returncode == 2 and "no Arm BF16" in proc.stderr and "Traceback" not in proc.stderr


def test_fast_math_you_set_reaches_the_job_auto_or_plain(tmp_path):
    root = str(make_arm_host(tmp_path, "neoverse_v2"))
    for auto in (["--auto"], []):
        plan, _ = run_json(["train", *auto, "--dry-run", "--sysroot", root, "--set", "fp32_math_mode=bf16"], TORCH)
        env = plan["launch"]["env"]
        assert env.get(FAST) == "BF16" and plan["settings"]["fp32_math_mode"] == "bf16"
        assert (env.get(THP) == "1") is bool(auto)  # a plain run gets only what you set


def test_thp_waits_for_the_torch_that_reads_it(tmp_path):
    old = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.1.2"})}
    facts = probe_host(sysroot=str(make_arm_host(tmp_path, "neoverse_v1")), environ=old)
    (thp,) = [lever for lever in arm_levers(facts) if lever.env == THP]
    assert not thp.applied and "from 2.2 on" in thp.why


def test_x86_hosts_get_no_arm_lever(tmp_path):
    rec, _ = run_json(["recommend", "--sysroot", str(make_host(tmp_path, flags=["avx2", "fma"]))], TORCH)
    assert not {FAST, THP, CACHE} & set(rec["env"]) and not any(CACHE in n for n in rec["notes"])


def test_every_arm_lever_has_a_source_and_a_rule():
    from cpuperf.decide.arm_levers import lever_rows

    rows = lever_rows()
    assert {r.env for r in rows} == {FAST, THP, CACHE}
    for row in rows:
        assert row.source and row.what and isinstance(row.changes_math, bool)
        assert "'" not in row.what + row.source  # they become a variable's comment in shell output
        assert row.changes_math is (row.env == FAST)  # the one that changes results is the user's
