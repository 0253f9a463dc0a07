"""`cpuperf install`: resolve, plan, show, confirm, run pip, verify; restore the environment on failure."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

from packaging.version import Version

from cpuperf import fsutil
from cpuperf.errors import (
    CpuperfError,
    ExitCode,
    FilesystemError,
    IncompatibleHostError,
    PipFailedError,
    UnreachableError,
    UsageError,
    exit_code_for_signal,
)
from cpuperf.output import Output, Progress
from cpuperf.plan import install as ip
from cpuperf.probe.pkgscan import canonical_name as canonicalize_name
from cpuperf.run import pip as pd
from cpuperf.versions import base_of, base_or_none, local_label, major_minor, version_or_none

if TYPE_CHECKING:
    from cpuperf.knowledge.matrix import Matrix
    from cpuperf.knowledge.resolve import Resolution
    from cpuperf.probe.facts import HostFacts

# The torch builds a CUDA host takes: one cuXYZ tag, or every tag its driver runs.
CudaTags = Union[str, Collection[str], None]

OFFLINE_HINT = ("offline route: on a connected machine run `cpuperf install --download DIR` (same Python), "
                "copy DIR here, then `cpuperf install --find-links DIR --from-lock DIR/cpuperf.lock.txt --yes`")


@dataclass
class Options:
    torch: Optional[str] = None
    with_: Sequence[str] = ()
    python: Optional[str] = None
    venv: Optional[str] = None
    dry_run: bool = False
    yes: bool = False
    index_url: Optional[str] = None
    find_links: Sequence[str] = ()
    download: Optional[str] = None
    write_lock: Optional[str] = None
    from_lock: Optional[str] = None
    allow_cuda_torch: bool = False
    recover: bool = False


def load_matrix_for_install() -> Matrix:
    """The compat matrix (shipped data plus $CPUPERF_COMPAT_DIR); malformed data is exit code 6."""
    from cpuperf.errors import BadDataError
    from cpuperf.knowledge import matrix as mx

    try:
        return mx.default_matrix()
    except mx.MatrixError as exc:
        raise BadDataError(str(exc), hint="fix the file, or unset CPUPERF_COMPAT_DIR") from exc


# --------------------------------------------------------------------------- the target


def _target(opts: Options, env: Mapping[str, str]) -> ip.Target:
    if opts.python and opts.venv:
        raise UsageError("--python and --venv name the same thing; give one", hint="cpuperf install --venv .venv")
    if opts.venv:
        venv = os.path.abspath(opts.venv)
        python = os.path.join(venv, "bin", "python")
        if os.path.exists(python):
            return ip.Target(python, pd.python_version(python, env) or "")
        if os.path.exists(venv) and not os.path.isdir(venv):
            raise UsageError(f"--venv {venv} is a file, not a directory", hint="name a new directory, or an existing venv")
        try:
            occupied = os.path.exists(venv) and bool(os.listdir(venv))
        except OSError as exc:
            raise UsageError(f"--venv {venv}: {exc.strerror or exc}", hint="name a new directory, or an existing venv") from exc
        if occupied:
            raise UsageError(f"{venv} exists but is not a virtual environment (no bin/python)",
                             hint="name a new directory, or an existing venv")
        return ip.Target(python, "%d.%d.%d" % sys.version_info[:3], create_venv=venv)
    python = opts.python or sys.executable
    if not os.path.exists(python):
        raise UsageError(f"no Python interpreter at {python}", hint="pass --python PATH of an existing interpreter")
    version = pd.python_version(python, env)
    if version is None:
        raise UsageError(f"{python} does not run as a Python interpreter", hint="pass --python PATH of a python")
    return ip.Target(os.path.abspath(python) if opts.python else python, version)


def _facts(target: ip.Target) -> HostFacts:
    from cpuperf.probe import probe_host

    if target.create_venv:
        # The venv does not exist yet: this interpreter's hardware facts, and no packages.
        facts = probe_host()
        sw = facts.software
        if sw is not None:
            sw = dataclasses.replace(sw, packages={k: None for k in sw.packages})
        return dataclasses.replace(facts, software=sw)
    return probe_host(python=target.python)


# --------------------------------------------------------------------------- sources


def _check_all(sources: ip.SourceSet, proxy: Optional[str]) -> ip.SourceSet:
    todo = [s for s in sources.sources if not (sources.no_index and s.kind != "find-links")]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(todo)))) as pool:
        checked = dict(zip([id(s) for s in todo], pool.map(lambda s: pd.check_source(s, proxy=proxy), todo)))
    return dataclasses.replace(sources, sources=tuple(checked.get(id(s), s) for s in sources.sources))


def _fail_unreachable(sources: ip.SourceSet, out: Output) -> None:
    """The user's (or pip's configured) unreachable remote index is an error; a missing local path too."""
    for s in sources.sources:
        if s.reachable is not False:
            continue
        if s.origin == "flag":
            what = "index" if s.kind != "find-links" else "find-links location"
            raise UnreachableError(f"the {what} {s.location} you named is unreachable ({s.error})", hint=OFFLINE_HINT)
        if s.origin in ("pip-config", "env"):
            if s.remote:
                where = "PIP_* environment" if s.origin == "env" else "pip configuration (`pip config list`)"
                raise UnreachableError(f"the index {s.location} from your {where} is unreachable ({s.error})",
                                       hint="fix or remove it (`pip config list` shows where), or " + OFFLINE_HINT)
            out.warn(f"{s.location} ({s.detail}) does not exist; pip ignores it")


def _sources(opts: Options, config: Mapping[str, str], lock: Optional[ip.Lock]) -> ip.SourceSet:
    for fl in opts.find_links:
        if not fl.startswith(("http://", "https://", "file://")) and not os.path.isdir(fl):
            raise UsageError(f"--find-links {fl}: no such directory", hint=OFFLINE_HINT)
    user = ip.user_sources(opts.index_url, opts.find_links)
    cfg = ip.sources_from_config(config)
    if user.no_index:
        cfg = [s for s in cfg if s.kind == "find-links"]
    srcs = ip.SourceSet(user.sources + tuple(cfg), no_index=user.no_index,
                        user_chosen=user.user_chosen).with_pypi()
    if lock is not None and not user.user_chosen:
        recorded = [ip.Source("extra-index-url", u, "lock", detail="recorded in the lock file")
                    for u in lock.index_urls if u != "https://pypi.org/simple"]
        recorded += [ip.Source("find-links", u, "lock", detail="recorded in the lock file") for u in lock.find_links]
        srcs = srcs.with_defaults(recorded)
    return srcs


# --------------------------------------------------------------------------- choosing torch


def _requested_match(text: str, request: Optional[str]) -> bool:
    if not request:
        return True
    v, r = version_or_none(text), version_or_none(request)
    if v is None or r is None:
        return False
    if r.local:
        return v == r
    if len(r.release) >= 3:
        return v.public == r.public
    return v.release[:len(r.release)] == r.release


def _choose_torch(opts: Options, py: str, want: frozenset[str], matrix: Matrix, device: str, cuda_tag: CudaTags,
                  versions: Optional[List[str]], specs: List[str],
                  installed: Optional[str]) -> Tuple[Optional[Resolution], Optional[str], List[str]]:
    """(resolution, exact torch build or None = host default label, notes)."""
    from cpuperf.knowledge.resolve import resolve
    from cpuperf.probe.wheel_platform import wheel_platform

    notes: List[str] = []
    if opts.torch is None and installed:
        r = resolve(py, None, want, wheel_platform(), matrix=matrix, installed_torch=installed)
        return r, installed, notes
    if versions is None:
        r = resolve(py, opts.torch, want, wheel_platform(), matrix=matrix)
        notes.append("could not list the versions the sources offer (pip index versions failed); "
                     "the dry run decides")
        return r, None, notes
    right = [v for v in versions if _requested_match(v, opts.torch)]
    for plain in (False, True):
        cands = [v for v in right if ip.newest_build([v], device, cuda_tag, specs, allow_plain=plain) == v]
        if plain:
            cands = [v for v in cands if not local_label(v)]
            if device == "cpu":
                cands = _plain_cpu_builds(cands, matrix, notes)
        cands.sort(key=Version, reverse=True)
        for v in cands:
            r = resolve(py, Version(v).public, want, wheel_platform(), matrix=matrix)
            if r.ok:
                if plain:
                    notes.append(f"no {'+cpu' if device == 'cpu' else 'CUDA'} build of torch"
                                 f"{' ' + opts.torch if opts.torch else ''} is offered by the sources; trying the "
                                 f"registry's build {v}")
                return r, v, notes
    return None, None, notes


def _plain_cpu_builds(versions: List[str], matrix: Matrix, notes: List[str]) -> List[str]:
    """The registry's unlabelled builds a CPU host may take on this interpreter's platform, with a note where the
    newer ones are CUDA builds (plan/install.py registry_cpu_builds)."""
    from cpuperf.probe.wheel_platform import wheel_platform

    keep, cuda = ip.registry_cpu_builds(versions, matrix, wheel_platform())
    if cuda and keep:
        notes.append(f"the registry's Linux aarch64 torch is a CUDA build from {min(cuda, key=Version)} on ({len(cuda)} "
                     f"of the releases offered; compat/torch.toml pypi_aarch64): its newest CPU build, "
                     f"{max(keep, key=Version)}, instead")
    return keep


# --------------------------------------------------------------------------- the command


def run(out: Output, opts: Options) -> int:
    """The whole command; returns the exit code (errors are raised as CpuperfError).

    SIGINT, SIGTERM and SIGHUP stop pip's whole process group and restore the environment; a stop
    before pip changed anything says so."""
    with pd.stops_as_exceptions():
        try:
            return _run(out, opts)
        except KeyboardInterrupt as exc:  # stopped while planning: nothing was changed
            raise CpuperfError(f"interrupted by {pd.describe_stop(exc)}; nothing was changed",
                               code=stop_code(exc)) from None


def _check_outputs(opts: Options) -> None:
    """Paths the command will write, checked before any work: a lock file that is a directory, a download
    directory that is a file, or a parent that is missing or not a directory is one line, exit 10."""
    from cpuperf.errors import FilesystemError
    from cpuperf.fsutil import check_output_file

    if opts.write_lock is not None:
        check_output_file("--write-lock", opts.write_lock)
    if opts.download is not None:  # a directory: made when missing, in a parent that exists
        path = opts.download
        if not path.strip():
            raise UsageError("--download is empty: name a directory")
        target, parent = Path(path), Path(path).absolute().parent
        if target.exists() and not target.is_dir():
            raise FilesystemError(f"--download {path} is a file, not a directory", hint="name a directory")
        if not parent.is_dir():
            what = "is not a directory" if parent.exists() else "does not exist"
            raise FilesystemError(f"--download {path}: the directory {parent} {what}",
                                  hint=f"make it first (mkdir -p {parent}), or name a directory whose parent exists")


def _check_request(out: Output, opts: Options) -> None:
    """Option combinations refused before anything is probed or asked."""
    _check_outputs(opts)
    if opts.recover and (opts.dry_run or opts.download or opts.torch or opts.with_ or opts.from_lock):
        raise UsageError("--recover only restores; it takes --python or --venv and nothing else",
                         hint="cpuperf install --recover --python PATH")
    if not (opts.dry_run or opts.download or opts.yes or opts.recover) and not sys.stdin.isatty():
        _confirm(opts, out, None)  # refuses at once: nobody could answer the question later


def _run(out: Output, opts: Options) -> int:
    _check_request(out, opts)
    environ = dict(os.environ)
    env = ip.child_env(environ)
    target = _target(opts, env)
    if opts.recover:
        return recover(out, target.python, environ)
    _refuse_unfinished(target.python, environ, out, changes=not (opts.dry_run or opts.download))
    facts = _facts(target)
    if not facts.platform.startswith("linux"):
        from cpuperf.errors import UnsupportedPlatformError

        raise UnsupportedPlatformError(f"cpuperf installs wheels on Linux; this is {facts.platform}")
    query_python = sys.executable if target.create_venv else target.python
    if not target.create_venv and not pd.has_pip(target.python, env):
        raise UsageError(f"{target.python} has no pip", hint=f"{target.python} -m ensurepip --upgrade")

    try:
        run_dir = Path(tempfile.mkdtemp(prefix="cpuperf-install-")) if (opts.dry_run or opts.download) \
            else pd.new_run_dir(environ)
    except OSError as exc:
        raise _cache_error(exc, "cpuperf's install directory") from exc
    log = run_dir / "pip.log"
    pip = pd.Pip(query_python, env, log)

    config = ip.parse_pip_config_list(pd.pip_config(pip))
    lock = _read_lock(opts.from_lock) if opts.from_lock else None
    sources = _sources(opts, config, lock)
    proxy = config.get("proxy") or None
    device = ip.host_device(facts)
    py = major_minor(target.version)
    _say_python_eol(out, facts, py)

    if lock is not None:
        plan = _plan_lock(opts, out, lock, facts, target, _check_all(sources, proxy), run_dir, environ)
    else:
        plan = _plan(opts, out, facts, target, pip, sources, config, proxy, device, py, environ)

    for w in plan.warnings:
        out.warn(w)
    plan = _dry_run(plan, pip, run_dir, out, ignore_installed=bool(target.create_venv))
    _refuse_cuda_torch(plan)

    if opts.write_lock:
        _write_lock(plan, opts.write_lock, out)
    if opts.download:
        return _download(plan, pip, opts.download, out)
    if opts.dry_run:
        if out.json_mode:
            out.json(plan.to_json({"status": "planned", "dry_run": True}))
        else:
            render_plan(out, plan, product=True)
        return int(ExitCode.OK)

    if _nothing_to_do(plan):
        return _unchanged(out, plan)
    if not out.json_mode:
        render_plan(out, plan, product=False)
    _confirm(opts, out, plan)
    return _execute(plan, out, run_dir, env)


def _say_python_eol(out: Output, facts: HostFacts, py: str) -> None:
    """Before anything is installed: the target Python past its end of life, or close to it (doctor's finding)."""
    from cpuperf.knowledge.resolve import python_eol_finding
    from cpuperf.probe import probe_today
    from cpuperf.probe.wheel_platform import wheel_platform

    if facts.software is not None and facts.software.python:
        py = major_minor(facts.software.python)  # CPUPERF_OVERRIDE_PYTHON describes another interpreter, as in doctor
    found = python_eol_finding(py, probe_today(), load_matrix_for_install(), wheel_platform())
    if found is None:
        return
    text = found["message"] + (f" (fix: {found['fix']})" if found["fix"] else "")
    if found["severity"] == "warning":
        out.warn(text)
    else:
        out.info(text)


def _nothing_to_do(plan: ip.InstallPlan) -> bool:
    """Every planned package is installed already at its planned version (pip's dry run would install nothing, or
    only what it marks "keep"): running pip would spend its start-up and resolution (15-33 s measured here) to
    change nothing."""
    return not plan.target.create_venv and all(p.action == "keep" for p in plan.packages)


def _unchanged(out: Output, plan: ip.InstallPlan) -> int:
    """The result of an install with nothing to do: no pip run, no transaction, nothing asked."""
    if not plan.packages:  # pip's dry run would install nothing: every pin is kept as installed
        plan = dataclasses.replace(plan, packages=tuple(dataclasses.replace(p, action="keep") for p in plan.requirements))
    if out.json_mode:
        out.json(plan.to_json({"status": "unchanged", "seconds": 0.0}))
        return int(ExitCode.OK)
    kept = ", ".join(f"{p.name} {p.version}" for p in plan.packages)
    out.product(f"nothing to do: {plan.target.python} has every planned package already ({kept})")
    return int(ExitCode.OK)


def _plan_lock(opts: Options, out: Output, lock: ip.Lock, facts: HostFacts, target: ip.Target, sources: ip.SourceSet,
               run_dir: Path, environ: Mapping[str, str]) -> ip.InstallPlan:
    """The plan that installs exactly the lock's pins, checked by their hashes where every pin has one."""
    _fail_unreachable(sources, out)
    try:
        plan = ip.plan_from_lock(lock, facts, sources, target, allow_cuda_torch=opts.allow_cuda_torch, environ=environ)
    except ip.PlanError as exc:
        raise IncompatibleHostError(str(exc), hint="make the lock on a node with the same Python") from exc
    if all(p.sha256 for p in lock.packages):
        # every pin has a hash: pip checks each wheel against it (--require-hashes)
        req_file = run_dir / "lock-requirements.txt"
        req_file.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in lock.packages),
                            encoding="utf-8")
        plan = dataclasses.replace(plan, requirements_file=str(req_file))
    return plan


