"""`cpuperf train`: run the built-in training loop (or a user's script) with the recommended settings.

probe -> recommendation (--auto) -> TrainSettings + runtime env (cpuperf.decide.runtime_env) -> LaunchPlan
(cpuperf.plan.launch) -> execute (cpuperf.run.launcher) -> verify what ran -> one summary.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cpuperf.errors import CpuperfError, ExitCode, LaunchFailedError, UsageError
from cpuperf.output import Output

SCHEMA = "cpuperf.train/1"
DRY_RUN_SCHEMA = "cpuperf.train-plan/1"


@dataclass
class TrainArgs:
    auto: bool = False
    dry_run: bool = False
    sets: List[str] = field(default_factory=list)
    model: Optional[str] = None
    max_steps: Optional[int] = None
    time_budget: Optional[float] = None
    batch_size: Optional[int] = None
    seed: Optional[int] = None
    resume: bool = False
    out_dir: Optional[str] = None
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    hostfile: Optional[str] = None
    ppn: Optional[int] = None
    launcher: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    rdzv_timeout: Optional[float] = None
    device: str = "auto"
    unit: str = "socket"
    hf_flags: str = "auto"
    user_argv: List[str] = field(default_factory=list)


def split_sets(items: Sequence[str]) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """--set KEY=VALUE: recommendation decisions vs worker settings (anything TrainSettings knows, model.X)."""
    import dataclasses

    from cpuperf.decide.recommend import DECISION_IDS, split_assignment
    from cpuperf.train.settings import TrainSettings

    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    decisions: Dict[str, str] = {}
    settings: Dict[str, Any] = {}
    for item in items:
        key, raw = split_assignment(item)
        if key in DECISION_IDS:
            decisions[key] = raw
        elif key in fields or key.startswith("model."):
            try:
                value: Any = json.loads(raw)
            except ValueError:
                value = raw
            if key.startswith("model."):
                settings.setdefault("model", {})[key[6:]] = value
            else:
                settings[key] = value
        else:
            raise UsageError(f"unknown setting {key!r} in --set",
                             hint="decisions: " + ", ".join(DECISION_IDS) + "; worker settings: " + ", ".join(sorted(fields)))
    return decisions, settings


def worker_settings(rec: Any, auto: bool, a: TrainArgs, world: int, extra: Dict[str, Any],
                    out_dir: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """TrainSettings (as a dict) from the recommendation (--auto) or plain defaults; and the decisions used."""
    from cpuperf.train.settings import TrainSettings

    s: Dict[str, Any] = {}
    decisions: List[Dict[str, Any]] = []
    preset = a.model or "tiny"
    s["preset"] = preset
    wl = rec.workload
    if auto:
        v = rec.values()
        s.update(dtype=v["dtype"], compile=bool(v["compile"]), ipex=bool(v["ipex"]), device=v["device"],
                 threads=v["threads_per_rank"] if v["device"] == "cpu" else None,
                 batch_size=int(v["batch_size"]), grad_accum_steps=int(v["grad_accum_steps"]),
                 grad_checkpointing=bool(v["grad_checkpointing"]),
                 dataloader_workers=int(v["dataloader_workers"] or 0), tf32=bool(v["tf32"]))
        optimizer = v["optimizer"]
        if optimizer in ("adamw", "adamw_fused"):
            s["optimizer"] = optimizer
        if v["ddp_backend"] and world > 1:
            s["ddp_backend"] = v["ddp_backend"]
        for d in rec.decisions:
            decisions.append({"id": d.id, "value": d.value, "reason": d.reason, "overridden": d.overridden})
    else:
        per_rank = max(1, -(-wl.batch_size // max(1, world)))
        s.update(dtype="fp32", compile=False, ipex=False, threads=None, batch_size=per_rank,
                 device="cuda" if a.device == "cuda" else "cpu")
        decisions.append({"id": "plain", "value": True, "reason": "no --auto: fp32, eager, torch's own thread count, "
                          "no pinning (the baseline --auto is compared with)", "overridden": False})
    if a.max_steps is not None:
        s["max_steps"] = a.max_steps
    if a.time_budget is not None:
        s["time_budget_s"] = a.time_budget
        if a.max_steps is None:
            s["max_steps"] = None
    if a.seed is not None:
        s["seed"] = a.seed
    s["out_dir"] = out_dir
    s["resume"] = a.resume
    s["progress"] = "plain"
    for key, value in extra.items():
        if key == "model":
            s.setdefault("model", {}).update(value)
        else:
            s[key] = value
    from cpuperf.train.errors import ConfigError

    try:
        checked = TrainSettings.from_dict(s)
    except ConfigError as exc:
        raise UsageError(f"training settings: {exc.message}", hint=exc.hint) from exc
    return checked.to_dict(), decisions


def build_plan(a: TrainArgs, facts: Any = None, environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Everything up to the launch: facts, recommendation, settings, env and LaunchPlan (no side effects but probing)."""
    from cpuperf.decide import runtime_env as envplan
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.plan.launch import hf_command, plan_launch, script_path, slurm_allocation
    from cpuperf.probe import probe_host
    from cpuperf.probe.hosts import read_hostfile
    from cpuperf.run import measure

    environ = dict(os.environ if environ is None else environ)
    facts = facts or probe_host()
    decision_sets, setting_sets = split_sets(a.sets)
    hosts = read_hostfile(a.hostfile) if a.hostfile else None
    nnodes = a.nnodes or (len(hosts) if hosts else None) or slurm_allocation(environ) or 1
    if hosts and nnodes > len(hosts):
        raise UsageError(f"--nnodes {nnodes} but the hostfile names {len(hosts)} host(s)",
                         hint="list every node in the hostfile, or lower --nnodes")
    nproc = a.nproc_per_node or a.ppn
    if not a.auto and nproc is None:
        nproc = 1
    user = list(a.user_argv)
    steps = a.max_steps if a.max_steps is not None else (None if a.time_budget else 400)
    workload = resolve_workload(a.model if (a.model and not user) else None, None, None, a.batch_size, steps)
    meas = measure.load_cached(facts) if facts.live else None
    if (meas is None and a.auto and not a.dry_run and facts.live and not facts.gpus
            and environ.get("CPUPERF_MEASURE", "1") != "0"):
        # Where a rule is unsure (native bf16 that may still be slower; an allocator that may or may
        # not help), measure once and cache per host; CPUPERF_MEASURE=0 skips it.
        from cpuperf.decide.placement import plan_placement

        meas = measure.measure_if_unsure(facts, plan_placement(facts).threads_per_rank,
                                         log=lambda msg: sys.stderr.write(msg + "\n"))
    rec = recommend(facts, workload, nproc_per_node=nproc, nnodes=nnodes, unit=a.unit, device=a.device,
                    measurements=meas, overrides=decision_sets, environ=environ if facts.live else {})
    v = rec.values()
    world = v["nproc_per_node"] * nnodes
    out_dir = a.out_dir or "runs/train"
    out_dir_abs = os.path.abspath(out_dir)
    log_dir = os.path.join(out_dir_abs, "logs")
    notes: List[str] = list(rec.notes)

    # Runtime variables: cpuperf.decide.runtime_env owns them (with --auto); plain runs get none of ours.
    env_vars: List[Any] = []
    if a.auto or world > 1:
        backend = v["ddp_backend"] if v["ddp_backend"] in ("ccl", "gloo") else "gloo"
        ifname = None
        mpi = None
        from cpuperf.plan.launch import mpi_flavour

        found = mpi_flavour(facts)
        if a.launcher == "mpirun" and found:
            mpi = found[1]
        if nnodes > 1:
            from cpuperf.run.vendor_env import route_interface

            addr = a.master_addr or (hosts[0].name if hosts else None)
            if addr:
                others = [h.name for h in (hosts or ()) if h.name != addr]
                ifname = route_interface(addr) or (route_interface(others[0]) if others else None)
        master = a.master_addr
        if master is None and not hosts and nnodes > 1 and slurm_allocation(environ):
            from cpuperf.plan.launch import expand_nodelist

            first = expand_nodelist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")[:1]
            master = first[0] if first else None  # rank 0 runs on the allocation's first node
        rt = envplan.runtime_env(facts, rec.placement, backend=backend, hosts=hosts, master_addr=master,
                                 master_port=a.master_port, preload=bool(v["allocator"]) and a.auto,
                                 nnodes=nnodes, mpi=mpi, socket_ifname=ifname, environ=environ)
        wanted = [e for e in rt.vars if a.auto or e.name.startswith(("MASTER_", "GLOO_"))]
        force = [n for n, given in (("MASTER_ADDR", a.master_addr), ("MASTER_PORT", a.master_port)) if given]
        if world > 1:
            force += ["MASTER_ADDR", "MASTER_PORT"]  # ours, not a stale value from the shell
        merged = envplan.merge_env(environ, wanted, force=force)
        for k in merged.kept:
            notes.append(f"kept your {k.name}={k.value} (cpuperf would set {k.wanted})")
        final = merged.final
        env_vars = [_Var(n, final[n], next((e.reason for e in wanted if e.name == n), "")) for n in final]
        if rec.decision("threads_per_rank").overridden:
            env_vars = [_Var(e.name, str(v["threads_per_rank"]), "set by you (--set threads_per_rank)")
                        if e.name == "OMP_NUM_THREADS" else e for e in env_vars]
        notes.extend(rt.notes)

    # What each rank runs.
    hf: Dict[str, Any] = {}
    if user:
        from cpuperf.render import recommendation as render
        source = None
        path = script_path(user)
        if path:
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    source = fh.read()
            except OSError:
                source = None
        ours = render.hf_flags(rec, rec.stack.get("transformers")) if a.auto else []
        cmd, dropped, why = hf_command(user, ours, a.hf_flags if a.auto else "never", source)
        hf = {"added": cmd[len(user):], "kept_yours": dropped, "why": why,
              "transformers": rec.stack.get("transformers")}
        settings: Optional[Dict[str, Any]] = None
        decisions = [{"id": d.id, "value": d.value, "reason": d.reason, "overridden": d.overridden}
                     for d in rec.decisions] if a.auto else []
    else:
        settings, decisions = worker_settings(rec, a.auto, a, world, setting_sets, out_dir_abs)
        cmd = [sys.executable, "-m", "cpuperf.train.worker", "--config", json.dumps(settings, separators=(",", ":"))]
    node_rank = a.node_rank
    addresses: Dict[str, str] = {}
    local_addr = None
    plan = plan_launch(facts, rec.placement, rank_command=cmd, env_vars=env_vars, launcher=a.launcher, hosts=hosts,
                       nnodes=nnodes, node_rank=node_rank if node_rank is not None else 0,
                       master_addr=a.master_addr, master_port=a.master_port, pin=a.auto,
                       threads=v["threads_per_rank"] if (a.auto and rec.decision("threads_per_rank").overridden) else None,
                       log_dir=log_dir, environ=environ, euid=os.geteuid(),
                       local_addr=local_addr, job_id=_job_id(hosts, a.master_port), rdzv_timeout=a.rdzv_timeout)
    return {"facts": facts, "rec": rec, "hosts": hosts, "plan": plan, "settings": settings,
            "decisions": decisions, "notes": notes, "hf": hf, "out_dir": out_dir_abs, "addresses": addresses,
            "nnodes": nnodes, "user": bool(user)}


