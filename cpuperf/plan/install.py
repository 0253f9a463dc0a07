"""Pure planning for `cpuperf install`: facts + resolution + sources -> InstallPlan (argv + env).

Nothing here touches the OS; cpuperf/pipdriver.py runs pip, checks indexes and restores state.
The plan pins exact builds: `+cpu` torch on hosts without an NVIDIA GPU, `+cuXYZ` (the newest
variant the driver runs) on NVIDIA hosts. The packages pip would really install come from pip's
own `--dry-run --report` (parse_report), and a CPU host refuses any plan that drags nvidia-* in.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from cpuperf.jsonable import NOT_IN_JSON, JsonMapping, JsonObject, JsonValue, as_json
from cpuperf.knowledge.cuda import cuda_tag_for_driver
from cpuperf.probe.pkgscan import canonical_name as canonicalize_name
from cpuperf.probe.pkgscan import key_for
from cpuperf.versions import is_version, local_label, major_minor, version_or_none

if TYPE_CHECKING:
    from cpuperf.knowledge.matrix import CudaVariant, Matrix
    from cpuperf.knowledge.resolve import Resolution
    from cpuperf.probe.facts import HostFacts

SCHEMA = "cpuperf.install/1"
LOCK_SCHEMA = "cpuperf.lock/1"

# The PyTorch wheel indexes (https://pytorch.org/get-started/locally/ and previous-versions/).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_INDEX = "https://pypi.org/simple"  # pip's index when none is configured
_SKIPPABLE = ("default", "lock", "pip-default")

# distribution name -> module to import in the verification step
IMPORT_NAMES = {
    "torch": "torch",
    "intel-extension-for-pytorch": "intel_extension_for_pytorch",
    "oneccl-bind-pt": "oneccl_bindings_for_pytorch",
}

# Distributions that are CUDA payload: a CPU host never needs them.
# Names as published on PyPI by NVIDIA (nvidia-cublas-cu12, nvidia-cudnn-cu12, ...) and triton,
# which torch's CUDA wheels pull in (https://pypi.org/project/triton/).
_CUDA_PAYLOAD = re.compile(r"^(nvidia-.*|triton|pytorch-triton.*|cuda-.*)$")

# Keep the child's environment the user's, minus what would redirect or break pip (pipx does the same:
# pipx/util.py run_subprocess drops PYTHONPATH and __PYVENV_LAUNCHER__).
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONNOUSERSITE", "__PYVENV_LAUNCHER__",
             "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_REQUIRE_VIRTUALENV",
             "PIP_REQUIREMENT", "PIP_EDITABLE", "PIP_UPGRADE", "PIP_FORCE_REINSTALL", "PIP_NO_DEPS",
             "PIP_DRY_RUN", "PIP_REPORT", "PIP_QUIET", "PIP_VERBOSE", "PIP_LOG")


class PlanError(ValueError):
    """The inputs cannot make a plan (the command layer turns it into a CpuperfError)."""


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """One place pip may find wheels."""

    kind: str  # index-url | extra-index-url | find-links
    location: str
    origin: str  # flag | pip-config | env | pip-default (PyPI, implied) | default | lock
    reachable: Optional[bool] = None  # None = not checked
    detail: str = ""  # where it was configured, what it is for
    error: str = ""  # why it is unreachable

    @property
    def remote(self) -> bool:
        return self.location.startswith(("http://", "https://"))

    def pip_args(self) -> List[str]:
        flag = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
                "find-links": "--find-links"}[self.kind]
        return [flag, self.location]

    def to_json(self) -> JsonObject:
        return as_json(self)

    def json_computed(self) -> Mapping[str, object]:
        return {"error": self.error or None}  # no error: null, not ""


@dataclass(frozen=True)
class SourceSet:
    """Sources in precedence order: the user's flags, pip's configuration, built-in defaults."""

    sources: Tuple[Source, ...] = ()
    no_index: bool = False  # --find-links without --index-url: an air-gapped install
    user_chosen: bool = False  # the user named sources on the command line: no built-in defaults

    def usable(self) -> Tuple[Source, ...]:
        """Sources pip will be told about or will read itself (unreachable defaults dropped)."""
        return tuple(s for s in self.sources if not (s.origin in _SKIPPABLE and s.reachable is False))

    def skipped(self) -> Tuple[Source, ...]:
        return tuple(s for s in self.sources if s.origin in _SKIPPABLE and s.reachable is False)

    def pip_args(self) -> List[str]:
        """Arguments for the sources pip does not read from its own configuration."""
        args: List[str] = []
        seen = set()
        no_index = self.no_index
        if not no_index and any(s.origin == "pip-default" and s.reachable is False for s in self.sources):
            # PyPI, pip's implied index, does not answer: pip would retry it for minutes on every
            # package. Put the first index that answers in its place, or use the find-links only.
            other = [s for s in self.usable() if s.kind != "find-links"]
            if other:
                args += ["--index-url", other[0].location]
                seen.add(("extra-index-url", other[0].location))
            else:
                no_index = True
        if no_index:
            args.append("--no-index")
        for s in self.usable():
            if s.origin in ("pip-config", "env", "pip-default") or (s.kind, s.location) in seen:
                continue
            if no_index and s.kind != "find-links":
                continue
            seen.add((s.kind, s.location))
            args += s.pip_args()
        return args

    def with_pypi(self) -> SourceSet:
        """Name PyPI as a source when pip would use it implicitly (no index-url anywhere, an index in use)."""
        if self.no_index or any(s.kind == "index-url" for s in self.sources):
            return self
        return replace(self, sources=self.sources + (Source("index-url", PYPI_INDEX, "pip-default",
                                                            detail="pip's default index"),))

    def has_index(self) -> bool:
        """True when pip has somewhere to look (an index that answers, or a find-links location)."""
        return any(s.reachable is not False and (s.kind == "find-links" or not self.no_index)
                   for s in self.usable())

    def with_defaults(self, defaults: Iterable[Source]) -> SourceSet:
        """Add built-in defaults unless the user chose the sources or one already names the place."""
        if self.user_chosen:
            return self
        have = {_norm_url(s.location) for s in self.sources}
        extra = [d for d in defaults if _norm_url(d.location) not in have]
        # A default never replaces the user's or pip's index-url: it is always an extra index.
        fixed = [replace(d, kind="extra-index-url") if d.kind == "index-url" else d for d in extra]
        return replace(self, sources=self.sources + tuple(fixed))

    def index_urls(self) -> List[str]:
        return [s.location for s in self.usable() if s.kind != "find-links" and not self.no_index]

    def find_links(self) -> List[str]:
        return [s.location for s in self.usable() if s.kind == "find-links"]


def _norm_url(url: str) -> str:
    return url.rstrip("/")


def parse_pip_config_list(text: str) -> Dict[str, str]:
    """`pip config list` output -> {"find-links": ..., "extra-index-url": ...} (later lines win).

    Lines look like `global.find-links='/opt/wheels'` or `:env:.index-url='...'`; the section
    (global/install/download/:env:) is dropped, pip applies them all to `install`.
    """
    out: Dict[str, str] = {}
    origin: Dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^([^.=\s]*)\.([A-Za-z0-9_-]+)=(.*)$", line.strip())
        if not m:
            continue
        section, key, raw = m.groups()
        if section not in ("global", "install", ":env:", "download", "index"):
            continue
        try:
            value = shlex.split(raw)[0] if raw.strip() else ""
        except ValueError:
            value = raw.strip("'\"")
        # :env: (PIP_* variables) overrides config files, install.* overrides global.*
        rank = {"global": 0, "download": 0, "index": 0, "install": 1, ":env:": 2}[section]
        if key in origin and int(origin[key]) > rank:
            continue
        out[key] = value
        origin[key] = str(rank)
        out["__origin__." + key] = "env" if section == ":env:" else "pip-config"
    return out


def sources_from_config(config: Mapping[str, str]) -> List[Source]:
    """pip's configured index-url / extra-index-url / find-links as Sources."""
    out: List[Source] = []
    for key in ("index-url", "extra-index-url", "find-links"):
        value = config.get(key)
        if not value:
            continue
        origin = config.get("__origin__." + key, "pip-config")
        for loc in value.split():
            out.append(Source(key, loc, origin, detail=f"pip {'environment' if origin == 'env' else 'configuration'}"))
    return out


