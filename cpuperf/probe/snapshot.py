"""`doctor --save-snapshot DIR`: copy exactly the files the probe reads, for a bug report."""

from __future__ import annotations

import os
import shutil
from typing import Mapping, Optional, Set

from cpuperf.probe.sources import Sources


class RecordingSources(Sources):
    """Sources that remember every file path that was successfully read or found."""

    def __init__(self, sysroot: Optional[str] = None, environ: Optional[Mapping[str, str]] = None):
        super().__init__(sysroot=sysroot, environ=environ)
        self.files: Set[str] = set()

    def read(self, path: str) -> Optional[str]:
        text = super().read(path)
        if text is not None:
            self.files.add(path)
        return text

    def exists(self, path: str) -> bool:
        found = super().exists(path)
        if found and os.path.isfile(self.path(path)):
            self.files.add(path)
        return found


def save_snapshot(dest: str, environ: Optional[Mapping[str, str]] = None,
                  sysroot: Optional[str] = None, python: Optional[str] = None) -> int:
    """Probe through a RecordingSources and copy what it read under dest. Returns the file count."""
    from cpuperf.probe import parse
    from cpuperf.probe.cpu import probe_cpu
    from cpuperf.probe.topology import cgroup_memory_limit, probe_topology

    src = RecordingSources(sysroot=sysroot, environ=environ)
    blocks = parse.parse_cpuinfo(src.read("/proc/cpuinfo") or "")
    probe_cpu(src, blocks)
    probe_topology(src, blocks)
    cgroup_memory_limit(src)
    src.read("/proc/meminfo")
    from cpuperf.probe.load import probe_load

    probe_load(src, window_s=0)  # /proc/loadavg and the pressure file, as recorded figures
    count = 0
    for path in sorted(src.files):
        target = os.path.join(dest, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            # /proc and /sys files report size 0: copy their contents, not their metadata.
            with open(src.path(path), "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            count += 1
        except OSError:
            continue
    return count + _save_stack(dest, src, python)


def _save_stack(dest: str, src: RecordingSources, python: Optional[str]) -> int:
    """The installed stack and GPUs beside the tree (probe/recorded.py), so `--sysroot DEST` plans exactly like
    this host. A snapshot of a snapshot copies the record it has."""
    import json

    from cpuperf.probe.gpus import probe_gpus
    from cpuperf.probe.recorded import STACK_FILE, stack_record
    from cpuperf.probe.software import probe_software

    record = stack_record(probe_software(src, python), probe_gpus(src))
    if record["software"] is None and record["gpus"] is None:
        return 0
    target = os.path.join(dest, STACK_FILE.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
    return 1

