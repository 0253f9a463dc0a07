"""Where a oneCCL / MPI environment comes from, for the stack really installed (the OS edge of ccl-env).

Found from package metadata in the target Python's prefix, never by importing a package:
  - the bindings' own env/setvars.sh (oneccl_bind_pt; torch_ccl before 1.12), located through the
    dist-info RECORD (or top_level.txt) of the distribution;
  - the registry runtime wheels (oneccl, oneccl-cpu, impi-rt): conda-style etc/conda/activate.d/*.sh
    listed in their RECORD, which expect CONDA_PREFIX = the environment's prefix;
  - a oneAPI install under $ONEAPI_ROOT or /opt/intel/oneapi (component vars.sh, else setvars.sh).
A script is sourced by a child bash (argv list, clean environment, timeout) and its contribution is the
difference of `env -0` before and after; nothing parses shell code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from typing import TYPE_CHECKING, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from cpuperf.decide.runtime_env import APPEND, PREPEND, SET, EnvVar, Libraries, path_like, split_entries
from cpuperf.decide.runtime_env import data as cclenv_data
from cpuperf.errors import ProbeFailedError, UsageError
from cpuperf.knowledge.variables import variables

if TYPE_CHECKING:
    from cpuperf.probe.hosts import Host

# Distributions ccl-env looks for: key -> canonical dist names (PEP 503, '-' and '.' as '_').
DISTS = {
    "torch": ("torch",),
    "bindings": ("oneccl_bind_pt", "torch_ccl"),
    "oneccl": ("oneccl", "oneccl_cpu"),
    "impi": ("impi_rt",),
}
# NAME-VERSION.dist-info; NAME-VERSION[-pyX.Y[-PLATFORM]].egg-info (setup.py develop, old torch_ccl)
_DIST_DIR = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[0-9][^-]*?)(?:-py\d[^-]*(?:-.+)?)?\.(?:dist|egg)-info$")

_PROBE_PY = "import json, sys; print(json.dumps({'prefix': sys.prefix, 'path': sys.path}))"


class Dist(NamedTuple):
    key: str
    name: str  # canonical: oneccl_bind_pt, oneccl_cpu, impi_rt, ...
    version: str
    site_dir: str
    meta_dir: str  # .../site-packages/NAME-VERSION.dist-info

    @property
    def label(self) -> str:
        return f"{self.name.replace('_', '-')} {self.version}"


class EnvSource(NamedTuple):
    kind: str  # 'bindings' | 'wheel' | 'oneapi'
    label: str  # 'oneccl-cpu 2022.1.2'
    script: str
    conda_prefix: Optional[str] = None  # set for conda activate scripts

    def to_json(self) -> Dict[str, Optional[str]]:
        return dict(self._asdict())


class Stack(NamedTuple):
    """What one Python environment has installed that matters for the distributed runtime."""

    executable: str
    prefix: str
    site_dirs: Tuple[str, ...]
    dists: Mapping[str, Dist]
    oneapi_root: Optional[str]
    notes: Tuple[str, ...] = ()

    def get(self, key: str) -> Optional[Dist]:
        return self.dists.get(key)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _site_dirs(paths: Sequence[str]) -> Tuple[str, ...]:
    dirs = [p for p in paths if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages")]
    return tuple(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def target_python(python: Optional[str]) -> Tuple[str, str, Tuple[str, ...]]:
    """(executable, prefix, site dirs) of this interpreter or of the one at `python` (a child process)."""
    # Not realpath: a venv's python is a symlink to the base interpreter, yet another environment.
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return sys.executable, sys.prefix, _site_dirs(sys.path)
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise UsageError(f"no Python interpreter at {python}", hint="pass --python PATH of an existing interpreter")
    import subprocess  # here, not at the top: ccl-env in every new shell usually starts no child

    try:
        proc = subprocess.run([python, "-I", "-c", _PROBE_PY], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
        info = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        info = None
    if not isinstance(info, dict) or "prefix" not in info:
        raise ProbeFailedError(f"could not ask {python} for its prefix and site-packages",
                               hint=f"check that `{python} -c 'import sys'` runs")
    return python, str(info["prefix"]), _site_dirs([str(p) for p in info.get("path", [])])


def find_dists(site_dirs: Sequence[str], wanted: Mapping[str, Sequence[str]] = DISTS) -> Dict[str, Dist]:
    """One distribution per key, from metadata directory names only (no metadata parsing).

    Within a key the names are a preference (the full `oneccl` before `oneccl_cpu`); for one name the
    first site directory on the path wins, as for an import.
    """
    rank = {name: (key, i) for key, names in wanted.items() for i, name in enumerate(names)}
    best: Dict[str, Tuple[int, Dist]] = {}
    for site in site_dirs:
        for entry in _listdir(site):
            if not entry.endswith("-info"):
                continue
            match = _DIST_DIR.match(entry)
            if not match:
                continue
            name = _canon(match.group("name"))
            if name not in rank:
                continue
            key, pref = rank[name]
            if key not in best or pref < best[key][0]:
                best[key] = (pref, Dist(key, name, match.group("version"), site, os.path.join(site, entry)))
    return {key: dist for key, (_, dist) in best.items()}


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def record_files(dist: Dist) -> List[str]:
    """Absolute paths of the files a distribution installed (RECORD), normalised."""
    try:
        with open(os.path.join(dist.meta_dir, "RECORD"), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        path = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
        path = path.strip('"')
        if path:
            out.append(os.path.normpath(os.path.join(dist.site_dir, path)))
    return out


def bindings_script(dist: Dist) -> Optional[str]:
    """The bindings' env/setvars.sh (or env/vars.sh), from RECORD, else from top_level.txt."""
    data = cclenv_data()["bindings"]
    pkg_dirs, scripts = data["package_dirs"], data["scripts"]
    files = set(record_files(dist))
    for pkg in pkg_dirs:
        for script in scripts:
            path = os.path.normpath(os.path.join(dist.site_dir, pkg, script))
            if path in files and os.path.isfile(path):
                return path
    try:
        with open(os.path.join(dist.meta_dir, "top_level.txt"), encoding="utf-8") as fh:
            tops = [t.strip() for t in fh.read().split() if t.strip()]
    except OSError:
        tops = []
    for top in tops:
        for script in scripts:
            path = os.path.join(dist.site_dir, top, script)
            if os.path.isfile(path):
                return path
    return None


