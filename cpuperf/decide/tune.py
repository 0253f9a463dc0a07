"""Joint tuning (issue 33): coordinate descent over a plan's levers, from measured throughput.

Pure. It starts from the rule's point (what recommend decides), measures the neighbours that change one
lever at a time, interleaved with the incumbent's own runs so drift hits all alike, and moves while a neighbour
beats the incumbent with confidence (cpuperf.decide.judge: the interval of its ratio above 1 + min_gain) and
wins again when run once more beside the incumbent; it stops when none does or the time budget is spent (keeping
the best so far, and saying so). Each lever's last comparison is kept as its verdict: moved, kept (every
alternative judged below the bar) or undecided (left to the rule); the decided ones stand whatever the others do.
Running a point is a function passed in: cpuperf.run.tune runs real processes; the tests pass tables.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypedDict, Union

from cpuperf.decide.judge import BELOW, EVEN, Verdict, bar_for, interleaved
from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue, as_json

if TYPE_CHECKING:
    from cpuperf.decide.records import Recommendation
    from cpuperf.knowledge.tuning import Tuning
    from cpuperf.probe.facts import HostFacts

SCHEMA = "cpuperf.tune/2"  # /2: each lever judged (cpuperf.decide.judge); /1 had one noise gate for all
MOVED, KEPT, UNDECIDED = "moved", "kept", "undecided"
LEVERS = ("dtype", "allocator", "optimizer", "layout", "pinning", "compile", "memory")
# A lever's value: a dtype, allocator or optimizer name (None: the default), pinned or compiled, (ranks, threads), a
# NUMA memory policy ('interleave'; None: first touch).
LeverValue = Union[str, bool, None, Tuple[int, int]]
# A decision's value a tuning sets (cpuperf.knowledge.knobs): a name, a count, true/false, None.
DecisionValue = Union[str, int, bool, None]


@dataclass(frozen=True)
class Point:
    """One configuration: the values of every lever."""

    dtype: str = "fp32"
    allocator: Optional[str] = None
    optimizer: Optional[str] = None  # a knob value (adamw, adamw_fused); None: the script's own
    ranks: int = 1
    threads: int = 1
    pinned: bool = True
    compile: bool = False
    memory: Optional[str] = None  # one process over several NUMA nodes: 'interleave' (numactl); None: first touch

    def get(self, lever: str) -> LeverValue:
        if lever == "layout":
            return (self.ranks, self.threads)
        if lever == "pinning":
            return self.pinned
        if lever == "compile":
            return self.compile
        if lever == "dtype":
            return self.dtype
        if lever == "allocator":
            return self.allocator
        if lever == "optimizer":
            return self.optimizer
        if lever == "memory":
            return self.memory
        raise KeyError(lever)

    def with_value(self, lever: str, value: LeverValue) -> Point:
        if lever == "layout" and isinstance(value, tuple):
            return replace(self, ranks=int(value[0]), threads=int(value[1]))
        if lever == "pinning":
            return replace(self, pinned=bool(value))
        if lever == "compile":
            return replace(self, compile=bool(value))
        name = None if value is None else str(value)
        if lever == "dtype" and name is not None:
            return replace(self, dtype=name)
        if lever == "allocator":
            return replace(self, allocator=name)
        if lever == "optimizer":
            return replace(self, optimizer=name)
        if lever == "memory" and name in (None, "interleave"):
            return replace(self, memory=name)
        raise ValueError(f"{lever} cannot be {value!r}")

    def label(self) -> str:
        """Every lever's value in words; the memory policy only where the point has one (most hosts have one node)."""
        return " ".join(label(lever, self.get(lever)) for lever in LEVERS if lever != "memory" or self.memory)

    def to_json(self) -> JsonObject:
        return as_json(self)

    @classmethod
    def from_json(cls, data: JsonMapping) -> Point:
        """A point as the cache holds it (checked by cpuperf.decide.measurement_schema); a field absent, or not of
        its type, takes the default."""
        d = cls()
        dtype, ranks, threads = data.get("dtype"), data.get("ranks"), data.get("threads")
        pinned, compiled = data.get("pinned", d.pinned), data.get("compile", d.compile)
        return cls(dtype=dtype if isinstance(dtype, str) else d.dtype, allocator=_name(data.get("allocator")),
                   optimizer=_name(data.get("optimizer")),
                   ranks=ranks if isinstance(ranks, int) and not isinstance(ranks, bool) else d.ranks,
                   threads=threads if isinstance(threads, int) and not isinstance(threads, bool) else d.threads,
                   pinned=pinned if isinstance(pinned, bool) else d.pinned,
                   compile=compiled if isinstance(compiled, bool) else d.compile,
                   memory="interleave" if data.get("memory") == "interleave" else None)


