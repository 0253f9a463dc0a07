"""`cpuperf ccl-env`: find the installed oneCCL/MPI environment, tune it for this host, print it.

Start-up matters (it runs in every new shell): no torch, no pip, no full software probe, rich only
for --explain, a subprocess only when a script exists or several nodes need the network interface.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, NoReturn, Optional, Set, Tuple

from cpuperf.boundary import CCL_ENV_MARKER
from cpuperf.errors import ExitCode, IncompatibleHostError
from cpuperf.output import Output

if TYPE_CHECKING:
    from cpuperf.decide.records import Recommendation
    from cpuperf.decide.runtime_env import EnvVar, Merged
    from cpuperf.plan.environment import EnvDecisions
    from cpuperf.plan.saved import SavedPlan
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hosts import Host
    from cpuperf.render.shell import CclEnv
    from cpuperf.run.vendor_env import Stack


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

    def path(text: str) -> str:
        if not text.strip():  # the rule of every path option (cpuperf.cli.PATH_METAVARS)
            raise argparse.ArgumentTypeError(f"{text!r}: an empty path")
        return text

    def port(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port in 1..65535")
        return int(text)

    p = Parser(prog="cpuperf ccl-env", allow_abbrev=False,
               description='Print the oneCCL / MPI environment for the installed stack, tuned for this host. '
                           'Use: eval "$(cpuperf ccl-env)"; fish: cpuperf ccl-env --shell fish | source.')
    p.add_argument("--nproc-per-node", type=positive, metavar="N", help="ranks per node (default: one per socket)")
    p.add_argument("--nnodes", type=positive, metavar="N", help="nodes in the job (default: hostfile length, else 1)")
    p.add_argument("--hostfile", type=path, metavar="FILE", help="hosts, one per line; the first is MASTER_ADDR")
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
    p.add_argument("--python", type=path, metavar="PATH", help="the environment of another interpreter (a venv's python)")
    p.add_argument("--sysroot", type=path, metavar="DIR", help="read /proc and /sys under DIR (a recorded host)")
    p.add_argument("--unit", choices=("socket", "numa"), default="socket", help="one rank per socket or NUMA node")
    p.add_argument("--plan", type=path, metavar="FILE", help="render this saved plan (cpuperf recommend --save FILE) as it stands")
    p.add_argument("--replan", action="store_true", help="with --plan: plan again where this host or stack differs")
    p.add_argument("--adapt-to-load", action="store_true",
                   help="plan around other work busy on this host now (off: plans come from stable facts only)")
    ns = p.parse_args(argv)
    if ns.replan and ns.plan is None:
        raise UsageError("--replan without --plan: there is no saved plan to plan again",
                         hint="cpuperf ccl-env --plan FILE --replan, or leave out --replan")
    if ns.plan and (ns.nproc_per_node or ns.unit != "socket"):
        raise UsageError(f"--plan {ns.plan} fixes ranks and placement; drop --nproc-per-node/--unit",
                         hint="or make a new plan: cpuperf recommend ... --save FILE")
    opts = Options(ns.nproc_per_node, ns.nnodes, ns.hostfile, ns.master_addr, ns.master_port, ns.shell,
                   ns.explain, ns.override, ns.preload, ns.require_ccl, ns.python, ns.sysroot, ns.unit,
                   ns.plan, ns.replan, ns.adapt_to_load)
    return opts, ns.json, ns.quiet


class _Job(NamedTuple):
    """ccl-env's inputs, checked before anything is probed."""

    opts: Options
    hosts: Optional[Tuple[Host, ...]]
    saved: Optional[SavedPlan]  # from --plan, or None
    nodes: int
    master: str  # the rendezvous address in force
    slurm_first: Optional[str]  # the Slurm allocation's first node, if any


