"""The installed stack and GPUs recorded beside a snapshot's /proc + /sys tree (`doctor --save-snapshot`).

A recorded host is a whole host: planning from `--sysroot SNAP` must see the torch, transformers, MPI and
allocators the live host had, or it plans another job (fused AdamW needs torch's version, for one). The
record is data from elsewhere: every field is typed here, once, and a bad one is refused with exit 2.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

from cpuperf.errors import UsageError
from cpuperf.jsonable import JsonObject, JsonValue
from cpuperf.probe.facts import Gpu, MpiLauncher, PackageInfo, Software
from cpuperf.probe.sources import Sources
from cpuperf.versions import is_version

STACK_FILE = "/.cpuperf/stack.json"
SCHEMA = "cpuperf.snapshot-stack/1"
_HINT = "record the host again: cpuperf doctor --save-snapshot DIR"


class _Bad(ValueError):
    pass


def _opt_str(value: JsonValue, field: str) -> Optional[str]:
    return None if value is None else _str(value, field)


def _str(value: JsonValue, field: str) -> str:
    if not isinstance(value, str) or len(value) > 4096 or "\0" in value:
        raise _Bad(f"{field} is not a string")
    return value


def _int(value: JsonValue, field: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**62:
        raise _Bad(f"{field} is not a non-negative integer")
    return value


def _paths(value: JsonValue, field: str) -> Dict[str, Tuple[str, ...]]:
    if not isinstance(value, dict):
        raise _Bad(f"{field} is not an object")
    return {_str(k, field): tuple(_str(p, f"{field}.{k}") for p in _list(v, f"{field}.{k}")) for k, v in value.items()}


def _list(value: JsonValue, field: str) -> List[JsonValue]:
    if not isinstance(value, list):
        raise _Bad(f"{field} is not a list")
    return value


def _package(value: JsonValue, name: str) -> Optional[PackageInfo]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Bad(f"packages.{name} is not an object")
    version = _str(value.get("version"), f"packages.{name}.version")
    if not is_version(version):
        raise _Bad(f"packages.{name}.version {version[:40]!r} is not a version")
    where = f"packages.{name}"
    return PackageInfo(version=version, local=_opt_str(value.get("local"), f"{where}.local"),
                       build=_opt_str(value.get("build"), f"{where}.build"),
                       cuda=_opt_str(value.get("cuda"), f"{where}.cuda"),
                       location=_opt_str(value.get("location"), f"{where}.location"))


def software_from_record(data: JsonValue) -> Software:
    if not isinstance(data, dict):
        raise _Bad("software is not an object")
    packages = data.get("packages")
    if not isinstance(packages, dict):
        raise _Bad("software.packages is not an object")
    mpi = tuple(MpiLauncher(name=_str(m.get("name"), "mpi.name"), path=_str(m.get("path"), "mpi.path"),
                            flavour=_opt_str(m.get("flavour"), "mpi.flavour"),
                            version=_opt_str(m.get("version"), "mpi.version"))
                for m in _list(data.get("mpi", []), "mpi") if isinstance(m, dict))
    return Software(python=_python(data.get("python")), python_abi=_str(data.get("python_abi"), "python_abi"),
                    executable=_str(data.get("executable", ""), "executable"), prefix=_str(data.get("prefix", ""), "prefix"),
                    packages={_str(k, "packages"): _package(v, k) for k, v in packages.items()}, mpi=mpi,
                    numactl=_opt_str(data.get("numactl"), "numactl"),
                    openmp=_paths(data.get("openmp", {}), "openmp"), allocators=_paths(data.get("allocators", {}), "allocators"))


def _python(value: JsonValue) -> str:
    text = _str(value, "python")
    parts = text.split(".")
    if len(parts) < 2 or not all(p.isdigit() and p.isascii() for p in parts[:2]):
        raise _Bad(f"python {text[:40]!r} is not a Python version")
    return text


def _flag(row: JsonObject, key: str, i: int) -> bool:
    value = row.get(key)
    if not isinstance(value, bool):
        raise _Bad(f"gpus[{i}].{key} is not true or false")
    return value


def _gpu(row: JsonValue, i: int) -> Gpu:
    if not isinstance(row, dict):
        raise _Bad(f"gpus[{i}] is not an object")
    bf16, tf32 = _flag(row, "bf16", i), _flag(row, "tf32", i)
    return Gpu(vendor=_str(row.get("vendor"), "vendor"), name=_str(row.get("name"), "name"),
               compute_capability=_opt_str(row.get("compute_capability"), "compute_capability"),
               memory_bytes=_int(row.get("memory_bytes"), "memory_bytes"), bf16=bf16, tf32=tf32,
               index=_int(row.get("index", i), "index") or 0,
               driver_version=_opt_str(row.get("driver_version"), "driver_version"),
               uuid=_opt_str(row.get("uuid"), "uuid"),
               memory_free_bytes=_int(row.get("memory_free_bytes"), "memory_free_bytes"),
               numa_node=_int(row.get("numa_node"), "numa_node"))


def _reject_constants(token: str) -> float:
    raise ValueError(f"{token} is not a number")


def read_record(src: Sources) -> Optional[JsonObject]:
    """The recorded stack of a snapshot (None: live host, or a tree recorded without one)."""
    if src.live:
        return None
    text = src.read(STACK_FILE)
    if text is None:
        return None
    where = f"{src.sysroot}{STACK_FILE}"
    try:
        data: JsonValue = json.loads(text, parse_constant=_reject_constants)
    except ValueError as exc:
        raise UsageError(f"recorded stack {where} is not JSON ({str(exc)[:80]})", hint=_HINT) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"recorded stack {where} is not a {SCHEMA} record", hint=_HINT)
    return data


def recorded_software(src: Sources) -> Optional[Software]:
    data = read_record(src)
    if data is None or data.get("software") is None:
        return None
    try:
        return software_from_record(data["software"])
    except _Bad as exc:
        raise UsageError(f"recorded stack {src.sysroot}{STACK_FILE}: {exc}", hint=_HINT) from None


def recorded_gpus(src: Sources) -> Optional[Tuple[Gpu, ...]]:
    data = read_record(src)
    if data is None or data.get("gpus") is None:
        return None
    try:
        return tuple(_gpu(row, i) for i, row in enumerate(_list(data["gpus"], "gpus")))
    except _Bad as exc:
        raise UsageError(f"recorded stack {src.sysroot}{STACK_FILE}: {exc}", hint=_HINT) from None


def stack_record(software: Optional[Software], gpus: Optional[Tuple[Gpu, ...]]) -> Dict[str, object]:
    """What a snapshot records beside its tree: the stack and the GPUs, as the readers above expect them."""
    import dataclasses

    return {"schema": SCHEMA, "software": dataclasses.asdict(software) if software else None,
            "gpus": [dataclasses.asdict(g) for g in gpus] if gpus is not None else None}
