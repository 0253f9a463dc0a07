"""NVIDIA GPUs: NVML (nvidia-ml-py) in a child process, `nvidia-smi` as fallback.

The probe runs in a subprocess with a timeout: a wedged driver must not hang cpuperf.
No GPU, no driver and no NVML are normal answers (an empty list), never errors.
"""

from __future__ import annotations

import json
import sys
from typing import Dict, Optional, Tuple

from cpuperf.errors import UsageError
from cpuperf.jsonable import JsonValue
from cpuperf.probe import parse
from cpuperf.probe.facts import Gpu
from cpuperf.probe.sources import Sources
from cpuperf.versions import int_pair

# Ampere (compute capability 8.0) brought bf16 and TF32 Tensor Cores.
# Source: NVIDIA Ampere architecture whitepaper; CUDA C Programming Guide, "Compute Capabilities".
AMPERE_CC = (8, 0)

_NVML_SCRIPT = r"""
import json, sys
try:
    import pynvml as nv
except Exception:
    sys.exit(3)
try:
    nv.nvmlInit()
except Exception:
    sys.exit(4)
out = []
driver = nv.nvmlSystemGetDriverVersion()
driver = driver.decode() if isinstance(driver, bytes) else driver
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    name = nv.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else name
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    uuid = nv.nvmlDeviceGetUUID(h)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    try:
        bus = nv.nvmlDeviceGetPciInfo(h).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
    except Exception:
        bus = None
    out.append({"index": i, "name": name, "cc": f"{major}.{minor}", "memory_bytes": int(mem.total),
                "free_bytes": int(mem.free), "driver_version": driver, "uuid": uuid, "pci_bus_id": bus})
print(json.dumps(out))
"""


def cc_at_least(cc: Optional[str], wanted: Tuple[int, int]) -> bool:
    pair = int_pair(cc) if cc else None
    return pair is not None and pair >= wanted


def make_gpu(index: int, name: str, cc: Optional[str], memory_bytes: Optional[int],
             driver_version: Optional[str] = None, uuid: Optional[str] = None,
             memory_free_bytes: Optional[int] = None, numa_node: Optional[int] = None) -> Gpu:
    ampere = cc_at_least(cc, AMPERE_CC)
    return Gpu(vendor="nvidia", name=name, compute_capability=cc, memory_bytes=memory_bytes,
               bf16=ampere, tf32=ampere, index=index, driver_version=driver_version, uuid=uuid,
               memory_free_bytes=memory_free_bytes, numa_node=numa_node)


def pci_numa_node(src: Sources, bus_id: Optional[str]) -> Optional[int]:
    """The NUMA node of a PCI device from sysfs (NVML's busId '00000000:17:00.0' is sysfs' '0000:17:00.0');
    -1 (no NUMA affinity reported) and anything unreadable are None."""
    if not bus_id or len(bus_id) < 12:
        return None
    raw = src.read_first_line(f"/sys/bus/pci/devices/{bus_id[-12:].lower()}/numa_node")
    node = parse.int_auto(raw) if raw is not None else None
    return node if node is not None and node >= 0 else None


def _opt_int(value: JsonValue) -> Optional[int]:
    return None if value is None else _int(value)


# A GPU's numbers, as an override or a recorded answer may give them: (least, most). A card of -1 bytes planned
# (issue 62); 2**60 bytes is far above any card.
_GPU_RANGES = {"index": (0, 4095), "memory_bytes": (1, 1 << 60), "memory_free_bytes": (0, 1 << 60),
               "free_bytes": (0, 1 << 60), "numa_node": (-1, 4095)}
# The keys of doctor's `gpus` shape and of the NVML child's rows: an override naming another (`memory_total`) is
# refused, not read as a card of unknown memory.
GPU_KEYS = frozenset({"vendor", "name", "compute_capability", "memory_bytes", "bf16", "tf32", "index",
                      "driver_version", "uuid", "memory_free_bytes", "numa_node", "cc", "free_bytes", "pci_bus_id"})


def _in_range(row: Dict[str, JsonValue], key: str) -> Optional[int]:
    """row[key] as a whole number within _GPU_RANGES (None when absent; numa_node -1, sysfs' "none", is None)."""
    value = _opt_int(row.get(key))
    low, high = _GPU_RANGES[key]
    if value is not None and not low <= value <= high:
        raise ValueError(f"{key} {value} is not in {low}..{high}")
    return None if value is None or (key == "numa_node" and value < 0) else value