def activate_scripts(dist: Dist) -> List[str]:
    """etc/conda/activate.d/*.sh that a registry wheel installed under the prefix."""
    return sorted(p for p in record_files(dist)
                  if os.sep + os.path.join("etc", "conda", "activate.d") + os.sep in p and p.endswith(".sh")
                  and os.path.isfile(p))


def oneapi_root(environ: Mapping[str, str]) -> Optional[str]:
    root = environ.get("ONEAPI_ROOT") or cclenv_data()["oneapi"]["default_root"]
    return root if os.path.isdir(root) else None


def discover(python: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Stack:
    """The runtime-relevant stack of this interpreter (or `python`): metadata reads only, no imports."""
    env = os.environ if environ is None else environ
    executable, prefix, site_dirs = target_python(python)
    dists = find_dists(site_dirs)
    notes: List[str] = []
    oneccl = dists.get("oneccl")
    if oneccl is not None and oneccl.name == "oneccl_cpu":
        lib = os.path.join(prefix, "lib")
        if os.path.exists(os.path.join(lib, "libccl.so.1")) and not os.path.exists(os.path.join(lib, "libccl.so.2")):
            notes.append("the oneccl-cpu wheel's libccl.so.1 needs libccl.so.2, which it does not ship "
                         "(python -m pip install oneccl: the full runtime)")
    return Stack(executable, prefix, site_dirs, dists, oneapi_root(env), tuple(notes))


def plan_sources(stack: Stack, backend: str) -> Tuple[List[EnvSource], List[str]]:
    """Scripts to source, lowest precedence first (oneAPI, wheels, bindings), and why any is skipped."""
    data = cclenv_data()["oneapi"]
    sources: List[EnvSource] = []
    notes: List[str] = []
    bindings, oneccl, impi = stack.get("bindings"), stack.get("oneccl"), stack.get("impi")
    bindings_used = bindings is not None and backend == "ccl"
    if stack.oneapi_root:
        root = stack.oneapi_root
        picked = []
        for comp, provided_by in (("ccl", bindings if bindings_used else oneccl), ("mpi", impi)):
            script = os.path.join(root, data[comp])
            if not os.path.isfile(script):
                continue
            if provided_by is not None:
                notes.append(f"oneAPI {comp} not sourced: {provided_by.label} in this environment provides it")
                continue
            picked.append(EnvSource("oneapi", f"oneAPI {comp}", script))
        setvars = os.path.join(root, data["setvars"])
        if not picked and not any(os.path.isfile(os.path.join(root, data[c])) for c in ("ccl", "mpi")) \
                and os.path.isfile(setvars):
            picked.append(EnvSource("oneapi", "oneAPI", setvars))
        sources += picked
    for dist in (impi, oneccl):
        if dist is None:
            continue
        scripts = activate_scripts(dist)
        if not scripts:
            notes.append(f"{dist.label}: no etc/conda/activate.d script in its RECORD; nothing sourced")
        # PREFIX/etc/conda/activate.d/x.sh -> PREFIX: the environment the wheel was installed into
        prefix = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(scripts[0])))) if scripts \
            else stack.prefix
        for script in scripts:
            sources.append(EnvSource("wheel", dist.label, script, conda_prefix=prefix))
    if bindings is not None:
        if not bindings_used:
            notes.append(f"{bindings.label}: its env script is not sourced, the ccl backend is not used")
        else:
            found = bindings_script(bindings)
            if found is None:
                notes.append(f"{bindings.label}: no env/setvars.sh or env/vars.sh in its package; nothing sourced")
            else:
                sources.append(EnvSource("bindings", bindings.label, found))
    return sources, notes