def _name(value: JsonValue) -> Optional[str]:
    return value if isinstance(value, str) else None


def label(lever: str, value: LeverValue) -> str:
    """A lever's value in words: 'mimalloc', 'default allocator', '1x2', 'pinned', 'eager'."""
    if lever == "layout" and isinstance(value, tuple):
        return f"{value[0]}x{value[1]}"
    if lever == "pinning":
        return "pinned" if value else "unpinned"
    if lever == "compile":
        return "compile" if value else "eager"
    if lever == "allocator":
        return str(value) if value else "default allocator"
    if lever == "optimizer":
        return str(value) if value else "default optimizer"
    if lever == "memory":
        return str(value) if value else "first touch"
    return str(value)


class LeverFigure(TypedDict):
    """A lever measured beside the best: the best's value and figure, each alternative's figure (samples/s)."""

    value: str
    figure: float
    alternatives: Dict[str, float]


@dataclass(frozen=True)
class Candidates:
    """The values each lever may take here (the start's first), and why a lever is not tuned."""

    values: Dict[str, Tuple[LeverValue, ...]]
    skipped: Dict[str, str] = field(default_factory=dict)
    not_with_ranks: Tuple[str, ...] = ()  # allocators never preloaded into a job of several ranks
    memory_argv: Tuple[str, ...] = ()  # numactl and its options: what starts a point with the memory policy

    def allowed(self, p: Point) -> bool:
        """A point that can run: no allocator that aborts a job of several ranks, no memory policy of one process
        over several nodes on a layout of several ranks (each rank then sits on its own socket or node)."""
        return not (p.ranks > 1 and (p.allocator in self.not_with_ranks or p.memory is not None))


def neighbours(p: Point, cand: Candidates) -> List[Tuple[str, Point]]:
    """(lever, point) for every point that changes one lever of `p` to another allowed value."""
    out = []
    for lever in LEVERS:
        for value in cand.values.get(lever, ()):
            if value != p.get(lever):
                q = p.with_value(lever, value)
                if cand.allowed(q):
                    out.append((lever, q))
    return out


@dataclass(frozen=True)
class Round:
    incumbent: Point
    samples: Dict[Point, Tuple[float, ...]]  # every point measured in this round, interleaved
    failed: Tuple[Point, ...]
    noise: float  # the incumbent's spread: (max - min) / median of its runs' figures (of its windows: one run)
    winner: Optional[Point]  # the neighbour moved to, or None
    confirmation: Dict[Point, Tuple[float, ...]] = field(default_factory=dict)  # the winner's pair, run after
    verdicts: Dict[Point, Verdict] = field(default_factory=dict)  # each neighbour against the incumbent
    confirmed: Optional[Verdict] = None  # the candidate with its pair, against the incumbent with its pair


