"""The edge of `cpuperf install`: runs pip in the target interpreter, checks indexes, snapshots,
restores and verifies. Everything here touches the OS; the decisions live in cpuperf/install.py.

pip is driven as `[python, "-m", "pip", ...]` with argv lists, never a shell (as pipx does).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.plan.install import Source, parse_freeze, restore_steps

# Seconds to wait for an index before declaring it unreachable; pip's own default is 15 s with
# 5 retries, which is how an air-gapped node "hangs" for minutes.
INDEX_TIMEOUT = 3.0


def cache_dir(environ: Mapping[str, str]) -> Path:
    """~/.cache/cpuperf (XDG_CACHE_HOME respected)."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cpuperf"


def new_run_dir(environ: Mapping[str, str]) -> Path:
    """A fresh directory for one install: the pip log, the freeze before, the wheel stash."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    root = cache_dir(environ) / "installs"
    for i in range(1000):
        d = root / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            d.mkdir(parents=True, exist_ok=False)
            return d
        except FileExistsError:
            continue
    raise OSError(f"cannot create a run directory under {root}")


@dataclass
class PipResult:
    argv: List[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class Pip:
    """`python -m pip` of one interpreter, with a log file and a cleaned environment."""

    def __init__(self, python: str, env: Mapping[str, str], log: Optional[Path] = None):
        self.python = python
        self.env = dict(env)
        self.log = log

    def _log(self, text: str) -> None:
        if self.log is None:
            return
        with open(self.log, "a", encoding="utf-8") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")

    def run(self, args: Sequence[str], timeout: float = 3600.0, stream: Optional[Callable[[str], None]] = None,
            env: Optional[Mapping[str, str]] = None) -> PipResult:
        """Run pip; Ctrl-C waits for pip to stop (it got the signal too), then propagates."""
        argv = [self.python, "-m", "pip", *args]
        self._log(f"$ {' '.join(argv)}")
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(env) if env is not None else self.env, stdin=subprocess.DEVNULL)
        try:
            out, err = proc.communicate(timeout=timeout)
        except KeyboardInterrupt:
            _stop(proc)
            self._log("interrupted (Ctrl-C)")
            raise
        except subprocess.TimeoutExpired:
            _stop(proc)
            out, err = "", f"ERROR: pip did not finish within {timeout:.0f} s"
        seconds = time.monotonic() - start
        self._log(out)
        self._log(err)
        self._log(f"exit {proc.returncode} after {seconds:.1f} s")
        return PipResult(argv, proc.returncode if proc.returncode is not None else -1, out, err, seconds)


def _stop(proc: subprocess.Popen) -> None:
    """Give pip a moment to finish its own Ctrl-C handling, then terminate it."""
    for sig, wait in ((None, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if sig is not None:
            try:
                proc.send_signal(sig)
            except OSError:
                pass
        try:
            proc.wait(timeout=wait)
            return
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue


# --------------------------------------------------------------------------- configuration


def pip_config(pip: Pip) -> str:
    """`pip config list` of the target interpreter ('' when pip cannot say)."""
    try:
        res = pip.run(["config", "list"], timeout=60)
    except OSError:
        return ""
    return res.stdout if res.returncode == 0 else ""


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def python_version(python: str, env: Mapping[str, str]) -> Optional[str]:
    try:
        res = subprocess.run([python, "-I", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=30, env=dict(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def has_pip(python: str, env: Mapping[str, str]) -> bool:
    try:
        res = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60,
                             env=dict(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def create_venv(directory: str, env: Mapping[str, str]) -> Tuple[bool, str]:
    """`python -m venv DIR` (with pip); (ok, error text)."""
    try:
        res = subprocess.run([sys.executable, "-m", "venv", directory], capture_output=True, text=True,
                             timeout=300, env=dict(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return res.returncode == 0, (res.stderr or res.stdout).strip()


# --------------------------------------------------------------------------- sources


def check_source(src: Source, timeout: float = INDEX_TIMEOUT, proxy: Optional[str] = None) -> Source:
    """Is this index / find-links location there? HTTP(S): one short request; paths: existence."""
    loc = src.location
    if loc.startswith(("http://", "https://")):
        handlers: List[Any] = []
        if proxy:
            handlers.append(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
        opener = urllib.request.build_opener(*handlers)
        last = ""
        for method in ("HEAD", "GET"):
            req = urllib.request.Request(loc, method=method, headers={"User-Agent": "cpuperf-install"})
            try:
                with opener.open(req, timeout=timeout) as resp:
                    if resp.status < 400:
                        return replace(src, reachable=True)
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code == 405 and method == "HEAD":
                    continue  # some servers refuse HEAD
                if exc.code in (401, 403):
                    return replace(src, reachable=True, error=last)  # there, pip handles credentials
                break
            except (urllib.error.URLError, OSError, ValueError) as exc:
                reason = getattr(exc, "reason", exc)
                last = str(reason) or type(exc).__name__
                break
        return replace(src, reachable=False, error=last)
    path = loc[len("file://"):] if loc.startswith("file://") else loc
    if os.path.exists(path):
        return replace(src, reachable=True)
    return replace(src, reachable=False, error="no such file or directory")


def index_versions(pip: Pip, name: str, source_args: Sequence[str]) -> Optional[List[str]]:
    """`pip index versions NAME` with these sources: the versions pip can really get (None = failed)."""
    res = pip.run(["index", "versions", name, *source_args], timeout=120)
    if res.returncode != 0:
        return None if "No matching distribution" not in res.stderr else []
    m = re.search(r"^Available versions:\s*(.*)$", res.stdout, re.M)
    if not m:
        return []
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


# --------------------------------------------------------------------------- state


def freeze(pip: Pip) -> str:
    """`pip freeze --all` (pip, setuptools and wheel included: they are part of the state too)."""
    res = pip.run(["freeze", "--all"], timeout=120)
    if res.returncode != 0:
        raise OSError(f"pip freeze failed: {res.stderr.strip()[-300:]}")
    return res.stdout


# Runs inside the target interpreter (standard library only): rebuilds a wheel from an installed
# distribution's RECORD, so a package that came from a local build or an index that is gone can
# still be put back offline. Files outside site-packages (console scripts) are left out: pip
# regenerates them from entry_points.txt.
_REPACK = r"""
import base64, csv, hashlib, os, sys, zipfile
from importlib import metadata
name, version, dest = sys.argv[1:4]
dist = metadata.distribution(name)
if dist.version != version:
    sys.exit("installed %s is %s, not %s" % (name, dist.version, version))
