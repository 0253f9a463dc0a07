"""Read what tests/arm/inside.sh left in OUT and say, step by step, what the Arm tier ran and whether it holds.

    python3 tests/arm/check.py OUT      # exit 0 when every check passes; the summary on stdout (and OUT/summary.json)

Plain Python (no cpuperf import): it runs on the x86 host after the emulated run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")


def _steps() -> Dict[str, Tuple[int, int]]:
    rows = (OUT / "steps.txt").read_text().split("\n") if (OUT / "steps.txt").exists() else []
    return {name: (int(rc), int(s)) for name, rc, s in (r.split() for r in rows if r.strip())}


def _json(name: str) -> Any:
    text = (OUT / f"{name}.out").read_text() if (OUT / f"{name}.out").exists() else ""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _text(name: str) -> str:
    path = OUT / f"{name}.out"
    return path.read_text() if path.exists() else ""


def _decision(rec: Any, key: str) -> Dict[str, Any]:
    return next((d for d in (rec or {}).get("decisions", []) if d["id"] == key), {})


def _install() -> Tuple[bool, str]:
    plan = _json("install-plan") or {}
    text = json.dumps(plan)
    torch = _text("torch-import").split()
    cuda = [p for p in ("nvidia-", "triton", "cuda-") if p in text]
    ok = bool(torch) and not cuda
    return ok, f"torch {torch[0] if torch else '?'} on {torch[1] if len(torch) > 1 else '?'}" + \
        (f"; CUDA payload planned: {cuda}" if cuda else "; no CUDA payload")


def _recommend(kind: str, fast_math_named: bool) -> Tuple[bool, str]:
    rec = _json(f"recommend-{kind}") or {}
    mm = _decision(rec, "fp32_math_mode")
    env = rec.get("env", {})
    named = "DNNL_DEFAULT_FPMATH_MODE" in mm.get("reason", "")
    why_not = ("yours to choose" in mm.get("reason", "")) if fast_math_named else ("no Arm BF16" in mm.get("reason", ""))
    ok = mm.get("value") is None and named and why_not and env.get("THP_MEM_ALLOC_ENABLE") == "1"
    return ok, f"dtype {_decision(rec, 'dtype').get('value')}, fp32_math_mode {mm.get('value')} ({'names fast math' if named else 'silent'}), env {sorted(env)}"


def _doctor(kind: str, want: str) -> Tuple[bool, str]:
    text = _text(f"doctor-{kind}")
    rep = _json(f"doctor-json-{kind}") or {}
    cpu = rep.get("host", {}).get("cpu", {})
    bf16 = "bf16" in cpu.get("isa", [])
    ok = cpu.get("bf16_native") is bf16 and want in text
    return ok, f"{cpu.get('microarchitecture')}: bf16 native {cpu.get('bf16_native')} beside ISA bf16 {bf16}; '{want}' shown"


def _train(name: str, dtype: str, steps: int) -> Tuple[bool, str]:
    run = _json(name) or {}
    got = run.get("steps")
    ran = (run.get("settings") or {}).get("dtype")
    ok = got == steps and ran == dtype
    return ok, f"{got} step(s) in {ran}, {run.get('samples_per_s') or run.get('throughput') or ''}".rstrip(", ")


def _ranks(dirname: str, n: int) -> Tuple[bool, str]:
    reports = [json.loads(p.read_text()) for p in sorted((OUT / dirname).glob("rank*.json"))]
    sums = {round(r.get("checksum", 0.0), 5) for r in reports if "checksum" in r}
    ok = len(reports) == n and (n == 1 or len(sums) == 1)
    cpus = [r.get("cpus") for r in reports]
    return ok, f"{len(reports)} rank report(s), CPUs {cpus}, threads {[r.get('omp_num_threads') for r in reports]}" + \
        (f", one model after DDP (checksum {sums.pop()})" if n > 1 and len(sums) == 1 else "")


CHECKS: List[Tuple[str, Optional[str], Callable[[], Tuple[bool, str]]]] = [
    ("aarch64 userland", None, lambda: ((OUT / "uname.txt").exists() and "aarch64" in (OUT / "uname.txt").read_text(),
                                        (OUT / "python.txt").read_text().strip() if (OUT / "python.txt").exists() else "")),
    ("cpuperf install picks a CPU torch", "install", _install),
    ("doctor: V1 bf16 line and unsourced clock", "doctor-neoverse_v1", lambda: _doctor("neoverse_v1", "unsourced: the clock of a Neoverse V1")),
    ("doctor: V2 bf16 line and unsourced clock", "doctor-neoverse_v2", lambda: _doctor("neoverse_v2", "unsourced: NVIDIA Grace highest rated clock")),
    ("doctor: N1 clock row (Ampere Altra)", "doctor-neoverse_n1", lambda: _doctor("neoverse_n1", "3.30 GHz (Ampere Altra Q80-33")),
    ("recommend V1: fast math named, not applied", "recommend-neoverse_v1", lambda: _recommend("neoverse_v1", True)),
    ("recommend V2: fast math named, not applied", "recommend-neoverse_v2", lambda: _recommend("neoverse_v2", True)),
    ("recommend N1: no fast math (no BF16)", "recommend-neoverse_n1", lambda: _recommend("neoverse_n1", False)),
    ("recommend N1 --set fp32_math_mode=bf16 refused", None, lambda: (_steps().get("recommend-n1-fastmath", (0, 0))[0] == 2,
                                                                   "exit 2" if _steps().get("recommend-n1-fastmath", (0, 0))[0] == 2 else "not refused")),
    ("train --auto fp32 (builtin, 3 steps)", "train-fp32", lambda: _train("train-fp32", "fp32", 3)),
    ("train --auto bf16 autocast (3 steps)", "train-bf16", lambda: _train("train-bf16", "bf16", 3)),
    ("train --auto fp32_math_mode=bf16 (2 steps)", "train-fastmath", lambda: _train("train-fastmath", "fp32", 2)),
    ("user script under --auto", "user-script", lambda: _ranks("seen-script", 1)),
    ("torchrun --nproc-per-node 2 under --auto", "torchrun-ddp", lambda: _ranks("seen-ddp", 2)),
]


def main() -> int:
    steps = _steps()
    results = []
    for title, step, check in CHECKS:
        rc, secs = steps.get(step, (0, 0)) if step else (0, 0)
        try:
            ok, detail = check()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ok, detail = False, f"unreadable: {exc}"
        ok = ok and rc == 0
        results.append({"check": title, "ok": ok, "step": step, "exit": rc, "seconds": secs, "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {title} [{step or '-'}: exit {rc}, {secs} s] {detail}")
    total = sum(s for _, s in steps.values())
    print(f"steps took {total} s in all; {sum(r['ok'] for r in results)} passed, {sum(not r['ok'] for r in results)} failed")
    (OUT / "summary.json").write_text(json.dumps({"results": results, "steps": steps, "seconds": total}, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