def _refuse_cuda_torch(plan: ip.InstallPlan) -> None:
    """A CUDA torch on a CPU host is refused (unless --allow-cuda-torch), with where the CPU wheels are."""
    refusal = ip.cuda_refusal(plan)
    if refusal:
        dead = [s.location for s in plan.sources.skipped() if "PyTorch" in s.detail]
        where = (f"the CPU wheels live at {dead[0]}, which is unreachable from here: use the offline route "
                 f"(`cpuperf install --download DIR` on a connected machine, then --find-links DIR)"
                 if dead else "install CPU wheels from https://download.pytorch.org/whl/cpu "
                              "(or --index-url/--find-links with +cpu builds)")
        raise IncompatibleHostError(refusal, hint=f"{where}; or pass --allow-cuda-torch to install the CUDA build anyway")


def _read_lock(path: str) -> ip.Lock:
    """The --from-lock file; unreadable, not UTF-8 or malformed is a usage error naming the file."""
    from cpuperf.fsutil import InputRefused, read_text_capped

    hint = "name a lock written by `cpuperf install --write-lock FILE`"
    try:
        return ip.parse_lock(read_text_capped(path))
    except InputRefused as exc:
        raise UsageError(f"lock file {exc}", hint=hint) from None
    except OSError as exc:
        raise UsageError(f"cannot read the lock file {path}: {exc.strerror or exc}", hint=hint) from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"the lock file {path} is not UTF-8 text (byte {exc.start})", hint=hint) from exc
    except ip.PlanError as exc:
        raise UsageError(f"{path}: {exc}", hint=hint) from exc