def user_sources(index_url: Optional[str], find_links: Sequence[str]) -> SourceSet:
    """The sources named on the command line (empty set when none)."""
    srcs: List[Source] = []
    if index_url:
        srcs.append(Source("index-url", index_url, "flag", detail="--index-url"))
    for fl in find_links:
        srcs.append(Source("find-links", fl, "flag", detail="--find-links"))
    chosen = bool(srcs)
    return SourceSet(tuple(srcs), no_index=bool(find_links) and not index_url, user_chosen=chosen)


def constraint_specs(constraint_text: str, name: str) -> List[str]:
    """The specifiers a pip constraints file puts on `name` (e.g. 'torch<=2.14.1' -> ['<=2.14.1'])."""
    out = []
    want = canonicalize_name(name)
    for line in constraint_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == want and str(req.specifier):
            out.append(str(req.specifier))
    return out


# --------------------------------------------------------------------------- builds


def runnable_cuda_tags(driver: Optional[str], variants: Sequence[CudaVariant]) -> Tuple[str, ...]:
    """Every cuXYZ build this driver runs (CUDA minor-version compatibility floor)."""
    have = version_or_none(driver)
    if have is None:
        return ()
    return tuple(v.tag for v in variants if have >= Version(v.min_driver_linux))


def is_cuda_payload(name: str) -> bool:
    """True for nvidia-* / triton distributions that only a CUDA build needs."""
    return bool(_CUDA_PAYLOAD.match(canonicalize_name(name)))


