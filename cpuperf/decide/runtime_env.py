"""Runtime environment decisions: THE owner of the variables a training process runs with.

Pure over HostFacts + Placement + what the caller found (libraries, the network interface, the current
environment): threads, oneCCL workers and their pinning, Intel MPI pin domains, OpenMP (KMP_*) knobs,
the rendezvous address and port, an allocator preload, OpenMP's wait policy (libgomp's, or libiomp5's blocktime)
where a plan that reads load finds other work on the CPUs. `ccl-env`, the recommendation engine and the
launcher all call runtime_env() and merge_env(), so the rules live here once.
"""

from __future__ import annotations

import os
import re
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from cpuperf.boundary import CCL_ENV_MARKER
from cpuperf.data import load_builtin
from cpuperf.decide.allocator import (
    allocator_names,
    allocator_rule,
    first_library,
    missing_here,
    not_with_ranks,
    preload_choice,
    preloadable,
)
from cpuperf.decide.placement import Placement
from cpuperf.errors import FieldError, UsageError
from cpuperf.knowledge.variables import value_problem, variables
from cpuperf.probe.facts import HostFacts

if TYPE_CHECKING:
    from cpuperf.knowledge.knobs import KnobValue  # the knob table: not needed at ccl-env's start-up
    from cpuperf.knowledge.tuning import Tuning
    from cpuperf.probe.hosts import Host

# Records are NamedTuples, not frozen dataclasses: ccl-env runs in every new shell and a frozen
# dataclass costs ~1 ms to define at import, a NamedTuple ~0.2 ms. Both are immutable and typed.
SET, PREPEND, APPEND = "set", "prepend", "append"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvVar(NamedTuple):
    """One variable: for kind 'prepend'/'append' the value is the ':'-joined entries to add."""

    name: str
    value: str
    source: str  # 'cpuperf' | a script path | 'conda activation'
    reason: str
    kind: str = SET

    def to_json(self) -> Dict[str, str]:
        return dict(self._asdict())


class Libraries(NamedTuple):
    """Shared libraries found: runtime name -> paths (facts.software.openmp / .allocators shape)."""

    openmp: Mapping[str, Tuple[str, ...]] = MappingProxyType({})
    allocators: Mapping[str, Tuple[str, ...]] = MappingProxyType({})


class RuntimeEnv(NamedTuple):
    vars: Tuple[EnvVar, ...]
    notes: Tuple[str, ...]
    master_addr: str
    master_port: int
    nnodes: int


class Kept(NamedTuple):
    name: str
    value: str  # the user's value, left in place
    wanted: str  # what cpuperf would have set

    def to_json(self) -> Dict[str, str]:
        return dict(self._asdict())


class Invalid(NamedTuple):
    """A variable the user already set whose value is not valid for it: replaced, reported, never echoed."""

    name: str
    value: str  # the user's value (for the report on stderr only)
    why: str

    def to_json(self) -> Dict[str, str]:
        return {"name": self.name, "why": self.why}


class Merged(NamedTuple):
    final: Dict[str, str]  # every managed name -> its value after eval, in first-seen order
    vars: Tuple[EnvVar, ...]  # every variable applied, in order (kept ones included)
    kept: Tuple[Kept, ...]
    skipped: Tuple[str, ...]  # names refused (invalid or reserved)
    invalid: Tuple[Invalid, ...] = ()  # the user's values refused (not valid for their variable)


# Characters no single quoting writes safely for sh, bash, zsh, dash AND fish at once: fish reads \\ and
# \' as escapes inside '...', POSIX shells do not, so one text cannot mean the same to both (fish docs,
# "Quotes"; POSIX 2.2.2). Control characters (newline, ESC, U+2028) have no business in a variable.
_SHELL_UNSAFE = frozenset("'\\")


