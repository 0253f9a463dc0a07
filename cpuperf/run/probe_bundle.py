"""cpuperf's probe as ONE self-contained `python -c` program, built from the package's own modules.

A compute node may have no cpuperf (or no packages at all). The bundle carries the real probe modules
(cpuperf/probe/*.py, errors.py, data.py, fsutil.py, versions.py, jsonable.py, readback.py) and the data files they read (compat/microarch.toml,
tuning.toml); on the node it writes them to a private temporary directory, runs
`cpuperf.probe.node.main`, and removes the directory. Nothing is duplicated: the parsers and the
microarchitecture table the node runs are the ones this host runs. It needs only Python (3.9+, the
package's floor); an older Python still reports its version, in a marked error line.
"""

from __future__ import annotations

import base64
import functools
import json
import zlib
from pathlib import Path
from typing import Dict, List

from cpuperf.data import builtin_compat_dir

# The package files the probe imports (a test runs the bundle under `python -I` from an empty
# directory, so a module missing here fails there, not on a cluster).
_PACKAGE_FILES = ("__init__.py", "errors.py", "data.py", "fsutil.py", "versions.py", "jsonable.py", "readback.py")
_DATA_FILES = ("microarch.toml", "tuning.toml")

# Runs on the node. Python 3-only syntax kept minimal so even an old python3 gets far enough to say
# which version it is. Reads the payload B, then hands argv to cpuperf.probe.node.main.
_BOOTSTRAP = r'''
import base64, json, os, shutil, sys, tempfile, zlib, platform
M = "CPUPERF-NODE-ERROR:"
if sys.version_info < (3, 9):
    print(M + " Python %s at %s is older than cpuperf's floor (3.9)" % (platform.python_version(), sys.executable))
    sys.exit(3)
d = tempfile.mkdtemp(prefix="cpuperf-probe-")
try:
    for rel, text in json.loads(zlib.decompress(base64.b64decode(B)).decode("utf-8")).items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    try:
        import tomllib
    except ImportError:
        try:
            import tomli
        except ImportError:  # the data also travels as JSON: a stand-in parser reads that
            with open(os.path.join(d, "tomli.py"), "w") as fh:
                fh.write("import json\nclass TOMLDecodeError(ValueError): pass\n"
                         "def load(fh):\n    with open(fh.name + '.json') as j:\n        return json.load(j)\n")
    sys.path.insert(0, d)
    from cpuperf.probe.node import main
    rc = main(sys.argv[1:])
except Exception as exc:
    print(M + " %s: %s (Python %s)" % (type(exc).__name__, exc, platform.python_version()))
    rc = 4
finally:
    shutil.rmtree(d, ignore_errors=True)
sys.exit(rc)
'''


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def bundle_files() -> Dict[str, str]:
    """Relative path -> text of every file the node needs."""
    root = _package_root()
    files = {f"cpuperf/{name}": (root / name).read_text(encoding="utf-8") for name in _PACKAGE_FILES}
    for path in sorted((root / "probe").glob("*.py")):
        files[f"cpuperf/probe/{path.name}"] = path.read_text(encoding="utf-8")
    from cpuperf.data import load_builtin

    compat = builtin_compat_dir()
    for name in _DATA_FILES:
        files[f"cpuperf/compat/{name}"] = (compat / name).read_text(encoding="utf-8")
        files[f"cpuperf/compat/{name}.json"] = json.dumps(load_builtin(name))
    return files


@functools.lru_cache(maxsize=1)
def bundle_code() -> str:
    """The `python -c` program: the bootstrap with the compressed files inline (base64: shell-safe)."""
    payload = zlib.compress(json.dumps(bundle_files(), sort_keys=True).encode("utf-8"), 9)
    return "B = %r\n%s" % (base64.b64encode(payload).decode("ascii"), _BOOTSTRAP)


def probe_args(name: str, master: str, load_window_s: float = 0.1) -> List[str]:
    """The arguments the bundle's main() reads (the interpreter is added by the launch script)."""
    return ["--name", name, "--master", master, "--load-window", f"{load_window_s:g}"]