def newest_build(versions: Iterable[str], device: str, cuda_tag: Union[str, Collection[str], None] = None,
                 specifiers: Sequence[str] = (), allow_plain: bool = False) -> Optional[str]:
    """The newest version string from `pip index versions` that is the right build for the host.

    CPU hosts take `+cpu` builds (or any build when allow_plain); CUDA hosts `+<cuda_tag>` (one tag,
    or a collection of the tags the driver runs), or the registry's default build when allow_plain.
    """
    from packaging.specifiers import SpecifierSet

    specs = [SpecifierSet(s) for s in specifiers]
    best: Optional[Tuple[Version, str]] = None
    for text in versions:
        v = version_or_none(text)
        if v is None:
            continue
        if v.is_prerelease or v.is_devrelease:
            continue
        label = v.local or ""
        if device == "cpu":
            ok = label.startswith("cpu") or (allow_plain and not label)
        else:
            tags = {cuda_tag} if isinstance(cuda_tag, str) else set(cuda_tag or ())
            ok = label in tags or (allow_plain and not label)
        if not ok or not all(s.contains(v, prereleases=False) for s in specs):
            continue
        if best is None or v > best[0]:
            best = (v, text)
    return best[1] if best else None


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Target:
    """The interpreter to install into."""

    python: str  # executable path
    version: str  # '3.11.7'
    create_venv: Optional[str] = None  # --venv DIR that does not exist yet


@dataclass(frozen=True)
class PlannedPackage:
    name: str
    version: str
    source: str
    reason: str
    action: str = "install"  # install | upgrade | downgrade | reinstall | keep
    replaces: Optional[str] = None
    # From pip's report and the lock: the plan's JSON shows none of them (the lock file writes url and sha256).
    requested: bool = field(default=True, metadata=NOT_IN_JSON)
    url: Optional[str] = field(default=None, metadata=NOT_IN_JSON)
    sha256: Optional[str] = field(default=None, metadata=NOT_IN_JSON)

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def to_json(self) -> JsonObject:
        return as_json(self)


@dataclass(frozen=True)
class InstallPlan:
    """Everything execute() needs, and everything --dry-run shows."""

    target: Target
    device: str  # cpu | cuda
    cuda_tag: Optional[str]
    requirements: Tuple[PlannedPackage, ...]  # what cpuperf asks for (exact pins)
    sources: SourceSet
    env: Mapping[str, str]
    allow_cuda_torch: bool = False
    packages: Tuple[PlannedPackage, ...] = ()  # what pip's dry-run report says it would change
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    requirements_file: Optional[str] = None  # --from-lock with hashes: pip -r FILE --require-hashes
    no_deps: bool = False  # --from-lock: the lock pins every dependency already

    def pip_install_args(self) -> List[str]:
        """`pip install` arguments (no interpreter): sources then the exact pins."""
        args = ["install", "--disable-pip-version-check", "--no-input", *self.sources.pip_args()]
        if self.no_deps:
            args.append("--no-deps")
        if self.requirements_file:
            return args + ["--require-hashes", "-r", self.requirements_file]
        return args + [p.requirement() for p in self.requirements]

    def argv(self) -> List[str]:
        return [self.target.python, "-m", "pip", *self.pip_install_args()]

    def cuda_payload(self) -> List[PlannedPackage]:
        return [p for p in self.packages if is_cuda_payload(p.name)]

    def to_json(self, result: object = None) -> Dict[str, object]:
        return {
            "schema": SCHEMA,
            "python": self.target.python,
            "python_version": self.target.version,
            "device": self.device,
            "cuda": self.cuda_tag,
            "requirements": [p.requirement() for p in self.requirements],
            "packages": [p.to_json() for p in (self.packages or self.requirements)],
            "index_urls": self.sources.index_urls(),
            "find_links": self.sources.find_links(),
            "sources": [s.to_json() for s in self.sources.sources],
            "argv": self.argv(),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "result": result,
        }


def child_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """A cleaned environment for pip and the verification child (as pipx does)."""
    env = {k: v for k, v in environ.items() if k not in _DROP_ENV}
    env["PYTHONIOENCODING"] = "utf-8"
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def host_device(facts: HostFacts) -> str:
    """'cuda' when the host has an NVIDIA GPU, else 'cpu'."""
    gpus = getattr(facts, "gpus", None) or ()
    return "cuda" if any(getattr(g, "vendor", "nvidia") == "nvidia" for g in gpus) else "cpu"


def _driver(facts: HostFacts) -> Optional[str]:
    for g in getattr(facts, "gpus", None) or ():
        if g.driver_version:
            return str(g.driver_version)
    return None


def _installed(facts: HostFacts, name: str) -> Optional[str]:
    software = getattr(facts, "software", None)
    if software is None:
        return None
    info = software.packages.get(key_for(name) or name)
    return info.version if info else None


def default_sources(resolution: Resolution, cuda_index: Optional[str]) -> List[Source]:
    """The built-in places the resolver names for torch and the Intel add-ons."""
    out: List[Source] = []
    torch_index = cuda_index or getattr(resolution, "torch_index_url", None) or TORCH_CPU_INDEX
    out.append(Source("extra-index-url", torch_index, "default", detail="PyTorch wheel index"))
    for pin in (getattr(resolution, "ipex", None), getattr(resolution, "oneccl", None)):
        if pin is not None and pin.index_url and pin.index_kind != "pypi":
            kind = "find-links" if pin.index_kind == "find-links" else "extra-index-url"
            out.append(Source(kind, pin.index_url, "default", detail=f"Intel wheel server for {pin.pip_name}"))
    return out


