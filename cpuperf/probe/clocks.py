"""The CPU's clocks as the OS reports them now: nominal (cpufreq's highest, else the model name's) and
measured ('cpu MHz' of /proc/cpuinfo), with the model name and the microarchitecture the MFU peak is
looked up by (knowledge/cpu_peaks.py). The text parsers are pure; `read_clocks` reads the files."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from cpuperf.probe.sources import Sources

CPUINFO = "/proc/cpuinfo"
MAX_FREQ = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"

_GHZ_IN_NAME = re.compile(r"@\s*([0-9.]+)\s*GHz", re.I)


def nominal_clock_hz(cpuinfo: Optional[str], max_freq_khz: Optional[str]) -> Tuple[Optional[float], str]:
    """(Hz, where from): cpufreq's cpuinfo_max_freq (the highest clock the part runs), else the clock in
    the model name ('@ 2.60GHz', Intel's base clock); (None, ...) where neither says."""
    if max_freq_khz and max_freq_khz.strip().isdigit():
        return int(max_freq_khz.strip()) * 1e3, "cpufreq cpuinfo_max_freq"
    for line in (cpuinfo or "").splitlines():
        if line.lower().startswith("model name"):
            m = _GHZ_IN_NAME.search(line)
            if m:
                return float(m.group(1)) * 1e9, "the model name"
            break
    return None, "unknown"


def measured_clock_hz(cpuinfo: Optional[str], cpus: Optional[Sequence[int]] = None) -> Optional[float]:
    """The mean 'cpu MHz' /proc/cpuinfo reports for these CPUs now (all of them by default), in Hz."""
    rates: List[float] = []
    cpu: Optional[int] = None
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        try:
            if key == "processor":
                cpu = int(value)
            elif key == "cpu mhz" and (cpus is None or cpu in cpus):
                rates.append(float(value) * 1e6)
        except ValueError:
            continue
    return statistics.fmean(rates) if rates else None


def model_name(cpuinfo: Optional[str]) -> Optional[str]:
    """The first 'model name' of /proc/cpuinfo, None without one."""
    return next((l.partition(":")[2].strip() for l in (cpuinfo or "").splitlines() if l.lower().startswith("model name")),
                None)


@dataclass(frozen=True)
class Clocks:
    """This host's clocks and CPU name, read at one moment."""

    nominal_hz: Optional[float]
    nominal_from: str
    measured_hz: Optional[float]
    model_name: Optional[str]

    @property
    def best_hz(self) -> Optional[float]:
        """The nominal clock, else the measured one."""
        return self.nominal_hz or self.measured_hz


def read_clocks(cpus: Optional[Sequence[int]] = None, src: Optional[Sources] = None) -> Clocks:
    """The clocks now: `cpus` limits the measured mean to those CPUs (all by default); `src` another host."""
    src = src if src is not None else Sources()
    cpuinfo = src.read(CPUINFO)
    nominal, nominal_from = nominal_clock_hz(cpuinfo, src.read(MAX_FREQ))
    return Clocks(nominal, nominal_from, measured_clock_hz(cpuinfo, cpus), model_name(cpuinfo))


def cpu_is_guest() -> bool:
    """This CPU runs a virtual machine's guest (the `hypervisor` flag, or CPUPERF_OVERRIDE_HYPERVISOR), as the probe
    says: its /proc/cpuinfo clock is then the host's TSC rate, not what the cores run at."""
    try:
        from cpuperf.probe import probe_host

        return "hypervisor" in probe_host(software=False).cpu.flags
    except Exception:  # the report must never stop training
        return False


def cpu_microarchitecture() -> str:
    """This CPU's microarchitecture, as cpuperf's probe names it ('unknown' when it cannot tell)."""
    try:
        from cpuperf.probe import probe_host

        return probe_host(software=False).cpu.microarchitecture
    except Exception:  # the report must never stop training
        return "unknown"