def shell_safe(value: str) -> Optional[str]:
    """None when `value` can be written, single-quoted, for every shell and dotenv; else why not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid text (undecodable bytes)"
    if any(ch in _SHELL_UNSAFE for ch in value):
        return "it holds a quote or a backslash, which no quoting makes mean the same in sh and fish"
    if not value.isprintable():
        return "it holds a control character (newline, tab, escape)"
    return None


def user_value_problem(name: str, value: str) -> Optional[str]:
    """Why the user's own `value` of a variable cpuperf manages cannot be kept (None: it can): shell-safe, and a
    value of its type by the one table of variables (compat/variables.toml)."""
    unsafe = shell_safe(value)
    if unsafe is not None:
        return unsafe
    return value_problem(name, value)


_MEMO: Dict[str, Any] = {}


def data() -> Dict[str, Any]:
    """compat/cclenv.toml, read once per process (with the name sets the hot paths test against)."""
    if not _MEMO:
        table = load_builtin("cclenv.toml")
        _MEMO.update(table=table, reserved=frozenset(table["reserved"]["names"]),
                     reserved_prefixes=tuple(table["reserved"].get("prefixes", ())),
                     paths=frozenset(variables().names(type=("path_list", "preload"))),
                     split_on_spaces=frozenset(variables().names(type="preload")))
    loaded: Dict[str, Any] = _MEMO["table"]
    return loaded


_data = data


def valid_name(name: str) -> bool:
    """A name a POSIX shell, fish and dotenv all accept, and no shell owns."""
    data()
    # fullmatch: `$` in NAME_RE also matches before a final newline ("CCL_X\n" would pass .match).
    return bool(NAME_RE.fullmatch(name)) and name not in _MEMO["reserved"] \
        and not name.startswith(_MEMO["reserved_prefixes"])


def path_like(name: str) -> bool:
    """Colon-separated list variables (PATH, LD_LIBRARY_PATH, ... and any *PATH)."""
    data()
    return name in _MEMO["paths"] or name.endswith("PATH")


def split_entries(name: str, value: Optional[str]) -> List[str]:
    """Entries of a list variable, empty ones dropped (LD_PRELOAD also splits on spaces)."""
    if not value:
        return []
    data()
    parts = re.split(r"[: ]+", value) if name in _MEMO["split_on_spaces"] else value.split(":")
    return [p for p in parts if p]


def _dedupe(entries: Sequence[str]) -> List[str]:
    return list(dict.fromkeys(e for e in entries if e))


def check_port(port: Optional[int]) -> int:
    """--master-port: 1..65535; None = the deterministic default."""
    if port is None:
        return int(_data()["rendezvous"]["master_port"])
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise FieldError("master_port", port, "master port {value!r} is not in 1..65535", "e.g. {flag} 29500")
    return port


def master_address(hosts: Optional[Sequence[Host]], master_addr: Optional[str], nnodes: int,
                   environ: Mapping[str, str], slurm_first: Optional[str] = None) -> Tuple[str, str]:
    """(address, why): --master-addr, else the hostfile's first host, else the Slurm allocation's first node
    (several nodes), else loopback on one node, else a MASTER_ADDR already set in `environ` (read at the edge)."""
    if master_addr is not None:
        from cpuperf.probe.hosts import check_host  # imported only when there is a host to check

        return check_host(master_addr, "--master-addr"), "given with --master-addr"
    if hosts:
        return hosts[0].name, "the first host of the hostfile (rank 0 runs there)"
    if nnodes > 1 and slurm_first:
        return slurm_first, "the first node of the Slurm allocation (rank 0 runs there)"
    if nnodes <= 1:
        return str(_data()["rendezvous"]["single_node_addr"]), "one node: rendezvous over loopback"
    preset = environ.get("MASTER_ADDR")
    if preset:
        from cpuperf.probe.hosts import check_host

        return check_host(preset, "MASTER_ADDR"), "MASTER_ADDR already set"
    raise FieldError("master_addr", None, f"{nnodes} nodes need a rendezvous address",
                     "pass {opt.hostfile} FILE (its first host) or {flag} HOST")


def _hexmask(cpus: Sequence[int]) -> str:
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    return hex(value)


def pin_domain(placement: Placement) -> Optional[str]:
    """Intel MPI's explicit domain list: each local rank's compute CPUs as a hex mask.

    oneCCL workers sit outside the domains (CCL_WORKER_AFFINITY pins them), as IPEX's distributed
    launcher does (intel/intel-extension-for-pytorch cpu/launch/launcher_distributed.py,
    get_pin_domain_affinity: CCL_WORKER_AFFINITY="0,1,2,3,28,29,30,31" with
    I_MPI_PIN_DOMAIN=[0xffffff0,0xffffff00000000] for 2 ranks on a 28-core-per-socket Xeon 8280).
    """
    masks = [_hexmask(s.compute_cpus or s.cpus) for s in placement.slots if (s.compute_cpus or s.cpus)]
    if len(masks) != len(placement.slots):
        return None
    return "[" + ",".join(masks) + "]"


class RuntimeEnvRequest(NamedTuple):
    """What `runtime_env` is asked for (issue 54: one record, not 15 keywords).

    backend: 'ccl' | 'gloo'. threads: each rank's thread count as decided (cpuperf.decide.threads.rank_threads;
    None: OMP_NUM_THREADS is not set, torch's own stands). mpi: 'intelmpi' when Intel MPI launches the ranks (adds
    pin domains). libraries: OpenMP runtimes and allocators found (default: facts.software's). socket_ifname: the
    interface that reaches the master (multi-node gloo). environ: the current environment (LD_PRELOAD, MASTER_ADDR),
    read at the edge and passed in. pin: the affinity decision; False (ranks left to the OS scheduler) also keeps
    Intel MPI from pinning. knobs: the plan's decided values the Arm levers follow (fp32_math_mode;
    cpuperf.decide.arm_levers). allocator_kept: the plan keeps the default allocator on purpose
    (cpuperf.decide.allocator.keeps_the_default): a preload adds none."""

    backend: str
    hosts: Optional[Sequence[Host]] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    preload: bool = False
    allocator: Optional[str] = None
    threads: Optional[int] = None
    nnodes: Optional[int] = None
    mpi: Optional[str] = None
    libraries: Optional[Libraries] = None
    socket_ifname: Optional[str] = None
    environ: Mapping[str, str] = MappingProxyType({})
    slurm_first: Optional[str] = None
    pin: bool = True
    knobs: Optional[Mapping[str, KnobValue]] = None
    allocator_kept: bool = False


def runtime_env(facts: HostFacts, placement: Placement, request: RuntimeEnvRequest) -> RuntimeEnv:
    """The tuned variables for `placement.nproc_per_node` ranks on each of the request's nodes."""
    r = request
    backend, hosts, master_port, mpi, pin, env = r.backend, r.hosts, r.master_port, r.mpi, r.pin, r.environ
    if backend not in ("ccl", "gloo"):
        raise UsageError(f"unknown backend {backend!r}", hint="use 'ccl' or 'gloo'")
    from cpuperf.decide.nodes import job_nodes

    _, nodes = job_nodes(r.nnodes, hosts, None)  # the caller decided the count; the hostfile checked against it
    addr, addr_why = master_address(hosts, r.master_addr, nodes, env, r.slurm_first)
    port = check_port(master_port)
    libraries = r.libraries
    if libraries is None:
        sw = facts.software
        libraries = Libraries(sw.openmp, sw.allocators) if sw is not None else Libraries()
    c = _Collected()
    _thread_vars(c, placement, r.threads, backend, mpi, nodes, pin)
    # Preloads first: KMP_* depends on whether libiomp5 ends up preloaded.
    preloaded = split_entries("LD_PRELOAD", env.get("LD_PRELOAD"))
    if r.preload:
        preloaded = _preload_vars(c, libraries, r.allocator, placement.nproc_per_node * nodes,
                                  r.allocator_kept) + preloaded
    busy = _busy_team(facts, r.threads)
    _kmp_vars(c, preloaded, placement.nproc_per_node, mpi, busy)
    _wait_vars(c, preloaded, busy)
    _arm_vars(c, facts, r.knobs)
    c.add("MASTER_ADDR", addr, addr_why)
    c.add("MASTER_PORT", str(port), "given with --master-port" if master_port is not None
          else f"the default rendezvous port ({_data()['rendezvous']['source']})")
    if backend == "gloo" and nodes > 1:
        if r.socket_ifname:
            c.add("GLOO_SOCKET_IFNAME", r.socket_ifname, f"the interface whose route reaches {addr}")
        else:
            c.notes.append(f"could not tell which interface reaches {addr}: set GLOO_SOCKET_IFNAME yourself "
                           "(ip -o route get ADDR)")
    if nodes > 1:
        c.notes.append(f"{nodes} nodes: threads and pinning assume every node looks like this one")
    return RuntimeEnv(tuple(c.vars), tuple(c.notes), addr, port, nodes)