@dataclass(frozen=True)
class InstallChoices:
    """What the command chose for an install beyond the resolution: `torch_version` is the exact build chosen from
    what the sources offer (e.g. '2.13.0+cpu'; default: the resolution's torch with the host's label, +cpu or
    +cuXYZ for the driver); `allocator_version` the allocator wheel's version the sources offer (None: not offered,
    not planned); `platform` the target's wheel platform (the registry's unlabelled aarch64 torch is a CPU build
    up to 2.10); `environ` the environment pip runs in."""

    torch_version: Optional[str] = None
    cuda_tag: Optional[str] = None
    allow_cuda_torch: bool = False
    environ: Optional[Mapping[str, str]] = None
    matrix: Optional[Matrix] = None
    allocator_version: Optional[str] = None
    platform: str = "linux_x86_64"


def plan_install(facts: HostFacts, resolution: Resolution, sources: SourceSet, target: Target,
                 chosen: InstallChoices = InstallChoices()) -> InstallPlan:
    """Pin the resolution's packages for this host and say where they come from and why."""
    torch_version, cuda_tag, matrix, platform = chosen.torch_version, chosen.cuda_tag, chosen.matrix, chosen.platform
    allow_cuda_torch, environ, allocator_version = chosen.allow_cuda_torch, chosen.environ, chosen.allocator_version
    if resolution.torch is None:
        reasons = "; ".join(r.reason for r in getattr(resolution, "rejected", ())) or "no torch fits"
        raise PlanError(reasons)
    device = host_device(facts)
    notes: List[str] = list(getattr(resolution, "notes", ()))
    warnings: List[str] = []
    base = Version(resolution.torch).public
    torch_version, cuda_tag = _torch_build(facts, device, base, torch_version, cuda_tag, matrix, notes)
    label = local_label(torch_version)
    if device == "cpu" and not label.startswith("cpu") and not _registry_cpu_build(matrix, base, platform):
        warnings.append(f"torch {torch_version} is not a +cpu build: on PyPI the Linux default is the CUDA build")

    usable = sources.usable()
    where = _describe_sources(usable, sources.no_index)
    why_torch = ("CPU build: no NVIDIA GPU on this host" if device == "cpu"
                 else f"CUDA build {cuda_tag} for this host's NVIDIA driver")
    reqs = [_planned(facts, "torch", torch_version, where, why_torch)]
    for pin, why in ((getattr(resolution, "ipex", None), "Intel Extension for PyTorch for torch " + base),
                     (getattr(resolution, "oneccl", None), "oneCCL bindings (ccl backend) for torch " + base)):
        if pin is not None:
            reqs.append(_planned(facts, pin.pip_name, pin.version, where, why))
    alloc = allocator_requirement(facts, where, allocator_version) if allocator_version else None
    if alloc is not None:
        reqs.append(alloc)
    system_note = system_allocator_note(facts)
    if system_note:
        notes.append(system_note)
    for s in sources.skipped():
        warnings.append(f"skipped {s.location} ({s.detail}): unreachable ({s.error or 'no answer'})")
    env = child_env(environ or {})
    return InstallPlan(target=target, device=device, cuda_tag=cuda_tag, requirements=tuple(reqs),
                       sources=sources, env=env, allow_cuda_torch=allow_cuda_torch,
                       warnings=tuple(warnings), notes=tuple(notes))


def registry_cpu_builds(versions: Sequence[str], matrix: Matrix, platform: str) -> Tuple[List[str], List[str]]:
    """(CPU builds, CUDA builds) among the registry's unlabelled torch `versions` on `platform`: on Linux aarch64
    a CPU build up to 2.10 and a CUDA build from 2.11 (compat/torch.toml pypi_aarch64); x86_64 keeps them all
    (its registry build is CUDA throughout: pip's dry run shows the payload and the plan refuses it)."""
    if platform != "linux_aarch64":
        return list(versions), []
    cuda = [v for v in versions if not _registry_cpu_build(matrix, Version(v).public, platform)
            and matrix.torch_release(Version(Version(v).public)) is not None]
    return [v for v in versions if v not in cuda], cuda


def _registry_cpu_build(matrix: Optional[Matrix], base: str, platform: str) -> bool:
    """The registry's unlabelled torch `base` is a CPU build on `platform` (Linux aarch64 up to 2.10)."""
    row = matrix.torch_release(Version(base)) if matrix is not None and platform == "linux_aarch64" else None
    return row is not None and row.pypi_aarch64 == "cpu"


def _torch_build(facts: HostFacts, device: str, base: str, torch_version: Optional[str], cuda_tag: Optional[str],
                 matrix: Optional[Matrix], notes: List[str]) -> Tuple[str, Optional[str]]:
    """(the exact torch build, its CUDA tag): the one chosen from the sources, else `base` with the host's
    label (+cpu, or the +cuXYZ this NVIDIA driver runs, said in `notes`)."""
    if torch_version is not None:
        if device == "cuda" and cuda_tag is None:
            cuda_tag = local_label(torch_version) or None
        return torch_version, cuda_tag
    if device == "cpu":
        return f"{base}+cpu", cuda_tag
    tag = cuda_tag
    if tag is None and matrix is not None:
        row = matrix.torch_release(Version(base))
        tag, why = cuda_tag_for_driver(_driver(facts), row.cuda if row else (), matrix.cuda)
        notes.append(f"CUDA build: {tag or 'none'}: {why}")
    if tag is None:
        raise PlanError(f"no CUDA build of torch {base} runs on this NVIDIA driver")
    return f"{base}+{tag}", tag


