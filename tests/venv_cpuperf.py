"""Which cpuperf a test venv imports: tests/run.sh runs it with the venv's Python before the suite, so a venv whose
editable cpuperf points into another (or a deleted) checkout is installed again from this one, and said, instead
of running the suite against the other code (56 tests failed with "No module named cpuperf.__main__", issue 53).

    python tests/venv_cpuperf.py CHECKOUT    exit 0: the venv imports CHECKOUT/cpuperf; 1: it does not (one line
                                             on stderr naming what it imports)
"""

from __future__ import annotations

import importlib.util
import os
import sys


def held(checkout: str) -> str:
    """'' where this interpreter imports cpuperf from `checkout`; else what it imports it from, in words."""
    # Run as a script, sys.path[0] is tests/ (not the working directory): what is found is what the venv installs.
    try:
        spec = importlib.util.find_spec("cpuperf")
    except (ImportError, ValueError) as exc:
        return f"a cpuperf that cannot be imported ({exc})"
    if spec is None or not spec.origin:
        return "no cpuperf"
    where = os.path.dirname(os.path.realpath(spec.origin))
    if where == os.path.realpath(os.path.join(checkout, "cpuperf")):
        return ""
    return f"the cpuperf of {os.path.dirname(where)}" + ("" if os.path.exists(where) else " (deleted)")


if __name__ == "__main__":
    other = held(sys.argv[1])
    if other:
        print(f"tests/run.sh: the test venv imports {other}, not this checkout's: installing this one", file=sys.stderr)
    sys.exit(1 if other else 0)
