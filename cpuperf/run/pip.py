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
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from cpuperf.fsutil import atomic_write_bytes, cache_root
from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue, as_json
from cpuperf.plan import install as ip
from cpuperf.plan.install import Source, parse_freeze, restore_steps

# Seconds to wait for an index before declaring it unreachable; pip's own default is 15 s with
# 5 retries, which is how an air-gapped node "hangs" for minutes.
INDEX_TIMEOUT = 3.0


def new_run_dir(environ: Mapping[str, str]) -> Path:
    """A fresh directory for one install: the pip log, the freeze before, the wheel stash."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    root = cache_root(environ) / "installs"
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
        try:
            with open(self.log, "a", encoding="utf-8") as fh:
                fh.write(text if text.endswith("\n") else text + "\n")
        except OSError:
            pass  # a full disk must not stop the restore that follows; pip's output is in memory too

    def run(self, args: Sequence[str], timeout: float = 3600.0, stream: Optional[Callable[[str], None]] = None,
            env: Optional[Mapping[str, str]] = None) -> PipResult:
        """Run pip in a session of its own; any stop of ours (Ctrl-C, SIGTERM, SIGHUP) kills its whole
        process group before it propagates, so no orphan pip goes on installing."""
        argv = [self.python, "-m", "pip", *args]
        self._log(f"$ {' '.join(argv)}")
        start = time.monotonic()
        # A session of its own: a terminal's Ctrl-C reaches cpuperf only, and cpuperf decides (and
        # kills the group); killpg then reaches every child pip started (build backends too).
        # Stops are held while pip starts: one landing between fork and `try` would leave pip unkilled.
        held = _main_thread()
        if held:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=dict(env) if env is not None else self.env, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        except BaseException:
            if held:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            raise
        try:
            if held:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a pending stop lands here
            out, err = proc.communicate(timeout=timeout)
        except BaseException as exc:  # KeyboardInterrupt / Stopped, and TimeoutExpired
            kill_group(proc)
            if not isinstance(exc, subprocess.TimeoutExpired):
                self._log(f"stopped ({describe_stop(exc)}); pip's process group was killed")
                raise
            out, err = "", f"ERROR: pip did not finish within {timeout:.0f} s"
        seconds = time.monotonic() - start
        self._log(out)
        self._log(err)
        self._log(f"exit {proc.returncode} after {seconds:.1f} s")
        return PipResult(argv, proc.returncode if proc.returncode is not None else -1, out, err, seconds)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when cpuperf dies, even by SIGKILL (Linux prctl
    PR_SET_PDEATHSIG), so a killed cpuperf leaves no pip installing on its own."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the mask Pip.run held is inherited
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to pip's process group, SIGKILL after a short grace; returns once pip is reaped."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:  # the group is gone already
            pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # pip exited on SIGTERM, but a child it started may linger in the group: it goes too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


# --------------------------------------------------------------------------- stop signals


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP while an install runs (a KeyboardInterrupt, so every Ctrl-C path handles it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_signal(exc: BaseException) -> int:
    """The signal behind a stop: Stopped carries it; a plain KeyboardInterrupt is SIGINT."""
    return exc.signum if isinstance(exc, Stopped) else int(signal.SIGINT)


def describe_stop(exc: BaseException) -> str:
    """'SIGINT', 'SIGTERM', 'SIGHUP'."""
    return signal.Signals(stop_signal(exc)).name


def _raise_stopped(signum: int, _frame: Optional[FrameType]) -> None:
    raise Stopped(signum)


@contextmanager
def stops_as_exceptions() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise Stopped in the main thread, so the install can kill pip and
    restore; without this SIGTERM/SIGHUP end the process on the spot and leave pip running."""
    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def stops_held() -> Iterator[List[int]]:
    """Hold stop signals off (a restore cut half-way is worse than none); yields those that came."""
    came: List[int] = []
    if not _main_thread():
        yield came
        return
    old = {s: signal.signal(s, lambda signum, _frame: came.append(signum)) for s in STOP_SIGNALS}
    try:
        yield came
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --------------------------------------------------------------------------- configuration


def pip_config(pip: Pip) -> str:
    """`pip config list` of the target interpreter ('' when pip cannot say)."""
    try:
        res = pip.run(["config", "list"], timeout=60)
    except OSError:
        return ""
    return res.stdout if res.returncode == 0 else ""


def read_text(path: str) -> str:
    """A pip configuration's constraint file, bounded; unreadable or refused reads as empty."""
    from cpuperf.fsutil import InputRefused, read_text_capped

    try:
        return read_text_capped(path, errors="replace")
    except (OSError, InputRefused):
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
        handlers: List[urllib.request.BaseHandler] = []
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
    from cpuperf.probe.pkgscan import canonical_name as canonicalize_name

    parts = filename.split("-")
    return len(parts) >= 2 and canonicalize_name(parts[0]) == canonicalize_name(name) and parts[1] == version