def _job_id(hosts: Any, port: Optional[int]) -> str:
    """The same rendezvous id on every node: derived from the hostfile and port, not from local paths."""
    import hashlib

    key = ",".join(h.name for h in hosts or ()) + f":{port or ''}"
    return "cpuperf-" + hashlib.sha1(key.encode()).hexdigest()[:10]


class _Var:
    """An env var as plan_launch reads it (name, value, reason)."""

    def __init__(self, name: str, value: str, reason: str):
        self.name, self.value, self.reason = name, value, reason


def _plan_json(b: Dict[str, Any]) -> Dict[str, Any]:
    plan = b["plan"]
    return {"launcher": plan.launcher, "flavour": plan.flavour, "argv": list(plan.argv), "env": plan.env,
            "env_reasons": plan.env_reasons, "per_rank": [{"local_rank": r.local_rank, "cpus": list(r.cpus),
                                                           "threads": r.threads} for r in plan.per_rank],
            "world_size": plan.world_size, "nproc_per_node": plan.nproc_per_node, "nnodes": plan.nnodes,
            "node_rank": plan.node_rank, "hosts": list(plan.hosts), "master_addr": plan.master_addr,
            "master_port": plan.master_port, "affinity": list(plan.affinity) if plan.affinity else None,
            "log_dir": plan.log_dir, "rank_command": list(plan.rank_command), "notes": list(plan.notes),
            "node_commands": list(plan.node_commands)}


