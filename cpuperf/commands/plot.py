"""`cpuperf plot RUN_DIR`: a picture of a run's loss and samples/s (also drawn at the end of `cpuperf train`)."""

from __future__ import annotations

from cpuperf.errors import ExitCode, FilesystemError
from cpuperf.output import Output


def run(out: Output, run_dir: str, out_dir: str | None) -> int:
    from cpuperf.render.plot import plot_run

    result = plot_run(run_dir, out_dir)
    if out.json_mode:
        out.json(result)
    else:
        if not result["png"]:
            out.info("plot: matplotlib is not importable, so no plot.png (pip install -e '.[bench]'); plot.svg drawn")
        out.product("\n".join(result["files"]))
    return int(ExitCode.OK)


__all__ = ["run", "FilesystemError"]