def _planned(facts: HostFacts, name: str, version: str, where: str, why: str) -> PlannedPackage:
    """One pinned package: kept where installed at that version, else installed, upgraded or replaced."""
    have = _installed(facts, name)
    act = _action(have, version)
    return PlannedPackage(name, version, "installed" if act == "keep" else where, why,
                          action=act, replaces=_replaced(have, version))


def allocator_wheel() -> Tuple[str, str]:
    """(name, preferred version) of the wheel that ships an allocator (compat/tuning.toml [allocator])."""
    from cpuperf.decide.allocator import allocator_rule

    rule = allocator_rule()
    return rule.wheel, rule.wheel_version


def pick_allocator_version(facts: HostFacts, offered: Optional[Sequence[str]]) -> Optional[str]:
    """The allocator wheel version to plan: the tested one if offered, else the newest offered; None where
    this CPU has no build or no source offers it. GPU hosts get none: the engine never preloads one there."""
    from cpuperf.decide.allocator import allocator_rule

    rule = allocator_rule()
    cpu = getattr(facts, "cpu", None)
    if host_device(facts) == "cuda" or not offered or cpu is None or getattr(cpu, "arch", None) not in rule.wheel_platforms:
        return None
    if rule.wheel_version in offered:
        return rule.wheel_version
    valid = [v for v in offered if is_version(v)]
    return str(max(valid, key=Version)) if valid else None


def allocator_requirement(facts: HostFacts, where: str, version: str) -> Optional[PlannedPackage]:
    """The wheel that ships a preloadable allocator (compat/tuning.toml [allocator]), where one is built
    for this CPU: `--auto` then has an allocator to measure and preload without root."""
    name, _ = allocator_wheel()
    return _planned(facts, name, version, where, "mimalloc for `--auto` to measure and preload (LD_PRELOAD; no root needed)")


def system_allocator_note(facts: HostFacts) -> Optional[str]:
    """The exact command that adds tcmalloc and jemalloc system-wide, where neither is found (needs root)."""
    from cpuperf.decide.allocator import allocator_rule

    software = getattr(facts, "software", None)
    if software is None or any(software.allocators.get(n) for n in ("tcmalloc", "jemalloc")):
        return None
    cmd = allocator_rule().system_install
    return (f"no system tcmalloc or jemalloc: as root, `{cmd}` adds them for cpuperf bench to measure too "
            "(cpuperf never runs the system package manager itself)")


def _describe_sources(usable: Sequence[Source], no_index: bool) -> str:
    names = [s.location for s in usable if not (no_index and s.kind != "find-links")]
    return " | ".join(names)


def _action(installed: Optional[str], planned: str) -> str:
    if installed is None:
        return "install"
    a, b = version_or_none(installed), version_or_none(planned)
    if a is None or b is None:
        return "reinstall"
    if a == b or (not b.local and a.public == b.public):
        return "keep"
    return "upgrade" if b > a else ("downgrade" if b < a else "reinstall")


def _replaced(installed: Optional[str], planned: str) -> Optional[str]:
    return installed if _action(installed, planned) in ("upgrade", "downgrade", "reinstall") else None


# --------------------------------------------------------------------------- pip's report


def parse_report(report: JsonMapping, plan: InstallPlan, installed: Mapping[str, str]) -> Tuple[PlannedPackage, ...]:
    """pip's `--report` JSON -> exactly the packages pip would install or change, with source and reason.

    `installed` maps canonical names to the versions in the environment now (from pip freeze).
    """
    wanted = {canonicalize_name(p.name): p for p in plan.requirements}
    out: List[PlannedPackage] = []
    items = report.get("install", [])
    for item in items if isinstance(items, list) else []:
        entry = _object(item)
        meta = _object(entry.get("metadata", {}))
        name = str(meta.get("name", "?"))
        version = str(meta.get("version", "?"))
        info = _object(entry.get("download_info"))
        url = _text(info.get("url"))
        archive = _object(info.get("archive_info"))
        sha = _text(_object(archive.get("hashes")).get("sha256"))
        if not sha:
            h = _text(archive.get("hash", "")) or ""
            sha = h.split("=", 1)[1] if h.startswith("sha256=") else None
        cname = canonicalize_name(name)
        have = installed.get(cname)
        req = wanted.get(cname)
        if req is not None:
            reason = req.reason
        elif is_cuda_payload(name):
            reason = "CUDA runtime pulled in by a CUDA build of torch"
        else:
            reason = "dependency"
        out.append(PlannedPackage(name, version, source_of(url, plan.sources), reason,
                                  action=_action(have, version) if have else "install",
                                  replaces=have if have and have != version else None,
                                  requested=bool(entry.get("requested")), url=url, sha256=sha))
    return tuple(out)