# -- running a script -------------------------------------------------------------------------------

_SNIPPET = r'''__cpuperf_s=$1; __cpuperf_t=$2; __cpuperf_env=$3; shift 3
"$__cpuperf_env" -0; printf '%s\0' "$__cpuperf_t"
. "$__cpuperf_s" >&2 </dev/null
__cpuperf_rc=$?
printf '%s\0' "$__cpuperf_t"; "$__cpuperf_env" -0
exit "$__cpuperf_rc"
'''


def _parse_env0(blob: bytes) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for item in blob.split(b"\0"):
        if b"=" in item:
            name, _, value = item.partition(b"=")
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def base_environment(source: EnvSource, environ: Mapping[str, str]) -> Dict[str, str]:
    """The clean environment a script runs in: fixed PATH, a few switches, CONDA_PREFIX for wheels."""
    data = cclenv_data()["scripts"]
    # the user's own locale and home, and the switches the vendor scripts read (compat/variables.toml)
    passed = (*data["passthrough"], *variables().names(script_switch=True))
    env = {k: environ[k] for k in passed if k in environ}
    env["PATH"] = data["base_path"]
    if source.conda_prefix:
        env["CONDA_PREFIX"] = source.conda_prefix
    return env


def diff_env(before: Mapping[str, str], after: Mapping[str, str], source: str) -> Tuple[List[EnvVar], List[str]]:
    """A script's contribution: set variables, and entries added to list variables."""
    ignored = set(cclenv_data()["scripts"]["ignored"])
    out: List[EnvVar] = []
    notes: List[str] = []
    why = f"exported by {source}"
    for name, value in after.items():
        if name in ignored or before.get(name) == value:
            continue
        if path_like(name):
            old = split_entries(name, before.get(name))
            new = split_entries(name, value)
            added = [e for e in dict.fromkeys(new) if e not in set(old)]
            if not added:
                continue
            first_old = next((i for i, e in enumerate(new) if e in set(old)), len(new))
            front = [e for e in added if new.index(e) < first_old]
            back = [e for e in added if new.index(e) > first_old]
            if front:
                out.append(EnvVar(name, ":".join(front), source, why, PREPEND))
            if back:
                out.append(EnvVar(name, ":".join(back), source, why, APPEND))
        else:
            out.append(EnvVar(name, value, source, why, SET))
    removed = sorted(n for n in before if n not in after and n not in ignored)
    if removed:
        notes.append(f"{source} unsets {', '.join(removed)}; cpuperf leaves them as they are")
    return out, notes


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return "".join(ch if ch.isprintable() else "?" for ch in line)[:200]


