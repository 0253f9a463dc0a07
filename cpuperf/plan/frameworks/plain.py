"""A plain PyTorch script (and a DDP or accelerate one): threads, placement and the allocator reach it from outside;
the dtype does not (autocast is a line of its code, and changes its math: the user's). Where the plan finds bf16
paying on this host and the source shows no autocast, the plan says the measured gain and the one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cpuperf.knowledge.script_parsers import HELP, ScriptParser
from cpuperf.plan.frameworks import Reach
from cpuperf.plan.script_args import ScriptArgs
from cpuperf.plan.script_source import ScriptSource

AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.cpu.amp.autocast", "torch.cuda.amp.autocast")
AUTOCAST_LINE = "with torch.autocast(device_type=\"cpu\", dtype=torch.bfloat16):  # around the forward and the loss"


def argparse_parser(source: ScriptSource) -> ScriptParser:
    """The script's own argparse options (its add_argument calls), or no parser where it makes none."""
    if not source.arguments and not source.unread_arguments:
        return ScriptParser("none", why="the script adds no command-line option")
    complete = not source.unread_arguments
    return ScriptParser("argparse", (HELP, *source.arguments), abbrev=True, complete=complete,
                        why="its add_argument calls" if complete else "an add_argument call cpuperf cannot read")


@dataclass(frozen=True)
class Plain:
    name: str = "plain"
    title: str = "a PyTorch script"

    def recognises(self, source: ScriptSource) -> bool:
        return True

    def parser(self, source: ScriptSource) -> ScriptParser:
        return argparse_parser(source)

    def dtype(self, source: ScriptSource, args: ScriptArgs, dtype: str, why: str) -> Optional[Reach]:
        if dtype not in ("bf16", "fp16") or not source.read or source.calls_any(*AUTOCAST):
            return None
        device = "cuda" if dtype == "fp16" else "cpu"
        line = AUTOCAST_LINE.replace("bfloat16", "float16" if dtype == "fp16" else "bfloat16").replace('"cpu"',
                                                                                                   f'"{device}"')
        return Reach("dtype", dtype, why=f"{why}; autocast changes the math, so it is your line to add: {line}",
                     applied=False)


PLAIN = Plain()