def _resolve_nodes(a: TrainArgs, b: Dict[str, Any]) -> Dict[str, Any]:
    """Multi-node: check every host, find this node's rank and address; re-plan with them."""
    from cpuperf.run.launcher import check_hosts, local_node_rank

    hosts = b["hosts"]
    if not hosts or b["nnodes"] <= 1:
        return b
    hosts = hosts[:b["nnodes"]]
    launcher = b["plan"].launcher
    addresses = check_hosts(hosts, ssh=launcher == "mpirun")
    node_rank = a.node_rank
    if node_rank is None:
        node_rank = local_node_rank(hosts, addresses)
        if node_rank is None:
            if launcher == "torchrun":
                raise UsageError("this machine is not in the hostfile", hint="pass --node-rank R (0 = the first host)")
            node_rank = 0
    if node_rank >= len(hosts):
        raise UsageError(f"--node-rank {node_rank} is outside 0..{len(hosts) - 1}")
    if launcher == "mpirun" and node_rank != 0:
        raise UsageError("mpirun starts every node from the first host of the hostfile",
                         hint="run cpuperf train there, or use --launcher torchrun on each node")
    from dataclasses import replace

    from cpuperf.plan.launch import plan_launch

    old = b["plan"]
    rec, facts = b["rec"], b["facts"]
    env_vars = [_Var(k, v, old.env_reasons.get(k, "")) for k, v in old.env.items()
                if k not in ("CPUPERF_RANK_SLOTS", "CPUPERF_RANK_LOGDIR")]
    plan = plan_launch(facts, rec.placement, rank_command=old.rank_command, env_vars=env_vars, launcher=a.launcher,
                       hosts=hosts, nnodes=b["nnodes"], node_rank=node_rank, master_addr=a.master_addr,
                       master_port=a.master_port, pin=a.auto, log_dir=old.log_dir, environ=dict(os.environ),
                       euid=os.geteuid(), local_addr=addresses.get(hosts[node_rank].name),
                       job_id=_job_id(hosts, a.master_port), rdzv_timeout=a.rdzv_timeout)
    return {**b, "plan": replace(plan), "addresses": addresses}