# The whole tree pip may change: purelib, platlib and, in a venv, its bin/ (console scripts). A
# venv's own bin/ is the venv's; a system interpreter's scripts dir (/usr/bin) is shared with the
# rest of the system, so it is left out. One scandir walk: ~0.1 s for a torch-sized tree (15k files).
_TREE = r"""
import json, os, sys, sysconfig
paths = sysconfig.get_paths()
roots = {paths["purelib"], paths["platlib"]}
if sys.prefix != sys.base_prefix:
    roots.add(paths["scripts"])
out = {}
for root in sorted(roots):
    files = {}
    cut = len(root) + 1
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        files[e.path[cut:] + "/"] = [-1, 0]
                    else:
                        st = e.stat(follow_symlinks=False)
                        files[e.path[cut:]] = [st.st_size, st.st_mtime_ns]
                except OSError:
                    pass
    if os.path.isdir(root):
        out[root] = files
json.dump(out, sys.stdout)
"""


def snapshot_tree(python: str, env: Mapping[str, str]) -> ip.Tree:
    """Every file (size, mtime) and directory under the target's site-packages (and a venv's bin/)."""
    try:
        res = subprocess.run([python, "-I", "-c", _TREE], capture_output=True, text=True, timeout=300,
                             env=dict(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(f"cannot list the site-packages of {python}: {exc}") from exc
    if res.returncode != 0:
        raise OSError(f"cannot list the site-packages of {python}: {res.stderr.strip()[-300:]}")
    try:
        data = json.loads(res.stdout)
    except ValueError as exc:
        raise OSError(f"cannot list the site-packages of {python}: {exc}") from exc
    return {root: {rel: (int(v[0]), int(v[1])) for rel, v in files.items()} for root, files in data.items()}


def remove_added(added: Sequence[Tuple[str, str]]) -> Tuple[List[str], List[str]]:
    """Delete what appeared since the snapshot (topmost new directories whole); (removed, failures)."""
    import shutil

    removed: List[str] = []
    failed: List[str] = []
    for root, rel in added:
        path = os.path.join(root, rel.rstrip("/"))
        try:
            if rel.endswith("/") and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror or exc}")
    return removed, failed


@dataclass
class RestoreResult:
    ok: bool
    uninstalled: List[str]
    reinstalled: List[str]
    problems: List[str]
    removed: List[str]


def restore(pip: Pip, before_text: str, stash_dir: Path, tree: ip.Tree) -> RestoreResult:
    """Put the environment back as it was: the `before` freeze, and the same files under site-packages
    (what a failed or killed pip unpacked is deleted, what it replaced is reinstalled from the stash).
    Never raises for the OS's reasons: what could not be done is in the result's problems."""
    with stops_held():
        try:
            return _restore(pip, before_text, stash_dir, tree)
        except OSError as exc:  # pip itself broken (freeze fails), site-packages unreadable
            pip._log(f"restore stopped: {exc}")
            return RestoreResult(False, [], [], [f"the restore stopped: {exc}"], [])


def _restore(pip: Pip, before_text: str, stash_dir: Path, tree: ip.Tree) -> RestoreResult:
    before = parse_freeze(before_text)
    problems: List[str] = []
    now = parse_freeze(freeze(pip))
    steps = restore_steps(before, now)
    if steps.uninstall:
        pip.run(["uninstall", "-y", *steps.uninstall], timeout=1800)  # checked by the final comparison
    diff = ip.tree_diff(tree, snapshot_tree(pip.python, pip.env))
    removed, failed = remove_added(diff.added)
    problems += [f"cannot remove {f}" for f in failed]
    # What pip replaced comes back from the stash: each pin whose version changed, and every stashed
    # one when files that were there are missing or changed (a replacement cut half-way).
    stashed = {n for n, v in before.items() if _in_stash(stash_dir, n, v)}
    pins = dict(steps.reinstall)
    if diff.damaged():
        pins.update({n: before[n] for n in stashed})
    plain = sorted(f"{n}=={v}" for n, v in pins.items() if not _direct(v))
    if plain:
        res = pip.run(["install", "--no-deps", "--no-index", "--force-reinstall", "--find-links", str(stash_dir),
                       *plain], timeout=1800)
        if res.returncode != 0:
            problems.append(f"reinstalling from the stash failed: {ip.error_summary(res.stderr)}")
    for line in sorted(v for v in pins.values() if _direct(v)):
        args = ["install", "--no-deps"] + (["-e", line[3:]] if line.startswith("-e ") else [line])
        res = pip.run(args, timeout=1800)
        if res.returncode != 0:
            problems.append(f"reinstalling {line} failed: {ip.error_summary(res.stderr)}")
    # The reinstall compiles .pyc files and writes REQUESTED where there were none: they go too.
    extra, failed = remove_added(ip.tree_diff(tree, snapshot_tree(pip.python, pip.env)).added)
    removed += extra
    problems += [f"cannot remove {f}" for f in failed]
    problems += _differences(before, parse_freeze(freeze(pip)), ip.tree_diff(tree, snapshot_tree(pip.python, pip.env)))
    pip._log(f"restore: removed {len(removed)} path(s) that appeared: " + ", ".join(removed[:50]))
    return RestoreResult(not problems, list(steps.uninstall), plain, problems, removed)


def _direct(version: str) -> bool:
    return version.startswith("-e ") or " @ " in version


def _in_stash(stash_dir: Path, name: str, version: str) -> bool:
    try:
        return any(_wheel_matches(f, name, version) for f in os.listdir(stash_dir))
    except OSError:
        return False


def _differences(before: Mapping[str, str], after: Mapping[str, str], diff: ip.TreeDiff) -> List[str]:
    problems: List[str] = []
    remaining = restore_steps(before, after)
    if remaining.uninstall or remaining.reinstall:
        problems.append("pip freeze still differs: " + ", ".join(
            [f"+{n}" for n in remaining.uninstall] + [f"{n}=={v}" for n, v in remaining.reinstall]))
    for what, paths in (("new", diff.added), ("missing", diff.missing), ("changed", diff.changed)):
        if paths:
            shown = ", ".join(os.path.join(r, p) for r, p in paths[:3])
            problems.append(f"{len(paths)} {what} file(s) under site-packages ({shown}{', ...' if len(paths) > 3 else ''})")
    return problems


# --------------------------------------------------------------------------- the journal

JOURNAL = "journal.json"
UNFINISHED = ("running", "restore-incomplete")


def write_journal(path: Path, data: Mapping[str, object]) -> None:
    """Atomically: a power cut leaves the old journal or the new one, never half of one."""
    atomic_write_bytes(path, (json.dumps(dict(data), indent=1) + "\n").encode("utf-8"))


def mark_journal(path: Path, state: str, **extra: object) -> None:
    """Record how the install ended ('done', 'restored', 'restore-incomplete')."""
    data: Dict[str, object] = {**(read_journal(path) or {}), **extra}
    data.update(state=state, ended=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_journal(path, data)


def read_journal(path: Path) -> Optional[JsonObject]:
    try:
        data: JsonValue = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == "cpuperf.install-journal/1" else None


def unfinished_journals(environ: Mapping[str, str], python: Optional[str] = None,
                        site: Optional[str] = None) -> List[Tuple[Path, JsonObject]]:
    """Journals of installs that neither finished nor were restored (SIGKILL, a power cut), newest first."""
    root = cache_root(environ) / "installs"
    try:
        dirs = sorted(root.iterdir(), reverse=True)
    except OSError:
        return []
    found = []
    for d in dirs:
        data = read_journal(d / JOURNAL)
        if data is None or data.get("state") not in UNFINISHED:
            continue
        if python is None or data.get("python") == python or (site is not None and data.get("site") == site):
            found.append((d / JOURNAL, data))
    return found


def recreated_since(data: JsonMapping) -> bool:
    """True when the journal's environment is a venv made again after that install started
    (`rm -rf .venv && python -m venv .venv`): nothing of the half-install is left to recover."""
    import calendar

    site, started = data.get("site"), data.get("started")
    if not isinstance(site, str) or not isinstance(started, str):
        return False
    try:
        began = calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return False
    for up in Path(site).parents[:4]:  # venv/lib/pythonX.Y/site-packages -> venv/pyvenv.cfg
        cfg = up / "pyvenv.cfg"
        try:
            return cfg.stat().st_mtime > began + 1
        except OSError:
            continue
    return False


def site_key(python: str, env: Mapping[str, str]) -> Optional[str]:
    """The interpreter's site-packages (real path): what an install changes, however the python is
    spelled (bin/python, bin/python3, a symlink); None when it does not run (a venv not made yet)."""
    try:
        res = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=60, env=dict(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return os.path.realpath(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip() else None


def install_running(data: JsonMapping) -> bool:
    """Is the cpuperf that wrote this journal still alive (another install going on right now)?"""
    pid = data.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    # a pid is reused after a reboot or a long time: its start time (ticks after boot) tells them apart
    started = process_start(pid)
    return started is not None and str(data.get("pid_start")) == started


def process_start(pid: int) -> Optional[str]:
    """Field 22 of /proc/PID/stat: when the process started (ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


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
        return as_json(self)

    def json_computed(self) -> Dict[str, float]:
        return {"seconds": round(self.seconds, 1)}


def verify(python: str, env: Mapping[str, str], expected: Mapping[str, str], modules: Mapping[str, str],
           timeout: float = 300.0) -> VerifyResult:
    """Import the installed packages in a child of the target interpreter and compare versions."""
    start = time.monotonic()
    try:
        res = subprocess.run([python, "-c", _VERIFY, json.dumps(dict(expected)), json.dumps(dict(modules))],
                             capture_output=True, text=True, timeout=timeout, env=dict(env),
                             stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
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
