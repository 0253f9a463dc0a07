"""The README's first line, tried as a new user would on a busy machine (issue 44's "done when").

    python -m tools.try_as_newcomer [--keep DIR] [--no-load] [--max-gap 10]

A fresh clone of this checkout's HEAD in a temporary directory, a fresh cache, and two `python -c 'while True: pass'`
processes started here (stopped after) keeping both cores busy; then README line 1 exactly as the README writes it,
every line it prints stamped with the time it came. Then, with the busy loops stopped, the plan it left behind is
compared with the plan from a measurement taken without them (`cpuperf bench --refresh` into a second cache): the
decisions' values must agree, or the busy run must have said once why not (a ratio too noisy to decide).

Prints line 1's wall time, its exit code, the longest silence and the ten longest, per phase; exit 0 when line 1
exits 0, no silence is longer than --max-gap seconds in the phases cpuperf runs (pip's own install of cpuperf's
dependencies is reported, not judged) and the plans agree (or the difference was said). Heavy: tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent


def readme_line_1() -> str:
    """The first command of the README's first code block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README has no bash block"
    return block.group(1).strip().splitlines()[0]


def run_stamped(cmd: str, cwd: Path, env: Dict[str, str], log: Path) -> Tuple[int, float, List[Tuple[float, str]]]:
    """Run `cmd` in bash, stdout and stderr merged, each line stamped (seconds since start) and logged as it comes."""
    start = time.monotonic()
    lines: List[Tuple[float, str]] = []
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    assert proc.stdout is not None
    with open(log, "w") as fh:
        for line in proc.stdout:
            t = time.monotonic() - start
            lines.append((t, line.rstrip("\n")))
            fh.write(f"{t:8.1f} {line}")
            fh.flush()
    code = proc.wait()
    return code, time.monotonic() - start, lines


def phases(lines: List[Tuple[float, str]]) -> Dict[str, List[Tuple[float, str]]]:
    """The lines of each part of line 1: pip installing cpuperf, `cpuperf install`, `cpuperf train`."""
    out: Dict[str, List[Tuple[float, str]]] = {"pip install -e .": [], "cpuperf install": [], "cpuperf train": []}
    phase = "pip install -e ."
    for t, line in lines:
        if phase == "pip install -e ." and (line.startswith(("cpuperf install", "asking pip", "install plan", "nothing to do"))
                                            or "pip is resolving" in line):
            phase = "cpuperf install"
        if phase == "cpuperf install" and line.startswith("cpuperf train"):
            phase = "cpuperf train"
        out[phase].append((t, line))
    return out


def gaps(stamps: List[float], start: float, end: float) -> List[Tuple[float, float]]:
    """(silence in seconds, when it began) between consecutive lines, from `start` to `end`, longest first."""
    points = [start, *stamps, end]
    return sorted(((b - a, a) for a, b in zip(points, points[1:])), reverse=True)


def decisions(venv_python: Path, cwd: Path, env: Dict[str, str]) -> Dict[str, object]:
    proc = subprocess.run([str(venv_python), "-m", "cpuperf", "train", "--auto", "--dry-run", "--json"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return {d["id"]: d["value"] for d in json.loads(proc.stdout)["decisions"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="work here (kept) instead of a temporary directory")
    ap.add_argument("--no-load", action="store_true", help="no busy loops (the quiet-machine baseline)")
    ap.add_argument("--max-gap", type=float, default=10.0)
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="cpuperf-newcomer-"))
    work.mkdir(parents=True, exist_ok=True)
    clone = work / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(clone), "log", "--oneline", "-1"], capture_output=True, text=True).stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPUPERF_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env.update({"CPUPERF_CACHE_DIR": str(work / "cache-busy"), "NO_COLOR": "1", "COLUMNS": "80"})
    shutil.rmtree(work / "cache-busy", ignore_errors=True)
    line = readme_line_1()
    print(f"clone of {head.strip()} in {clone}\nREADME line 1: {line}", flush=True)
    hogs = [] if args.no_load else [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        code, wall, lines = run_stamped(line, clone, env, work / "line1.log")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(f"line 1: exit {code}, {wall:.0f} s ({wall / 60:.1f} min), {len(lines)} lines; log {work / 'line1.log'}")
    ok = code == 0
    parts = phases(lines)
    bounds = [t for part in parts.values() for t, _ in part[:1]] + [wall]
    for i, (name, part) in enumerate(parts.items()):
        if not part:
            continue
        start = part[0][0]
        end = next((b for b in bounds if b > start), wall) if i < len(parts) - 1 else wall
        worst = gaps([t for t, _ in part], start, end)
        judged = name != "pip install -e ."
        print(f"  {name}: {end - start:.0f} s, {len(part)} lines, longest silences "
              + ", ".join(f"{g:.1f} s at {t:.0f} s" for g, t in worst[:10]) + ("" if judged else " (pip's own: not judged)"))
        if judged and worst and worst[0][0] > args.max_gap:
            ok = False
    said = [ln for _, ln in lines if "`cpuperf bench --refresh` measures again" in ln
            and ("the rule decides" in ln or "does not count" in ln)]
    py = clone / ".venv" / "bin" / "python"
    if code == 0 and py.exists():
        busy = decisions(py, clone, env)
        quiet_env = {**env, "CPUPERF_CACHE_DIR": str(work / "cache-quiet")}
        shutil.rmtree(work / "cache-quiet", ignore_errors=True)
        bench = subprocess.run([str(py), "-m", "cpuperf", "bench", "--refresh", "--json"], cwd=clone, env=quiet_env,
                               capture_output=True, text=True, timeout=1800)
        print(f"quiet measurement (no busy loops of ours): exit {bench.returncode}")
        quiet = decisions(py, clone, quiet_env)
        differ = {k: (busy.get(k), quiet.get(k)) for k in set(busy) | set(quiet) if busy.get(k) != quiet.get(k)}
        print("plan under load vs without it: " + ("the same decisions" if not differ else f"differ: {differ}"))
        print(f"said why (once each): {said}" if said else "every ratio decided")
        if differ and not said:
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