def _plan(opts: Options, out: Output, facts: HostFacts, target: ip.Target, pip: pd.Pip, sources: ip.SourceSet,
          config: Mapping[str, str], proxy: Optional[str], device: str, py: str,
          environ: Mapping[str, str]) -> ip.InstallPlan:
    from cpuperf.knowledge.resolve import ResolveError, resolve
    from cpuperf.probe.wheel_platform import wheel_platform

    matrix = load_matrix_for_install()
    want = frozenset(w.strip() for w in opts.with_ if w.strip())
    installed_info = facts.software.packages.get("torch") if facts.software else None
    installed = installed_info.version if installed_info else None
    try:
        first = resolve(py, opts.torch, want, wheel_platform(), matrix=matrix, installed_torch=None if opts.torch else installed)
    except ResolveError as exc:
        raise UsageError(str(exc), hint="cpuperf install --torch 2.7 --with ipex,oneccl") from exc
    if first.torch is None:
        raise IncompatibleHostError(_rejections(first), hint="cpuperf compat --python " + py)

    tag, cuda_tag, cuda_index, cap, walk_notes = _cuda_builds(opts, facts, matrix, first.torch, device)
    sources = sources.with_defaults(ip.default_sources(first, cuda_index))
    sources = _check_all(sources, proxy)
    _fail_unreachable(sources, out)
    if not sources.has_index():
        raise UnreachableError("no package source answers: " + ", ".join(
            f"{s.location} ({s.error})" for s in sources.sources if s.reachable is False), hint=OFFLINE_HINT)

    constraint_text = "\n".join(pd.read_text(p) for p in (config.get("constraint") or "").split())
    specs = ip.constraint_specs(constraint_text, "torch")
    versions = pd.index_versions(pip, "torch", sources.pip_args())
    if cap is not None:  # releases above the walk's have no build this driver runs (their plain build neither)
        versions = None if versions is None else [v for v in versions if _public(v) <= cap]
        if versions is None:
            opts = dataclasses.replace(opts, torch=str(cap))
    resolution, torch_build, notes = _choose_torch(opts, py, want, matrix, device, cuda_tag, versions, specs,
                                                   None if opts.torch else installed)
    notes = walk_notes + notes
    if resolution is None:
        _refuse_unoffered(opts, sources, device, cuda_tag, py, versions)
    if resolution.torch is None or not resolution.ok:
        raise IncompatibleHostError(_rejections(resolution), hint="cpuperf compat --python " + py)
    _check_addon_servers(resolution, sources, pip)
    if device == "cuda" and torch_build is None and not isinstance(cuda_tag, str):
        cuda_tag = tag
    alloc_name, _ = ip.allocator_wheel()
    alloc_version = ip.pick_allocator_version(facts, pd.index_versions(pip, alloc_name, sources.pip_args())
                                              if device == "cpu" else None)
    if alloc_version is None and ip.host_device(facts) == "cpu":
        notes.append(f"no package source offers {alloc_name} for this host: no allocator wheel planned")
    try:
        plan = ip.plan_install(facts, resolution, sources, target, ip.InstallChoices(
            torch_version=torch_build, cuda_tag=cuda_tag if isinstance(cuda_tag, str) else None,
            allow_cuda_torch=opts.allow_cuda_torch, environ=environ, matrix=matrix, allocator_version=alloc_version,
            platform=wheel_platform()))
    except ip.PlanError as exc:
        raise IncompatibleHostError(str(exc)) from exc
    return dataclasses.replace(plan, notes=plan.notes + tuple(notes))