def _object(value: JsonValue) -> JsonObject:
    """An object of pip's report; {} where absent (or not an object)."""
    return value if isinstance(value, dict) else {}


def _text(value: JsonValue) -> Optional[str]:
    """A text field of pip's report; None where absent (or not text)."""
    return value if isinstance(value, str) else None


def source_of(url: Optional[str], sources: SourceSet) -> str:
    """The configured source a download URL belongs to (or the URL's host)."""
    if not url:
        return "?"
    best = None
    for s in sources.usable():
        loc = s.location.rstrip("/")
        candidates = [loc]
        if not s.remote and not loc.startswith("file:"):
            candidates.append("file://" + loc)
        if s.kind != "find-links" and loc.endswith("/simple"):
            candidates.append(loc[: -len("simple")])  # files often sit beside the index: .../files/
        for c in candidates:
            if url.startswith(c) and (best is None or len(c) > len(best)):
                best = s.location
    if best:
        return best
    m = re.match(r"^(https?://[^/]+)", url)
    if m and "pythonhosted.org" in m.group(1):
        return "https://pypi.org/simple"
    return m.group(1) if m else url.rsplit("/", 1)[0]


def cuda_refusal(plan: InstallPlan) -> Optional[str]:
    """The sentence refusing a plan that installs CUDA payload on a CPU host; None when fine."""
    if plan.device != "cpu" or plan.allow_cuda_torch:
        return None
    payload = plan.cuda_payload()
    if not payload:
        return None
    names = ", ".join(f"{p.name}=={p.version}" for p in payload[:6]) + (" ..." if len(payload) > 6 else "")
    culprit = [p for p in plan.packages if canonicalize_name(p.name) == "torch"]
    via = f" (torch {culprit[0].version} from {culprit[0].source} is a CUDA build)" if culprit and not local_label(culprit[0].version).startswith("cpu") else ""
    return (f"this host has no NVIDIA GPU, but pip would install {len(payload)} CUDA package(s): {names}{via}")


# --------------------------------------------------------------------------- freeze and errors


