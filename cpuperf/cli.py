"""Typer wiring only: parse, call one engine function, hand the result to output.

One error boundary lives in main(): CpuperfError -> one line (or a JSON object with --json) and
its exit code; a traceback only with CPUPERF_DEBUG=1.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Tuple, get_args, get_origin

import typer

from cpuperf import __version__
from cpuperf.errors import CpuperfError, ExitCode, UsageError, one_line
from cpuperf.output import Output

app = typer.Typer(
    name="cpuperf",
    help="Probe, install, tune and launch PyTorch training on Xeon/EPYC CPUs and NVIDIA GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JSON_HELP = "Print one JSON object on stdout (errors too)."
QUIET_HELP = "Only the product on stdout; no messages on stderr."
SYSROOT_HELP = "Read /proc and /sys under DIR instead of the live host (as lscpu --sysroot)."


def _version(value: bool) -> None:
    if value:
        Output().product(f"cpuperf {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """cpuperf: the right PyTorch stack and settings for this machine."""


def _finite(option: str, value: float, maximum: Optional[float] = None) -> float:
    """Durations and sizes are finite and positive: `nan` never stops, `inf` never ends."""
    import math

    from cpuperf.errors import UsageError

    if not (math.isfinite(value) and value > 0) or (maximum is not None and value > maximum):
        bound = f"0 < S <= {maximum:g}" if maximum is not None else "a finite number of seconds > 0"
        raise UsageError(f"{option} {value!r}: expected {bound}", hint=f"e.g. {option} 60")
    return value


def _addons(value: Optional[str]) -> Tuple[str, ...]:
    """--with LIST: comma-separated add-on names, none empty (`--with ''`, `ipex,`), each once."""
    import re

    from cpuperf.errors import UsageError

    if value is None:
        return ()
    names = [w.strip() for w in value.split(",")]
    hint = "e.g. --with ipex,oneccl"
    if any(not n for n in names):
        raise UsageError(f"--with {value!r}: an empty add-on name", hint=hint)
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
            raise UsageError(f"--with {value!r}: {name!r} is not a package name", hint=hint)
    return tuple(dict.fromkeys(names))


def _platform_tag(value: Optional[str]) -> Optional[str]:
    """--platform: a wheel platform tag (linux_x86_64); empty or not a tag is a usage error."""
    import re

    from cpuperf.errors import UsageError

    if value is not None and not re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", value):
        raise UsageError(f"--platform {value!r} is not a platform tag", hint="linux_x86_64 or linux_aarch64")
    return value


def _finish(code: int) -> None:
    if code:
        raise typer.Exit(code)


@app.command(short_help="Probe this host; say what is wrong and the exact fix.")
def doctor(
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    sysroot: Optional[str] = typer.Option(None, "--sysroot", metavar="DIR", help=SYSROOT_HELP),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="Inspect the packages of another interpreter (a venv's python)."),
    save_snapshot: Optional[str] = typer.Option(None, "--save-snapshot", metavar="DIR",
                                                help="Copy the files the probe reads under DIR, for a bug report."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", metavar="FILE",
                                           help="Probe every node of this hostfile (inside a Slurm allocation of several nodes: its nodes) and show the skews between them."),
    launcher: Optional[str] = typer.Option(None, "--launcher", metavar="NAME",
                                           help="Reach the nodes through srun, mpirun or ssh (default: srun for a Slurm allocation's own nodes, else mpirun, else ssh)."),
    timeout: float = typer.Option(60.0, "--timeout", metavar="S", help="Seconds each node has to answer."),
    parallel: int = typer.Option(32, "--parallel", metavar="N", help="Nodes probed at once."),
    save_facts: Optional[str] = typer.Option(None, "--save-facts", metavar="FILE|DIR/",
                                             help="Save every node's facts (one file, or DIR/NODE.json), to plan from later without reaching the nodes."),
    facts: Optional[str] = typer.Option(None, "--facts", metavar="FILE|DIR",
                                        help="Diagnose nodes from saved facts (--save-facts) instead of probing them."),
    this_node: bool = typer.Option(False, "--this-node", help="Inside a Slurm allocation: this node only."),
    collectives: bool = typer.Option(False, "--collectives", help="With the nodes: measure a short allreduce across them with each backend (gloo, mpi, ccl) they all have, and choose DDP's backend and bucket from it."),
    bucket_mb: float = typer.Option(25.0, "--bucket-mb", metavar="MB", help="Allreduce size for --collectives (DDP's bucket_cap_mb default: 25)."),
) -> None:
    """Probe hardware and software, then say what is wrong and the exact fix."""
    import os

    from cpuperf.commands import doctor_cluster
    out = Output(json_mode=json_out, quiet=quiet)
    # Checked whichever way doctor goes: `doctor --timeout -1` without nodes was accepted silently.
    timeout, bucket_mb = _finite("--timeout", timeout, 3600.0), _finite("--bucket-mb", bucket_mb, 4096.0)
    if parallel < 1:
        from cpuperf.errors import UsageError
        raise UsageError(f"--parallel {parallel}: give at least 1", hint="e.g. --parallel 32 (nodes probed at once)")
    if (hostfile or facts) and (sysroot or save_snapshot):
        from cpuperf.errors import UsageError
        raise UsageError("--sysroot and --save-snapshot describe one host; --hostfile and --facts, several",
                         hint="use one or the other")
    if doctor_cluster.wants_cluster(hostfile, facts, this_node, os.environ) and sysroot is None:
        opts = doctor_cluster.ClusterOptions(hostfile=hostfile, launcher=launcher, python=python,
                                             timeout=timeout, parallel=parallel, save_facts=save_facts, facts=facts,
                                             collectives=collectives, bucket_mb=bucket_mb)
        _finish(doctor_cluster.run(out, opts))
        return
    if save_facts:  # this node's facts (a user who asks to save facts expects a file, not a silent no-op)
        if sysroot:
            from cpuperf.errors import UsageError
            raise UsageError("--save-facts saves a live node's facts; --sysroot describes a recorded host",
                             hint="use --save-snapshot DIR to keep a recorded host")
        doctor_cluster.save_this_node(out, save_facts, python)
    from cpuperf.commands import doctor as cmd
    _finish(cmd.run(out, sysroot, python, save_snapshot))


@app.command(short_help="Install the torch (+ IPEX, oneCCL) wheels that fit this host.")
def install(
    torch: Optional[str] = typer.Option(None, "--torch", metavar="X", help="torch version (2.7, 2.7.0, 2.7.0+cpu); default: keep the installed one, else the newest the sources offer."),
    with_: Optional[str] = typer.Option(None, "--with", metavar="LIST", help="Add-ons, comma-separated: ipex, oneccl."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH", help="Install into this interpreter (default: the one running cpuperf)."),
    venv: Optional[str] = typer.Option(None, "--venv", metavar="DIR", help="Install into this venv (created when missing)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the exact plan (pip's own dry run) and change nothing."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    index_url: Optional[str] = typer.Option(None, "--index-url", metavar="URL", help="Use this package index (replaces the built-in defaults)."),
    find_links: Optional[List[str]] = typer.Option(None, "--find-links", metavar="DIR", help="Install from this wheelhouse with --no-index (air-gapped)."),
    download: Optional[str] = typer.Option(None, "--download", metavar="DIR", help="Download the planned wheels into DIR (plus a lock) instead of installing."),
    write_lock: Optional[str] = typer.Option(None, "--write-lock", metavar="FILE", help="Write the exact pins (FILE.json or requirements style)."),
    from_lock: Optional[str] = typer.Option(None, "--from-lock", metavar="FILE", help="Install exactly the pins of a lock file."),
    allow_cuda_torch: bool = typer.Option(False, "--allow-cuda-torch", help="Allow a CUDA torch (nvidia-* packages) on a host without an NVIDIA GPU."),
    recover: bool = typer.Option(False, "--recover", help="Restore the environment an install killed half-way left (from its journal)."),
) -> None:
    """Install the matching torch (+ IPEX, oneCCL) wheels; verify; restore the environment on failure."""
    from cpuperf.commands import install as cmd
    opts = cmd.Options(torch=torch, with_=_addons(with_), python=python,
                       venv=venv, dry_run=dry_run, yes=yes, index_url=index_url, find_links=tuple(find_links or ()),
                       download=download, write_lock=write_lock, from_lock=from_lock,
                       allow_cuda_torch=allow_cuda_torch, recover=recover)
    _finish(cmd.run(Output(json_mode=json_out, quiet=quiet), opts))


@app.command(short_help="The torch / IPEX / oneCCL matrix and the exact pins.")
def compat(
    python: Optional[str] = typer.Option(None, "--python", metavar="3.N",
                                         help="Target CPython version (default: this interpreter's)."),
    torch: Optional[str] = typer.Option(None, "--torch", metavar="VERSION",
                                        help="Pin torch (2.7.0, 2.5.0+cpu, or 2.5 for the newest 2.5.x)."),
    with_: Optional[str] = typer.Option(None, "--with", metavar="ipex,oneccl",
                                        help="Add-ons wanted: ipex, oneccl (comma-separated)."),
    why_not: Optional[str] = typer.Option(None, "--why-not", metavar="PKG==VER",
                                          help="Explain why one release does not fit --python/--torch."),
    platform: Optional[str] = typer.Option(None, "--platform", metavar="PLATFORM",
                                           help="linux_x86_64 or linux_aarch64 (default: this machine)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """The torch / IPEX / oneCCL compatibility matrix, and the exact pins for your Python and torch."""
    from cpuperf.commands import compat as cmd
    addons = _addons(with_)
    _finish(cmd.run(Output(json_mode=json_out, quiet=quiet), python, torch, ",".join(addons) or None, why_not,
                    _platform_tag(platform)))


LOAD_HELP = ("Plan around other work busy on this host now (fewer threads on the CPUs it keeps busy). Off by default: "
             "load changes from second to second, so plans are made from stable facts and doctor reports load.")
RECOMMEND_SETS_HELP = "Override a decision: --set dtype=fp32 (repeatable)."


@app.command(short_help="Every training decision for this host, with its reason.")
def recommend(
    model: Optional[str] = typer.Option(None, "--model", help="Preset (tiny, small, gpt2-small, micro; default: the host's built-in model), a HF config.json, or a model id in the local HF cache."),
    params: Optional[str] = typer.Option(None, "--params", help="Parameter count, e.g. 124M or 7B."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Global batch (samples per optimizer step)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Run length; decides whether torch.compile pays off."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node"),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", min=1, help="Nodes (default: the hostfile's hosts, or the Slurm allocation's)."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", metavar="FILE"),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", metavar="HOST", help="Several nodes: the rendezvous host every node reaches (default: the hostfile's first host, or the Slurm allocation's first node)."),
    unit: str = typer.Option("socket", "--unit", help="One rank per 'socket' or per 'numa' node."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    sets: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=RECOMMEND_SETS_HELP),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help="TOML/JSON file of decision overrides."),
    measurements: Optional[str] = typer.Option(None, "--measurements", metavar="FILE", help="Recorded measurements (cpuperf bench --json)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="Print only one rendering: env, hf, accelerate or launch."),
    save: Optional[str] = typer.Option(None, "--save", metavar="FILE", help="Write the plan with the facts it was made from (JSON): `train --plan FILE` and `ccl-env --plan FILE` run or render exactly it, on every node."),
    adapt_to_load: bool = typer.Option(False, "--adapt-to-load", help=LOAD_HELP),
    node_facts: Optional[str] = typer.Option(None, "--node-facts", metavar="FILE|DIR", help="With --hostfile: plan every node from its own saved facts (cpuperf doctor --hostfile FILE --save-facts DIR/), without reaching the nodes."),
    probe_nodes: bool = typer.Option(False, "--probe-nodes", help="With --hostfile: probe every node now (mpirun, else ssh) and plan each from its own facts."),
    sysroot: Optional[str] = typer.Option(None, "--sysroot", metavar="DIR", help=SYSROOT_HELP),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Decide dtype, ranks, threads, backend, IPEX/compile, allocator and memory plan, with reasons."""
    from cpuperf.commands import recommend as cmd
    from cpuperf.errors import UsageError

    if fmt not in (None, "env", "hf", "accelerate", "launch"):
        raise UsageError(f"--format {fmt!r}: use env, hf, accelerate or launch")
    _finish(cmd.run_recommend(Output(json_mode=json_out, quiet=quiet), fmt, sysroot=sysroot, model=model,
                              params=params, seq_len=seq_len, batch_size=batch_size, steps=steps,
                              nproc_per_node=nproc_per_node, nnodes=nnodes, hostfile=hostfile, unit=unit,
                              device=device, sets=sets, config=config, measurements=measurements, save=save,
                              adapt_to_load=adapt_to_load, node_facts=node_facts, probe_nodes=probe_nodes,
                              master_addr=master_addr))