def _rules() -> Tuning:
    """compat/tuning.toml, typed: read where a rule of it applies (its ~25 records cost ccl-env's start ~15 ms)."""
    from cpuperf.knowledge.tuning import tuning

    return tuning()


class _Collected:
    """The variables (in order) and notes runtime_env gathers."""

    def __init__(self) -> None:
        self.vars: List[EnvVar] = []
        self.notes: List[str] = []

    def add(self, name: str, value: str, reason: str, kind: str = SET) -> None:
        self.vars.append(EnvVar(name, value, "cpuperf", reason, kind))


def _thread_vars(c: _Collected, placement: Placement, threads: Optional[int], backend: str, mpi: Optional[str],
                 nodes: int, pin: bool = True) -> None:
    """OMP_NUM_THREADS (the decided count), oneCCL's workers and their cores, Intel MPI's pin domains."""
    nproc = placement.nproc_per_node
    if threads is not None:
        why_threads = f"{threads} physical core(s) per rank, {nproc} rank(s) per node"
        if backend == "ccl" and placement.ccl_workers:
            why_threads += f", minus {placement.ccl_workers} oneCCL worker core(s)"
        c.add("OMP_NUM_THREADS", str(threads), why_threads + " (" + "; ".join(placement.reasons) + ")")
    if backend == "ccl":
        workers = placement.ccl_workers
        if workers:
            rule = _rules().ccl_workers
            c.add("CCL_WORKER_COUNT", str(workers), f"{rule.reason} ({rule.source})")
            cpus = [cpu for s in placement.slots for cpu in s.ccl_worker_cpus]
            c.add("CCL_WORKER_AFFINITY", ",".join(str(cpu) for cpu in cpus),
                  "each local rank's oneCCL workers on its own first cores, in local-rank order")
        else:
            c.add("CCL_WORKER_COUNT", "1", "no core is set aside (a single rank, or a rank of one core): oneCCL's default single worker")
    if mpi == "intelmpi" and not pin:
        # Intel MPI pins every rank by default (I_MPI_PIN on): the plan's "no pinning" must reach it.
        c.add("I_MPI_PIN", "0", "the plan leaves the ranks to the OS scheduler (no pinning): Intel MPI pins by "
              "default, so its pinning is switched off")
    elif mpi == "intelmpi":
        domain = pin_domain(placement)
        if domain:
            c.add("I_MPI_PIN_DOMAIN", domain, "Intel MPI pins each local rank to its compute cores (hex masks, "
                  "local-rank order); oneCCL workers stay outside")
            c.notes.append(f"I_MPI_PIN_DOMAIN names {nproc} domain(s): start exactly {nproc} rank(s) per node "
                           f"(mpirun -ppn {nproc} -n {nproc * nodes})")