def parse_freeze(text: str) -> Dict[str, str]:
    """`pip freeze` -> {canonical name: version or the whole line for direct references}."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e "):
            m = re.search(r"[#&]egg=([A-Za-z0-9_.-]+)", line)
            if m:
                out[canonicalize_name(m.group(1))] = line
            continue
        if "==" in line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name.strip())] = version.strip()
        elif " @ " in line:
            name = line.split(" @ ", 1)[0].strip()
            out[canonicalize_name(name)] = line
    return out


@dataclass(frozen=True)
class RestoreSteps:
    """What brings the environment back: uninstall what is new, reinstall what changed."""

    uninstall: Tuple[str, ...]
    reinstall: Tuple[Tuple[str, str], ...]  # (name, version or freeze line)


def restore_steps(before: Mapping[str, str], now: Mapping[str, str]) -> RestoreSteps:
    """The difference between two freezes, as actions that turn `now` back into `before`."""
    uninstall = tuple(sorted(n for n in now if n not in before))
    reinstall = tuple(sorted((n, v) for n, v in before.items() if now.get(n) != v))
    return RestoreSteps(uninstall, reinstall)


def error_digest(text: str, limit: int = 8) -> List[str]:
    """pip's `ERROR:` lines (and the lines that continue them), at most `limit`."""
    out: List[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("ERROR:"):
            out.append(line.strip())
            for cont in lines[i + 1:i + 3]:
                if cont.startswith(("  ", "\t")) and cont.strip():
                    out.append(cont.rstrip())
                else:
                    break
    if not out:
        tail = [ln for ln in lines if ln.strip()][-3:]
        out = tail
    return out[:limit]


# --------------------------------------------------------------------------- the site-packages tree

# {root directory: {relative path ('dir/' for directories): (size, mtime_ns)}}
Tree = Dict[str, Dict[str, Tuple[int, int]]]
# Byte-code caches come and go with every import; they are deleted when new, never missed.
_CACHE = re.compile(r"(^|/)__pycache__/|\.py[co]$")
# What pip writes per install (not per wheel): a reinstall from the stash changes these.
_INSTALL_META = re.compile(r"\.dist-info/(RECORD|INSTALLER|REQUESTED|direct_url\.json)$")


@dataclass(frozen=True)
class TreeDiff:
    """How a tree differs from its snapshot: (root, rel) pairs; a new directory is listed alone."""

    added: Tuple[Tuple[str, str], ...]
    missing: Tuple[Tuple[str, str], ...]
    changed: Tuple[Tuple[str, str], ...]  # another size
    touched: Tuple[Tuple[str, str], ...] = ()  # same size, another mtime: rewritten

    def damaged(self) -> bool:
        """Did files that were there go missing or get rewritten (so what owned them is reinstalled)?"""
        return bool(self.missing or self.changed or self.touched)


def tree_diff(before: Tree, now: Tree) -> TreeDiff:
    """What appeared (topmost new directories only), went missing, or changed size since `before`."""
    added: List[Tuple[str, str]] = []
    missing: List[Tuple[str, str]] = []
    changed: List[Tuple[str, str]] = []
    touched: List[Tuple[str, str]] = []
    for root, files in now.items():
        old = before.get(root)
        if old is None:
            continue  # a root that did not exist before is not ours to judge
        new_dirs = {rel for rel in files if rel.endswith("/") and rel not in old}
        for rel in sorted(files):
            if rel in old:
                if rel.endswith("/") or _CACHE.search(rel) or _INSTALL_META.search(rel):
                    continue
                if files[rel][0] != old[rel][0]:
                    changed.append((root, rel))
                elif files[rel][1] != old[rel][1]:
                    touched.append((root, rel))
                continue
            parts = rel.rstrip("/").split("/")
            if any("/".join(parts[:i]) + "/" in new_dirs for i in range(1, len(parts))):
                continue  # inside a new directory, which goes whole
            added.append((root, rel))
    for root, old in before.items():
        files = now.get(root, {})
        missing += [(root, rel) for rel in sorted(old)
                    if rel not in files and not rel.endswith("/") and not _CACHE.search(rel)]
    return TreeDiff(tuple(added), tuple(missing), tuple(changed), tuple(touched))


# pip's own failure lines that say nothing of the cause; the cause is further down (the traceback).
_VAGUE = ("ERROR: Exception:", "ERROR: Could not install packages due to an OSError.")


def error_summary(text: str, where: Optional[str] = None) -> str:
    """One line for the user from pip's stderr: the real cause (zlib error, ENOSPC, hash mismatch),
    not `ERROR: Exception:`. `where` names the place a full disk is reported at when pip names none."""
    m = re.search(r"\[Errno 28\] No space left on device(?:: '([^']*)')?", text)
    if m or "No space left on device" in text:
        return f"no space left on device ({(m.group(1) if m else None) or where or 'the target'})"
    m = re.search(r"\[Errno (30|13)\] (Read-only file system|Permission denied)(?:: '([^']*)')?", text)
    if m:  # pip names a bare 'RECORD': say which site-packages could not be written
        named = m.group(3) or ""
        place = named if os.path.isabs(named) else where or named or "the target"
        why = "read-only file system" if m.group(1) == "30" else "permission denied"
        return f"{why}: cannot write {place}" + (f" ({named})" if named and place != named else "")
    if "DO NOT MATCH THE HASHES" in text:
        names = re.findall(r"^\s+(\S+==\S+) from ", text, re.M)
        exp = re.search(r"Expected sha256 (\w+)", text)
        got = re.search(r"Got\s+(\w+)", text)
        detail = f" (expected sha256 {exp.group(1)[:12]}..., got {got.group(1)[:12]}...)" if exp and got else ""
        return f"hash mismatch: {', '.join(names) or 'a downloaded wheel'}{detail}"
    lines = [ln.rstrip() for ln in text.splitlines()]
    if "Traceback (most recent call last):" in text:
        # the exception line ends the traceback: 'zlib.error: Error -3 while decompressing data: ...'
        tail = [ln for ln in lines if ln and not ln.startswith((" ", "\t", "Traceback", "During handling",
                                                                "The above exception"))]
        exc = [ln for ln in tail if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|error|Interrupt|Exit)\b.*", ln)]
        if exc:
            return exc[-1]
    errors = [ln for ln in lines if ln.startswith("ERROR:") and ln.strip() not in _VAGUE]
    if errors:
        return errors[0][len("ERROR:"):].strip()
    m = re.search(r"due to an OSError: (.+)$", text, re.M)
    if m:
        return m.group(1).strip()
    rest = [ln.strip() for ln in lines if ln.strip()]
    return rest[-1] if rest else "pip gave no error message"


# --------------------------------------------------------------------------- lock files


@dataclass(frozen=True)
class Lock:
    python: str
    platform: str
    device: str
    packages: Tuple[PlannedPackage, ...]
    index_urls: Tuple[str, ...] = ()
    find_links: Tuple[str, ...] = ()


def lock_from_plan(plan: InstallPlan, platform: str = "linux_x86_64") -> Lock:
    pkgs = plan.packages or plan.requirements
    return Lock(python=plan.target.version, platform=platform, device=plan.device, packages=tuple(pkgs),
                index_urls=tuple(plan.sources.index_urls()), find_links=tuple(plan.sources.find_links()))


def render_lock(lock: Lock, fmt: str) -> str:
    """'json' -> the cpuperf.lock/1 object; 'requirements' -> pins (with --hash when every pin has one)."""
    if fmt == "json":
        return json.dumps({
            "schema": LOCK_SCHEMA, "python": lock.python, "platform": lock.platform, "device": lock.device,
            "index_urls": list(lock.index_urls), "find_links": list(lock.find_links),
            "packages": [{"name": p.name, "version": p.version, "sha256": p.sha256, "url": p.url,
                          "source": p.source} for p in lock.packages],
        }, indent=2) + "\n"
    hashes = all(p.sha256 for p in lock.packages)
    lines = [f"# cpuperf lock ({LOCK_SCHEMA}): python {lock.python}, {lock.platform}, {lock.device}",
             "# install on every node: cpuperf install --from-lock THIS_FILE --yes"]
    for url in lock.index_urls:
        lines.append(f"# index-url: {url}")
    for fl in lock.find_links:
        lines.append(f"# find-links: {fl}")
    for p in lock.packages:
        lines.append(f"{p.name}=={p.version}" + (f" \\\n    --hash=sha256:{p.sha256}" if hashes else ""))
    return "\n".join(lines) + "\n"


def lock_format(path: str) -> str:
    return "json" if path.endswith(".json") else "requirements"


def parse_lock(text: str) -> Lock:
    """Read a lock written by render_lock (JSON or requirements style)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return _parse_json_lock(text)
    return _parse_requirements_lock(text)


def _parse_json_lock(text: str) -> Lock:
    """The JSON lock (render_lock's "json" format)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PlanError(f"the lock file is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise PlanError("the lock file is JSON but not an object")
    if data.get("schema") != LOCK_SCHEMA:
        raise PlanError(f"the lock file's schema is {data.get('schema')!r}, expected {LOCK_SCHEMA!r}")
    raw = data.get("packages", [])
    if not isinstance(raw, list) or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                            and isinstance(p.get("version"), str) for p in raw):
        raise PlanError("the lock file's packages must be a list of {\"name\": ..., \"version\": ...} objects")
    bad = [p for p in raw if not _valid_pin(p["name"], p["version"])]
    if bad:
        raise PlanError(f"the lock file's pin {bad[0]['name'][:40]!r}=={bad[0]['version'][:40]!r} is not an exact pin")
    pkgs = tuple(PlannedPackage(p["name"], p["version"], str(p.get("source") or "lock"), "pinned by the lock file",
                                sha256=_opt_str(p.get("sha256")), url=_opt_str(p.get("url"))) for p in raw)
    if not pkgs:
        raise PlanError("the lock file pins no packages")
    lists = [data.get(k, []) for k in ("index_urls", "find_links")]
    if not all(isinstance(v, list) and all(isinstance(u, str) for u in v) for v in lists):
        raise PlanError("the lock file's index_urls and find_links must be lists of strings")
    return Lock(str(data.get("python", "")), str(data.get("platform", "")), str(data.get("device", "cpu")),
                pkgs, tuple(lists[0]), tuple(lists[1]))


def _parse_requirements_lock(text: str) -> Lock:
    """The requirements-style lock: name==version lines, the header and index lines as comments."""
    python = platform = ""
    device = "cpu"
    index_urls: List[str] = []
    find_links: List[str] = []
    pkgs_l: List[PlannedPackage] = []
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("#"):
            m = re.match(r"#\s*cpuperf lock \(([^)]*)\):\s*python\s+(\S+),\s*(\S+),\s*(\S+)", line)
            if m:
                python, platform, device = m.group(2), m.group(3), m.group(4)
            m = re.match(r"#\s*index-url:\s*(\S+)", line)
            if m:
                index_urls.append(m.group(1))
            m = re.match(r"#\s*find-links:\s*(\S+)", line)
            if m:
                find_links.append(m.group(1))
            continue
        if not line:
            continue
        parts = line.split()
        sha = None
        for part in parts[1:]:
            if part.startswith("--hash=sha256:"):
                sha = part.split(":", 1)[1]
        name, sep, version = parts[0].partition("==")
        if not sep or not _valid_pin(name, version):
            raise PlanError(f"lock line {line[:80]!r} is not an exact pin (name==version)")
        pkgs_l.append(PlannedPackage(name, version, "lock", "pinned by the lock file", sha256=sha))
    if not pkgs_l:
        raise PlanError("the lock file pins no packages")
    return Lock(python, platform, device, tuple(pkgs_l), tuple(index_urls), tuple(find_links))


def _valid_pin(name: str, version: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name)) and is_version(version)