root = str(dist.locate_file(""))
files = [f for f in (dist.files or []) if not str(f).startswith("..")]
distinfo = [f for f in files if str(f).split("/")[0].endswith(".dist-info")]
if not distinfo:
    sys.exit("no dist-info")
di = str(distinfo[0]).split("/")[0]
tag = "py3-none-any"
wheel_file = os.path.join(root, di, "WHEEL")
if os.path.exists(wheel_file):
    for line in open(wheel_file, encoding="utf-8"):
        if line.startswith("Tag:"):
            tag = line.split(":", 1)[1].strip()
            break
stem = di[:-len(".dist-info")]
out = os.path.join(dest, "%s-%s.whl" % (stem, tag))
records = []
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
    for f in files:
        rel = str(f)
        if rel.endswith(".pyc") or rel == di + "/RECORD" or rel.startswith(di + "/INSTALLER") or rel.startswith(di + "/direct_url.json"):
            continue
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        data = open(path, "rb").read()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        zf.writestr(rel, data)
        records.append((rel, "sha256=" + digest, str(len(data))))
    import io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for r in records:
        w.writerow(r)
    w.writerow((di + "/RECORD", "", ""))
    zf.writestr(di + "/RECORD", buf.getvalue())
print(out)
"""


def stash(pip: Pip, packages: Sequence[Tuple[str, str]], dest: Path, source_args: Sequence[str]) -> Dict[str, str]:
    """Keep a wheel of each (name, version) that will be replaced; {name: wheel path or 'ERROR: ...'}."""
    dest.mkdir(parents=True, exist_ok=True)
    out: Dict[str, str] = {}
    for name, version in packages:
        if version.startswith("-e ") or " @ " in version:
            out[name] = f"ERROR: {name} is a direct reference ({version}); restore reinstalls from that reference"
            continue
        before = set(os.listdir(dest))
        res = pip.run(["download", "--no-deps", "--only-binary", ":all:", "--dest", str(dest),
                       f"{name}=={version}", *source_args], timeout=1800)
        new = sorted(set(os.listdir(dest)) - before)
        if res.returncode == 0 and new:
            out[name] = str(dest / new[0])
            continue
        if res.returncode == 0 and any(_wheel_matches(f, name, version) for f in before):
            out[name] = next(str(dest / f) for f in before if _wheel_matches(f, name, version))
            continue
        try:
            rp = subprocess.run([pip.python, "-I", "-c", _REPACK, name, version, str(dest)], capture_output=True,
                                text=True, timeout=1800, env=pip.env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            out[name] = f"ERROR: {exc}"
            continue
        out[name] = rp.stdout.strip() if rp.returncode == 0 else f"ERROR: {rp.stderr.strip()[-300:]}"
    return out


def _wheel_matches(filename: str, name: str, version: str) -> bool:
    from packaging.utils import canonicalize_name

    parts = filename.split("-")
    return len(parts) >= 2 and canonicalize_name(parts[0]) == canonicalize_name(name) and parts[1] == version


_LISTING = r"""
import json, os, sysconfig
paths = sysconfig.get_paths()
out = {}
for d in {paths["purelib"], paths["platlib"]}:
    try:
        out[d] = sorted(os.listdir(d))
    except OSError:
        pass
