"""The recommendation engine: host facts + installed stack + workload (+ measurements) -> decisions.

Pure code. Every decision carries an id, a plain value, a reason and the evidence it used; every
decision can be overridden (`--set id=value`), and the result says which were.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from packaging.version import InvalidVersion, Version

from cpuperf.data import load_builtin
from cpuperf.decide.placement import Placement, plan_placement
from cpuperf.decide.workload import Workload
from cpuperf.errors import UsageError
from cpuperf.knowledge.gpu import visible_gpus
from cpuperf.probe.facts import Gpu, HostFacts

SCHEMA = "cpuperf.recommend/1"

DECISION_IDS = (
    "device", "dtype", "tf32", "fp32_math_mode", "nproc_per_node", "nnodes", "threads_per_rank", "affinity",
    "ddp_backend", "ipex", "compile", "allocator", "attention", "batch_size", "grad_accum_steps",
    "grad_checkpointing", "optimizer", "dataloader_workers", "pin_memory", "zero",
)
_BOOL_IDS = {"tf32", "ipex", "compile", "grad_checkpointing", "pin_memory"}
_INT_IDS = {"nproc_per_node", "nnodes", "threads_per_rank", "batch_size", "grad_accum_steps", "dataloader_workers"}
_CHOICES: Dict[str, Set[Any]] = {
    "device": {"cpu", "cuda"},
    "dtype": {"fp32", "bf16", "fp16"},
    "ddp_backend": {"gloo", "ccl", "mpi", "nccl", None},
    "allocator": {"tcmalloc", "jemalloc", None},
    "optimizer": {"adamw", "adamw_fused", "adafactor", "adamw_8bit"},
    "attention": {"sdpa", "flash", "mem_efficient", "math"},
    "fp32_math_mode": {"bf16", None},
}


@dataclass(frozen=True)
class Decision:
    id: str
    value: Any
    reason: str
    evidence: Dict[str, Any] = field(default_factory=dict)
    overridden: bool = False
    needs_torch: bool = False

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Measurements:
    """Micro-benchmark results for this host (cpuperf bench), or recorded ones in tests."""

    gemm_fp32_gflops: Optional[float] = None
    gemm_bf16_gflops: Optional[float] = None
    gemm_fp16_gflops: Optional[float] = None
    compile_seconds: Optional[float] = None
    step_seconds: Optional[float] = None  # eager fp32 step of the workload, if measured
    compile_speedup: Optional[float] = None
    # name -> throughput ratio vs default (geometric mean); name_by_workload -> {workload: ratio}
    allocator_speedup: Dict[str, Any] = field(default_factory=dict)
    source: str = "none"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurements:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Recommendation:
    decisions: Tuple[Decision, ...]
    placement: Placement
    workload: Workload
    notes: Tuple[str, ...]
    stack: Dict[str, Optional[str]]

    def get(self, decision_id: str) -> Any:
        for d in self.decisions:
            if d.id == decision_id:
                return d.value
        raise KeyError(decision_id)

    def decision(self, decision_id: str) -> Decision:
        for d in self.decisions:
            if d.id == decision_id:
                return d
        raise KeyError(decision_id)

    def values(self) -> Dict[str, Any]:
        return {d.id: d.value for d in self.decisions}


# -- the stack -------------------------------------------------------------------------------------

def _version(text: Optional[str]) -> Optional[Version]:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _major_minor(v: Optional[Version]) -> Optional[Tuple[int, int]]:
    return (v.major, v.minor) if v is not None else None


def stack_versions(facts: HostFacts) -> Dict[str, Optional[str]]:
    if facts.software is None:
        return {}
    return {name: (info.version if info else None) for name, info in facts.software.packages.items()}


def _matrix_verdict(package: str, version: str, torch: str, python: Optional[str]) -> List[str]:
    """Reasons from the compat matrix why `package==version` does not fit torch (empty = it fits)."""
    from cpuperf.knowledge.resolve import why_not

    py = ".".join((python or "3.11").split(".")[:2])
    try:
        return why_not(package, version, py, torch)
    except ValueError as exc:  # a version the matrix cannot parse
        return [str(exc)]


def _addon_compatible(dist: str, label: str, torch: Optional[str], version: Optional[str],
                      python: Optional[str], missing: str) -> Tuple[bool, str]:
    if _version(version) is None:
        return False, missing
    if _version(torch) is None:
        return False, "torch is not installed"
    reasons = _matrix_verdict(dist, str(version), str(torch), python)
    if reasons:
        return False, "; ".join(reasons)
    return True, f"{label} {version} matches torch {torch}"


def ipex_compatible(torch: Optional[str], ipex: Optional[str], python: Optional[str] = None) -> Tuple[bool, str]:
    """IPEX demands torch of its own major.minor (it kills the process at import otherwise)."""
    return _addon_compatible("intel_extension_for_pytorch", "IPEX", torch, ipex, python,
                             "intel_extension_for_pytorch is not installed")


def ccl_compatible(torch: Optional[str], bindings: Optional[str], python: Optional[str] = None) -> Tuple[bool, str]:
    """oneCCL bindings are built for one (sometimes two) exact torch releases."""
    return _addon_compatible("oneccl_bind_pt", "oneccl_bind_pt", torch, bindings, python,
                             "oneccl_bind_pt is not installed (its last CPU release, 2.7, supports torch 2.7)")


# -- helpers ---------------------------------------------------------------------------------------

def _cc(gpu: Gpu) -> Tuple[int, int]:
    try:
        major, minor = (int(x) for x in (gpu.compute_capability or "0.0").split(".")[:2])
        return major, minor
    except ValueError:
        return 0, 0


def _parse_cc(text: str) -> Tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _cpu_evidence(facts: HostFacts) -> Dict[str, Any]:
    return {"microarchitecture": facts.cpu.microarchitecture, "avx512_bf16": "avx512_bf16" in facts.cpu.isa,
            "amx_bf16": "amx_bf16" in facts.cpu.isa, "amx_usable": facts.cpu.amx_usable}


# -- memory plan ------------------------------------------------------------------------------------

def _activation_bytes_per_sample(w: Workload, dtype: str, checkpointing: bool) -> float:
    rule = load_builtin("tuning.toml")["memory"]
    t, d, h, layers = w.seq_len, w.d_model, max(1, w.n_head), w.n_layer
    per_layer_16bit = t * d * (rule["activation_coeff"] + rule["activation_attn_coeff"] * h * t / d)
    scale = 2.0 if dtype == "fp32" else 1.0
    if checkpointing:
        # Only block inputs are kept, plus one block recomputed at a time.
        return (layers * 2 * t * d * 2 + per_layer_16bit) * scale + t * w.vocab * 4
    return layers * per_layer_16bit * scale + t * w.vocab * 4 * 2  # logits + their grad in fp32


def memory_budget(facts: HostFacts, placement: Placement, device: str, gpu: Optional[Gpu]) -> Tuple[Optional[int], str]:
    rule = load_builtin("tuning.toml")["memory"]
    if device == "cuda" and gpu is not None:
        if gpu.memory_bytes is None:
            return None, "GPU memory unknown"
        if gpu.memory_free_bytes is not None and gpu.memory_free_bytes < gpu.memory_bytes * rule["gpu_headroom"]:
            # Another process holds part of the card: only what is free now can be planned for.
            return (int(gpu.memory_free_bytes * rule["gpu_headroom"]),
                    f"{gpu.name}: {gpu.memory_free_bytes / 2**30:.1f} GiB free of {gpu.memory_bytes / 2**30:.0f} GiB "
                    f"x {rule['gpu_headroom']}")
        return int(gpu.memory_bytes * rule["gpu_headroom"]), f"{gpu.name}: {gpu.memory_bytes / 2**30:.0f} GiB x {rule['gpu_headroom']}"
    total: Optional[float] = facts.memory.available_bytes or facts.memory.total_bytes
    limit = facts.limits.memory_limit_bytes
    if limit:
        total = min(total, float(limit)) if total else float(limit)
    if total is None:
        return None, "memory unknown"
    per_rank = total / max(1, placement.nproc_per_node)
    nodes = {n.id: n for n in facts.topology.numa_nodes}
    slot_node = placement.slots[0].node if placement.slots else None
    node_bytes = nodes[slot_node].memory_bytes if slot_node in nodes else None
    if node_bytes and placement.nproc_per_node > 1:
        per_rank = min(per_rank, float(node_bytes))
    return int(per_rank * rule["headroom"]), f"{per_rank / 2**30:.1f} GiB per rank x {rule['headroom']}"


# -- the engine -------------------------------------------------------------------------------------

def recommend(facts: HostFacts, workload: Workload, *, nproc_per_node: Optional[int] = None,
              nnodes: int = 1, unit: str = "socket", device: str = "auto",
              measurements: Optional[Measurements] = None, overrides: Optional[Mapping[str, str]] = None,
              environ: Optional[Mapping[str, str]] = None) -> Recommendation:
    """Decide every setting for this host and workload."""
    environ = environ or {}
    meas = measurements or Measurements()
    tuning = load_builtin("tuning.toml")
    stack = stack_versions(facts)
    torch_v = stack.get("torch")
    torch_info = facts.software.packages.get("torch") if facts.software else None
    torch_build = torch_info.build if torch_info else None
    py = facts.software.python if facts.software else None
    notes: List[str] = []
    decisions: Dict[str, Decision] = {}
    ov = dict(overrides or {})
    unknown = sorted(set(ov) - set(DECISION_IDS))
    if unknown:
        raise UsageError(f"unknown decision {unknown[0]!r} in --set",
                         hint="decisions: " + ", ".join(DECISION_IDS))

    def put(d: Decision) -> None:
        decisions[d.id] = d

    if facts.software is None:
        notes.append("the installed stack is unknown (snapshot): decisions that need torch assume a recent CPU torch")
    elif torch_v is None:
        notes.append("torch is not installed: decisions marked needs_torch assume the stack `cpuperf install --yes` "
                     "would install; run it first")

    # device ---------------------------------------------------------------------------------------
    gpus = visible_gpus(facts, environ)
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {device!r}: use auto, cpu or cuda")
    chosen_device = "cpu"
    reason = "no NVIDIA GPU visible"
    if device == "cpu":
        reason = "asked for CPU"
    elif gpus and torch_build in ("cuda", None):
        chosen_device, reason = "cuda", f"{len(gpus)} NVIDIA GPU(s) visible"
        if torch_build is None and facts.software is not None:
            reason += " (torch not installed yet: install the CUDA build)"
    elif gpus and torch_build == "cpu":
        reason = "the installed torch is a CPU-only build; GPUs are unused (cpuperf doctor has the fix)"
        notes.append(reason)
    elif device == "cuda":
        raise UsageError("--device cuda but no usable NVIDIA GPU or CUDA torch",
                         hint="run cpuperf doctor for the exact fix")
    put(Decision("device", ov.get("device", chosen_device) if "device" not in ov else ov["device"], reason,
                 {"gpus": [g.name for g in gpus], "torch_build": torch_build}))
    on_gpu = decisions["device"].value == "cuda"
    gpu = gpus[0] if (on_gpu and gpus) else None

    # placement: ranks and threads --------------------------------------------------------------------
    total_nodes = max(1, nnodes)
    if on_gpu:
        nproc = nproc_per_node or max(1, len(gpus))
        placement = plan_placement(facts, min(nproc, max(1, len(facts.topology.cpus))) if facts.topology.cpus else None, unit)
        put(Decision("nproc_per_node", nproc, "one rank per visible GPU" if nproc_per_node is None else "as asked",
                     {"visible_gpus": len(gpus)}))
    else:
        want_ccl = bool(facts.software and ccl_compatible(torch_v, stack.get("oneccl_bind_pt"), py)[0])
        placement = plan_placement(facts, nproc_per_node, unit, ccl=want_ccl, nnodes=total_nodes)
        put(Decision("nproc_per_node", placement.nproc_per_node, "; ".join(placement.reasons[-1:]),
                     {"sockets": facts.topology.sockets, "numa_nodes": len(facts.topology.numa_nodes),
                      "usable_physical_cores": placement.cpu_budget}))
    put(Decision("nnodes", total_nodes, "one node" if total_nodes == 1 else f"{total_nodes} nodes, as asked", {}))
    world = decisions["nproc_per_node"].value * total_nodes
    put(Decision("threads_per_rank", placement.threads_per_rank, "; ".join(placement.reasons[:-1]) or "usable physical cores",
                 {"allowed_cpus": len(facts.usable_cpus()), "cpu_quota": facts.topology.cpu_quota,
                  "physical_cores": facts.topology.physical_cores, "ccl_workers": placement.ccl_workers}))
    from cpuperf.probe.parse import format_cpulist

    affinity = ";".join(format_cpulist(s.compute_cpus) for s in placement.slots if s.compute_cpus) or None
    put(Decision("affinity", affinity, "each rank pinned to its own physical cores (no SMT siblings)",
                 {"slots": [list(s.cpus) for s in placement.slots]}))

    # dtype -------------------------------------------------------------------------------------------
    if on_gpu and gpu is not None:
        cc = _cc(gpu)
        if cc >= _parse_cc(tuning["dtype"]["fp16_gpu_below_cc"]):
            dtype, why = "bf16", f"{gpu.name} (compute capability {gpu.compute_capability}) has native bf16"
        elif cc >= _parse_cc(tuning["dtype"]["fp32_gpu_below_cc"]):
            dtype, why = "fp16", f"{gpu.name} (cc {gpu.compute_capability}) has fp16 Tensor Cores but no bf16: fp16 autocast with a gradient scaler"
        else:
            dtype, why = "fp32", f"{gpu.name} (cc {gpu.compute_capability}) predates Tensor Cores"
        put(Decision("dtype", dtype, why, {"compute_capability": gpu.compute_capability}))
        tf32 = cc >= (8, 0)
        put(Decision("tf32", tf32, "TF32 Tensor Cores for fp32 matmul and cuDNN" if tf32 else "no TF32 before Ampere",
                     {"compute_capability": gpu.compute_capability}))
        put(Decision("fp32_math_mode", None, "CPU-only setting", {}))
    else:
        evidence = _cpu_evidence(facts)
        ratio = None
        if meas.gemm_bf16_gflops and meas.gemm_fp32_gflops:
            ratio = meas.gemm_bf16_gflops / meas.gemm_fp32_gflops
            evidence.update(gemm_fp32_gflops=meas.gemm_fp32_gflops, gemm_bf16_gflops=meas.gemm_bf16_gflops,
                            measured=meas.source)
        amx_ok = facts.cpu.amx_supported and facts.cpu.amx_usable is not False
        native = facts.cpu.bf16_native and (amx_ok or "avx512_bf16" in facts.cpu.isa)
        if facts.cpu.arch != "x86_64":
            dtype = "fp32"
            why = (f"{facts.cpu.arch} ({facts.cpu.microarchitecture}): cpuperf keeps fp32 unless a measurement on "
                   "this host shows bf16 faster")
            if ratio is not None and ratio >= tuning["dtype"]["min_bf16_over_fp32_gemm"] * 1.2:
                dtype, why = "bf16", f"measured bf16 GEMM {ratio:.2f}x fp32 on this {facts.cpu.arch} host"
        elif not native:
            dtype = "fp32"
            why = (f"{facts.cpu.microarchitecture} has no avx512_bf16 or usable AMX: bf16 would be emulated and "
                   "slower than fp32")
            if ratio is not None:
                why += f" (measured bf16/fp32 GEMM {ratio:.2f}x)"
        elif ratio is not None and ratio < tuning["dtype"]["min_bf16_over_fp32_gemm"]:
            dtype, why = "fp32", f"bf16 is native but measured slower than fp32 here ({ratio:.2f}x GEMM)"
        else:
            engine = "AMX" if amx_ok and "amx_bf16" in facts.cpu.isa else "avx512_bf16"
            dtype, why = "bf16", f"native bf16 ({engine}): bf16 autocast"
            if ratio is not None:
                why += f", measured {ratio:.2f}x fp32 GEMM"
        put(Decision("dtype", dtype, why, evidence))
        put(Decision("tf32", False, "TF32 is an NVIDIA GPU mode", {}))
        tv = _version(torch_v)
        mm = tuning["fp32_math_mode"]
        if amx_ok and "amx_bf16" in facts.cpu.isa and tv is not None and tv >= Version(mm["min_torch"]):
            put(Decision("fp32_math_mode", mm["value"], "AMX host with torch >= " + mm["min_torch"] +
                         ": oneDNN runs remaining fp32 matmuls in bf16 (torch.backends.mkldnn.matmul.fp32_precision)",
                         {"torch": torch_v}, needs_torch=True))
        else:
            put(Decision("fp32_math_mode", None, "needs an AMX host and torch >= " + mm["min_torch"], {"torch": torch_v}))

    # backend -----------------------------------------------------------------------------------------
    if world <= 1:
        put(Decision("ddp_backend", None, "one rank: no process group", {}))
    elif on_gpu:
        put(Decision("ddp_backend", "nccl", "NCCL for NVIDIA GPUs", {}))
    else:
        ok, why = ccl_compatible(torch_v, stack.get("oneccl_bind_pt"), py)
        if ok:
            put(Decision("ddp_backend", "ccl", why, {"oneccl_bind_pt": stack.get("oneccl_bind_pt")}))
        else:
            put(Decision("ddp_backend", "gloo", f"gloo: {why}", {"oneccl_bind_pt": stack.get("oneccl_bind_pt"),
                                                                  "torch": torch_v}))

    # IPEX vs torch.compile -----------------------------------------------------------------------------
    ipex_ok, ipex_why = ipex_compatible(torch_v, stack.get("intel_extension_for_pytorch"), py)
    avx512 = "avx512f" in facts.cpu.isa
    if on_gpu:
        put(Decision("ipex", False, "IPEX's CPU optimisations do not apply to CUDA training", {}))
    elif not ipex_ok:
        extra = ""
        tv = _version(torch_v)
        if tv is not None and tv >= Version("2.9"):
            extra = " (IPEX is archived; its last release 2.8 supports torch 2.8: torch.compile and autocast are the native path)"
        put(Decision("ipex", False, ipex_why + extra, {"torch": torch_v, "ipex": stack.get("intel_extension_for_pytorch")}))
    elif not avx512:
        put(Decision("ipex", False, f"{ipex_why}, but this CPU has no AVX-512: IPEX brings little here",
                     {"isa": list(facts.cpu.isa)}))
    else:
        put(Decision("ipex", True, f"{ipex_why} on an AVX-512 host: ipex.optimize(model, optimizer)",
                     {"torch": torch_v, "ipex": stack.get("intel_extension_for_pytorch")}, needs_torch=True))
    put(_decide_compile(workload, meas, tuning, torch_v, on_gpu, decisions["ipex"].value, placement, facts))

    # allocator -------------------------------------------------------------------------------------------
    put(_decide_allocator(facts, meas, on_gpu))

    # attention -------------------------------------------------------------------------------------------
    put(_decide_attention(workload, decisions["dtype"].value, gpu))

    # memory plan -------------------------------------------------------------------------------------------
    for d in _memory_plan(facts, workload, placement, decisions, tuning, gpu, world, torch_v):
        put(d)

    # overrides ---------------------------------------------------------------------------------------------
    for key, raw in ov.items():
        value = coerce(key, raw)
        old = decisions.get(key)
        put(Decision(key, value, f"set by the user (cpuperf chose {old.value!r}: {old.reason})" if old else "set by the user",
                     old.evidence if old else {}, overridden=True))
    if "dtype" in ov and decisions["dtype"].value == "bf16" and not on_gpu and not facts.cpu.bf16_native:
        notes.append("dtype=bf16 was forced on a CPU without native bf16: expect it to be several times slower than fp32")

    ordered = tuple(decisions[i] for i in DECISION_IDS if i in decisions)
    return Recommendation(ordered, placement, workload, tuple(notes), stack)


def coerce(key: str, raw: Any) -> Any:
    """A --set value as the decision's plain type; a bad value is a usage error."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text.lower() in ("none", "null", ""):
        value: Any = None
    elif key in _BOOL_IDS:
        if text.lower() in ("1", "true", "yes", "on"):
            value = True
        elif text.lower() in ("0", "false", "no", "off"):
            value = False
        else:
            raise UsageError(f"--set {key}={raw}: expected true or false")
    elif key in _INT_IDS:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"--set {key}={raw}: expected an integer") from None
        if value < (0 if key == "dataloader_workers" else 1):
            raise UsageError(f"--set {key}={raw}: out of range")
    else:
        value = text
    if key in _CHOICES and value not in _CHOICES[key]:
        allowed = ", ".join(str(c) for c in sorted(_CHOICES[key], key=str))
        raise UsageError(f"--set {key}={raw}: expected one of {allowed}")
    return value