def _cuda_builds(opts: Options, facts: HostFacts, matrix: Matrix, torch: str,
                 device: str) -> Tuple[Optional[str], CudaTags, Optional[str], Optional[Version], List[str]]:
    """On a CUDA host: (the walk's tag, the builds acceptable, the CUDA index, the torch cap, notes); Nones on CPU."""
    if device != "cuda":
        return None, None, None, None, []
    driver = next((g.driver_version for g in facts.gpus or () if g.driver_version), None)
    tag, cap, walk_notes = _cuda_release(matrix, torch, driver, pinned=bool(opts.torch))
    variant = matrix.cuda_variant(tag)
    # any build the driver runs is acceptable; the newest torch (then the newest CUDA) wins
    cuda_tag = ip.runnable_cuda_tags(driver, matrix.cuda) if not opts.torch else tag
    return tag, cuda_tag, variant.index_url if variant else None, cap, walk_notes


def _refuse_unoffered(opts: Options, sources: ip.SourceSet, device: str, cuda_tag: CudaTags, py: str,
                      versions: Optional[List[str]]) -> NoReturn:
    """No source offers the torch build the host needs: an unreachable PyTorch index, or what was offered."""
    skipped = [s for s in sources.skipped() if "PyTorch" in s.detail]
    label = "+cpu" if device == "cpu" else "+" + (cuda_tag if isinstance(cuda_tag, str) else "/+".join(cuda_tag or ()))
    what = f"torch {opts.torch + ' ' if opts.torch else ''}({label} build) for Python {py}"
    if skipped:
        s = skipped[0]
        raise UnreachableError(f"{s.location} ({s.detail}) is unreachable ({s.error}) and no other source "
                               f"offers {what}", hint=OFFLINE_HINT)
    offered = ", ".join(versions[:8]) if versions else "none"
    raise IncompatibleHostError(f"no source offers {what} that fits the wishes (offered: {offered})",
                                hint="point --index-url/--find-links at the wheels, or choose another --torch")