def build(opts: Options, environ: Optional[Mapping[str, str]] = None) -> CclEnv:
    """Everything but printing: the inputs checked, the plan's decisions, the environment rendered (a CclEnv).
    Raises CpuperfError on bad input."""
    from cpuperf.decide.runtime_env import ours_in, users_own
    from cpuperf.run import vendor_env as envsources

    raw = dict(os.environ if environ is None else environ)
    # What an earlier eval of ccl-env exported and nobody changed since is cpuperf's, decided again here (the
    # marker, boundary.CCL_ENV_MARKER): never kept as the user's own.
    env, previous = users_own(raw), ours_in(raw)
    job = _checked(opts, env)
    stack = envsources.discover(opts.python, env)  # the vendor env scripts this interpreter's packages ship
    facts = _facts(job)
    decided, planned, diffs = _plan_decisions(job, facts, env)
    if opts.require_ccl and decided.backend.name != "ccl":
        raise IncompatibleHostError(f"the ccl backend is not available: {decided.backend.reason.removeprefix('gloo: ')}",
                                    hint="cpuperf compat --with oneccl shows the torch it needs, or drop --require-ccl")
    return _rendered(job, stack, facts, decided, planned, diffs, env, previous)


def _checked(opts: Options, env: Mapping[str, str]) -> _Job:
    """Every input validated before any work: bad input is a one-line usage error."""
    from cpuperf.decide import runtime_env as envplan
    from cpuperf.render import shell as cclenv

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
    from cpuperf.decide.nodes import job_nodes
    from cpuperf.probe.slurm import slurm_facts

    slurm = slurm_facts(env)  # the job's nodes as train counts them: the same rule, the same answer
    planned = saved_plan.rec.levers.nnodes.value if saved_plan is not None else None
    hosts, nodes = job_nodes(opts.nnodes, hosts, slurm.allocation, planned)
    slurm_first = slurm.nodes[0] if slurm.allocation and slurm.nodes else None
    master, _ = envplan.master_address(hosts, opts.master_addr, nodes, env, slurm_first)
    if opts.python is not None:
        from cpuperf.probe import check_python

        check_python(opts.python)
    return _Job(opts, hosts, saved_plan, nodes, master, slurm_first)


def _facts(job: _Job) -> HostFacts:
    """The host as every command sees it, probed for what this environment needs."""
    from cpuperf.probe import probe_host

    opts = job.opts
    # The OpenMP and allocator libraries matter here only to what --preload renders (LD_PRELOAD, KMP_*), and the MPI
    # launchers not at all (Intel MPI is found from its scripts).
    plan_preloads = job.saved is not None and any(v.name == "LD_PRELOAD" for v in job.saved.env)
    # The GPUs matter only to whether a saved plan fits (ccl-env decides for the CPU): their probe is a child process.
    facts = probe_host(sysroot=opts.sysroot, python=opts.python, runtimes=opts.preload or plan_preloads,
                       gpus=job.saved is not None)
    if opts.adapt_to_load and facts.live:
        from cpuperf.knowledge.tuning import tuning
        from cpuperf.probe import with_load

        facts = with_load(facts, default_s=tuning().load.window_s)
    return facts


def _plan_decisions(job: _Job, facts: HostFacts,
                    env: Mapping[str, str]) -> Tuple[EnvDecisions, Optional[List[EnvVar]], List[str]]:
    """(the environment's decisions, a saved plan's variables, how that plan differs from what cpuperf decides here)."""
    if job.saved is None:
        return _decided(facts, job.opts, job.nodes, env), None, []
    from cpuperf.plan.environment import decisions_of

    rec, planned, diffs = _from_plan(job.opts, job.saved, facts, env)
    return decisions_of(facts, rec), planned, diffs


