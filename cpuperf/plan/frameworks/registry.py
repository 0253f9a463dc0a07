"""The adapters, most specific first; `plain` recognises every script and comes last."""

from __future__ import annotations

from typing import Tuple

from cpuperf.plan.frameworks import Framework
from cpuperf.plan.frameworks.hf_trainer import HF_TRAINER
from cpuperf.plan.frameworks.lightning import LIGHTNING
from cpuperf.plan.frameworks.plain import PLAIN

FRAMEWORKS: Tuple[Framework, ...] = (HF_TRAINER, LIGHTNING, PLAIN)