def script_env(source: EnvSource, environ: Optional[Mapping[str, str]] = None,
               timeout: Optional[float] = None) -> Tuple[List[EnvVar], List[str]]:
    """Source one script in a child bash and return what it exports (ProbeFailedError if it fails)."""
    data = cclenv_data()["scripts"]
    env = base_environment(source, os.environ if environ is None else environ)
    bash = shutil.which("bash") or ("/bin/bash" if os.path.exists("/bin/bash") else None)
    env_tool = shutil.which("env", path=data["base_path"])
    if bash is None or env_tool is None:
        raise ProbeFailedError(f"bash and env are needed to read {source.script}",
                               hint="apt-get install -y bash coreutils")
    import subprocess

    token = "__cpuperf_" + os.urandom(8).hex()  # no '=': can never be an environment entry
    argv = [bash, "--norc", "--noprofile", "-c", _SNIPPET, "cpuperf-source", source.script, token, env_tool]
    limit = float(timeout if timeout is not None else data["timeout_s"])
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True, cwd="/")
    except OSError as exc:
        raise ProbeFailedError(f"could not run bash to read {source.script}: {exc.strerror}") from exc
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise ProbeFailedError(f"sourcing {source.script} ({source.label}) did not finish in {limit:g} s",
                               hint="run it by hand: bash -c '. SCRIPT'") from None
    marker = token.encode() + b"\0"
    parts = out.split(marker)
    detail = _one_line(os.fsdecode(err))
    if proc.returncode != 0 or len(parts) != 3:
        what = f"exit {proc.returncode}" if len(parts) == 3 or proc.returncode else "it exited the shell"
        raise ProbeFailedError(f"sourcing {source.script} ({source.label}) failed ({what})"
                               + (f": {detail}" if detail else ""),
                               hint=f"run it by hand: bash -c '. {source.script}'")
    before, after = _parse_env0(parts[0]), _parse_env0(parts[2])
    return diff_env(before, after, source.script)


def conda_path(source: EnvSource) -> Optional[EnvVar]:
    """Conda puts PREFIX/bin on PATH before running activate.d (the wheels' scripts rely on it)."""
    if not source.conda_prefix:
        return None
    return EnvVar("PATH", os.path.join(source.conda_prefix, "bin"), "conda activation",
                  "the environment's launchers (mpirun, ...) live there; conda activation puts PREFIX/bin on PATH", PREPEND)


# -- libraries and network (multi-node, --preload) --------------------------------------------------

def find_libraries(stack: Stack) -> Libraries:
    """OpenMP runtimes and allocators in the prefix, torch's lib dir and the system library dirs."""
    from cpuperf.probe.facts import ALLOCATOR_LIBS
    from cpuperf.probe.software import OPENMP_LIBS, WHEEL_LIB_DIRS
    from cpuperf.probe.sources import Sources

    src = Sources()
    extra = [os.path.join(stack.prefix, "lib")]
    for site in stack.site_dirs:
        extra += [os.path.join(site, "torch", "lib"), os.path.join(site, "torch.libs")]
    # An allocator's wheel (cmeel-mimalloc, which `cpuperf install` adds) keeps it in site-packages, where the probe
    # finds it too (probe.software WHEEL_LIB_DIRS): --preload preloads what the plan decided on.
    wheels = [os.path.join(site, sub) for site in stack.site_dirs for sub in WHEEL_LIB_DIRS]

    def scan(table: Mapping[str, Sequence[str]], dirs: Sequence[str]) -> Dict[str, Tuple[str, ...]]:
        out = {}
        for name, patterns in table.items():
            paths = list(src.find_libraries(patterns))
            for directory in dirs:
                paths += [q for p in patterns for q in src.glob(os.path.join(directory, p))]
            out[name] = tuple(dict.fromkeys(paths))
        return out

    return Libraries(openmp=scan(OPENMP_LIBS, extra), allocators=scan(ALLOCATOR_LIBS, extra + wheels))