def run_train(out: Output, a: TrainArgs) -> int:
    """`cpuperf train`: plan, (dry-run | execute), verify, report. Returns the exit code."""
    from cpuperf.plan.launch import check_observations
    from cpuperf.run.launcher import execute, result_summary_from_metrics

    if a.user_argv and a.user_argv[0] == "--":
        a.user_argv = a.user_argv[1:]
    b = build_plan(a)
    if not a.dry_run:
        b = _resolve_nodes(a, b)
    plan = b["plan"]
    launch = _plan_json(b)
    if a.dry_run:
        result = {"schema": DRY_RUN_SCHEMA, "auto": a.auto, "launch": launch, "settings": b["settings"],
                  "decisions": b["decisions"], "hf_flags": b["hf"] or None, "notes": b["notes"]}
        if out.json_mode:
            out.json(result)
        else:
            _print_plan(out, b, launch)
        return 0
    for note in b["notes"]:
        out.info(f"note: {note}")
    out.info(f"cpuperf train: {plan.launcher} with {plan.world_size} rank(s)"
             + (f" on {plan.nnodes} node(s), this is node {plan.node_rank}" if plan.nnodes > 1 else "")
             + (", tuned (--auto)" if a.auto else ", plain defaults (no --auto)"))
    res = execute(plan, echo=None if out.quiet else sys.stderr, stdout_is_product=b["user"] and not out.json_mode)
    observed = [res.observations[r] for r in sorted(res.observations)]
    summary, runtime = (None, None)
    if not b["user"] and b["settings"] is not None:
        summary, runtime = result_summary_from_metrics(os.path.join(b["out_dir"], "metrics.jsonl"))
    warnings = check_observations(plan, observed, runtime)
    for w in warnings:
        out.warn(w)
    verification = {"ranks": [o.to_json() for o in observed], "warnings": warnings,
                    "worker_runtime": runtime}
    ckpt = os.path.join(b["out_dir"], "checkpoint.pt")
    has_ckpt = not b["user"] and os.path.isfile(ckpt)
    if res.interrupted:
        # Say "checkpoint" only where one exists: a run stopped before its first step has none.
        message = f"interrupted ({res.signal_name or 'SIGINT'}); the ranks were stopped" + (
            f", the last checkpoint is {ckpt}" if has_ckpt else ", no checkpoint was written")
        hint = "cpuperf train --resume continues from it" if has_ckpt else None
        out.error(message, hint)
        if out.json_mode:
            out.json({"error": {"code": int(ExitCode.INTERRUPTED), "name": "interrupted", "message": message,
                                "hint": hint}, "launch": launch})
        return int(ExitCode.INTERRUPTED)
    if res.code != 0:
        code, message, hint = _failure(plan, res, b)
        if hint is None and has_ckpt:
            hint = "fix the cause, then cpuperf train --resume continues from the last checkpoint"
        if out.json_mode:
            out.json({"error": {"code": code, "name": "launch_failed" if code == ExitCode.LAUNCH_FAILED else "rank_failed",
                                "message": message, "hint": hint}, "launch": launch, "verification": verification})
        out.error(message, hint)
        return code
    if b["user"]:
        result = {"schema": SCHEMA, "user_command": list(plan.rank_command), "world_size": plan.world_size,
                  "wall_s": round(res.wall_s, 3), "hf_flags": b["hf"] or None, "decisions": b["decisions"],
                  "launch": launch, "verification": verification}
    else:
        if summary is None and plan.node_rank != 0:
            summary = {"schema": SCHEMA, "status": "completed", "node_rank": plan.node_rank,
                       "world_size": plan.world_size, "settings": b["settings"],
                       "note": f"rank 0 runs on {plan.master_addr}: the run's summary and metrics are written there"}
        if summary is None:
            raise LaunchFailedError("the training run ended without a summary in its metrics file",
                                    hint=f"see the logs under {plan.log_dir}")
        summary = {k: val for k, val in summary.items() if k != "type"}
        result = {**summary, "wall_s": round(res.wall_s, 3), "decisions": b["decisions"], "launch": launch,
                  "verification": verification}
    if out.json_mode:
        out.json(result)
    elif not b["user"]:
        out.product(_human(result))
    return 0