def _preload_vars(c: _Collected, libraries: Libraries, allocator: Optional[str], world: int,
                  kept: bool = False) -> List[str]:
    """--preload: libiomp5 and the allocator (decide.allocator.preload_choice); the libraries preloaded."""
    adds: List[str] = []
    iomp = first_library(libraries.openmp.get("iomp", ()))
    if iomp:
        adds.append(iomp)
    else:
        c.notes.append("no libiomp5 to preload (pip install intel-openmp): OpenMP stays as torch ships it")
    alloc_name = preload_choice(allocator, libraries.allocators, world, kept)
    refused = not_with_ranks([n for n, paths in libraries.allocators.items() if preloadable(paths)], world)
    missing = missing_here(allocator, libraries.allocators)
    if alloc_name:
        adds.append(preloadable(libraries.allocators[alloc_name]) or "")
        if alloc_name == "jemalloc":
            c.add("MALLOC_CONF", allocator_rule().jemalloc_malloc_conf, allocator_rule().source)
    elif missing:  # decided elsewhere (a saved plan, a measurement): never another allocator in its place
        c.notes.append(missing)
    elif kept:
        c.notes.append("no allocator preloaded: the plan keeps the default allocator (measured on this host, or "
                       "your value; `cpuperf recommend` says why)")
    elif refused:
        c.notes.append(f"no allocator preloaded: {', '.join(refused)} aborted jobs of {world} ranks at exit "
                       f"({allocator_rule().not_with_ranks_source})")
    else:
        c.notes.append(f"no allocator preloaded: no {allocator_names()} found (cpuperf install adds the mimalloc wheel)")
    if adds:
        c.add("LD_PRELOAD", ":".join(adds), "--preload: " + ", ".join(os.path.basename(a) for a in adds)
              + " for every later command of this shell", PREPEND)
    return adds