@app.command(short_help="Measure this host (GEMM, allocators, compile); cached.")
def bench(
    threads: Optional[int] = typer.Option(None, "--threads", help="Threads to measure with (default: the recommended count)."),
    size: int = typer.Option(512, "--size", min=64, max=8192, help="GEMM size (n of the n x n matrices)."),
    seconds: float = typer.Option(1.0, "--seconds", min=0.1, help="Time per GEMM measurement (at most 600)."),
    allocators: bool = typer.Option(True, "--allocators/--no-allocators", help="Measure preloading each allocator found (tcmalloc, jemalloc, mimalloc)."),
    compile_: bool = typer.Option(False, "--compile", help="Measure torch.compile's cost and gain for --model (tens of seconds to minutes)."),
    model: Optional[str] = typer.Option(None, "--model", help="--compile: the model to measure (a preset or config.json; default: the host's built-in model)."),
    sets: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="--compile: constrain the plan whose dtype torch.compile is measured at (--set dtype=fp32); repeatable; one that cannot be honoured exits 2."),
    refresh: bool = typer.Option(False, "--refresh", help="Measure again even if a fresh, trusted measurement is cached."),
    tune: bool = typer.Option(False, "--tune", help="Tune the plan's levers jointly for --model's shape (dtype, allocator, optimizer, ranks x threads, pinning): ~60 s, cached."),
    budget: Optional[float] = typer.Option(None, "--budget", metavar="S", help="--tune: seconds the search may take (default 60)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Measure this host (GEMM fp32 vs bf16, allocators, compile) and cache it for the engine."""
    from cpuperf.commands import recommend as cmd
    _finite("--seconds", seconds, maximum=600.0)
    if budget is not None:
        _finite("--budget", budget, maximum=3600.0)
    if sets and (tune or not compile_):  # never dropped: it says which plan's dtype torch.compile is measured at
        from cpuperf.errors import UsageError

        raise UsageError("--set: only with --compile (the plan whose dtype torch.compile is measured at)",
                         hint="cpuperf bench --compile --model M --set dtype=fp32")
    if tune:
        _finish(cmd.run_bench_tune(Output(json_mode=json_out, quiet=quiet), model, budget, refresh))
        return
    _finish(cmd.run_bench(Output(json_mode=json_out, quiet=quiet), threads, size, seconds, allocators, compile_,
                        refresh, model, sets))


@app.command(short_help="Draw a run's loss and samples/s (plot.svg, plot.png).")
def plot(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A directory cpuperf train wrote (its metrics.jsonl)."),
    out_dir: Optional[str] = typer.Option(None, "--out", metavar="DIR", help="Write the pictures here (default: RUN_DIR)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Draw a run's loss and samples/s against the step: RUN_DIR/plot.svg, and plot.png with matplotlib."""
    from cpuperf.commands import plot as cmd
    _finish(cmd.run(Output(json_mode=json_out, quiet=quiet), run_dir, out_dir))


TRAIN_SETS_HELP = "Constrain a decision (dtype, compile, threads_per_rank, nproc_per_node, batch_size, optimizer...) or a setting of the built-in loop (lr, log_every, model.d_model...): --set KEY=VALUE (repeatable); one that cannot be honoured exits 2."


@app.command(short_help="Train with the recommended settings: built-in or your script.",
             context_settings={"allow_extra_args": True})
def train(
    ctx: typer.Context,
    auto: bool = typer.Option(False, "--auto", help="Apply the recommendation: dtype, IPEX/compile, threads, pinning, env, ranks, backend."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (argv, env, decisions) and do not run it."),
    sets: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=TRAIN_SETS_HELP),
    model: Optional[str] = typer.Option(None, "--model", help="Built-in preset (tiny, small, gpt2-small, micro; default: tiny, or small on a host with the cores for it), or a Hugging Face config.json: sizes the memory plan, and the built-in model's shape."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Optimizer steps (default 400: ~2-3 minutes on 2 cores)."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", metavar="S", help="Stop after S seconds of training."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Global batch (samples per optimizer step)."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --out."),
    out_dir: Optional[str] = typer.Option(None, "--out", metavar="DIR", help="Run directory: metrics, checkpoint, logs/ (default: a new runs/train/version_N per run; with --resume the newest)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", min=1, help="Ranks per node (--auto: one per socket)."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", min=1, help="Nodes (default: the hostfile's hosts, or the Slurm allocation's)."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", min=0, help="This node's index in the hostfile (torchrun; default: found from its addresses)."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", metavar="FILE", help="One host per line; the first runs rank 0."),
    ppn: Optional[int] = typer.Option(None, "--ppn", min=1, help="Ranks per node (same as --nproc-per-node, MPI's name)."),
    launcher: Optional[str] = typer.Option(None, "--launcher", help="torchrun, mpirun or srun (default: direct for one rank, srun in Slurm, else torchrun)."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", metavar="A"),
    master_port: Optional[int] = typer.Option(None, "--master-port", metavar="P", min=1, max=65535),
    rdzv_timeout: Optional[float] = typer.Option(None, "--rdzv-timeout", metavar="SECONDS", help="Several ranks: how long the rendezvous may take before the missing nodes are named (default 300)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    unit: str = typer.Option("socket", "--unit", help="One rank per 'socket' or per 'numa' node (--auto)."),
    hf_flags: str = typer.Option("auto", "--hf-flags", help="For `-- python script.py`: add Trainer flags auto (HF Trainer scripts only), always or never."),
    sysroot: Optional[str] = typer.Option(None, "--sysroot", metavar="DIR", help="Plan for a recorded host (/proc, /sys under DIR); with --dry-run only."),
    plan: Optional[str] = typer.Option(None, "--plan", metavar="FILE", help="Run exactly this saved plan (cpuperf recommend --save FILE): nothing is decided again; a plan made for another host or stack is refused."),
    replan: bool = typer.Option(False, "--replan", help="With --plan: where this host or stack differs, plan again from the plan's own inputs and this host's facts."),
    adapt_to_load: bool = typer.Option(False, "--adapt-to-load", help=LOAD_HELP),
    tune: bool = typer.Option(False, "--tune", help="With `-- <Trainer command>`: tune the levers on the command itself (a few short runs per candidate); later --auto runs of it use the winner."),
    budget: Optional[float] = typer.Option(None, "--budget", metavar="S", help="--tune: seconds the search may take (default 240)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Errors and the closing summary only on stderr (no progress, no report)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="The full lever report before the job starts (each lever, applied or not, and why), and after the run where its wall time went."),
) -> None:
    """Train with the recommended settings: the built-in loop, or your script after `--`, from one core to many nodes."""
    from cpuperf.run import timeline

    with timeline.collector_paused():  # while it plans: resumed where the job starts (commands/train.py)
        from cpuperf.commands import train as cmd
        if time_budget is not None:
            _finite("--time-budget", time_budget)
        if budget is not None:
            _finite("--budget", budget, maximum=3600.0)
        argv = ctx.args[1:] if ctx.args[:1] == ["--"] else ctx.args  # `train -- cmd`: the `--` may reach ctx.args
        options = cmd.TrainOptions(auto=auto, dry_run=dry_run, model=model, max_steps=max_steps, time_budget=time_budget,
                                   seed=seed, resume=resume, out_dir=out_dir, nnodes=nnodes, node_rank=node_rank,
                                   launcher=launcher, master_addr=master_addr, master_port=master_port,
                                   rdzv_timeout=rdzv_timeout, device=device, unit=unit, hf_flags=hf_flags,
                                   argv=tuple(argv), plan=plan, replan=replan,
                                   sets=tuple(sets), batch_size=batch_size, nproc_per_node=nproc_per_node, ppn=ppn,
                                   sysroot=sysroot, hostfile=hostfile, adapt_to_load=adapt_to_load, tune=tune,
                                   budget=budget, verbose=verbose, again=_train_again(ctx))
        _finish(cmd.run(Output(json_mode=json_out, quiet=quiet, verbose=verbose and not quiet), options))


# The options a resume hint leaves out: it names the run directory and --resume itself; the rest are how it is said.
_NOT_AGAIN = frozenset({"out_dir", "resume", "json_out", "quiet", "dry_run", "tune", "budget"})


def _train_again(ctx: typer.Context) -> Tuple[str, ...]:
    """The options this `train` was given, as words that give them again (each as its first spelling): the printed
    `--resume` hint carries them, so the run it continues is planned as this one (the same model, the same plan)."""
    words: List[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in _NOT_AGAIN or value is None or value == param.default or value in ((), [], False):
            continue
        flag = param.opts[0]
        for one in value if isinstance(value, (list, tuple)) else [value]:
            words += [flag] if value is True else [flag, str(one)]
    return tuple(words)


@app.command("ccl-env", add_help_option=False, short_help="The oneCCL/MPI environment for this host, as shell.",
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
def ccl_env(ctx: typer.Context) -> None:
    """Print the oneCCL/MPI environment tuned for this host: eval "$(cpuperf ccl-env)" (--help for options)."""
    # Its options are parsed by argparse in commands/cclenv.py: this typer coerces every non-flag option
    # through pydantic (~0.15 s to import), too slow for a command run in every new shell.
    _finish(_ccl_env_main(list(ctx.args)))


def _ccl_env_main(argv: List[str]) -> int:
    # main() calls this directly for `cpuperf ccl-env ...`: typer's own parse of the root group
    # coerces its help flag through pydantic too. Same error boundary (main's try), ~0.1 s less.
    from cpuperf.commands import ccl_env as cmd
    opts, json_out, quiet = cmd.parse_args(argv)
    return cmd.run(Output(json_mode=json_out, quiet=quiet), opts)


def _report(out: Output, exc: CpuperfError) -> int:
    """The error line (plus a hint line) on stderr, and the JSON object on stdout with --json.

    cpuperf's own messages are printed as written (install's carry pip's error lines on purpose);
    third-party text is cut to one line where it is caught (_known_failure, the internal-error line); a pure
    layer's FieldError is said with the flag the user typed (cpuperf.commands.flags)."""
    from cpuperf.commands.flags import with_flags

    exc = with_flags(exc)
    _tell(out, exc.to_json(), exc.message, exc.hint)
    return int(exc.code)


def _tell(out: Output, error: Optional[Dict[str, Any]], message: str, hint: Optional[str]) -> None:
    """An error said at the boundary: the JSON object on stdout (with --json) and the line on stderr, each where it
    still can be: a stream that fails now (stderr on a full disk) loses the line, never the error's own exit code."""
    from cpuperf.output import StreamError

    if out.json_mode and error is not None:
        with contextlib.suppress(StreamError):
            out.json(error)
    with contextlib.suppress(StreamError):
        out.error(message, hint)


_FILE_ERRNOS = {getattr(errno, name) for name in (
    "EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT", "ENOTDIR", "EISDIR", "ENOENT", "EEXIST", "ENAMETOOLONG",
    "ELOOP", "EIO", "EFBIG", "ETXTBSY") if hasattr(errno, name)}


def _known_failure(exc: BaseException) -> Optional[CpuperfError]:
    """Failures a user or the host causes, raised below a command's own checks, as their error class."""
    from cpuperf.errors import UsageError, from_os_error

    if isinstance(exc, RecursionError):
        return UsageError("input is nested too deeply", hint="flatten the TOML/JSON file or value")
    if isinstance(exc, UnicodeError):
        return UsageError(f"input is not valid UTF-8 text ({one_line(str(exc), 120)})",
                          hint="save the file as UTF-8")
    if isinstance(exc, OSError) and exc.errno in _FILE_ERRNOS:
        return from_os_error(exc)
    return None


def _json_requested(argv: List[str]) -> bool:
    # Only cpuperf's own options: a user's command after `--` may have a --json of its own.
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def _check_user_program(command: List[str]) -> None:
    """The words after train's `--` start with a program: not nothing (click drops a bare `--`, and `-- --`
    reached train as no command, so the built-in loop was planned), not an empty or blank word (a dry run
    planned it with exit 0, a real run failed to start it with exit 8), not a second `--`."""
    from cpuperf.errors import UsageError

    hint = "cpuperf train --auto -- python train.py ... (or leave out `--` for the built-in loop)"
    if not command:
        raise UsageError("train --: no command after `--`", hint=hint)
    first = command[0]
    if not first.strip():
        raise UsageError("train --: the command after `--` starts with an empty word", hint=hint)
    if first == "--":
        raise UsageError("train -- --: `--` is not a program; the command after the first `--` is yours",
                         hint=hint)


def _check_no_dashes(args: List[str], command: Any) -> None:
    """`train python x.py --max-steps 3` (no `--`): click takes every option it knows as train's own, wherever it
    stands, and runs the rest: the script's `--max-steps 3` was cpuperf's, silently. A command given without `--`
    whose words after its program hold an option is refused: its options would be taken, or refused as train's."""
    train = getattr(command, "commands", {}).get("train")
    if train is None:
        return
    valued = {o for p in train.params if not getattr(p, "is_flag", False) for o in getattr(p, "opts", ())
              if o.startswith("-")}
    i = 0
    while i < len(args) and args[i].startswith("-"):  # train's own options, before the command's first word
        i += 2 if args[i] in valued else 1
    rest = args[i + 1:]
    if i >= len(args) or not any(w.startswith("-") and w != "-" for w in rest):
        return
    word = next(w for w in rest if w.startswith("-") and w != "-")
    own = word.split("=", 1)[0] in {o for p in train.params for o in getattr(p, "opts", ())}
    raise UsageError(f"train {args[i]} ... {word}: without `--` before your command, {word} "
                     + ("is taken as cpuperf's own option, not your command's" if own
                        else "is read as an option of cpuperf's, which it is not"),
                     hint=f"put `--` before your command: cpuperf train {shlex.join(args[:i])}{' ' if i else ''}-- "
                          f"{shlex.join(args[i:])}")


def _dispatch(args: List[str], command: Any, pending: Optional[BaseException]) -> int:
    """Run the command line: the typer-free fast path's error, ccl-env's fast path, or the typer app."""
    if pending is not None:
        raise pending
    if args and not set(args) & {"-h", "--help", "--version"} and os.environ.get("CPUPERF_COMPAT_DIR"):
        from cpuperf.knowledge.matrix import check_env_dir
        check_env_dir()
    if args[:1] == ["ccl-env"]:  # fast path, see _ccl_env_main
        return _ccl_env_main(args[1:])
    if args[:1] == ["train"] and "--" in args:
        _check_user_program(args[args.index("--") + 1:])
    elif args[:1] == ["train"]:
        _check_no_dashes(args[1:], command)
    result = command.main(args=args, prog_name="cpuperf", standalone_mode=False)
    return int(result) if isinstance(result, int) else 0


def _usage_error(out: Output, exc: Any) -> int:  # Any: click or typer's vendored click
    """A click usage error (a click.ClickException) as one line, and as a JSON error object in --json mode."""
    ctx = getattr(exc, "ctx", None)
    hint = f"{ctx.command_path if ctx else 'cpuperf'} --help"  # the command's own help: the one hint for both
    # One line, as every other error: click's own show() prints a usage block first.
    _tell(out, {"error": {"code": int(ExitCode.USAGE), "name": "usage", "message": exc.format_message(), "hint": hint}},
          one_line(exc.format_message()), hint)
    return int(ExitCode.USAGE)


def _reader_left(exc: BrokenPipeError) -> int:
    """`cpuperf ... | head`: the reader left, in a write that did not go through Output (click's help): that is not
    an error of ours (cpuperf.output's rule; the stream is /dev/null from now on)."""
    from cpuperf.output import stream_failed

    stream_failed(sys.stdout, exc)
    return 0


def _library_reader_left(exc: SystemExit) -> bool:
    """click ends the process with SystemExit(1) from its handler of EPIPE where a reader left: only typer's own
    help reaches it (every product of cpuperf's own goes through cpuperf.output, and rich only draws into a buffer)."""
    if not isinstance(exc.__context__, BrokenPipeError):
        return False
    from cpuperf.output import stream_failed

    stream_failed(sys.stdout, exc.__context__)
    return True


def _unexpected(out: Output, exc: Exception) -> int:
    """The last line of defence: a known host or input failure gets its own class and exit code; anything
    else is one line, never a traceback."""
    known = _known_failure(exc)
    if known is not None:  # the host or the input caused it: its own class and exit code
        return _report(out, known)
    message = f"internal error: {type(exc).__name__}: {one_line(str(exc))}"
    hint = "rerun with CPUPERF_DEBUG=1 and report it"
    _tell(out, {"error": {"code": int(ExitCode.FOUND_ERROR), "name": "internal", "message": message, "hint": hint}},
          message, hint)
    return int(ExitCode.FOUND_ERROR)


# The metavars of the options and arguments that name a file or directory.
PATH_METAVARS = frozenset({"DIR", "FILE", "PATH", "FILE|DIR", "FILE|DIR/", "RUN_DIR"})


def _paths_given(command: Any) -> Any:
    """Every option and argument that names a path (PATH_METAVARS) refuses an empty or blank one, exit 2, by one
    rule: `train --out ''` wrote the run into the current directory, `doctor --save-snapshot ''` was no option."""
    for sub in getattr(command, "commands", {}).values():
        for param in sub.params:
            if param.metavar in PATH_METAVARS and param.callback is None:
                param.callback = _a_path
    return command


def _a_path(ctx: Any, param: Any, value: Any) -> Any:  # Any: click or typer's vendored click
    """A path option's value(s) as given; an empty or blank one is a UsageError naming the option."""
    for text in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(text, str) and not text.strip():
            name = param.opts[0] if param.opts[0].startswith("-") else param.metavar
            raise UsageError(f"{name} {text!r}: an empty path", hint=f"give {name} a file or directory name "
                             "(`.` for the current directory)")
    return value


def _skip_needless_coercion() -> None:
    """typer 0.29 coerces every option of a command through a pydantic TypeAdapter it builds on first use, given or
    not: pydantic's import and the adapters cost about 0.1 s of CPU before any command runs. An option not given
    (None), a text option given as text (one or a list of them) and a number or flag left at its own default are
    what that coercion returns unchanged (typer's RuntimeParam.coerce returns None for None; its str adapter returns the text; a
    default is within its bounds), so those skip it; every other value (a number given on the command line, a
    choice, a path typed as one) goes through typer as before. A typer without this parameter class is left as
    it is."""
    core = sys.modules.get("typer.core")
    cls = getattr(core, "_TyperParameter", None)
    original = getattr(cls, "process_value", None)
    if cls is None or original is None or getattr(original, "_cpuperf_lazy", False):
        return

    def process_value(self: Any, ctx: Any, value: Any) -> Any:
        desc = getattr(self, "type_descriptor", None)
        info = getattr(desc, "parameter_info", None)
        single = self.nargs == 1 and not self.multiple
        kind = getattr(desc, "annotation", None)
        if info is None or getattr(info, "parser", None) is not None or self.required:
            return original(self, ctx, value)
        if single and (value is None or (kind is str and type(value) is str)
                       or (kind in (int, float, bool) and type(value) is kind and value == self.default)):
            return self.callback(ctx, self, value) if self.callback is not None else value
        if self.multiple and self.nargs == 1 and get_origin(kind) is list and get_args(kind) == (str,) and \
                isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            value = list(value)  # what typer's list-of-text adapter returns
            return self.callback(ctx, self, value) if self.callback is not None else value
        return original(self, ctx, value)

    process_value._cpuperf_lazy = True  # type: ignore[attr-defined]
    cls.process_value = process_value


def _click_command(args: List[str]) -> Any:
    """typer's click group for this command line. Where its first word names a command, the group holds that command
    alone: typer builds every command's options from its signature (10-30 ms of every start for the eight commands, a
    third of it train's), and a command line runs one command; its options, help, errors and exit codes are the
    same. Anything else (no command, `--help`, `--version`, a word that is no command) gets the group of them all."""
    name = typer.main.get_command_name
    chosen = [c for c in app.registered_commands
              if args and c.callback is not None and (c.name or name(c.callback.__name__)) == args[0]]
    if len(chosen) != 1:
        return typer.main.get_command(app)
    every = app.registered_commands
    app.registered_commands = chosen
    try:
        return typer.main.get_command(app)
    finally:
        app.registered_commands = every


def main(argv: Optional[List[str]] = None, _pending: Optional[BaseException] = None) -> int:
    """The single error boundary (entry.main hands in `_pending`, an error of its typer-free fast path). A closed
    stdout or stderr is /dev/null first (cpuperf.output: what it would show is dropped, the exit code is the
    command's own); stdout failing otherwise (a full disk) is a StreamError, exit 10, like any other error."""
    from cpuperf.output import guard_std_streams

    guard_std_streams()
    try:  # recent typer vendors click
        from typer._click import exceptions as click_exc
    except ImportError:  # pragma: no cover - typer that depends on click
        import click.exceptions as click_exc  # type: ignore[no-redef]  # the same module, unvendored

    args = list(sys.argv[1:] if argv is None else argv)
    out = Output(json_mode=_json_requested(args), quiet="--quiet" in args or "-q" in args)
    _skip_needless_coercion()
    command = _paths_given(_click_command(args))
    try:
        return _dispatch(args, command, _pending)
    except CpuperfError as exc:
        if os.environ.get("CPUPERF_DEBUG") == "1":
            raise
        return _report(out, exc)
    except (typer.Exit, getattr(click_exc, "Exit", typer.Exit)) as exc:  # noqa: B030  (click 8.2 moved Exit)
        return int(exc.exit_code or 0)
    except typer.Abort:
        _tell(out, None, "interrupted", None)
        return int(ExitCode.INTERRUPTED)
    except click_exc.ClickException as exc:
        return _usage_error(out, exc)
    except KeyboardInterrupt:
        _tell(out, None, "interrupted", None)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError as exc:
        return _reader_left(exc)
    except SystemExit as exc:
        if not _library_reader_left(exc):
            raise
        return 0  # typer's help met a reader gone: as _reader_left
    except Exception as exc:  # the last line of defence: one line, never a traceback
        if os.environ.get("CPUPERF_DEBUG") == "1":
            raise
        return _unexpected(out, exc)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