def _opt_str(value: object) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def plan_from_lock(lock: Lock, facts: HostFacts, sources: SourceSet, target: Target, *,
                   allow_cuda_torch: bool = False, environ: Optional[Mapping[str, str]] = None) -> InstallPlan:
    """Install exactly the lock's pins (all of them, dependencies included: pip runs with --no-deps)."""
    device = host_device(facts)
    warnings: List[str] = []
    if lock.python and target.version and major_minor(lock.python) != major_minor(target.version):
        raise PlanError(f"the lock was made for Python {lock.python}; the target is Python {target.version}")
    if lock.device != device:
        warnings.append(f"the lock was made on a {lock.device} host; this host is {device}")
    where = _describe_sources(sources.usable(), sources.no_index)
    reqs = []
    for p in lock.packages:
        have = _installed(facts, p.name)
        reqs.append(replace(p, source=where, action=_action(have, p.version), replaces=_replaced(have, p.version)))
    torch = [p for p in reqs if canonicalize_name(p.name) == "torch"]
    cuda_tag = local_label(torch[0].version) if torch and device == "cuda" else None
    return InstallPlan(target=target, device=device, cuda_tag=cuda_tag or None, requirements=tuple(reqs),
                       sources=sources, env=child_env(environ or {}), allow_cuda_torch=allow_cuda_torch,
                       warnings=tuple(warnings), notes=("every package is pinned by the lock file",), no_deps=True)