def _arm_vars(c: _Collected, facts: HostFacts, knobs: Optional[Mapping[str, KnobValue]]) -> None:
    """The Arm levers (cpuperf.decide.arm_levers): the applied ones as variables, the others as notes with why."""
    from cpuperf.decide.arm_levers import arm_levers

    for lever in arm_levers(facts, knobs):
        if lever.applied:
            c.add(lever.env, lever.value, lever.reason)
        else:
            c.notes.append(lever.line())


def _kmp_vars(c: _Collected, preloaded: Sequence[str], nproc: int, mpi: Optional[str], busy: Optional[str] = None) -> None:
    """KMP_AFFINITY / KMP_BLOCKTIME: only where libiomp5 is preloaded; where other work keeps the host busy (`busy`:
    _busy_team's finding), [openmp_wait]'s blocktime instead of [kmp]'s."""
    iomp_loaded = any(os.path.basename(p).startswith("libiomp5") for p in preloaded)
    if iomp_loaded:
        rules = _rules()
        wait = rules.openmp_wait
        blocktime, why = ((wait.kmp_blocktime, f"{busy}: {wait.reason} ({wait.kmp_source})") if busy
                          else (rules.kmp.blocktime, rules.kmp.reason))
        pinned = nproc == 1 or mpi == "intelmpi"
        if pinned:
            c.add("KMP_AFFINITY", rules.kmp.affinity, f"libiomp5 is preloaded; {rules.kmp.source}")
        c.add("KMP_BLOCKTIME", blocktime, why)
        if not pinned:
            c.notes.append("KMP_AFFINITY not set: with several ranks and no pinning launcher every rank would bind "
                           "to the same cores (launch with Intel MPI, or cpuperf launch)")


def _busy_team(facts: HostFacts, threads: Optional[int]) -> Optional[str]:
    """[openmp_wait]'s conditions, as the load they found (None where they do not hold): the plan reads load
    (facts.load: --adapt-to-load), other work keeps a CPU of the host busy, and a rank runs a team of threads."""
    if facts.load is None or threads is None or threads < _rules().openmp_wait.min_threads:
        return None
    from cpuperf.decide.load import describe, taken_cpus  # only where load was read

    taken = taken_cpus(facts.load, facts.usable_cpus())
    return describe(facts.load, taken) if taken else None


def _wait_vars(c: _Collected, preloaded: Sequence[str], busy: Optional[str]) -> None:
    """OMP_WAIT_POLICY ([openmp_wait]): only where _busy_team found other work beside a team of threads, and
    libiomp5 is not preloaded (KMP_BLOCKTIME decides: _kmp_vars)."""
    if busy is None or any(os.path.basename(p).startswith("libiomp5") for p in preloaded):
        return
    rule = _rules().openmp_wait
    c.add("OMP_WAIT_POLICY", rule.policy, f"{busy}: {rule.reason} ({rule.source})")


