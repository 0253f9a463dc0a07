"""`cpuperf ccl-env`: find the installed oneCCL/MPI environment, tune it for this host, print it.

Start-up matters (it runs in every new shell): no torch, no pip, no full software probe, rich only
for --explain, a subprocess only when a script exists or several nodes need the network interface.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, NamedTuple, NoReturn, Optional, Tuple

from cpuperf.errors import ExitCode, IncompatibleHostError
from cpuperf.output import Output

if TYPE_CHECKING:
    from cpuperf.decide.runtime_env import EnvVar
    from cpuperf.render.shell import CclEnv


class Options(NamedTuple):
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    hostfile: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    shell: Optional[str] = None
    explain: bool = False
    override: bool = False
    preload: bool = False
    require_ccl: bool = False
    python: Optional[str] = None
    sysroot: Optional[str] = None
    unit: str = "socket"
    plan: Optional[str] = None  # a saved plan (cpuperf recommend --save): rendered as it stands
    replan: bool = False
    adapt_to_load: bool = False


def parse_args(argv: List[str]) -> Tuple[Options, bool, bool]:
    """ccl-env's options -> (Options, --json, --quiet); a bad option is a UsageError (exit 2)."""
    if not argv:  # `eval "$(cpuperf ccl-env)"` in every new shell: skip building a parser
        return Options(), False, False
    return _start_up_line(argv) or _parse_all(argv)


_START_UP_FLAGS = {"--json": "json", "--quiet": "quiet", "-q": "quiet"}
_START_UP_VALUES = ("--plan", "--shell")


def _start_up_line(argv: List[str]) -> Optional[Tuple[Options, bool, bool]]:
    """What a shell's start-up line passes (--plan FILE, --shell NAME, --json, --quiet, each once), read without
    argparse (importing it and building the parser costs ~8 ms, most of it gettext looking for translations);
    None for anything else, which _parse_all reads (the same result where both read it)."""
    seen: dict[str, str] = {}
    rest = iter(argv)
    for arg in rest:
        name, eq, value = arg.partition("=")
        if arg in _START_UP_FLAGS:
            key, value = _START_UP_FLAGS[arg], "yes"
        elif name in _START_UP_VALUES:
            value = value if eq else next(rest, "")
            key = name[2:]
        else:
            return None
        if key in seen or not value or value.startswith("-"):  # argparse's rules for these: _parse_all
            return None
        seen[key] = value
    return Options(shell=seen.get("shell"), plan=seen.get("plan")), "json" in seen, "quiet" in seen