@dataclass(frozen=True)
class TuneResult:
    start: Point
    best: Point
    rounds: Tuple[Round, ...]
    stopped: str  # converged | budget | failed
    elapsed_s: float
    runs: int

    def median(self, p: Point) -> Optional[float]:
        for r in reversed(self.rounds):
            if r.samples.get(p):
                return statistics.median(r.samples[p])
        return None

    def lever_figures(self) -> Dict[str, LeverFigure]:
        """Per lever: the best's value and figure, and each alternative measured beside it (one lever apart),
        from the latest round that measured both (figures from one round only: drift between rounds)."""
        out: Dict[str, LeverFigure] = {}
        for rnd in reversed(self.rounds):
            if not rnd.samples.get(self.best):
                continue
            best_fig = statistics.median(rnd.samples[self.best])
            for lever in LEVERS:
                alts = {label(lever, p.get(lever)): round(statistics.median(s), 3) for p, s in rnd.samples.items()
                        if s and _differs_only_in(p, self.best, lever)}
                if alts and lever not in out:
                    out[lever] = {"value": label(lever, self.best.get(lever)), "figure": round(best_fig, 3),
                                  "alternatives": alts}
        return {lever: out[lever] for lever in LEVERS if lever in out}

    def judged(self) -> Dict[str, Dict[str, object]]:
        """Per lever, its latest comparison: moved (a confirmed win), kept (every alternative measured beside the
        incumbent judged below the bar) or undecided (an interval that holds the bar, or a win that did not
        repeat: the rule decides that lever), with the figure that decided it and the alternative it names."""
        out: Dict[str, Dict[str, object]] = {}
        for rnd in reversed(self.rounds):
            if rnd.winner is not None and rnd.confirmed is not None:
                lever = _lever_between(rnd.incumbent, rnd.winner)
                if lever is not None and lever not in out:
                    out[lever] = _judged(MOVED, rnd.winner, lever, rnd.confirmed)
            by_lever: Dict[str, List[Tuple[Point, Verdict]]] = {}
            for p, v in rnd.verdicts.items():
                lever = _lever_between(rnd.incumbent, p)
                if lever is not None and lever not in out:
                    by_lever.setdefault(lever, []).append((p, v))
            for lever, got in by_lever.items():
                open_ = [(p, v) for p, v in got if v.outcome not in (BELOW, EVEN)]
                if open_:
                    p, v = max(open_, key=lambda pv: pv[1].ratio)
                    why = v.why
                    if p in rnd.confirmation and rnd.confirmed is not None:
                        v, why = rnd.confirmed, "it won its round but not its confirming pair, run again side by side"
                    elif v.above:
                        why = ("it beat its round's incumbent, but another lever moved first and it was not compared "
                               "again (the budget, or the point was seen)")
                    out[lever] = {**_judged(UNDECIDED, p, lever, v), "why": why}
                else:
                    p, v = max(got, key=lambda pv: pv[1].ratio)
                    out[lever] = _judged(KEPT, p, lever, v)
        return {lever: out[lever] for lever in LEVERS if lever in out}

    def measured(self) -> int:
        """How many settings have a figure: under two, nothing was compared."""
        return len({p for r in self.rounds for p, s in (*r.samples.items(), *r.confirmation.items()) if s})

    @property
    def noise(self) -> Optional[float]:
        """The noise of the last round whose incumbent ran (a round the budget cut before it ran measured none)."""
        return next((r.noise for r in reversed(self.rounds) if r.samples.get(r.incumbent)), None)

    def to_json(self) -> Dict[str, object]:
        """What the cache keeps: start, best, the per-lever figures, the noise, how it stopped."""
        best = self.median(self.best)
        return {"schema": SCHEMA, "start": self.start.to_json(), "best": self.best.to_json(),
                "best_samples_per_s": round(best, 3) if best else None,
                "start_samples_per_s": _round(self.median(self.start)),
                "noise": round(self.noise, 4) if self.noise is not None else None,
                "levers": self.lever_figures(), "judged": self.judged(), "stopped": self.stopped,
                "elapsed_s": round(self.elapsed_s, 1),
                "rounds": len(self.rounds), "runs": self.runs}


def _round(x: Optional[float]) -> Optional[float]:
    return round(x, 3) if x is not None else None


def _lever_between(p: Point, q: Point) -> Optional[str]:
    """The one lever `q` changes of `p` (None: not one lever apart)."""
    differ = [lever for lever in LEVERS if p.get(lever) != q.get(lever)]
    return differ[0] if len(differ) == 1 else None


def _judged(outcome: str, alt: Point, lever: str, v: Verdict) -> Dict[str, object]:
    return {**v.to_json(), "outcome": outcome, "alternative": label(lever, alt.get(lever))}