def split_assignment(item: str) -> Tuple[str, str]:
    """'dtype=fp32' -> ('dtype', 'fp32'); anything without a key and '=' is a usage error."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set {item!r}: expected KEY=VALUE", hint="e.g. --set dtype=fp32")
    return key, value


def parse_sets(items: List[str]) -> Dict[str, str]:
    """['dtype=fp32', 'compile=false'] -> {'dtype': 'fp32', 'compile': 'false'}."""
    out: Dict[str, str] = {}
    for item in items:
        key, value = split_assignment(item)
        if key not in DECISION_IDS:
            raise UsageError(f"unknown decision {key!r} in --set", hint="decisions: " + ", ".join(DECISION_IDS))
        out[key] = value
    return out


def _decide_compile(w: Workload, meas: Measurements, tuning: Mapping[str, Any], torch_v: Optional[str],
                    on_gpu: bool, ipex: bool, placement: Placement, facts: HostFacts) -> Decision:
    tv = _version(torch_v)
    if tv is not None and tv < Version("2.0"):
        return Decision("compile", False, f"torch {torch_v} has no torch.compile", {"torch": torch_v})
    if ipex:
        return Decision("compile", False, "IPEX optimize is used instead", {})
    rule = tuning["compile"]
    compile_s = meas.compile_seconds or rule["assumed_compile_seconds_per_layer"] * max(1, w.n_layer)
    speedup = meas.compile_speedup or (rule["assumed_speedup_gpu"] if on_gpu else rule["assumed_speedup_cpu"])
    step_s = meas.step_seconds
    evidence: Dict[str, Any] = {"compile_seconds": round(compile_s, 1), "speedup": speedup,
                                "measured": meas.source if meas.compile_seconds else "assumed"}
    if step_s is None:
        # FLOP estimate: tokens per step x FLOPs per token over a rate (measured GEMM or a guess).
        per_rank_batch = max(1, w.batch_size // max(1, placement.nproc_per_node))
        flops = w.flops_per_token() * w.seq_len * per_rank_batch
        rate = (meas.gemm_fp32_gflops or (rule["assumed_gflops_per_thread"] * max(1, placement.threads_per_rank))) * 1e9 * 0.5
        if on_gpu:
            rate = 100e12 * 0.3
        step_s = flops / rate
        evidence["step_seconds_estimate"] = round(step_s, 4)
    else:
        evidence["step_seconds"] = step_s
    steps = w.steps
    if steps is None:
        return Decision("compile", False, "run length unknown: compile time cannot be shown to pay for itself", evidence)
    saving = steps * step_s * (1 - 1 / speedup)
    evidence.update(steps=steps, expected_saving_seconds=round(saving, 1))
    if speedup <= 1.0:
        return Decision("compile", False, "no measured speed-up from torch.compile on this host (cpuperf bench "
                        "--compile measures it)", evidence)
    if saving > compile_s:
        return Decision("compile", True, f"{steps} steps save ~{saving:.0f} s against ~{compile_s:.0f} s of compilation",
                        evidence, needs_torch=True)
    return Decision("compile", False, f"{steps} steps would save ~{saving:.0f} s, less than ~{compile_s:.0f} s of compilation",
                    evidence)


def _decide_allocator(facts: HostFacts, meas: Measurements, on_gpu: bool) -> Decision:
    available = {}
    if facts.software is not None:
        available = {k: v for k, v in facts.software.allocators.items() if v}
    if on_gpu:
        return Decision("allocator", None, "host allocator does not matter for GPU training", {})
    if not available:
        return Decision("allocator", None, "no tcmalloc or jemalloc installed (apt-get install libgoogle-perftools4 "
                        "libjemalloc2 to let cpuperf measure them)", {})
    rule = load_builtin("tuning.toml")["allocator"]
    measured = {k: v for k, v in meas.allocator_speedup.items() if k in available and isinstance(v, (int, float))}
    if measured:
        by_workload = {k: meas.allocator_speedup.get(f"{k}_by_workload", {}) for k in measured}
        # A preload must help on average and hurt no reference workload.
        good = {k: v for k, v in measured.items()
                if v >= rule["min_speedup"] and min(by_workload[k].values() or [v]) >= rule["max_loss"]}
        evidence = {"measured": measured, "by_workload": by_workload, "source": meas.source}
        if good:
            best = max(good, key=lambda k: good[k])
            return Decision("allocator", best, f"measured {good[best]:.2f}x the default allocator (geometric mean over "
                            "the reference workloads)", evidence)
        return Decision("allocator", None, f"measured: no allocator beat the default by {rule['min_speedup']:.2f}x "
                        "without slowing a workload", evidence)
    return Decision("allocator", None, f"{', '.join(sorted(available))} installed but unmeasured on this host: a fixed "
                    "preload lost 20% here before (run cpuperf bench to measure)", {"available": sorted(available)})


def _decide_attention(w: Workload, dtype: str, gpu: Optional[Gpu]) -> Decision:
    if gpu is None:
        return Decision("attention", "sdpa", "scaled_dot_product_attention (PyTorch picks its CPU flash kernel)",
                        {"head_dim": w.head_dim})
    from cpuperf.knowledge.gpu import sdpa_constraints  # the worker's sdpa_report explains with the same rules

    why_not = sdpa_constraints("flash", dtype, w.head_dim, "cuda", _cc(gpu))
    if not why_not:
        return Decision("attention", "flash", "SDPA flash kernel: half precision, cc >= 8.0, head size "
                        f"{w.head_dim}", {"head_dim": w.head_dim})
    return Decision("attention", "mem_efficient", "SDPA memory-efficient kernel; not flash: " + "; ".join(why_not),
                    {"head_dim": w.head_dim})


def _memory_plan(facts: HostFacts, w: Workload, placement: Placement, decisions: Dict[str, Decision],
                 tuning: Mapping[str, Any], gpu: Optional[Gpu], world: int, torch_v: Optional[str]) -> List[Decision]:
    rule = tuning["memory"]
    dtype = decisions["dtype"].value
    on_gpu = gpu is not None
    budget, budget_why = memory_budget(facts, placement, "cuda" if on_gpu else "cpu", gpu)
    optimizer = "adamw"
    tv = _version(torch_v)
    opt_rule = tuning["optimizer"]
    # Same family (AdamW), fastest implementation the installed torch has: fused on CUDA and, since
    # torch 2.4, on CPU (one kernel over all parameters; ~6x faster steps measured on CPU, issue 15).
    fused_min = opt_rule["fused_cuda_min_torch" if on_gpu else "fused_cpu_min_torch"]
    if (tv is None and on_gpu) or (tv is not None and tv >= Version(fused_min)):
        optimizer, opt_why = "adamw_fused", (f"fused AdamW kernel (one kernel for all parameters; torch >= {fused_min} "
                                             f"on {'CUDA' if on_gpu else 'CPU'})")
    else:
        opt_why = (f"AdamW (foreach implementation): fused needs torch >= {fused_min}" if tv is not None
                   else "AdamW (foreach implementation): torch version unknown")
    state_bytes = w.params * rule["bytes_per_param_adamw"]
    evidence: Dict[str, Any] = {"params": w.params, "budget_bytes": budget, "budget": budget_why,
                                "weights_grads_optimizer_bytes": state_bytes}
    checkpointing = False
    per_device = max(1, math.ceil(w.batch_size / max(1, world)))
    multiple = 1
    if on_gpu:
        multiple = tuning["gpu_batch"]["fp16_tensor_core_multiple"] if dtype == "fp16" else tuning["gpu_batch"]["multiple"]
    zero = None
    if budget is not None:
        if state_bytes > budget * 0.8:
            installed = stack_has(facts, "bitsandbytes")
            if installed:
                optimizer, opt_why = "adamw_8bit", "optimizer state does not fit: 8-bit AdamW (bitsandbytes installed)"
                state_bytes = w.params * rule["bytes_per_param_adamw_8bit"]
            else:
                optimizer, opt_why = "adafactor", ("optimizer state does not fit: factored Adafactor "
                                                  "(bitsandbytes is not installed for 8-bit AdamW)")
                state_bytes = w.params * rule["bytes_per_param_adafactor"]
            evidence["weights_grads_optimizer_bytes"] = state_bytes
        free = budget - state_bytes
        act = _activation_bytes_per_sample(w, dtype, False)
        fit = int(free // act) if free > 0 else 0
        if fit < 1:
            act_ck = _activation_bytes_per_sample(w, dtype, True)
            fit_ck = int(free // act_ck) if free > 0 else 0
            if fit_ck >= 1:
                checkpointing, fit, act = True, fit_ck, act_ck
            else:
                fit = 0
        evidence.update(activation_bytes_per_sample=int(act), max_batch_that_fits=fit)
        if fit < 1:
            zero = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                          "offload_param": {"device": "cpu", "pin_memory": True}},
                    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": w.batch_size,
                    "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"}}
            per_device = 1
        elif on_gpu:
            # Largest Tensor-Core-friendly size that fits; fall back to multiples of 8, then to what fits.
            if fit >= multiple:
                cap = (fit // multiple) * multiple
            elif fit >= 8:
                cap = (fit // 8) * 8
            else:
                cap = fit
            needed = per_device
            steps_needed = max(1, math.ceil(needed / cap))
            per_device = min(cap, math.ceil(needed / steps_needed))
        else:
            per_device = min(per_device, fit)
    accum = max(1, math.ceil(w.batch_size / (per_device * max(1, world))))
    why_batch = (f"{per_device} samples per rank per step fit in {budget_why}" if budget is not None
                 else f"{per_device} samples per rank (memory unknown)")
    if on_gpu and multiple > 1:
        why_batch += f"; a multiple of {multiple} for Tensor Cores where the global batch allows"
    out = [
        Decision("batch_size", per_device, why_batch, evidence),
        Decision("grad_accum_steps", accum, f"reaches the global batch {w.batch_size} over {world} rank(s)"
                 if accum > 1 else "the global batch fits in one step", {"global_batch": w.batch_size, "world_size": world}),
        Decision("grad_checkpointing", checkpointing, "activations do not fit otherwise" if checkpointing
                 else "activations fit without recomputation", {}),
        Decision("optimizer", optimizer, opt_why, {"torch": torch_v}),
    ]
    # Data loading: the built-in corpus is in memory; workers would steal compute cores on CPU.
    spare = max(0, len(facts.usable_cpus()) - placement.threads_per_rank * placement.nproc_per_node)
    if on_gpu:
        per_gpu = tuning["dataloader"]["gpu_workers_per_gpu"]
        workers = min(per_gpu, max(0, len(facts.usable_cpus()) // max(1, placement.nproc_per_node) - 1))
        out.append(Decision("dataloader_workers", workers, f"{workers} worker(s) per GPU from the cores the process may use",
                            {"usable_cpus": len(facts.usable_cpus())}))
        out.append(Decision("pin_memory", True, "page-locked host buffers allow non-blocking copies to the GPU", {}))
    else:
        workers = min(2, spare)
        out.append(Decision("dataloader_workers", workers, "no spare cores: load data in the training process"
                            if workers == 0 else f"{spare} cores are not used for compute", {"spare_cpus": spare}))
        out.append(Decision("pin_memory", False, "no device copies on CPU training", {}))
    out.append(Decision("zero", zero, "the model does not fit even with checkpointing: DeepSpeed ZeRO-3 with CPU offload"
                        if zero else "not needed: the model fits", {}))
    return out


def stack_has(facts: HostFacts, name: str) -> bool:
    return bool(facts.software and facts.software.packages.get(name))
