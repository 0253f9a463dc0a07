"""Console entry point. `cpuperf ccl-env` runs without importing typer: it runs in every new shell.

Everything else, and every error (the fast path's included), goes through cli.main, the one error
boundary: an exception here is handed to it to be reported exactly as any other command's.
"""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """`cpuperf` console script and `python -m cpuperf` (argv None: this process's own command line, which ends when
    this returns); a caller in a process that goes on gives `argv`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["train"]:  # it plans with the collector paused from here, typer's import included (cli.train)
        from cpuperf.run.timeline import collector_paused

        with collector_paused():
            code = _main(args)
    else:
        code = _main(args)
    if argv is None:
        _ending()
    return code


def _ending() -> None:
    """The process ends with this command: Python's shutdown walks every object left for cycles to collect, 20-60 ms
    after a `train` on a 2-CPU host (all of cpuperf's modules, the plan, the compat tables), between the job's last
    line and the prompt. Frozen (gc.freeze), they are left to the OS as the process exits; atexit handlers still run,
    and stdout and stderr are still flushed."""
    import gc

    gc.freeze()


def _main(args: List[str]) -> int:
    if args[:1] == ["ccl-env"]:
        from cpuperf.output import guard_std_streams

        guard_std_streams()  # a closed stdout is /dev/null before anything is opened (cpuperf.output)
        try:
            import os

            from cpuperf.commands import ccl_env as cclenv
            from cpuperf.output import Output

            if os.environ.get("CPUPERF_COMPAT_DIR") and "--help" not in args and "-h" not in args:
                from cpuperf.knowledge.matrix import check_env_dir  # exit 6 here as under every command
                check_env_dir()

            opts, json_out, quiet = cclenv.parse_args(args[1:])
            return cclenv.run(Output(json_mode=json_out, quiet=quiet), opts)
        except (Exception, KeyboardInterrupt) as exc:
            from cpuperf import cli
            return cli.main(args, _pending=exc)
    from cpuperf import cli
    return cli.main(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
