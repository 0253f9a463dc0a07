"""The one judgement of a measured comparison: its effect against its own noise (issue 52).

Pure and deterministic. Two ways of measuring feed it: pairs of runs side by side (a round of `cpuperf bench`'s
ratios, a pair of the benchmark suite's head to head: one ratio per pair) and runs interleaved in time (the
tuner's rounds: every figure of each side). Either way the comparison is of logarithms, so a ratio and its
inverse are judged alike: the mean log-ratio with a Student t interval (`confidence`, two-sided), turned back into
a ratio. The comparison is measured against a bar, the value the lever must beat (1.0 for "faster", an
allocator's min_speedup; times 1 + min_gain, the smallest gain worth a change of plan). It is decided above the bar
when the whole interval lies above it, below when the whole interval lies below it, and undecided otherwise: then
the lever is named as undecided and left to the rule, and a sequential measurement (`cpuperf bench`) takes another
round until its budget ends. One fixed threshold on one side (the spread of the incumbent alone) judged an effect
seven times its noise as too noisy (issue 52: 1.59x with no overlap, dropped for a 22% spread). An interval that
holds the bar but lies wholly within `resolution` of it is decided too, as even: a difference too small to tell
from the bar is no reason to change a plan, and a sequential measurement stops there instead of at its budget.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from cpuperf.jsonable import JsonObject

ABOVE, BELOW, EVEN, UNDECIDED = "above", "below", "even", "undecided"
FIGURE_MAX = 1e6  # the largest ratio or bound cpuperf writes and reads back


@dataclass(frozen=True)
class Verdict:
    """A comparison judged: the ratio (geometric mean), its interval, the bar, how many figures, and the outcome."""

    ratio: float
    low: float
    high: float
    bar: float
    n: int  # pairs, or the smaller side's figures
    outcome: str  # above | below | even (within the resolution of the bar: no change) | undecided
    why: str = ""  # why undecided, in words; empty when decided

    @property
    def above(self) -> bool:
        return self.outcome == ABOVE

    @property
    def decided(self) -> bool:
        return self.outcome != UNDECIDED

    def to_json(self) -> JsonObject:
        # Held to what the cache's reader takes (cpuperf.decide.measurement_schema): a wide interval of a noisy pair
        # (8.5e6 seen) is as undecided at the bound, and a figure past it would drop the whole tuning when read back.
        def held(x: float) -> float:
            return round(min(max(x, 0.0), FIGURE_MAX), 4)

        return {"ratio": held(self.ratio), "low": held(self.low), "high": held(self.high),
                "bar": held(self.bar), "n": self.n, "outcome": self.outcome}


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile at probability `p` (> 0.5) with `df` degrees of freedom: exact for 1 and 2, else the
    Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5; within 0.002 of the tables from 3 degrees on)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def _verdict(mean: float, se: float, df: int, n: int, bar: float, confidence: float, short: Optional[str],
             resolution: float = 0.0) -> Verdict:
    if short is not None:
        r = math.exp(mean) if n else 0.0
        return Verdict(r, r, r, bar, n, UNDECIDED, short)
    half = t_quantile(0.5 + confidence / 2, df) * se
    low, high = math.exp(mean - half), math.exp(mean + half)
    if low > bar:
        outcome, why = ABOVE, ""
    elif high < bar:
        outcome, why = BELOW, ""
    elif resolution > 0 and bar / (1 + resolution) <= low and high <= bar * (1 + resolution):
        outcome, why = EVEN, ""
    else:
        outcome, why = UNDECIDED, f"its {confidence * 100:.0f}% interval {low:.2f}-{high:.2f} holds {bar:.2f}"
    return Verdict(math.exp(mean), low, high, bar, n, outcome, why)


def _logs(values: Sequence[float]) -> list[float]:
    return [math.log(v) for v in values if math.isfinite(v) and v > 0]


def paired(ratios: Sequence[float], bar: float, confidence: float, min_pairs: int = 2,
           resolution: float = 0.0) -> Verdict:
    """Rounds of the two sides side by side, one ratio (a / b) per round: judged against `bar`."""
    logs = _logs(ratios)
    n = len(logs)
    mean = statistics.fmean(logs) if logs else 0.0
    short = (f"only {n} of the {max(2, min_pairs)} pairs it needs" if n < max(2, min_pairs) else None)
    se = statistics.stdev(logs) / math.sqrt(n) if n > 1 else 0.0
    return _verdict(mean, se, n - 1, n, bar, confidence, short, resolution)


def interleaved(a: Sequence[float], b: Sequence[float], bar: float, confidence: float, min_each: int = 2,
                resolution: float = 0.0) -> Verdict:
    """Every figure of side a and of side b, taken interleaved in time: a / b judged against `bar` (Welch's
    interval on the logarithms: the two sides may be as noisy as they like, each counts with its own spread)."""
    la, lb = _logs(a), _logs(b)
    n = min(len(la), len(lb))
    if n < max(2, min_each):
        mean = statistics.fmean(la) - statistics.fmean(lb) if la and lb else 0.0
        return _verdict(mean, 0.0, 1, n, bar, 0.0, f"only {n} figure(s) on a side, of the {max(2, min_each)} it needs")
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    se = math.sqrt(va + vb)
    # Welch-Satterthwaite degrees of freedom, rounded down (the smaller, the wider: never narrower than it is)
    df = (max(1, math.floor((va + vb) ** 2 / (va ** 2 / (len(la) - 1) + vb ** 2 / (len(lb) - 1))))
          if va + vb > 0 else len(la) + len(lb) - 2)
    return _verdict(statistics.fmean(la) - statistics.fmean(lb), se, df, n, bar, confidence, None, resolution)


def bar_for(threshold: float, min_gain: float = 0.0) -> float:
    """The value a comparison must clear: the threshold its decision flips at, raised by the minimum gain."""
    return threshold * (1 + min_gain)