def _failure(plan: Any, res: Any, b: Dict[str, Any]) -> Tuple[int, str, Optional[str]]:
    """(exit code, one-line message, hint or None) naming what failed first: the rank's own error
    when it left one, a rendezvous that timed out with the nodes that never joined, else the rank
    and its log."""
    from cpuperf.plan.launch import first_failure, rendezvous_timed_out

    if plan.launcher == "torchrun" and plan.nnodes > 1 and rendezvous_timed_out(res.launcher_output):
        others = [h for i, h in enumerate(plan.hosts[:plan.nnodes]) if i != plan.node_rank] or ["the other nodes"]
        timeout = plan.env.get("CPUPERF_RDZV_TIMEOUT", "?")
        return int(ExitCode.UNREACHABLE), (
            f"the rendezvous at {plan.master_addr}:{plan.master_port} did not complete within {timeout} s: "
            f"not joined: {', '.join(others)}"), "start cpuperf train on every node of the hostfile, or raise --rdzv-timeout"
    parsed = first_failure(res.launcher_output, res.died_first) if plan.launcher != "direct" else (0, res.code)
    rank = parsed[0] if parsed else None
    errors = res.rank_errors
    # Only the first-failing rank's own error: a peer that then lost its connection leaves one too.
    own = errors.get(rank) if rank is not None else (errors[min(errors)] if errors else None)
    if own is not None:  # the worker's own one line, said once, with its code and hint
        who = f"rank {own.get('rank', rank)}: " if plan.world_size > 1 else ""
        return int(own.get("code") or res.code or 1), who + str(own["message"]), own.get("hint")
    if plan.launcher == "direct":
        return res.code, f"the training process exited with code {res.code}" + _signal_name(res.code), None
    code = parsed[1] if parsed and parsed[1] else None
    if rank is None:
        return res.code or int(ExitCode.LAUNCH_FAILED), (f"{plan.launcher} failed with exit code {res.code}; "
                                                          f"log: {os.path.join(plan.log_dir or '', 'launcher.log')}"), None
    log = os.path.join(plan.log_dir or "", f"rank{rank}.log")
    if code is None:
        code = res.code or int(ExitCode.LAUNCH_FAILED)
        how = f"{plan.launcher} exited with {res.code}"
    else:
        how = f"exit code {code}{_signal_name(code)}"
    return code, f"rank {rank} failed first ({how}); log: {log}", None