def _iface_holding(ip: str) -> Optional[str]:
    try:
        import psutil
    except ImportError:
        return None
    try:
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] == ip for a in addrs):
                return str(name)  # psutil has no type stubs
    except OSError:
        return None
    return None


def _iface_by_subnet(ip: str) -> Optional[str]:
    import ipaddress

    try:
        import psutil

        target = ipaddress.ip_address(ip)
        for name, addrs in psutil.net_if_addrs().items():
            for a in addrs:
                if not a.netmask:
                    continue
                try:
                    net = ipaddress.ip_network(f"{a.address.split('%')[0]}/{a.netmask}", strict=False)
                except ValueError:
                    continue
                if target in net and name != "lo":
                    return str(name)  # psutil has no type stubs
    except (ImportError, OSError, ValueError):
        return None
    return None


def route_interface(host: str, timeout: float = 3.0) -> Optional[str]:
    """The network interface this host uses to reach `host` (None when it cannot tell)."""
    from cpuperf.probe.hosts import resolve

    ip = resolve(host, timeout)
    if ip is None:
        return None
    ip_tool = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)
    if ip_tool:
        import subprocess

        try:
            proc = subprocess.run([ip_tool, "-o", "route", "get", ip], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
            text = proc.stdout if proc.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        match = re.search(r"\bdev (\S+)", text)
        if match:
            if text.lstrip().startswith("local") or match.group(1) == "lo":
                return _iface_holding(ip) or match.group(1)  # the master is this host
            return match.group(1)
    return _iface_holding(ip) or _iface_by_subnet(ip)


def master_interface(master: Optional[str], hosts: Optional[Sequence[Host]]) -> Optional[str]:
    """The local interface a multi-node gloo job talks on: the one that reaches the master (else the hostfile's
    first host), or failing that the one that reaches another host of the hostfile."""
    addr = master or (hosts[0].name if hosts else None)
    if not addr:
        return None
    others = [h.name for h in (hosts or ()) if h.name != addr]
    return route_interface(addr) or (route_interface(others[0]) if others else None)


class VendorEnv(NamedTuple):
    """The vendor scripts a shell needs for a backend and the variables they set, in order."""

    sources: Tuple[EnvSource, ...]
    vars: Tuple[EnvVar, ...]
    notes: Tuple[str, ...]
    intel_mpi: bool  # Intel MPI launches the ranks (its pin domains apply)


def vendor_env(stack: Stack, backend: str, environ: Mapping[str, str]) -> VendorEnv:
    """Source the scripts plan_sources() picks for `backend` (each in a child shell) and collect what they set."""
    sources, notes = plan_sources(stack, backend)
    notes = list(stack.notes) + notes
    wanted: List[EnvVar] = []
    for source in sources:
        path_var = conda_path(source)
        if path_var is not None and not any(v.name == "PATH" and v.value == path_var.value for v in wanted):
            wanted.append(path_var)
        found, script_notes = script_env(source, environ)
        wanted += found
        notes += script_notes
    intel_mpi = stack.get("impi") is not None or any(s.label == "oneAPI mpi" for s in sources) \
        or bool(environ.get("I_MPI_ROOT")) or any(v.name == "I_MPI_ROOT" for v in wanted)
    return VendorEnv(tuple(sources), tuple(wanted), tuple(notes), intel_mpi)
