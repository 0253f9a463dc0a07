"""`cpuperf compat`: show the matrix, resolve a stack, or explain why a version does not fit."""

from __future__ import annotations

import re
import sys
from typing import Optional

from cpuperf.errors import BadDataError, ExitCode, UsageError
from cpuperf.output import Output


def _this_python() -> str:
    gil_enabled = getattr(sys, "_is_gil_enabled", None)  # 3.13+: False on a free-threaded build
    ft = "t" if gil_enabled is not None and not gil_enabled() else ""
    return f"{sys.version_info.major}.{sys.version_info.minor}{ft}"


def run(out: Output, python: Optional[str], torch: Optional[str], with_: Optional[str],
        why_not: Optional[str], platform: Optional[str]) -> int:
    """Dispatch to the table, the resolver or why_not; map data/input errors to CpuperfError."""
    from cpuperf.knowledge.matrix import MatrixError, default_matrix
    from cpuperf.knowledge.resolve import SCHEMA, ResolveError, resolve
    from cpuperf.knowledge.resolve import why_not as explain
    from cpuperf.render import compat as compat_cmd

    try:
        matrix = default_matrix()
    except MatrixError as exc:
        raise BadDataError(str(exc), hint="fix the listed rows, or unset CPUPERF_COMPAT_DIR") from exc
    from cpuperf.probe.wheel_platform import wheel_platform

    plat = platform or wheel_platform()
    try:
        if why_not is not None:
            m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*(\S+)\s*$", why_not)
            if not m:
                raise UsageError(f"--why-not expects PKG==VERSION, got {why_not!r}",
                                 hint="cpuperf compat --why-not oneccl_bind_pt==1.12.0 --torch 1.12.1")
            py = python or _this_python()
            reasons = explain(m.group(1), m.group(2), py, torch, matrix, platform=plat)
            if out.json_mode:
                out.json({"schema": SCHEMA, "package": m.group(1), "version": m.group(2), "python": py,
                          "torch": torch, "platform": plat, "fits": not reasons, "reasons": reasons})
            elif reasons:
                out.product("\n".join(f"- {r}" for r in reasons))
            else:
                out.product(f"{m.group(1)}=={m.group(2)} fits Python {py}" + (f" and torch {torch}" if torch else ""))
            return int(ExitCode.FOUND_ERROR) if reasons else int(ExitCode.OK)

        if python is None and torch is None and not with_:
            if out.json_mode:
                out.json({"schema": SCHEMA, "addons": compat_cmd.matrix_rows(matrix),
                          "torch": compat_cmd.torch_rows(matrix)})
            else:
                out.table(compat_cmd.matrix_table(matrix))
            return int(ExitCode.OK)

        res = resolve(python or _this_python(), torch, with_ or frozenset(), platform=plat, matrix=matrix)
    except ResolveError as exc:
        raise UsageError(str(exc), hint="cpuperf compat --python 3.11 --torch 2.7.0 --with ipex,oneccl") from exc
    if out.json_mode:
        out.json(res.to_json())
    else:
        out.product("\n".join(compat_cmd.resolution_lines(res)))
    return int(ExitCode.OK) if res.ok else int(ExitCode.INCOMPATIBLE_HOST)
