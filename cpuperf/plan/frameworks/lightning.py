"""Lightning (`lightning`, `lightning.pytorch`, `pytorch_lightning`): its Trainer takes every __init__ argument the
script does not pass from a `PL_TRAINER_<ARG>` environment variable (lightning/pytorch/utilities/argparse.py
`_defaults_from_env_vars` on Trainer.__init__, kwargs the script passes win; compat/frameworks.toml [lightning]);
a LightningCLI script takes `--trainer.precision` on its command line (jsonargparse), where an environment default
would be overridden by the CLI's own explicit default. The batch is the script's code's (its DataLoader or
DataModule): cpuperf never splits it into ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Optional

from cpuperf.knowledge.frameworks import lightning_rule
from cpuperf.knowledge.script_parsers import ScriptParser
from cpuperf.plan.frameworks import Reach
from cpuperf.plan.script_args import ScriptArgs
from cpuperf.plan.script_source import ScriptSource

_PACKAGES = ("lightning", "pytorch_lightning")


def _trainers() -> FrozenSet[str]:
    """Lightning's Trainer as a resolved callee, every import path it is published under."""
    return frozenset(f"{p}.Trainer" for p in lightning_rule().trainer_paths)


def _clis() -> FrozenSet[str]:
    return frozenset(f"{p}.LightningCLI" for p in lightning_rule().cli_paths)


@dataclass(frozen=True)
class Lightning:
    name: str = "lightning"
    title: str = "a Lightning script"

    def recognises(self, source: ScriptSource) -> bool:
        return source.read and source.imports(*_PACKAGES) and (source.calls_any(*_trainers()) or self.cli(source))

    def cli(self, source: ScriptSource) -> bool:
        return source.calls_any(*_clis())

    def parser(self, source: ScriptSource) -> ScriptParser:
        if self.cli(source):
            # jsonargparse: --trainer.precision, --data.batch_size, --config; its whole table is built at run time
            # from the classes' signatures, so only options written in full are read
            return ScriptParser("lightning-cli", abbrev=False, complete=False,
                                why="LightningCLI builds its options from the classes' signatures at run time")
        return ScriptParser("none", why="the script builds its Trainer in code")

    def dtype(self, source: ScriptSource, args: ScriptArgs, dtype: str, why: str) -> Optional[Reach]:
        rule = lightning_rule()
        value = rule.precision.get(dtype)
        if value is None:
            return None  # fp32: Lightning's own default
        if self.cli(source):
            option = rule.cli_precision_option
            given = [w for w in args.args if w.split("=", 1)[0] in (option, *rule.cli_config_options)]
            if given:
                return Reach("dtype", value, why=f"your command gives {given[0].split('=', 1)[0]} (it decides the "
                             "precision: yours)", applied=False)
            return Reach("dtype", value, flags=(option, value), why=f"{why} (LightningCLI's --trainer.precision)")
        passed = source.keywords_of(*_trainers())
        if "precision" in passed:
            return Reach("dtype", value, why="your script passes precision= to its Trainer: yours", applied=False)
        if "**" in passed:
            return Reach("dtype", value, why="your script unpacks a mapping into its Trainer (it may hold precision): "
                         "left to it", applied=False)
        variable = rule.precision_env
        return Reach("dtype", value, env=((variable, value),),
                     why=f"{why} (Lightning's Trainer reads {variable} for the precision your script does not pass)")


LIGHTNING = Lightning()