def _rendered(job: _Job, stack: Stack, facts: HostFacts, decided: EnvDecisions, planned: Optional[List[EnvVar]],
              diffs: List[str], env: Mapping[str, str], previous: Mapping[str, str]) -> CclEnv:
    """ccl-env's own rendering of the plan's environment: the vendor scripts first, the plan's variables merged
    over what the shell has (kept unless --override or an option names them), every value checked for the shell,
    and the marker naming those that are cpuperf's own (`previous`: an earlier eval's, still as it set them)."""
    from cpuperf.decide import runtime_env as envplan
    from cpuperf.decide.allocator import missing_here
    from cpuperf.plan.environment import EnvRequest, plan_env
    from cpuperf.render import shell as cclenv
    from cpuperf.run import vendor_env as envsources

    opts = job.opts
    vendor = envsources.vendor_env(stack, decided.backend.name, env)
    # What an option asks for explicitly replaces what the environment has (a stale 127.0.0.1 from an
    # earlier single-node eval must not survive --hostfile).
    forced = ({"MASTER_ADDR"} if opts.master_addr or opts.hostfile else set()) \
        | ({"MASTER_PORT"} if opts.master_port is not None else set())
    libraries = envsources.find_libraries(stack) if opts.preload else envplan.Libraries()
    request = EnvRequest(job.hosts, job.nodes, opts.master_addr, opts.master_port, opts.preload,
                         "intelmpi" if vendor.intel_mpi else None, libraries,
                         _gloo_interface(job, decided.backend.name, forced, env), job.slurm_first)
    tuned, env_notes = plan_env(facts, decided, request, env, planned)
    notes = list(vendor.notes) + [f"the plan differs from what cpuperf decides here: {d}" for d in diffs] + env_notes
    merged = envplan.merge_env(env, list(vendor.vars) + tuned, override=opts.override, force=sorted(forced))
    notes += _merge_notes(merged)
    ours = _ours(merged, env, previous, forced)
    marker = envplan.EnvVar(CCL_ENV_MARKER, envplan.ours_marker(ours), "cpuperf", MARKER_REASON)
    placement = decided.placement
    header = (f"cpuperf ccl-env: backend {decided.backend.name}; {job.nodes} node(s) x {placement.nproc_per_node} "
              f"rank(s), {decided.threads or 'default'} thread(s) each; python {stack.executable}")
    return cclenv.CclEnv(backend=decided.backend.name, backend_reason=decided.backend.reason,
                         final={**merged.final, marker.name: marker.value}, vars=(*merged.vars, marker),
                         kept=merged.kept, sources=tuple(s.to_json() for s in vendor.sources),
                         notes=tuple(notes), skipped=merged.skipped, placement=placement.to_json(), header=header,
                         invalid=merged.invalid, decisions=decided.levers,
                         allocator_missing=(missing_here(decided.allocator, libraries.allocators) or "") if opts.preload else "",
                         extra={"cpuperf_set": {"variable": CCL_ENV_MARKER, "names": list(ours)},
                                "nnodes": job.nodes, "nproc_per_node": placement.nproc_per_node,
                                "plan_differences": diffs, "python": stack.executable, "prefix": stack.prefix})


MARKER_REASON = ("the variables this output sets to values cpuperf chose, each with a digest of its value: a later "
                 "cpuperf plans them again while they hold that value (one you change is yours again)")


def _ours(merged: Merged, env: Mapping[str, str], previous: Mapping[str, str], forced: Set[str]) -> Dict[str, str]:
    """The variables this output sets wholly to cpuperf's values (name -> value): not one of yours kept, not a list
    of yours with entries added, not a value an option gave; and an earlier eval's that still hold and are not
    set here."""
    from cpuperf.decide.runtime_env import SET, shell_safe, valid_name

    kept = {k.name for k in merged.kept}
    sources: Dict[str, List[EnvVar]] = {}
    for var in merged.vars:
        sources.setdefault(var.name, []).append(var)
    ours: Dict[str, str] = {}
    for name, value in merged.final.items():
        given = sources.get(name, [])
        if name in kept or name in forced or not given or any(v.source != "cpuperf" for v in given):
            continue
        if any(v.kind != SET for v in given) and env.get(name):  # entries added to a list of yours
            continue
        if valid_name(name) and shell_safe(value) is None:  # written (a refused value is not)
            ours[name] = value
    for name, value in previous.items():
        if name not in merged.final:
            ours.setdefault(name, value)
    return ours


def _gloo_interface(job: _Job, backend: str, forced: Set[str], env: Mapping[str, str]) -> Optional[str]:
    """The interface that reaches the master, where several nodes meet over gloo (a child process)."""
    if backend != "gloo" or job.nodes <= 1:
        return None
    from cpuperf.probe.hosts import valid_host
    from cpuperf.run import vendor_env as envsources

    # The address that will be in force: a MASTER_ADDR you set is kept unless an option names one.
    preset = env.get("MASTER_ADDR")
    kept_addr = preset if preset and "MASTER_ADDR" not in forced and not job.opts.override \
        and valid_host(preset) else None
    return envsources.route_interface(kept_addr or job.master)