def _signal_name(code: int) -> str:
    import signal

    if code > 128:
        try:
            return f" = killed by {signal.Signals(code - 128).name}"
        except ValueError:
            return ""
    return ""


def _human(r: Dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    st = r.get("settings") or {}
    return (f"{r.get('status', 'done')}: {r.get('steps')} steps on {r.get('world_size')} rank(s), "
            f"{st.get('dtype')}{' compile' if st.get('compile') else ''}{' ipex' if st.get('ipex') else ''}, "
            f"{r.get('threads')} thread(s)\n"
            f"loss {f(r.get('loss_first'), '.4f')} -> {f(r.get('loss_last'), '.4f')}, "
            f"{f(r.get('samples_per_s'), '.1f')} samples/s, {f(r.get('tokens_per_s'), '.0f')} tokens/s, "
            f"wall {r['wall_s']:.1f} s\n"
            f"metrics {r.get('metrics_file')}\ncheckpoint {r.get('checkpoint')}")


def _print_plan(out: Output, b: Dict[str, Any], launch: Dict[str, Any]) -> None:
    from cpuperf.plan.launch import shell_line

    plan = b["plan"]
    lines = [f"# launcher: {plan.launcher}" + (f" ({plan.flavour})" if plan.flavour and plan.flavour != plan.launcher else "")
             + f", {plan.world_size} rank(s)"]
    for spec in plan.per_rank:
        lines.append(f"#   local rank {spec.local_rank}: CPUs {','.join(map(str, spec.cpus)) or 'unpinned'}, "
                     f"threads {spec.threads if spec.threads is not None else 'torch default'}")
    for d in b["decisions"]:
        if d["id"] in ("dtype", "compile", "ipex", "threads_per_rank", "ddp_backend", "allocator", "batch_size", "plain"):
            lines.append(f"# {d['id']} = {d['value']}: {d['reason']}")
    for note in plan.notes:
        lines.append(f"# {note}")
    if b["hf"]:
        lines.append(f"# HF flags: {' '.join(b['hf']['added']) or '(none)'} ({b['hf']['why']})")
        if b["hf"]["kept_yours"]:
            lines.append(f"# not added (you decided): {' '.join(b['hf']['kept_yours'])}")
    env = {k: v for k, v in plan.env.items()}
    lines.append(shell_line(plan.argv, env))
    out.product("\n".join(lines))
    for note in b["notes"]:
        out.info(f"note: {note}")


__all__ = ["TrainArgs", "run_train", "build_plan", "CpuperfError"]