def _check_addon_servers(resolution: Resolution, sources: ip.SourceSet, pip: pd.Pip) -> None:
    """The add-ons' own servers may be the ones that are down: their pins must then be offered elsewhere."""
    for pin in (resolution.ipex, resolution.oneccl):
        if pin is None or not pin.index_url:
            continue
        if any(s.location == pin.index_url and s.reachable is False for s in sources.sources):
            have = pd.index_versions(pip, pin.pip_name, sources.pip_args()) or []
            if not any(_requested_match(v, pin.version) for v in have):
                raise UnreachableError(f"{pin.index_url} (Intel wheel server for {pin.pip_name}) is unreachable "
                                       f"and no other source offers {pin.pip_name} {pin.version}", hint=OFFLINE_HINT)


def _public(version: str) -> Version:
    return base_or_none(version) or Version("0")


def _cuda_release(matrix: Matrix, torch: str, driver: Optional[str],
                  pinned: bool) -> Tuple[str, Optional[Version], List[str]]:
    """The CUDA build for this driver: (tag, cap or None, notes). The newest release may build only for a CUDA
    the driver is too old for: unpinned, the install walks to the newest older release that has a build (its
    version is the cap, said in a note); pinned (--torch), that is refused with the release to pin instead."""
    from cpuperf.knowledge.cuda import newest_release_for_driver

    ceiling = base_of(Version(torch))
    listed = [r for r in matrix.torch if r.cuda and r.version <= ceiling]
    newest = listed[-1] if listed else None
    row, tag, why = newest_release_for_driver(matrix.torch, ceiling, driver, matrix.cuda)
    if row is None or tag is None:
        raise IncompatibleHostError(f"no CUDA build of torch {torch} fits this host: {why}",
                                    hint="update the NVIDIA driver, or choose another --torch")
    if newest is None or row.version == newest.version:
        return tag, None, []
    from cpuperf.knowledge.cuda import cuda_tag_for_driver

    _, why_not = cuda_tag_for_driver(driver, newest.cuda, matrix.cuda)
    if pinned:
        raise IncompatibleHostError(f"no CUDA build of torch {torch} fits this host: torch {newest.version} builds "
                                    f"{', '.join(newest.cuda)}: {why_not}",
                                    hint=f"update the NVIDIA driver, or pin the newest torch with a build for it: "
                                         f"--torch {row.version}")
    note = (f"torch {newest.version} builds only {', '.join(newest.cuda)} ({why_not}): planning torch {row.version}, "
            f"the newest release with a CUDA build for this driver ({tag}); update the driver for a newer torch")
    return tag, row.version, [note]


def _rejections(resolution: Resolution) -> str:
    rej = [r.reason for r in resolution.rejected] or list(resolution.notes) or ["nothing fits"]
    return "; ".join(rej)


def _dry_run(plan: ip.InstallPlan, pip: pd.Pip, run_dir: Path, out: Output, ignore_installed: bool) -> ip.InstallPlan:
    """Ask pip what it would install (`--dry-run --report`): the plan's package list is exactly that."""
    report_path = run_dir / "dry-run-report.json"
    args = [*plan.pip_install_args(), "--dry-run", "--quiet", "--report", str(report_path)]
    if ignore_installed:
        args.append("--ignore-installed")
    out.info(f"asking pip what it would install ({len(plan.requirements)} pinned package(s)) ...")
    with Progress(out.teller("cpuperf install: "), "pip is resolving the plan (reading the indexes)"):
        res = pip.run(args, timeout=1800)
    if res.returncode != 0:
        raise PipFailedError("pip cannot satisfy the plan (nothing was changed): " + ip.error_summary(res.stderr),
                             hint=f"full log: {pip.log}")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PipFailedError(f"pip wrote no readable report ({exc})", hint=f"full log: {pip.log}") from exc
    installed: Dict[str, str] = {}
    if not ignore_installed:
        installed = ip.parse_freeze(pd.freeze(pip))
    return dataclasses.replace(plan, packages=ip.parse_report(report, plan, installed))


def _write_lock(plan: ip.InstallPlan, path: str, out: Output) -> None:
    lock = ip.lock_from_plan(plan)
    # The lock pins what the environment will hold: the report's packages plus pins already satisfied.
    have = {canonicalize_name(p.name) for p in lock.packages}
    extra = [p for p in plan.requirements if canonicalize_name(p.name) not in have and plan.packages]
    lock = dataclasses.replace(lock, packages=lock.packages + tuple(extra))
    try:
        fsutil.atomic_write_bytes(path, ip.render_lock(lock, ip.lock_format(path)).encode("utf-8"), make_parents=False)
    except OSError as exc:
        raise _path_error(exc, "--write-lock", path) from exc
    out.info(f"wrote the lock file {path} ({len(lock.packages)} pinned packages)")