def _merge_notes(merged: Merged) -> List[str]:
    """What the merge refused or kept, one line each, for stderr."""
    from cpuperf.decide import runtime_env as envplan
    from cpuperf.render import shell as cclenv

    notes = [f"skipped variable {cclenv.one_line(repr(name), 80)}: not a valid or allowed name" for name in merged.skipped]
    notes += [envplan.describe_invalid(item) for item in merged.invalid]
    for name, value in merged.final.items():
        why = envplan.shell_safe(value)
        if why is not None:
            notes.append(f"refused {name}: {why}; it is not written (set it yourself if you need it)")
    if merged.kept:
        notes.append("kept your " + ", ".join(k.name for k in merged.kept) + " (--override replaces them)")
    return notes


def _decided(facts: HostFacts, opts: Options, nodes: int, env: Mapping[str, str]) -> EnvDecisions:
    """The environment's decisions as `recommend` and `train --auto` make them here, remembered (run.remembered):
    the engine runs when the facts, options, measurements or rules change, not in every new shell."""
    if facts.load is not None:  # --adapt-to-load: the load of this moment, decided now
        return _decide_now(facts, opts, nodes, env)[0]
    import dataclasses

    from cpuperf.plan.environment import decisions_from_json, decisions_to_json
    from cpuperf.run.remembered import remembered

    # Free memory moves from one run to the next; the decisions read it only where the total is unknown.
    memory = facts.memory if facts.memory.total_bytes is None else dataclasses.replace(facts.memory, available_bytes=None)
    gpus = None if facts.gpus is None else tuple(dataclasses.replace(g, memory_free_bytes=None) for g in facts.gpus)
    stable = repr(dataclasses.replace(facts, memory=memory, gpus=gpus))

    def compute() -> Tuple[Any, Optional[float]]:
        decided, until = _decide_now(facts, opts, nodes, env)
        return decisions_to_json(decided), until

    decided: EnvDecisions = remembered("ccl-decisions", facts, [stable, opts.nproc_per_node, opts.unit, nodes],
                                       compute, lambda raw: _fits_here(decisions_from_json(raw), facts))
    return decided


def _fits_here(decided: EnvDecisions, facts: HostFacts) -> EnvDecisions:
    """A remembered decision held to the ranges a plan's or a user's own value is (ValueError: decided again): its
    placement on this host's CPUs, a backend it can use, an allocator it has. (No knobs or plan schema imported:
    this is the path of every new shell.)"""
    usable = set(facts.usable_cpus())
    p = decided.placement
    if not 1 <= p.nproc_per_node == len(p.slots) or not 0 <= p.ccl_workers <= len(usable) or p.cpu_budget < 1:
        raise ValueError("placement: ranks, workers or CPU budget out of range")
    for slot in p.slots:
        if not 1 <= slot.threads <= len(usable) or not slot.cpus or \
                not set(slot.cpus) | set(slot.compute_cpus) | set(slot.ccl_worker_cpus) <= usable:
            raise ValueError(f"placement: rank {slot.local_rank}'s threads or CPUs are not this host's")
    if decided.threads is not None and not 1 <= decided.threads <= len(usable):
        raise ValueError("threads per rank out of this host's range")
    counts = [d.get("value") for d in decided.levers if d["id"] in ("threads_per_rank", "nproc_per_node")]
    if any(v is not None and not (isinstance(v, (int, float)) and 1 <= v <= len(usable)) for v in counts):  # --json
        raise ValueError("the levers' ranks or threads out of this host's range")
    backend, sw = decided.backend, facts.software
    if backend.name not in ("gloo", "ccl", "mpi") or not backend.reason.isprintable() or len(backend.reason) > 4096:
        raise ValueError(f"backend {backend.name[:20]!r} is not one cpuperf decides")
    if backend.name == "ccl" and (sw is None or sw.packages.get("oneccl_bind_pt") is None):
        raise ValueError("the ccl backend without oneccl_bind_pt installed")
    if decided.allocator is not None and (sw is None or not sw.allocators.get(decided.allocator)):
        raise ValueError(f"allocator {decided.allocator[:20]!r} is not installed here")
    if any(not r.isprintable() for r in p.reasons):
        raise ValueError("placement reasons hold a control character")
    return decided