def merge_env(current: Mapping[str, str], wanted: Sequence[EnvVar], *, override: bool = False,
              force: Sequence[str] = ()) -> Merged:
    """Apply `wanted` in order over `current`: final values, idempotent.

    'set': the last EnvVar of a name wins among ours; a different value the user already has is kept
    unless override, or the name is in `force` (asked for by an explicit option such as --master-addr).
    'prepend'/'append': entries added without duplicates or empty entries, so applying the result
    twice changes nothing.
    """
    forced = set(force)
    last_set = {v.name: v for v in wanted if v.kind == SET}
    final: Dict[str, str] = {}
    applied: List[EnvVar] = []
    kept: List[Kept] = []
    skipped: List[str] = []
    invalid: List[Invalid] = []
    for var in wanted:
        if not valid_name(var.name):
            if var.name not in skipped:
                skipped.append(var.name)
            continue
        if var.kind == SET:
            if last_set[var.name] is not var:
                continue
            user_value = current.get(var.name)
            mine = user_value is not None and user_value != var.value and not override and var.name not in forced
            problem = user_value_problem(var.name, user_value) if mine and user_value is not None else None
            if problem is not None and user_value is not None:
                invalid.append(Invalid(var.name, user_value, problem))
                final[var.name] = var.value
            elif mine and user_value is not None:
                kept.append(Kept(var.name, user_value, var.value))
                final[var.name] = user_value
            else:
                final[var.name] = var.value
        else:
            have = final[var.name] if var.name in final else current.get(var.name)
            entries = split_entries(var.name, var.value)
            existing = split_entries(var.name, have)
            merged = _dedupe(entries + existing) if var.kind == PREPEND else _dedupe(existing + entries)
            final[var.name] = ":".join(merged)
        applied.append(var)
    return Merged(final, tuple(applied), tuple(kept), tuple(skipped), tuple(invalid))


# -- cpuperf's own exports (ccl-env) ---------------------------------------------------------------------

def _digest(name: str, value: str) -> str:
    """A short digest of NAME=value: the marker holds it, never the value (a value may hold ',' or ':')."""
    from cpuperf.fsutil import sha256_hex

    return sha256_hex(f"{name}={value}".encode("utf-8", "surrogateescape"))[:16]


def ours_marker(values: Mapping[str, str]) -> str:
    """The marker's value for the variables cpuperf sets to `values` (name -> value): `NAME:DIGEST,...`, safe for
    every shell and a dotenv file as it stands."""
    return ",".join(f"{name}:{_digest(name, value)}" for name, value in values.items())


def ours_in(environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables of `environ` its marker (boundary.CCL_ENV_MARKER) names that still hold the value ccl-env
    wrote (name -> value): cpuperf's own. A variable changed or unset since, or an entry that is not one, is not."""
    ours: Dict[str, str] = {}
    for entry in environ.get(CCL_ENV_MARKER, "").split(","):
        name, _, digest = entry.partition(":")
        value = environ.get(name)
        if value is not None and NAME_RE.fullmatch(name) and name != CCL_ENV_MARKER and digest == _digest(name, value):
            ours[name] = value
    return ours


def users_own(environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` as the user set it: without what an earlier `eval "$(cpuperf ccl-env)"` exported and nobody changed
    since (cpuperf's own, planned again by whoever reads this), and without the marker itself."""
    ours = ours_in(environ)
    return {k: v for k, v in environ.items() if k not in ours and k != CCL_ENV_MARKER}


def describe_invalid(item: Invalid) -> str:
    """One line for stderr: the variable, its value as a repr (never raw), why it was replaced."""
    shown = repr(item.value) if len(item.value) <= 60 else repr(item.value[:57]) + "..."
    return f"your {item.name}={shown} is not kept ({item.why}): cpuperf's value is used instead"