def _differs_only_in(p: Point, q: Point, lever: str) -> bool:
    return p.get(lever) != q.get(lever) and all(p.get(o) == q.get(o) for o in LEVERS if o != lever)


def spread(samples: Sequence[float]) -> float:
    """(max - min) / median: 0 for one sample."""
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if len(samples) > 1 and med > 0 else 0.0


@dataclass(frozen=True)
class Search:
    """How a tuning searches: its time budget, the interleaved passes a round runs, and what a move must show (the
    bar 1 + `min_gain`, judged at `confidence` and `resolution` by cpuperf.decide.judge)."""

    budget_s: float
    passes: int
    min_gain: float
    confidence: float
    resolution: float = 0.0


def descend(start: Point, cand: Candidates, run_one: Callable[[Point], Optional[Sequence[float]]], search: Search,
            clock: Callable[[], float]) -> TuneResult:
    """Coordinate descent from `start`. `run_one(point)` is one timed run: its samples/s figures (several short
    windows of one process, or one), None or [] when it failed. A round runs the incumbent and its unseen
    neighbours `passes` times, interleaved, then the incumbent once more, and judges each neighbour against the
    incumbent (cpuperf.decide.judge, at `confidence` and `resolution`, the bar 1 + `min_gain`); its best win moves
    only when it
    wins again, run once more beside the incumbent (_confirmed). A round keeps the budget for that pair: one the
    budget cuts short still confirms what it measured."""
    budget_s, passes, min_gain, confidence, resolution = (search.budget_s, search.passes, search.min_gain,
                                                          search.confidence, search.resolution)
    t0 = clock()
    costs: List[float] = []  # the seconds each run took, to see whether the next one fits the budget
    bar = bar_for(1.0, min_gain)

    def run(p: Point, keep: int = 0) -> Optional[List[float]]:
        """One run's figures ([] when it failed), or None when it and `keep` more would not end in the budget."""
        if costs and clock() - t0 + statistics.mean(costs) * (1 + keep) > budget_s:
            return None
        began = clock()
        got = [x for x in (run_one(p) or []) if math.isfinite(x) and x > 0]  # inf or 0 samples/s is no figure
        costs.append(clock() - began)
        return got

    rounds: List[Round] = []
    incumbent, seen, stopped = start, {start}, "converged"
    while True:
        points = [incumbent] + [q for _, q in neighbours(incumbent, cand) if q not in seen]
        if len(points) == 1 and rounds:
            break
        runs: Dict[Point, List[List[float]]] = {p: [] for p in points}
        failed: List[Point] = []
        out_of_time = _run_round(points * max(1, passes) + [incumbent], lambda p: run(p, keep=2), runs, failed)
        seen.update(points)
        rnd = _decide(incumbent, runs, failed, bar, (confidence, resolution))
        if rnd.winner is not None:
            rnd = _confirmed(rnd, run(rnd.winner), run(incumbent), bar, (confidence, resolution))
        rounds.append(rnd)
        if not runs[incumbent]:  # the start never ran: nothing tuned; a later incumbent ran in its round
            stopped = "failed" if incumbent == start or not out_of_time else "budget"
            break
        if rnd.winner is not None:
            incumbent = rnd.winner
        if out_of_time:
            stopped = "budget"
            break
        if rnd.winner is None:
            break
    return TuneResult(start, incumbent, tuple(rounds), stopped, clock() - t0, len(costs))


def _run_round(schedule: Sequence[Point], run: Callable[[Point], Optional[List[float]]],
               runs: Dict[Point, List[List[float]]], failed: List[Point]) -> bool:
    """Run the round's schedule into `runs` (each run's windows; a point that fails is not run again): True when
    the budget stopped it."""
    for p in schedule:
        if p in failed:
            continue
        got = run(p)
        if got is None:
            return True
        if got:
            runs[p].append(got)
        else:
            failed.append(p)
    return False


