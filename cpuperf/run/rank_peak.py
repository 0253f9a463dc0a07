"""What rank 0 of a user's own script reported of its GPU memory (cpuperf/rank_hook, asked for by
cpuperf.plan.peak_report): read back as data, bounded and checked, after the job ended."""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

from cpuperf.readback import MAX_FIGURE, count, read_json, record, text

MAX_BYTES = int(MAX_FIGURE)  # far above any card's memory
_REPORT = record({"max_allocated_bytes": count(0, MAX_BYTES), "max_reserved_bytes": count(0, MAX_BYTES),
                  "device_name": text(256)}, required=("max_allocated_bytes", "max_reserved_bytes"))


class RankPeak(NamedTuple):
    max_allocated_bytes: int
    max_reserved_bytes: int
    device_name: Optional[str]


def read_rank_peak(path: str) -> Tuple[Optional[RankPeak], Optional[str]]:
    """(rank 0's report, None) or (None, why there is none: the job wrote none, or what it wrote does not fit)."""
    try:
        data = read_json(path, limit=1 << 20)
    except FileNotFoundError:
        return None, ("rank 0 reported no GPU memory peak (it used no CUDA device, ended by a signal, or its Python "
                      "ran without site: -I, -S or -E)")
    except (OSError, ValueError) as exc:  # Unreadable, or fsutil.InputRefused (not a regular file, too big)
        return None, f"rank 0's GPU memory report {path} is unreadable: {exc}"
    why = _REPORT(data)
    if why:
        return None, f"rank 0's GPU memory report {path} is refused: {why}"
    name = data.get("device_name")
    return RankPeak(int(data["max_allocated_bytes"]), int(data["max_reserved_bytes"]),
                    name if isinstance(name, str) else None), None