def _decide_now(facts: HostFacts, opts: Options, nodes: int,
                env: Mapping[str, str]) -> Tuple[EnvDecisions, Optional[float]]:
    """(the decisions, when the measurement they used expires) from the decision engine."""
    from cpuperf.plan.environment import decide_here
    from cpuperf.run import measure

    meas = measure.planning_measurements(facts)
    decided = decide_here(facts, opts.nproc_per_node, opts.unit, nodes, meas, env if facts.live else {})
    return decided, measure.expiry(facts) if meas else None


def _from_plan(opts: Options, plan: SavedPlan, facts: HostFacts,
               env: Mapping[str, str]) -> Tuple[Recommendation, Optional[List[EnvVar]], List[str]]:
    """(recommendation, its saved variables, how it differs from what cpuperf decides here) of a saved plan;
    decided again only with --replan (exit 13 without)."""
    from cpuperf.plan.saved import plan_fits

    plan, diffs = plan_fits(str(opts.plan), plan, facts, opts.replan)
    if diffs:
        from cpuperf.plan.saved import replan_from
        from cpuperf.run.measure import planning_measurements

        return replan_from(plan, facts, planning_measurements(facts), env if facts.live else {}), None, []

    def fresh(p: SavedPlan, f: HostFacts) -> List[str]:  # only when nothing remembered answers: the engine loads here
        from cpuperf.plan.saved import fresh_differences
        from cpuperf.run.measure import planning_measurements

        return fresh_differences(p, f, planning_measurements(f))

    return plan.rec, [v._replace(source="cpuperf") for v in plan.env], _plan_differences(plan, facts, fresh)


def _plan_differences(plan: SavedPlan, facts: HostFacts,
                      compute: Callable[[SavedPlan, HostFacts], List[str]]) -> List[str]:
    """compute(plan, facts) (how the plan differs from a fresh one), remembered per plan, host and stack identity
    (run.remembered)."""
    from cpuperf.plan import saved
    from cpuperf.run.remembered import remembered

    def fresh() -> Tuple[List[str], Optional[float]]:
        from cpuperf.run import measure

        return list(compute(plan, facts)), measure.expiry(facts)

    def checked(known: object) -> List[str]:
        if not (isinstance(known, list) and all(isinstance(d, str) and d.isprintable() for d in known)):
            raise TypeError("not a list of printable lines")
        return known

    lines: List[str] = remembered("plan-checks", facts,
                                  [plan.to_json(), saved.host_identity(facts), saved.stack_identity(facts)], fresh, checked)
    return lines


def run(out: Output, opts: Options) -> int:
    from cpuperf.render import shell as cclenv
    from cpuperf.run.said import first_time

    result = build(opts)
    notes = [f"the ccl backend is not available: {result.backend_reason.removeprefix('gloo: ')}; using gloo"
             ] if result.backend != "ccl" else []
    # ccl-env runs in every new shell: a note is said the first time it holds, not in each shell (doctor says it
    # every time; --explain shows the whole decision)
    for note in [*notes, *result.notes]:
        if not out.quiet and (opts.explain or first_time("ccl-env-notes", note)):
            out.info(f"ccl-env: {cclenv.one_line(note, 400)}")
    if opts.explain:
        _explain(out, result)
    if out.json_mode:
        out.json(cclenv.to_json(result._replace(levers=_levers(result))))
    else:
        shell = opts.shell or cclenv.DEFAULT_SHELL
        out.product(cclenv.render(result, shell))
    return int(ExitCode.OK)


# What an environment alone cannot carry (the launch, a Trainer's flags): the report says so for each such lever.
ENV_ONLY = ("ccl-env renders the environment only: your launcher starts and places the ranks, and the Trainer flags "
            "are `cpuperf recommend --format hf` (or `cpuperf train --auto -- ...` applies them)")


def _levers(result: CclEnv) -> Optional[Dict[str, Any]]:
    """Each lever applied by this environment (the variables as a shell gets them) or not, with why (--json)."""
    if not result.decisions:
        return None
    from cpuperf.plan.applied import RenderedJob, lever_report, split
    from cpuperf.plan.saved import levers_from_json

    extra = result.extra or {}
    job = RenderedJob(auto=True, nproc_per_node=int(extra.get("nproc_per_node", 1)), nnodes=int(extra.get("nnodes", 1)),
                      env=dict(result.final), ranks=(), env_only=ENV_ONLY, allocator_missing=result.allocator_missing)
    return split(lever_report(levers_from_json(result.decisions), job))


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