def detrended(runs: Mapping[Point, Sequence[Sequence[float]]]) -> Dict[Point, List[float]]:
    """Every window of every run, each divided by how far its position in a run sits from the run's own level,
    over all runs here: a trend inside every process (its first window faster, measured on a Zen 4 VM: 70.4,
    62.7, 60.4 samples/s) hits every point alike and is no noise; counted as noise it hid a 1.10x allocator win."""
    shift: Dict[int, List[float]] = {}
    for point_runs in runs.values():
        for windows in point_runs:
            level = statistics.fmean(math.log(x) for x in windows)
            for k, x in enumerate(windows):
                shift.setdefault(k, []).append(math.log(x) - level)
    factor = {k: math.exp(statistics.fmean(v)) for k, v in shift.items()}
    return {p: [x / factor[k] for windows in point_runs for k, x in enumerate(windows)]
            for p, point_runs in runs.items()}


def _decide(incumbent: Point, runs: Mapping[Point, Sequence[Sequence[float]]], failed: Sequence[Point], bar: float,
            judging: Tuple[float, float]) -> Round:
    """The round's winner: of the neighbours judged above the bar against the incumbent (every window of the
    round, the trend inside a process taken out: `detrended`), the fastest.

    The noise kept beside it (for the record; it decides nothing) is how far the incumbent's runs (processes)
    differ, each run's figure the median of its windows; one run only: the spread of its windows."""
    kept = {p: tuple(x for w in rs for x in w) for p, rs in runs.items() if rs}
    mine = runs.get(incumbent) or []
    if not mine:
        return Round(incumbent, kept, tuple(failed), 0.0, None)
    per_run = [statistics.median(w) for w in mine]
    noise = spread(per_run) if len(per_run) > 1 else spread(kept[incumbent])
    flat = detrended({p: rs for p, rs in runs.items() if rs})
    verdicts = {p: interleaved(flat[p], flat[incumbent], bar, judging[0], resolution=judging[1])
                for p in flat if p != incumbent}
    wins = [(v.ratio, p) for p, v in verdicts.items() if v.above]
    winner = max(wins, key=lambda t: t[0])[1] if wins else None
    return Round(incumbent, kept, tuple(failed), noise, winner, verdicts=verdicts)


def _confirmed(rnd: Round, again: Optional[Sequence[float]], beside: Optional[Sequence[float]], bar: float,
               judging: Tuple[float, float]) -> Round:
    """The round's winner run once more (`again`), then the incumbent (`beside`): that pair, judged on its own, must
    be above the bar too. Two processes started apart in time can differ by more than one process's windows do
    (other work starting or ending between them), so a win seen in one run is not enough; side by side, both runs
    see the same host. The pair is judged apart from the round (the host may have changed between them: a drift
    that hits both sides of the pair alike is no noise). Unconfirmed, or not run: no move. The lever's verdict is
    the weaker of the two."""
    assert rnd.winner is not None
    pair = {p: tuple(s) for p, s in ((rnd.winner, again), (rnd.incumbent, beside)) if s}
    if len(pair) < 2:
        return replace(rnd, winner=None, confirmation=pair)
    in_round = rnd.verdicts[rnd.winner]
    if min(len(s) for s in pair.values()) < 2:  # one figure a run (a Trainer's own): the pair's ratio must clear it
        won = statistics.median(pair[rnd.winner]) > statistics.median(pair[rnd.incumbent]) * bar
        return replace(rnd, winner=rnd.winner if won else None, confirmation=pair, confirmed=in_round)
    flat = detrended({p: [list(s)] for p, s in pair.items()})
    verdict = interleaved(flat[rnd.winner], flat[rnd.incumbent], bar, judging[0], resolution=judging[1])
    weaker = min(verdict, in_round, key=lambda v: v.low)
    return replace(rnd, winner=rnd.winner if verdict.above else None, confirmation=pair, confirmed=weaker)


# -- the levers this host and plan have ---------------------------------------------------------------

def start_point(rec: Recommendation, cand: Optional[Candidates] = None) -> Point:
    """The rule's point: what recommend decided (and, where `cand` tunes it, the memory policy the rule gives)."""
    lv = rec.levers
    memory = cand.values.get("memory", (None,))[0] if cand is not None else None
    return Point(dtype=lv.dtype.value, allocator=lv.allocator.value, optimizer=lv.optimizer.value,
                 ranks=lv.nproc_per_node.value, threads=lv.threads_per_rank.value, pinned=lv.affinity.value == "auto",
                 compile=lv.compile.value, memory=memory if isinstance(memory, str) else None)


