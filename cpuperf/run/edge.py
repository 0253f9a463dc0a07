"""What a planning command finds at the edge, gathered by one function in one order (`gather`): the host's facts
(probed, or read under --sysroot; the load of the moment only with --adapt-to-load), then the user's records read
against them (the hostfile, the Slurm job, the command after `--` with its script read once, a saved plan held
against this host), the MPI launcher's flavour, and the job's nodes. `cpuperf train` and `cpuperf recommend` both
ask it; what only one of them does (the workload, the measurements, the run directory, this node's place) each adds
when it makes the planner's `EdgeFacts` (cpuperf.plan.build) from this record (`Found.edge_facts`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Tuple

if TYPE_CHECKING:
    from cpuperf.decide.workload import Workload
    from cpuperf.plan.build import EdgeFacts
    from cpuperf.plan.request import PlanRequest
    from cpuperf.plan.saved import SavedPlan
    from cpuperf.plan.script_read import ScriptRead
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hosts import Host
    from cpuperf.probe.slurm import SlurmFacts


@dataclass(frozen=True)
class Sources:
    """Where a command's facts come from: the options it reads besides its request."""

    sysroot: Optional[str] = None  # a recorded host's tree (--sysroot)
    python: Optional[str] = None  # the interpreter whose packages are probed (None: this one)
    hostfile: Optional[str] = None
    adapt_to_load: bool = False  # --adapt-to-load: the load of the moment shapes the plan
    facts: Optional[HostFacts] = None  # facts handed in (a test); None: probed


@dataclass(frozen=True)
class Found:
    """The host's facts and the user's records, each read once, in the order `gather` reads them."""

    facts: HostFacts
    environ: Mapping[str, str]  # the environment the plan sees
    slurm: SlurmFacts
    hosts: Optional[Tuple[Host, ...]]  # the hostfile's (or the allocation's) nodes, cut to the node count
    nnodes: int
    mpi: Optional[Tuple[str, str]]  # the MPI launcher found and its flavour (cpuperf.probe.software.mpi_flavour)
    rendezvous: Optional[str]  # where rank 0 is reached: --master-addr, else the Slurm allocation's first node
    euid: int
    script_text: Optional[str] = None  # the user's script as read from its file
    script: Optional[ScriptRead] = None  # the script read once (cpuperf.plan.script_read)
    launcher_python: Optional[str] = None  # the Python the user's own launcher runs scripts with
    accelerate_default_config: bool = False
    saved: Optional[SavedPlan] = None  # --plan, fitted to this host
    saved_diffs: Tuple[str, ...] = ()  # how this host differs from it (--replan)

    def edge_facts(self, workload: Workload, out_dir: str, python: str, **more: Any) -> EdgeFacts:
        """The planner's `EdgeFacts`: this record, with what the command added (`more`: the measurements, this
        node's place, the route to the rendezvous, a recommendation made already)."""
        from cpuperf.plan.build import EdgeFacts

        return EdgeFacts(environ=self.environ, out_dir=out_dir, python=python, euid=self.euid, workload=workload,
                         hosts=self.hosts, nnodes=self.nnodes, saved=self.saved, saved_diffs=self.saved_diffs,
                         slurm=self.slurm, mpi=self.mpi, script_text=self.script_text, script=self.script,
                         launcher_python=self.launcher_python,
                         accelerate_default_config=self.accelerate_default_config, **more)


def gather(request: PlanRequest, sources: Sources, environ: Mapping[str, str]) -> Found:
    """The host's facts, then the user's records against them, then the nodes (see the module). A value the user
    gave that cannot be read (a hostfile, an argument the script's parser refuses, a saved plan that does not
    fit this host) is refused here, before anything is measured or started."""
    from cpuperf.decide.nodes import job_nodes
    from cpuperf.plan.request import with_command
    from cpuperf.probe import probe_host, with_load
    from cpuperf.probe.slurm import slurm_facts
    from cpuperf.probe.software import mpi_flavour
    from cpuperf.run import timeline

    request = with_command(request)  # the user's command, read once (a request from train_request carries it)
    facts = sources.facts if sources.facts is not None else probe_host(sysroot=sources.sysroot, python=sources.python)
    timeline.mark("check the request, probe the host")
    if sources.adapt_to_load and facts.load is None and facts.live:
        from cpuperf.knowledge.tuning import tuning

        # threads per rank avoid CPUs other work keeps busy now
        facts = with_load(facts, default_s=tuning().load.window_s)
    listed = None
    if sources.hostfile:  # the resolver's module (socket): a hostfile's run only
        from cpuperf.probe.hosts import read_hostfile

        listed = read_hostfile(sources.hostfile)
    slurm = slurm_facts(environ)
    text, reading, its_python, accelerate_config = _command_reads(request, environ)
    saved, diffs = _saved_plan(request, facts, listed)
    mpi = mpi_flavour(facts)
    hosts, nnodes = job_nodes(request.nnodes, listed, slurm.allocation,
                              saved.rec.levers.nnodes.value if saved is not None else None)
    master = request.master_addr
    if master is None and nnodes > 1 and not hosts and slurm.allocation:
        master = slurm.nodes[0] if slurm.nodes else None  # rank 0 runs on the allocation's first node
    return Found(facts, environ, slurm, hosts, nnodes, mpi, master, os.geteuid(), text, reading, its_python,
                 accelerate_config, saved, diffs)


def _command_reads(request: PlanRequest, environ: Mapping[str, str]
                   ) -> Tuple[Optional[str], Optional[ScriptRead], Optional[str], bool]:
    """The user's command after `--`: (its script's text, the script read once (a value its own parser refuses
    exits 2 here), the Python its own launcher runs scripts with, whether accelerate has a default config)."""
    command = request.command
    if command is None:
        return None, None, None, False
    from cpuperf.plan.script_read import read_user_script
    from cpuperf.probe.hf import accelerate_default_config
    from cpuperf.probe.launchers import launcher_python, read_script

    yours, script = command.launcher, command.script
    its_python = launcher_python(yours.prefix) if yours else None
    text = read_script(script.script)
    reading = read_user_script(script, text) if script.script or script.module else None
    accelerate = yours is not None and yours.launcher == "accelerate" and accelerate_default_config(environ)
    return text, reading, its_python, accelerate


def _saved_plan(request: PlanRequest, facts: HostFacts, listed: Optional[Tuple[Host, ...]]
                ) -> Tuple[Optional[SavedPlan], Tuple[str, ...]]:
    """--plan: the saved plan for this node, refused (exit 13) where this host differs from it, unless --replan."""
    if not request.plan:
        return None, ()
    from cpuperf.plan.saved import plan_fits, read_plan_file
    from cpuperf.probe.hosts import this_node_names

    names = this_node_names(listed, request.node_rank)
    saved, diffs = plan_fits(request.plan, read_plan_file(request.plan), facts, request.replan, names)
    return saved, tuple(diffs)