print(json.dumps(out))
"""


def site_listing(python: str, env: Mapping[str, str]) -> Dict[str, List[str]]:
    """Top-level entries of the target's site-packages, to remove what a broken install left behind."""
    try:
        res = subprocess.run([python, "-I", "-c", _LISTING], capture_output=True, text=True, timeout=60,
                             env=dict(env), stdin=subprocess.DEVNULL)
        return json.loads(res.stdout) if res.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}


def _remove_leftovers(before: Mapping[str, List[str]], now: Mapping[str, List[str]]) -> List[str]:
    """Delete site-packages entries that did not exist before (pip cannot uninstall a dist it did
    not finish installing: it has no RECORD)."""
    import shutil

    removed = []
    for directory, names in now.items():
        old = set(before.get(directory, ()))
        if directory not in before:
            continue
        for name in names:
            if name in old or name == "__pycache__":
                continue
            path = os.path.join(directory, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(path)
            except OSError:
                continue
    return removed


@dataclass
class RestoreResult:
    ok: bool
    uninstalled: List[str]
    reinstalled: List[str]
    problems: List[str]


def restore(pip: Pip, before_text: str, stash_dir: Path,
            listing: Optional[Mapping[str, List[str]]] = None) -> RestoreResult:
    """Put the environment back to the `before` freeze: uninstall what is new, reinstall from the stash."""
    # Ctrl-C during a restore would leave the environment half-way: hold it off until the end.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
    try:
        before = parse_freeze(before_text)
        now = parse_freeze(freeze(pip))
        steps = restore_steps(before, now)
        problems: List[str] = []
        if steps.uninstall:
            res = pip.run(["uninstall", "-y", *steps.uninstall], timeout=1800)
            left = [n for n in steps.uninstall if n in parse_freeze(freeze(pip))]
            if left and listing:
                removed = _remove_leftovers(listing, site_listing(pip.python, pip.env))
                pip._log("removed what a broken install left behind: " + ", ".join(removed))
                left = [n for n in steps.uninstall if n in parse_freeze(freeze(pip))]
            if left:
                problems.append(f"pip uninstall failed: {res.stderr.strip()[-300:]}")
        plain = [f"{n}=={v}" for n, v in steps.reinstall if not (v.startswith("-e ") or " @ " in v)]
        direct = [v for _, v in steps.reinstall if v.startswith("-e ") or " @ " in v]
        if plain:
            res = pip.run(["install", "--no-deps", "--no-index", "--find-links", str(stash_dir), *plain], timeout=1800)
            if res.returncode != 0:
                problems.append(f"reinstalling from the stash failed: {res.stderr.strip()[-300:]}")
        for line in direct:
            args = ["install", "--no-deps"] + (["-e", line[3:]] if line.startswith("-e ") else [line])
            res = pip.run(args, timeout=1800)
            if res.returncode != 0:
                problems.append(f"reinstalling {line} failed: {res.stderr.strip()[-300:]}")
        after = parse_freeze(freeze(pip))
        remaining = restore_steps(before, after)
        if remaining.uninstall or remaining.reinstall:
            problems.append("still different from before: "
                            + ", ".join([f"+{n}" for n in remaining.uninstall] + [f"{n}=={v}" for n, v in remaining.reinstall]))
        return RestoreResult(not problems, list(steps.uninstall), [f"{n}=={v}" for n, v in steps.reinstall], problems)
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------- verification

# Runs in the target interpreter: one JSON line per step, flushed, so a crash (IPEX's version check
# calls exit(127) on a torch mismatch) still leaves the steps before it.
_VERIFY = r"""
import importlib, json, sys
from importlib import metadata
expected = json.loads(sys.argv[1])
modules = json.loads(sys.argv[2])
def say(**kw):
    print(json.dumps(kw), flush=True)
for dist, version in expected.items():
    try:
        have = metadata.version(dist)
    except metadata.PackageNotFoundError:
        have = None
    say(step="version", dist=dist, expected=version, found=have, ok=have == version)
for dist, module in modules.items():
    say(step="import-start", dist=dist, module=module)
    try:
        mod = importlib.import_module(module)
        extra = {"version": getattr(mod, "__version__", None)}
        if module == "torch" and hasattr(mod, "ones"):
            x = mod.ones(8, 8)
            extra.update(cuda=mod.version.cuda, cuda_available=bool(mod.cuda.is_available()),
                         mkldnn=bool(mod.backends.mkldnn.is_available()),
                         matmul_ok=float((x @ x).sum()) == 512.0)
        say(step="import", dist=dist, module=module, ok=extra.get("matmul_ok", True) is not False, **extra)
    except BaseException as exc:
        say(step="import", dist=dist, module=module, ok=False, error="%s: %s" % (type(exc).__name__, exc))
"""


@dataclass
class VerifyResult:
    ok: bool
    checks: List[Dict[str, Any]]
    problems: List[str]
    seconds: float

    def to_json(self) -> Dict[str, Any]:
        return {"ok": self.ok, "checks": self.checks, "problems": self.problems, "seconds": round(self.seconds, 1)}


def verify(python: str, env: Mapping[str, str], expected: Mapping[str, str], modules: Mapping[str, str],
           timeout: float = 300.0) -> VerifyResult:
    """Import the installed packages in a child of the target interpreter and compare versions."""
    start = time.monotonic()
    try:
        res = subprocess.run([python, "-c", _VERIFY, json.dumps(dict(expected)), json.dumps(dict(modules))],
                             capture_output=True, text=True, timeout=timeout, env=dict(env),
                             stdin=subprocess.DEVNULL)
        out, err, rc = res.stdout, res.stderr, res.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", f"verification did not finish within {timeout:.0f} s", -1
    except OSError as exc:
        out, err, rc = "", str(exc), -1
    checks: List[Dict[str, Any]] = []
    for line in out.splitlines():
        try:
            checks.append(json.loads(line))
        except ValueError:
            continue
    problems: List[str] = []
    for c in checks:
        if c["step"] == "version" and not c["ok"]:
            problems.append(f"{c['dist']}: expected {c['expected']}, found {c['found'] or 'nothing'}")
        if c["step"] == "import" and not c["ok"]:
            problems.append(f"import {c['module']} failed: {c.get('error')}")
    started = [c for c in checks if c["step"] == "import-start"]
    finished = {c["module"] for c in checks if c["step"] == "import"}
    for c in started:
        if c["module"] not in finished:
            last = [ln for ln in err.splitlines() if ln.strip()][-2:]
            problems.append(f"import {c['module']} ended the process with exit code {rc}"
                            + (f": {' '.join(last)}" if last else ""))
    if rc != 0 and not problems:
        problems.append(f"the verification exited with code {rc}: {err.strip()[-300:]}")
    checks = [c for c in checks if c["step"] != "import-start"]
    return VerifyResult(not problems, checks, problems, time.monotonic() - start)
