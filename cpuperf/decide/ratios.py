"""When a measured ratio decides a lever: the figure the decision reads, taken as rounds of two runs side by side.

Pure. A shared host's load falls on both runs of a round alike (they run back to back, in alternating order), so
the ratio of a round holds where either figure alone would not (a busy 2-core host halved the fp32 GEMM rate from
one second to the next). Each round is a pair, judged by the one judgement (cpuperf.decide.judge.paired): a ratio
decides once it has `min_rounds` rounds and its interval lies wholly on one side of the value where the decision
flips (bf16 at 1.0x fp32, an allocator at min_speedup); one still undecided when the time budget ends is named, and
the rule decides.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Tuple

from cpuperf.decide.judge import Verdict, paired
from cpuperf.jsonable import JsonObject


@dataclass(frozen=True)
class Ratio:
    """One measured ratio: `name` in words, the value where its decision flips, and one figure per round."""

    name: str
    threshold: float
    rounds: Tuple[float, ...] = ()

    def add(self, value: float) -> Ratio:
        return replace(self, rounds=(*self.rounds, value))

    @property
    def median(self) -> float:
        return statistics.median(self.rounds) if self.rounds else 0.0

    @property
    def spread(self) -> float:
        """(max - min) / median of the rounds: 0 for one round."""
        med = self.median
        return (max(self.rounds) - min(self.rounds)) / med if len(self.rounds) > 1 and med > 0 else 0.0

    def verdict(self, min_rounds: int, confidence: float, resolution: float = 0.0) -> Verdict:
        """The rounds as pairs against the threshold (cpuperf.decide.judge)."""
        return paired(self.rounds, self.threshold, confidence, min_rounds, resolution)

    def decided(self, min_rounds: int, confidence: float, resolution: float = 0.0) -> bool:
        return self.verdict(min_rounds, confidence, resolution).decided

    def describe(self) -> str:
        """'0.91x (0.88-0.95 over 4 rounds)'."""
        if not self.rounds:
            return "not measured"
        return (f"{self.median:.2f}x ({min(self.rounds):.2f}-{max(self.rounds):.2f} over {len(self.rounds)} "
                f"round{'s' if len(self.rounds) != 1 else ''})")

    def to_json(self, min_rounds: int, confidence: float, resolution: float = 0.0) -> JsonObject:
        v = self.verdict(min_rounds, confidence, resolution)
        return {"name": self.name, "median": round(self.median, 4), "rounds": [round(r, 4) for r in self.rounds],
                "spread": round(self.spread, 4), "threshold": self.threshold, "decided": v.decided,
                "verdict": v.to_json()}


def alternating(names: Tuple[str, ...], round_no: int) -> Tuple[str, ...]:
    """The order a round runs its sides in: as given, then reversed, and so on (ABBA), so a load that rises or
    falls through a round favours neither side over the rounds."""
    return names if round_no % 2 == 0 else tuple(reversed(names))