def keeps_the_job(rec: Recommendation, ranks: int) -> bool:
    """Whether `ranks` ranks run the same job as one process for this plan (cpuperf.decide.workload's rule)."""
    yours = {d.id for d in rec.decisions if d.overridden} & {"batch_size", "grad_accum_steps"}
    return rec.workload.splits_into(ranks, batch_yours=bool(yours))


def candidates(facts: HostFacts, rec: Recommendation, rules: Tuning, script: bool = False,
               own_launcher: bool = False, memory_asked: object = "auto") -> Candidates:
    """What each lever may be on this host for this plan, and why a lever is left to the rule.

    `script`: a user's script (the optimizer only as a Trainer flag, which the planner never adds towards a
    slower kernel); `own_launcher`: their command starts its own ranks (ranks x threads are theirs);
    `memory_asked`: --set numa_memory as given ('auto': not set)."""
    from packaging.version import Version

    from cpuperf.decide.allocator import allocator_names, allocator_rule, preloadable
    from cpuperf.knowledge.bf16 import bf16_native

    values: Dict[str, Tuple[LeverValue, ...]] = {}
    skipped: Dict[str, str] = {}
    start = start_point(rec)
    fixed = {d.id for d in rec.decisions if d.overridden}

    def offer(lever: str, options: Sequence[LeverValue], why_not: Optional[str]) -> None:
        mine = [d for d in DECISIONS[lever] if d in fixed]
        if mine:
            skipped[lever] = f"{mine[0]} is set by you"
        elif why_not:
            skipped[lever] = why_not
        else:
            values[lever] = tuple(dict.fromkeys([start.get(lever), *options]))

    from cpuperf.decide.records import measured_gemm

    gemm = measured_gemm(rec.levers.dtype.evidence)
    ratio = (f" (GEMM {gemm[0] / gemm[1]:.0f}x slower measured here)"
             if gemm else "")
    offer("dtype", ["fp32", "bf16"], None if bf16_native(facts) else
          f"{facts.cpu.microarchitecture} has no native bf16 (avx512_bf16, usable AMX, Arm BF16, POWER10 MMA): emulated "
          f"bf16 runs many times slower than fp32{ratio}, so it is not a candidate")
    installed = {k: preloadable(v) for k, v in (facts.software.allocators.items() if facts.software else [])}
    libs = sorted(k for k, path in installed.items() if path)
    offer("allocator", [None, *libs], None if libs else f"no {allocator_names()} installed")
    torch_v = rec.stack.get("torch")
    fused_min = rules.optimizer.fused_cpu_min_torch
    no_fused = ("torch is not installed" if not torch_v else
                f"torch {torch_v} has no fused AdamW on CPU (since {fused_min})"
                if Version(torch_v).release < Version(fused_min).release else None)
    offer("optimizer", ["adamw", "adamw_fused"], "the Trainer's optimizer is the script's (a flag is added only "
          "towards the fused kernel)" if script else no_fused)
    offer("layout", *_layouts(rec, start.ranks * start.threads, own_launcher))
    offer("pinning", [True, False], None if len(facts.usable_cpus()) > 1 else "one usable CPU: nothing to pin to")
    compile_d = rec.levers.compile
    offer("compile", [True, False], None if compile_d.value else
          f"not tried: {compile_d.reason} (the compile-crossover rule)")
    memory_argv = _offer_memory(facts, rec, memory_asked, values, skipped)
    return Candidates(values, skipped, allocator_rule().not_with_ranks, memory_argv)