def _download(plan: ip.InstallPlan, pip: pd.Pip, dest: str, out: Output) -> int:
    """Build a wheelhouse for an air-gapped install: every planned package, exact pins, plus a lock."""
    try:
        os.makedirs(dest, exist_ok=True)  # its parent exists (_check_outputs)
        fd, probe = tempfile.mkstemp(dir=dest, prefix=".cpuperf-write-test-")  # fail now, not after pip ran
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _path_error(exc, "--download", dest) from exc
    pins = [p.requirement() for p in (plan.packages or plan.requirements)]
    out.info(f"downloading {len(pins)} wheel(s) into {dest} ...")
    res = pip.run(["download", "--no-deps", "--only-binary", ":all:", "--dest", dest, *plan.sources.pip_args(),
                   *pins], timeout=7200)
    if res.returncode != 0:
        raise PipFailedError("pip download failed: " + ip.error_summary(res.stderr, dest),
                             hint=f"full log: {pip.log}")
    lock_path = os.path.join(dest, "cpuperf.lock.txt")
    lock = ip.lock_from_plan(plan)
    try:
        fsutil.atomic_write_bytes(lock_path, ip.render_lock(dataclasses.replace(lock, index_urls=(), find_links=()),
                                                            "requirements").encode("utf-8"))
    except OSError as exc:
        raise _path_error(exc, "--download", lock_path) from exc
    result = {"status": "downloaded", "dir": os.path.abspath(dest), "lock": lock_path,
              "next": f"cpuperf install --find-links {dest} --from-lock {lock_path} --yes"}
    if out.json_mode:
        out.json(plan.to_json(result))
    else:
        out.product(f"downloaded {len(pins)} wheel(s) into {dest}\n"
                    f"on the air-gapped node: {result['next']}")
    return int(ExitCode.OK)


def _path_error(exc: OSError, option: str, path: str) -> CpuperfError:
    if exc.errno == errno.ENOSPC:
        return FilesystemError(f"{option} {path}: no space left on device ({exc.filename or path})",
                               hint="free some space, or name a path on another disk")
    return FilesystemError(f"{option} {path}: cannot write there ({exc.strerror or exc})",
                           hint="name a writable path")


def _confirm(opts: Options, out: Output, plan: Optional[ip.InstallPlan]) -> None:
    if opts.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("not changing the environment without confirmation, and there is no terminal to ask on",
                         hint="rerun with --yes (or look first with --dry-run)")
    import typer

    if plan is None or not typer.confirm(f"change {plan.target.python}?", default=False, err=True):
        raise CpuperfError("nothing changed: not confirmed", code=ExitCode.FOUND_ERROR)


# --------------------------------------------------------------------------- execute

def stop_code(exc: BaseException) -> ExitCode:
    """130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP (128 + the signal, as a shell reports it)."""
    return exit_code_for_signal(signal.Signals(pd.stop_signal(exc)).name)


def _cache_error(exc: OSError, what: str) -> CpuperfError:
    where = exc.filename or what
    if exc.errno == errno.ENOSPC:
        return FilesystemError(f"no space left on device ({where}); nothing was changed",
                               hint="free some space, or set CPUPERF_CACHE_DIR to a directory on another disk")
    return FilesystemError(f"cannot write {what} ({where}: {exc.strerror or exc}); nothing was changed",
                           hint="make it writable, or set CPUPERF_CACHE_DIR to a writable directory")


@dataclass
class _Txn:
    """One install as a transaction: the state before, the stash, the journal that outlives a SIGKILL."""

    pip: pd.Pip
    run_dir: Path
    before: str
    tree: ip.Tree
    journal: Path

    @property
    def stash_dir(self) -> Path:
        return self.run_dir / "stash"

    def restore(self, message: str, code: ExitCode) -> CpuperfError:
        """Undo everything pip did; the error to raise says what happened and whether the restore held."""
        res = pd.restore(self.pip, self.before, self.stash_dir, self.tree)
        try:
            pd.mark_journal(self.journal, "restored" if res.ok else "restore-incomplete", problems=res.problems)
        except OSError:
            pass  # the journal stays 'running': the next install asks for --recover, which is right
        if not res.ok:
            state = "RESTORE INCOMPLETE: " + "; ".join(res.problems)
        elif not ip.parse_freeze(self.before):
            state = "the new environment was emptied again"
        else:
            state = "the environment was restored to its previous state"
        hint = f"full log: {self.pip.log} (state before: {self.run_dir / 'freeze-before.txt'})"
        if not res.ok:
            hint = f"cpuperf install --recover --python {self.pip.python} retries the restore; " + hint
        # The outcome before pip's cause: a long cause is cut to one line, the outcome must survive.
        head, sep, cause = message.partition(": ")
        return CpuperfError(f"{head}; {state}" + (f": {cause}" if sep else ""), hint=hint, code=code)