def _int(value: JsonValue) -> int:
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"{json.dumps(value)[:40]} is not a number")
    return int(value)


def _opt_text(value: JsonValue) -> Optional[str]:
    return None if value is None else str(value)


def gpu_from_row(row: JsonValue, default_index: int = 0) -> Gpu:
    """One GPU from doctor's `gpus` shape or from the NVML child's row ('cc', 'free_bytes')."""
    if not isinstance(row, dict):
        raise TypeError("a GPU is not an object")
    cc = row.get("compute_capability", row.get("cc"))
    free = _in_range(row, "memory_free_bytes" if "memory_free_bytes" in row else "free_bytes")
    index = _in_range(row, "index")
    return make_gpu(default_index if index is None else index, str(row.get("name", "NVIDIA GPU")),
                    _opt_text(cc), _in_range(row, "memory_bytes"),
                    _opt_text(row.get("driver_version")), _opt_text(row.get("uuid")), free,
                    _in_range(row, "numa_node"))


def gpus_from_json(text: str) -> Tuple[Gpu, ...]:
    """CPUPERF_OVERRIDE_GPUS: a JSON list in doctor's `gpus` shape or a recorded NVML answer ('[]' = none)."""
    try:
        rows: JsonValue = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError("not a list")
        for row in rows:
            unknown = sorted(set(row) - GPU_KEYS) if isinstance(row, dict) else []
            if unknown:
                raise ValueError(f"unknown key {unknown[0][:40]!r}; known: {', '.join(sorted(GPU_KEYS))}")
        return tuple(gpu_from_row(row, i) for i, row in enumerate(rows))
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError, OverflowError) as exc:
        raise UsageError(f"CPUPERF_OVERRIDE_GPUS is not a JSON list of GPUs ({exc})",
                         hint='e.g. CPUPERF_OVERRIDE_GPUS=\'[{"name": "NVIDIA A100", "compute_capability": "8.0", "memory_bytes": 85899345920}]\'') from exc


def _maybe_nvidia(src: Sources) -> bool:
    """Cheap signs of an NVIDIA driver, so hosts without one never pay for a subprocess."""
    return (src.exists("/proc/driver/nvidia/version") or src.exists("/dev/nvidiactl")
            or src.which("nvidia-smi") is not None)


def probe_gpus(src: Sources) -> Optional[Tuple[Gpu, ...]]:
    """The host's NVIDIA GPUs; None for a snapshot (unknown), () when there are none."""
    override = src.override("gpus")
    if override is not None:
        return gpus_from_json(override) if override.strip() else ()
    if not src.live:
        from cpuperf.probe.recorded import recorded_gpus

        return recorded_gpus(src)  # None (unknown) unless the snapshot recorded them
    if not _maybe_nvidia(src):
        return ()
    result = src.run([sys.executable, "-I", "-c", _NVML_SCRIPT], timeout=10.0)
    if result is not None and result.returncode == 0:
        try:
            found: JsonValue = json.loads(result.stdout)
            nvml = [entry for entry in found if isinstance(entry, dict)] if isinstance(found, list) else []
            if not isinstance(found, list) or len(nvml) != len(found):
                raise TypeError("not a list of GPUs")
            for entry in nvml:  # the GPU's NUMA node: where its rank's CPUs and memory belong
                bus = entry.get("pci_bus_id")
                entry.setdefault("numa_node", pci_numa_node(src, bus if isinstance(bus, str) else None))
            return tuple(gpu_from_row(r, i) for i, r in enumerate(nvml))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    smi = src.which("nvidia-smi")
    if smi is None:
        return ()
    result = src.run([smi, "--query-gpu=index,name,memory.total,driver_version,compute_cap,uuid,memory.free",
                      "--format=csv,noheader,nounits"], timeout=10.0)
    if result is None or result.returncode != 0:
        return ()
    gpus = []
    for row in parse.parse_nvidia_smi_csv(result.stdout):
        mib = parse.int_auto(row.get("memory_mib"))
        free_mib = parse.int_auto(row.get("memory_free_mib"))
        cc = row.get("compute_cap")
        gpus.append(make_gpu(parse.int_auto(row.get("index")) or 0, row.get("name", "NVIDIA GPU"),
                             cc if cc and cc[0].isdigit() else None,
                             mib * 1024 * 1024 if mib else None, row.get("driver_version"),
                             row.get("uuid"), free_mib * 1024 * 1024 if free_mib is not None else None))
    return tuple(gpus)