def _parse_all(argv: List[str]) -> Tuple[Options, bool, bool]:
    """Every option, with argparse (--help, usage errors)."""
    import argparse

    from cpuperf.errors import UsageError

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one line through cli.main's error boundary
            raise UsageError(message, hint="cpuperf ccl-env --help")

    def positive(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
        return int(text)

    def port(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port in 1..65535")
        return int(text)

    p = Parser(prog="cpuperf ccl-env", allow_abbrev=False,
               description='Print the oneCCL / MPI environment for the installed stack, tuned for this host. '
                           'Use: eval "$(cpuperf ccl-env)"; fish: cpuperf ccl-env --shell fish | source.')
    p.add_argument("--nproc-per-node", type=positive, metavar="N", help="ranks per node (default: one per socket)")
    p.add_argument("--nnodes", type=positive, metavar="N", help="nodes in the job (default: hostfile length, else 1)")
    p.add_argument("--hostfile", metavar="FILE", help="hosts, one per line; the first is MASTER_ADDR")
    p.add_argument("--master-addr", metavar="HOST", help="rendezvous host (default 127.0.0.1, or the hostfile's first)")
    p.add_argument("--master-port", type=port, metavar="PORT", help="rendezvous port (default 29500)")
    p.add_argument("--shell", metavar="SHELL", help="sh (default: POSIX, for sh, bash, zsh and dash), bash, zsh, fish or dotenv; "
                        "never guessed from $SHELL")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout (schema cpuperf.ccl-env/1)")
    p.add_argument("--quiet", "-q", action="store_true", help="no messages on stderr")
    p.add_argument("--explain", action="store_true", help="a table of variable, value, source, reason on stderr")
    p.add_argument("--override", action="store_true", help="replace variables you already set (kept by default)")
    p.add_argument("--preload", action="store_true",
                   help="LD_PRELOAD libiomp5 and tcmalloc/jemalloc (affects every later command of the shell)")
    p.add_argument("--require-ccl", action="store_true", help="fail unless the oneCCL (ccl) backend is usable")
    p.add_argument("--python", metavar="PATH", help="the environment of another interpreter (a venv's python)")
    p.add_argument("--sysroot", metavar="DIR", help="read /proc and /sys under DIR (a recorded host)")
    p.add_argument("--unit", choices=("socket", "numa"), default="socket", help="one rank per socket or NUMA node")
    p.add_argument("--plan", metavar="FILE", help="render this saved plan (cpuperf recommend --save FILE) as it stands")
    p.add_argument("--replan", action="store_true", help="with --plan: plan again where this host or stack differs")
    p.add_argument("--adapt-to-load", action="store_true",
                   help="plan around other work busy on this host now (off: plans come from stable facts only)")
    ns = p.parse_args(argv)
    if ns.plan and (ns.nproc_per_node or ns.unit != "socket"):
        raise UsageError(f"--plan {ns.plan} fixes ranks and placement; drop --nproc-per-node/--unit",
                         hint="or make a new plan: cpuperf recommend ... --save FILE")
    opts = Options(ns.nproc_per_node, ns.nnodes, ns.hostfile, ns.master_addr, ns.master_port, ns.shell,
                   ns.explain, ns.override, ns.preload, ns.require_ccl, ns.python, ns.sysroot, ns.unit,
                   ns.plan, ns.replan, ns.adapt_to_load)
    return opts, ns.json, ns.quiet


def build(opts: Options, environ: Optional[Mapping[str, str]] = None) -> CclEnv:  # noqa: C901  (being reworked for start-up time: split then)
    """Everything but printing: returns a cclenv.CclEnv. Raises CpuperfError on bad input."""
    from cpuperf.decide import runtime_env as envplan
    from cpuperf.probe import probe_host
    from cpuperf.render import shell as cclenv
    from cpuperf.run import vendor_env as envsources

    env = dict(os.environ if environ is None else environ)
    # Validate every input before doing any work: bad input is a one-line usage error.
    if opts.shell is not None:
        cclenv.check_shell(opts.shell)
    envplan.check_port(opts.master_port)
    hosts = None
    if opts.hostfile:
        from cpuperf.probe.hosts import read_hostfile

        hosts = read_hostfile(opts.hostfile)
    saved_plan = None
    if opts.plan:
        from cpuperf.plan.saved import read_plan_file

        saved_plan = read_plan_file(opts.plan)  # a bad file is refused before anything is probed
        if opts.nnodes is None and hosts is None:
            opts = opts._replace(nnodes=int(saved_plan.rec.get("nnodes") or 1))
    nodes = envplan.node_count(hosts, opts.nnodes)
    master, _ = envplan.master_address(hosts, opts.master_addr, nodes, env)

    if opts.python is not None:
        from cpuperf.probe import check_python

        check_python(opts.python)
    stack = envsources.discover(opts.python, env)  # the vendor env scripts this interpreter's packages ship
    # The stack as every command sees it. The OpenMP and allocator libraries matter here only to what --preload
    # renders (LD_PRELOAD, KMP_*), and the MPI launchers not at all (Intel MPI is found from its scripts).
    plan_preloads = saved_plan is not None and any(v.name == "LD_PRELOAD" for v in saved_plan.env)
    # The GPUs matter only to whether a saved plan fits (ccl-env decides for the CPU): their probe is a child process.
    facts = probe_host(sysroot=opts.sysroot, python=opts.python, runtimes=opts.preload or plan_preloads,
                       gpus=saved_plan is not None)
    if opts.adapt_to_load and facts.live:
        from cpuperf.probe import with_load

        facts = with_load(facts)
    planned: Optional[List[envplan.EnvVar]] = None
    plan_diffs: List[str] = []
    if saved_plan is not None:
        rec, planned, plan_diffs = _from_plan(opts, saved_plan, facts, nodes, env)
        placement, backend, allocator = rec.placement, _backend(facts, rec), rec.get("allocator")
    else:
        placement, backend, allocator = _decided(facts, opts, nodes, env)
    if opts.require_ccl and backend.name != "ccl":
        raise IncompatibleHostError(f"the ccl backend is not available: {backend.reason.removeprefix('gloo: ')}",
                                    hint="cpuperf compat --with oneccl shows the torch it needs, or drop --require-ccl")
    sources, notes = envsources.plan_sources(stack, backend.name)
    notes = list(stack.notes) + notes
    wanted: List[envplan.EnvVar] = []
    for source in sources:
        path_var = envsources.conda_path(source)
        if path_var is not None and not any(v.name == "PATH" and v.value == path_var.value for v in wanted):
            wanted.append(path_var)
        found, script_notes = envsources.script_env(source, env)
        wanted += found
        notes += script_notes
    intel_mpi = stack.get("impi") is not None or any(s.label == "oneAPI mpi" for s in sources) \
        or bool(env.get("I_MPI_ROOT")) or any(v.name == "I_MPI_ROOT" for v in wanted)
    # What an option asks for explicitly replaces what the environment has (a stale 127.0.0.1 from an
    # earlier single-node eval must not survive --hostfile).
    forced = ({"MASTER_ADDR"} if opts.master_addr or opts.hostfile else set()) \
        | ({"MASTER_PORT"} if opts.master_port is not None else set())
    ifname = None
    if backend.name == "gloo" and nodes > 1:
        from cpuperf.probe.hosts import valid_host

        # The address that will be in force: a MASTER_ADDR you set is kept unless an option names one.
        preset = env.get("MASTER_ADDR")
        kept_addr = preset if preset and "MASTER_ADDR" not in forced and not opts.override \
            and valid_host(preset) else None
        ifname = envsources.route_interface(kept_addr or master)
    libraries = envsources.find_libraries(stack) if opts.preload else envplan.Libraries()
    tuned = envplan.runtime_env(facts, placement, backend=backend.name, hosts=hosts, master_addr=opts.master_addr,
                                master_port=opts.master_port, preload=opts.preload, allocator=allocator,
                                nnodes=nodes, mpi="intelmpi" if intel_mpi else None, libraries=libraries,
                                socket_ifname=ifname, environ=env)
    notes += [f"the plan differs from what cpuperf decides here: {d}" for d in plan_diffs] + list(tuned.notes)
    tuned_vars = list(tuned.vars)
    if planned is not None:  # the saved plan's variables as they are; this launch's rendezvous added
        from cpuperf.plan.saved import LAUNCH_VARS

        names = {v.name for v in planned}
        tuned_vars = [v for v in planned if opts.preload or v.name not in ("LD_PRELOAD", "MALLOC_CONF")] + \
            [v for v in tuned_vars if v.name in LAUNCH_VARS and v.name not in names]
        if not opts.preload and any(v.name == "LD_PRELOAD" for v in planned):
            notes.append("the plan preloads an allocator; ccl-env prints LD_PRELOAD only with --preload (it affects "
                         "every later command of the shell)")
    merged = envplan.merge_env(env, list(wanted) + tuned_vars, override=opts.override, force=sorted(forced))
    for name in merged.skipped:
        notes.append(f"skipped variable {cclenv.one_line(repr(name), 80)}: not a valid or allowed name")
    for item in merged.invalid:
        notes.append(envplan.describe_invalid(item))
    for name, value in merged.final.items():
        why = envplan.shell_safe(value)
        if why is not None:
            notes.append(f"refused {name}: {why}; it is not written (set it yourself if you need it)")
    if merged.kept:
        notes.append("kept your " + ", ".join(k.name for k in merged.kept) + " (--override replaces them)")
    header = (f"cpuperf ccl-env: backend {backend.name}; {nodes} node(s) x {placement.nproc_per_node} rank(s), "
              f"{placement.threads_per_rank} thread(s) each; python {stack.executable}")
    source_json = tuple(s.to_json() for s in sources)
    return cclenv.CclEnv(backend=backend.name, backend_reason=backend.reason, final=merged.final,
                         vars=merged.vars, kept=merged.kept, sources=source_json, notes=tuple(notes),
                         skipped=merged.skipped, placement=placement.to_json(), header=header, invalid=merged.invalid,
                         extra={"nnodes": nodes, "nproc_per_node": placement.nproc_per_node, "plan_differences": plan_diffs,
                                "python": stack.executable, "prefix": stack.prefix})


def _decided(facts: Any, opts: Options, nodes: int, env: Mapping[str, str]) -> Tuple[Any, Any, Optional[str]]:
    """(placement, backend, allocator) as `recommend` and `train --auto` decide them here, remembered (see _remembered):
    the engine runs when the facts, options, measurements or rules change, not in every new shell."""
    if facts.load is not None:  # --adapt-to-load: the load of this moment, decided now
        return _decide_now(facts, opts, nodes, env)[0]
    import dataclasses

    # Free memory moves from one run to the next; the decisions read it only where the total is unknown.
    memory = facts.memory if facts.memory.total_bytes is None else dataclasses.replace(facts.memory, available_bytes=None)
    gpus = None if facts.gpus is None else tuple(dataclasses.replace(g, memory_free_bytes=None) for g in facts.gpus)
    stable = repr(dataclasses.replace(facts, memory=memory, gpus=gpus))

    def compute() -> Tuple[Any, Optional[float]]:
        (placement, backend, allocator), until = _decide_now(facts, opts, nodes, env)
        return {"placement": placement.to_json(), "backend": list(backend[:2]), "allocator": allocator}, until

    decided: Tuple[Any, Any, Optional[str]] = _remembered("ccl-decisions", facts, [stable, opts.nproc_per_node, opts.unit,
                                                                               nodes], compute, _decisions_from)
    return decided


def _decide_now(facts: Any, opts: Options, nodes: int, env: Mapping[str, str]) -> Tuple[Tuple[Any, Any, Optional[str]], Optional[float]]:
    """((placement, backend, allocator), when the measurement they used expires) from the decision engine."""
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.run import measure

    meas = measure.planning_measurements(facts)
    rec = recommend(facts, resolve_workload(None, None, None, None, 400), nproc_per_node=opts.nproc_per_node,
                    nnodes=nodes, unit=opts.unit, device="cpu", measurements=meas, environ=env if facts.live else {})
    return (rec.placement, _backend(facts, rec), rec.get("allocator")), measure.expiry(facts) if meas else None


def _decisions_from(raw: Any) -> Tuple[Any, Any, Optional[str]]:
    """_decided's remembered JSON -> (Placement, Backend, allocator); TypeError/KeyError when it is not that."""
    from cpuperf.decide.placement import Placement, RankSlot
    from cpuperf.decide.runtime_env import Backend

    def typed(value: Any, kind: Any) -> Any:
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"{value!r} is not {kind}")
        return value

    def ints(values: Any) -> Tuple[int, ...]:
        return tuple(typed(v, int) for v in typed(values, list))

    p = raw["placement"]
    slots = tuple(RankSlot(typed(s["local_rank"], int), typed(s["socket"], (int, type(None))),
                           typed(s["node"], (int, type(None))), ints(s["cpus"]), ints(s["compute_cpus"]),
                           ints(s["ccl_worker_cpus"]), typed(s["threads"], int)) for s in typed(p["slots"], list))
    placement = Placement(typed(p["nproc_per_node"], int), typed(p["unit"], str), slots, typed(p["ccl_workers"], int),
                          typed(p["cpu_budget"], int), tuple(typed(r, str) for r in typed(p["reasons"], list)))
    name, reason = (typed(v, str) for v in typed(raw["backend"], list))
    return placement, Backend(name, reason, name == "ccl"), typed(raw["allocator"], (str, type(None)))


def _from_plan(opts: Options, plan: Any, facts: Any, nodes: int, env: Mapping[str, str]) -> Tuple[Any, Optional[List[EnvVar]], List[str]]:
    """(recommendation, its saved variables, how it differs from what cpuperf decides here) of a saved plan;
    decided again only with --replan (exit 13 without)."""
    from cpuperf.plan.saved import plan_fits

    plan, diffs = plan_fits(str(opts.plan), plan, facts, opts.replan)
    if diffs:
        from cpuperf.plan.saved import replan_from
        from cpuperf.run.measure import planning_measurements

        return replan_from(plan, facts, planning_measurements(facts), env if facts.live else {}), None, []

    def fresh(p: Any, f: Any) -> List[str]:  # only when nothing remembered answers: the engine loads here
        from cpuperf.plan.saved import fresh_differences
        from cpuperf.run.measure import planning_measurements

        return fresh_differences(p, f, planning_measurements(f))

    return plan.rec, [v._replace(source="cpuperf") for v in plan.env], _plan_differences(plan, facts, fresh)


def _plan_differences(plan: Any, facts: Any, compute: Any) -> List[str]:
    """compute(plan, facts) (how the plan differs from a fresh one), remembered per plan, host and stack identity
    (see _remembered)."""
    from cpuperf.plan import saved

    def fresh() -> Tuple[List[str], Optional[float]]:
        from cpuperf.run import measure

        return list(compute(plan, facts)), measure.expiry(facts)

    def checked(known: Any) -> List[str]:
        if not (isinstance(known, list) and all(isinstance(d, str) and d.isprintable() for d in known)):
            raise TypeError("not a list of printable lines")
        return known

    lines: List[str] = _remembered("plan-checks", facts,
                                   [plan.to_json(), saved.host_identity(facts), saved.stack_identity(facts)], fresh, checked)
    return lines


def _remembered(kind: str, facts: Any, parts: List[Any], compute: Callable[[], Tuple[Any, Optional[float]]],
                decode: Callable[[Any], Any]) -> Any:
    """decode(what compute() returns: (JSON, when it expires)), remembered per `parts`, measurements, knowledge files,
    the engine's own files, GPU visibility and cpuperf version: ccl-env runs in every new shell, and the decision
    engine costs ~40-65 ms there; a change to any of these decides again. decode raises ValueError, TypeError or
    KeyError on what is not its JSON (then it is computed again)."""
    import json
    import time
    import zlib
    from pathlib import Path

    from cpuperf import __version__
    from cpuperf.data import builtin_compat_dir, extra_compat_dirs
    from cpuperf.fsutil import atomic_write_bytes, cache_root, read_capped

    engine = Path(__file__).resolve().parent.parent  # the rules themselves: an edited checkout decides again
    stamps: List[Any] = sorted((k, v) for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_", "CPUPERF_")))
    # A recorded host's own measurement: .cpuperf/ in its tree (run.measure.RECORDED_FILE; measure imports the engine).
    recorded = [] if facts.live else [Path(str(facts.sysroot)) / ".cpuperf"]
    for folder in (cache_root() / "measurements", *recorded, builtin_compat_dir(), *extra_compat_dirs(),
                   *(engine / part for part in ("decide", "knowledge", "plan", "run", "commands"))):
        try:
            stamps += sorted((str(folder), e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(folder))
        except OSError:
            stamps.append((str(folder), "", 0, 0))
    key = json.dumps([__version__, *parts, stamps], default=str)
    # The entry holds its whole key (compared, so the file name need not be unique): no hashlib (OpenSSL) to load.
    path = cache_root() / kind / f"{zlib.crc32(key.encode()):08x}{zlib.adler32(key.encode()):08x}.json"
    try:
        known = json.loads(read_capped(path, 4 << 20))
        until = known["until"]
        if known["key"] == key and (until is None or (isinstance(until, (int, float)) and time.time() <= until)):
            return decode(known["value"])
    except (OSError, ValueError, TypeError, KeyError, RecursionError):  # InputRefused is a ValueError: decide again
        pass
    value, until = compute()
    text = json.dumps({"key": key, "until": until, "value": value})
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError:
        pass  # a read-only cache costs the engine's time, nothing else
    return decode(json.loads(text)["value"])  # as a later run reads it: the same output either way


def _backend(facts: Any, rec: Any) -> Any:
    """The job's DDP backend; for one rank, the one several ranks would use (the env is for either)."""
    from cpuperf.decide.runtime_env import Backend

    chosen = rec.decision("ddp_backend")
    if chosen.value in ("ccl", "gloo"):
        return Backend(chosen.value, chosen.reason, chosen.value == "ccl")
    several = chosen.evidence.get("several_ranks")
    if several in ("ccl", "gloo"):  # recorded with the plan: no second look at the matrix
        return Backend(several, str(chosen.evidence.get("several_ranks_reason", "")), several == "ccl")
    from cpuperf.knowledge.addons import cpu_ddp_backend  # reads the matrix: only for a plan that did not record it

    return cpu_ddp_backend(rec.stack.get("torch"), rec.stack.get("oneccl_bind_pt"),
                           facts.software.python if facts.software else None)


def run(out: Output, opts: Options) -> int:
    from cpuperf.render import shell as cclenv
    result = build(opts)
    if result.backend != "ccl":
        out.info(f"ccl-env: the ccl backend is not available: {result.backend_reason.removeprefix('gloo: ')}; using gloo")
    for note in result.notes:
        out.info(f"ccl-env: {cclenv.one_line(note, 400)}")
    if opts.explain:
        _explain(out, result)
    if out.json_mode:
        out.json(cclenv.to_json(result))
    else:
        shell = opts.shell or cclenv.DEFAULT_SHELL
        out.product(cclenv.render(result, shell))
    return int(ExitCode.OK)


def _explain(out: Output, result: CclEnv) -> None:
    from rich.table import Table
    from rich.text import Text  # cells as Text: values like [0xff,0xff00] are not markup

    from cpuperf.render import shell as cclenv
    table = Table(title=f"ccl-env: backend {result.backend}", title_justify="left")
    for col in ("variable", "value", "source", "reason"):
        table.add_column(col, overflow="fold")
    for row in cclenv.explain_rows(result):
        table.add_row(*(Text(cell) for cell in row))
    out.err_renderable(table)