def _layouts(rec: Recommendation, cores: int, own_launcher: bool) -> Tuple[List[Tuple[int, int]], Optional[str]]:
    """The (ranks, threads) layouts the tuner may try over these cores, and why none is tried where so."""
    # Only layouts that run the same job: a rank count that would change it (N copies of a one-process script, or
    # N times a Trainer's global batch) is no candidate, whatever it would measure (issue 51).
    every = [(r, cores // r) for r in range(1, cores + 1) if cores % r == 0]
    layouts = [(r, t) for r, t in every if keeps_the_job(rec, r)]
    one_node = rec.levers.nnodes.value == 1
    changes = [r for r, _ in every if (r, cores // r) not in layouts]
    return layouts, ("your command's launcher starts the ranks" if own_launcher else
                     None if len(layouts) > 1 and one_node else
                     "several nodes: ranks follow the nodes" if not one_node else
                     f"{changes[0]} ranks would change the job ({rec.workload.parallel.signs}): one process only"
                     if changes else f"{cores} core(s): one layout")


def _offer_memory(facts: HostFacts, rec: Recommendation, asked: object, values: Dict[str, Tuple[LeverValue, ...]],
                  skipped: Dict[str, str]) -> Tuple[str, ...]:
    """The memory lever where the plan's one process spans several NUMA nodes (cpuperf.decide.placement
    memory_policy: the rule's interleave first, then first touch); else why not, said only where the host has more
    than one node (on one node there is nothing to say). Returns numactl's argv for a point with the policy."""
    from cpuperf.decide.placement import memory_policy

    if len(facts.topology.numa_nodes) < 2:
        return ()
    if asked != "auto":
        skipped["memory"] = "numa_memory is set by you"
        return ()
    policy, _ = memory_policy(facts, rec.placement, rec.levers.on_gpu, auto=True)
    numactl = facts.software.numactl if facts.software is not None else None
    if policy is None:
        skipped["memory"] = ("GPU ranks: each bound to its GPU's NUMA node" if rec.levers.on_gpu else
                             "a rank per socket or node: each rank's memory is on its own node"
                             if rec.placement.nproc_per_node > 1 else "the process's CPUs are on one NUMA node")
        return ()
    if not numactl:
        skipped["memory"] = f"{policy.describe()} needs numactl, which is not installed"
        return ()
    values["memory"] = (policy.mode, None)
    return (numactl, *policy.numactl)


# -- the plan's side: what a cached result decides -----------------------------------------------------

# Lever -> the decisions it sets (one vocabulary: cpuperf.knowledge.knobs).
DECISIONS = {"dtype": ("dtype",), "allocator": ("allocator",), "optimizer": ("optimizer",),
             "layout": ("nproc_per_node", "threads_per_rank"), "pinning": ("affinity",), "compile": ("compile",),
             "memory": ("numa_memory",)}


def decision_values(p: Point) -> Dict[str, DecisionValue]:
    """The --set values of `p` (numa_memory: a launch option of the same vocabulary, cpuperf.knowledge.knobs)."""
    return {"dtype": p.dtype, "allocator": p.allocator, "optimizer": p.optimizer, "nproc_per_node": p.ranks,
            "threads_per_rank": p.threads, "affinity": "auto" if p.pinned else None, "compile": p.compile,
            "numa_memory": p.memory}


def host_problem(entry: JsonMapping, facts: HostFacts) -> Optional[str]:
    """Why a cached tuning's best point cannot run on this host (None: it can): a dtype the tuner never offers
    here (fp16 on a CPU; bf16 without native bf16, cpuperf.knowledge.bf16), more ranks than usable cores or more
    ranks x threads than usable CPUs. A cached best.ranks=4096 made every later --auto of the command exit 2, and
    best.dtype=fp16 added --fp16 on a CPU host (issue 53)."""
    from cpuperf.decide.placement import usable_cores
    from cpuperf.knowledge.bf16 import bf16_native

    raw = entry.get("best")
    if not isinstance(raw, dict):
        return None  # the schema requires it: nothing here to hold
    best = Point.from_json(raw)
    dtype, ranks, threads = best.dtype, best.ranks, best.threads
    if dtype == "fp16" or (dtype == "bf16" and not bf16_native(facts)):
        return f"best.dtype {dtype} is not one a tuning runs on this host's CPUs"
    cores, cpus = max(1, len(usable_cores(facts))), max(1, len(facts.usable_cpus()))
    if ranks > cores or ranks * threads > cpus:
        return (f"best.ranks {ranks} x best.threads {threads} does not fit this host's {cores} usable core(s) "
                f"and {cpus} CPU(s)")
    return None


def not_judged(entry: JsonMapping) -> Optional[str]:
    """Why a cached tuning decides nothing: it was taken before each lever was judged (schema /1 had one noise
    gate over the whole tuning); None: its levers are judged one by one (`undecided_levers`)."""
    if isinstance(entry.get("judged"), dict):
        return None
    return "it was tuned before cpuperf judged each lever against its own noise: tune again"


def undecided_levers(entry: JsonMapping) -> Dict[str, str]:
    """lever -> why its comparison stayed undecided (the rule decides it; the tuning's other levers stand)."""
    out: Dict[str, str] = {}
    for lever, j in _object(entry.get("judged")).items():
        if isinstance(j, dict) and j.get("outcome") == UNDECIDED:
            out[lever] = (f"{lever} undecided: {j.get('alternative')} {_figure(j, 'ratio'):.2f}x "
                          f"({_figure(j, 'low'):.2f}-{_figure(j, 'high'):.2f}) against the bar {_figure(j, 'bar'):.2f}"
                          + (f" ({j['why']})" if j.get("why") else ""))
    return out


def _object(value: JsonValue) -> JsonObject:
    """A JSON object of the cache entry (checked by cpuperf.decide.measurement_schema); {} where absent."""
    return value if isinstance(value, dict) else {}


def _figure(data: JsonMapping, key: str) -> float:
    """A figure of the cache entry; 0 where absent."""
    value = data.get(key, 0)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def tuned_decisions(entry: JsonMapping, what: str) -> Dict[str, Tuple[DecisionValue, str, JsonObject]]:
    """decision id -> (value, reason, evidence) for each lever a cached tuning decided (moved, or kept against
    every alternative); `what` names where. An undecided lever is left out: the rule decides it."""
    import time

    best = Point.from_json(_object(entry.get("best")))
    values = decision_values(best)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(_figure(entry, "measured_at")))
    noise = entry.get("noise")
    how = ("" if entry.get("stopped") != "budget" else
           f"; the {entry.get('budget_s', '')} s budget ended the search: best so far")
    load = _object(entry.get("load"))
    if load.get("under_load"):  # said, as for any measurement; a real --auto run tunes again
        how += f"; taken under load ({load.get('figure') or 'busy CPUs'})"
    out: Dict[str, Tuple[DecisionValue, str, JsonObject]] = {}
    judged = _object(entry.get("judged"))
    for lever, fig in _object(entry.get("levers")).items():
        verdict = judged.get(lever)
        if lever not in DECISIONS or not isinstance(fig, dict) or not isinstance(verdict, dict) or \
                verdict.get("outcome") not in (MOVED, KEPT):
            continue  # not compared, or undecided: the rule decides it
        figure = _figure(fig, "figure")
        alternatives = _object(fig.get("alternatives", {}))
        alts = ", ".join(f"{name} {x:.2f} ({x / figure:.2f}x)" for name, x in
                         sorted(((n, _figure(alternatives, n)) for n in alternatives), key=lambda kv: -kv[1])) \
            if figure else ""
        judged_as = (f"; {verdict['outcome']}: {verdict.get('alternative')} {_figure(verdict, 'ratio'):.2f}x "
                     f"({_figure(verdict, 'low'):.2f}-{_figure(verdict, 'high'):.2f}, bar {_figure(verdict, 'bar'):.2f})")
        reason = (f"tuned {what} at {when}: {fig['value']} {figure:.2f} samples/s; alternatives: {alts}"
                  + judged_as + (f"; noise {noise * 100:.0f}%" if isinstance(noise, (int, float)) else "") + how)
        evidence: JsonObject = {
            "tuned": {"lever": lever, "value": fig["value"], "samples_per_s": fig["figure"],
                      "alternatives": dict(alternatives), "noise": noise, "judged": dict(verdict),
                      "measured_at": entry.get("measured_at"), "stopped": entry.get("stopped")}}
        for decision in DECISIONS[lever]:
            out[decision] = (values[decision], reason, evidence)
    return out