def _begin(plan: ip.InstallPlan, pip: pd.Pip, run_dir: Path) -> _Txn:
    """Record the state before (freeze and every file under site-packages) and write the journal."""
    try:
        before = pd.freeze(pip)
        tree = pd.snapshot_tree(plan.target.python, plan.env)
    except OSError as exc:
        raise PipFailedError(f"cannot record the environment before changing it ({exc}); nothing was changed") from exc
    journal = run_dir / pd.JOURNAL
    try:
        fsutil.atomic_write_bytes(run_dir / "freeze-before.txt", before.encode("utf-8"))
        fsutil.atomic_write_bytes(run_dir / "tree-before.json", json.dumps(tree).encode("utf-8"))
        pd.write_journal(journal, {
            "schema": "cpuperf.install-journal/1", "state": "running", "python": plan.target.python,
            "site": pd.site_key(plan.target.python, plan.env),
            "pid": os.getpid(), "pid_start": pd.process_start(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "freeze_before": str(run_dir / "freeze-before.txt"), "tree_before": str(run_dir / "tree-before.json"),
            "stash": str(run_dir / "stash"), "log": str(pip.log), "argv": plan.argv()})
    except OSError as exc:
        raise _cache_error(exc, f"the install journal under {run_dir}") from exc
    return _Txn(pip, run_dir, before, tree, journal)


def _execute(plan: ip.InstallPlan, out: Output, run_dir: Path, env: Mapping[str, str]) -> int:
    start = time.monotonic()
    log = run_dir / "pip.log"
    if plan.target.create_venv:
        out.info(f"creating the virtual environment {plan.target.create_venv} ...")
        ok, err = pd.create_venv(plan.target.create_venv, env)
        if not ok:
            raise PipFailedError(f"could not create {plan.target.create_venv}: {err[-300:]}")
    pip = pd.Pip(plan.target.python, plan.env, log)
    txn = _begin(plan, pip, run_dir)  # a stop before this changed nothing: run() says so
    # where a full disk is reported when pip names no file: site-packages, not a venv's bin/
    site = next((r for r in sorted(txn.tree, key=lambda r: "-packages" not in r)), None)
    try:
        _stash(plan, txn, out)
        out.info(f"installing with pip (log: {log}) ...")
        changed = [p for p in plan.packages if p.action != "keep"]
        what = ", ".join(f"{p.name} {p.version}" for p in changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        with Progress(out.teller("cpuperf install: "), f"pip is downloading and installing {what or 'the plan'}"):
            res = pip.run(plan.pip_install_args(), timeout=7200)
        if res.returncode != 0:
            raise txn.restore(f"pip failed (exit {res.returncode}): {ip.error_summary(res.stderr, site)}",
                              ExitCode.PIP_FAILED)
        expected = _expected_versions(plan, pip)
        modules = _modules(plan)
        out.info("verifying: importing " + ", ".join(modules.values()) + " in the target interpreter ...")
        with Progress(out.teller("cpuperf install: "), "verifying (importing torch: tens of seconds on a busy host)"):
            ver = pd.verify(plan.target.python, plan.env, expected, modules)
        if not ver.ok:
            raise txn.restore("verification failed after pip ran: " + "; ".join(ver.problems), ExitCode.PIP_FAILED)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: pip's group is dead already
        raise txn.restore(f"interrupted by {pd.describe_stop(exc)}", stop_code(exc)) from None
    except OSError as exc:  # cpuperf's own writes (the full disk pip also hit): still undo pip's work
        raise txn.restore(f"install failed: {ip.error_summary(str(exc), exc.filename or site)}",
                          ExitCode.PIP_FAILED) from None
    try:
        pd.mark_journal(txn.journal, "done")
    except OSError as exc:
        out.warn(f"installed, but the journal {txn.journal} could not be closed ({exc.strerror}); "
                 "remove it, or the next install will ask for --recover")
    seconds = time.monotonic() - start
    result = {"status": "installed", "verify": ver.to_json(), "seconds": round(seconds, 1), "log": str(log),
              "freeze_before": str(run_dir / "freeze-before.txt")}
    if out.json_mode:
        out.json(plan.to_json(result))
    else:
        render_result(out, plan, ver, seconds, log)
    return int(ExitCode.OK)


def _stash(plan: ip.InstallPlan, txn: _Txn, out: Output) -> None:
    """Keep a wheel of every package pip will replace, so a restore can put it back offline."""
    before_map = ip.parse_freeze(txn.before)
    replaced = [(p.name, before_map[canonicalize_name(p.name)]) for p in plan.packages
                if canonicalize_name(p.name) in before_map]
    if not replaced:
        return
    out.info(f"keeping wheels of the {len(replaced)} package(s) this replaces, under {txn.stash_dir} ...")
    try:
        kept = pd.stash(txn.pip, replaced, txn.stash_dir, plan.sources.pip_args())
    except OSError as exc:
        pd.mark_journal(txn.journal, "restored")
        raise _cache_error(exc, f"the stash {txn.stash_dir}") from exc
    lost = {n: w for n, w in kept.items() if w.startswith("ERROR")}
    if lost:
        pd.mark_journal(txn.journal, "restored")  # nothing was changed yet
        raise PipFailedError("cannot keep a copy of what this install would replace, so nothing was changed: "
                             + "; ".join(f"{n}: {w[7:]}" for n, w in lost.items()),
                             hint=f"full log: {txn.pip.log}")


# --------------------------------------------------------------------------- recover


def _refuse_unfinished(python: str, environ: Mapping[str, str], out: Output, changes: bool) -> None:
    """An install that was killed (SIGKILL, a power cut) left its journal: nothing goes on until
    `--recover` has put the environment back."""
    for path, data in pd.unfinished_journals(environ, python, pd.site_key(python, ip.child_env(environ))):
        if not pd.install_running(data) and pd.recreated_since(data):
            if changes:
                pd.mark_journal(path, "superseded")
            out.info(f"note: an earlier install into {python} did not finish, but the venv was made again since "
                     f"(journal {path} closed)")
            continue
        if pd.install_running(data):
            msg = f"another cpuperf install (pid {data.get('pid')}) is changing {python} right now"
            hint = "wait for it to finish"
        else:
            msg = (f"an earlier install into {python} (started {data.get('started')}) did not finish; "
                   f"the environment may be half-installed (journal: {path})")
            hint = f"cpuperf install --recover --python {python}"
        if not changes:
            out.warn(f"{msg}; {hint}")
            return
        raise CpuperfError(msg, hint=hint, code=ExitCode.INSTALL_UNFINISHED)


def recover(out: Output, python: str, environ: Mapping[str, str]) -> int:
    """`cpuperf install --recover`: restore the environment from the journal an unfinished install left."""
    env = ip.child_env(environ)
    found = pd.unfinished_journals(environ, python, pd.site_key(python, env))
    if not found:
        others = pd.unfinished_journals(environ)
        if others:
            other = others[0][1].get("python")
            raise UsageError(f"no unfinished install into {python}; there is one into {other}",
                             hint=f"cpuperf install --recover --python {other}")
        if out.json_mode:
            out.json({"status": "nothing-to-recover", "python": python})
        else:
            out.product(f"nothing to recover: no unfinished install into {python}")
        return int(ExitCode.OK)
    done: List[Dict[str, object]] = []
    removed = reinstalled = 0
    for path, data in found:
        if pd.install_running(data):
            raise CpuperfError(f"another cpuperf install (pid {data.get('pid')}) is changing {python} right now",
                               hint="wait for it to finish", code=ExitCode.INSTALL_UNFINISHED)
        try:
            before = Path(str(data["freeze_before"])).read_text(encoding="utf-8")
            raw = json.loads(Path(str(data["tree_before"])).read_text(encoding="utf-8"))
            tree: ip.Tree = {r: {k: (int(v[0]), int(v[1])) for k, v in f.items()} for r, f in raw.items()}
        except (OSError, KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
            raise CpuperfError(f"the journal {path} names a state that cannot be read ({exc})",
                               hint="compare `pip freeze` with what you expect by hand, then delete the journal",
                               code=ExitCode.INSTALL_UNFINISHED) from exc
        out.info(f"restoring {python} to its state before the install of {data.get('started')} ...")
        log = path.parent / "recover.log"
        res = pd.restore(pd.Pip(python, env, log), before, Path(str(data.get("stash", ""))), tree)
        pd.mark_journal(path, "restored" if res.ok else "restore-incomplete", problems=res.problems)
        if not res.ok:
            raise PipFailedError("RESTORE INCOMPLETE: " + "; ".join(res.problems), hint=f"full log: {log}")
        done.append({"journal": str(path), "started": data.get("started"), "removed": len(res.removed),
                     "reinstalled": res.reinstalled, "uninstalled": res.uninstalled})
        removed, reinstalled = removed + len(res.removed), reinstalled + len(res.reinstalled)
    if out.json_mode:
        out.json({"status": "restored", "python": python, "restores": done})
    else:
        out.product(f"restored {python} to its state before the unfinished install "
                    f"({removed} leftover path(s) removed, {reinstalled} package(s) reinstalled)")
    return int(ExitCode.OK)


def _expected_versions(plan: ip.InstallPlan, pip: pd.Pip) -> Dict[str, str]:
    now = ip.parse_freeze(pd.freeze(pip))
    out: Dict[str, str] = {}
    by_name = {canonicalize_name(p.name): p for p in plan.packages}
    for req in plan.requirements:
        key = canonicalize_name(req.name)
        if key in by_name:
            out[req.name] = by_name[key].version
        elif key in now and _requested_match(now[key], req.version):
            out[req.name] = now[key]
        else:
            out[req.name] = req.version
    return out


def _modules(plan: ip.InstallPlan) -> Dict[str, str]:
    mods: Dict[str, str] = {}
    for req in plan.requirements:
        key = canonicalize_name(req.name)
        if key == "oneccl-bind-pt":
            mods[req.name] = _oneccl_module(req.version)
        elif key in ip.IMPORT_NAMES:
            mods[req.name] = ip.IMPORT_NAMES[key]
    order = ["torch", "intel-extension-for-pytorch", "oneccl_bind_pt"]
    return dict(sorted(mods.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9))


def _oneccl_module(version: str) -> str:
    try:
        m = load_matrix_for_install()
        v = base_of(Version(version))
        for row in m.oneccl:
            if row.version == v and row.device == "cpu":
                return str(row.import_name)
    except Exception:  # the import name is a nicety; the default is right for every release from 1.12
        pass
    return "oneccl_bindings_for_pytorch"


# --------------------------------------------------------------------------- rendering


def render_plan(out: Output, plan: ip.InstallPlan, product: bool) -> None:
    from rich.table import Table

    write = out.product if product else out.info
    if not product and out.quiet:
        return
    head = f"install plan for {plan.target.python} (Python {plan.target.version}, {plan.device}"
    head += f" {plan.cuda_tag})" if plan.cuda_tag else ")"
    if plan.target.create_venv:
        head += f"; creates {plan.target.create_venv}"
    write(head)
    table = Table(show_header=True, box=None, pad_edge=False)
    for col in ("package", "version", "action", "source", "why"):
        table.add_column(col, overflow="fold")
    rows = plan.packages if plan.packages else plan.requirements
    if not rows:
        write("  nothing to install: every pinned package is already there")
    for p in rows:
        action = p.action + (f" (was {p.replaces})" if p.replaces else "")
        table.add_row(p.name, p.version, action, p.source, p.reason)
    if rows:
        if product:
            out.table(table)
        else:
            out.err_renderable(table)
    for n in plan.notes:
        write(f"note: {n}")
    write("pip: " + " ".join(plan.argv()))


def render_result(out: Output, plan: ip.InstallPlan, ver: pd.VerifyResult, seconds: float, log: Path) -> None:
    lines = [f"installed into {plan.target.python} in {seconds:.0f} s; verified:"]
    for c in ver.checks:
        if c["step"] == "version":
            lines.append(f"  {c['dist']} {c['found']} (planned {c['expected']}): ok")
        elif c["step"] == "import" and c.get("module") == "torch":
            lines.append(f"  import torch: ok (torch {c.get('version')}, CUDA {c.get('cuda') or 'none'}, "
                         f"oneDNN {'yes' if c.get('mkldnn') else 'no'}, matmul {'ok' if c.get('matmul_ok') else 'WRONG'})")
        elif c["step"] == "import":
            lines.append(f"  import {c['module']}: ok")
    payload = [p for p in plan.packages if ip.is_cuda_payload(p.name)]
    lines.append(f"  nvidia/CUDA packages installed: {len(payload)}")
    lines.append(f"log: {log}")
    out.product("\n".join(lines))
