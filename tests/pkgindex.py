"""Packages without the registry: tiny wheels with correct metadata, a PEP 503 index over loopback, venvs, and
cpuperf run against them with pip isolated from this machine's configuration (tests/test_install.py,
tests/test_install_transaction.py; the `index`, `pip_home` and `torch26_venv` fixtures are in conftest.py).

pip is isolated from this machine's configuration (PIP_CONFIG_FILE=/dev/null, no PIP_* variables, a private
cache), so nothing here can reach the public registry or pull a real torch.
"""

from __future__ import annotations

import atexit
import base64
import csv
import functools
import hashlib
import http.server
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import pytest
from cli_util import cli_env, run_in_process

REPO = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- wheels

FAKE_TORCH = '__version__ = "{version}"\n'
# Like IPEX: the import refuses a torch of another minor version and ends the process (exit 127).
FAKE_IPEX = '''import os, sys, torch
__version__ = "{version}"
if torch.__version__.split("+")[0].rsplit(".", 1)[0] != "{minor}":
    print("ERROR! Intel Extension for PyTorch needs torch {minor}.*, found " + torch.__version__, file=sys.stderr)
    os._exit(127)
'''
BROKEN_IPEX = 'import os\nos._exit(127)\n'


def build_wheel(dest: Path, name: str, version: str, files: Dict[str, Any], requires: Iterable[str] = (),
                extra_paths: Dict[str, str] = None) -> Path:
    """A pure-python wheel with correct METADATA, WHEEL and RECORD."""
    dist = name.replace("-", "_")
    di = f"{dist}-{version}.dist-info"
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    contents = dict(files)
    contents[f"{di}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires))
    contents[f"{di}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: cpuperf-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    contents.update(extra_paths or {})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for rel, text in contents.items():
        data = text if isinstance(text, bytes) else text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow((rel, f"sha256={digest}", len(data)))
    writer.writerow((f"{di}/RECORD", "", ""))
    contents[f"{di}/RECORD"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in contents.items():
            zf.writestr(rel, text)
    return path


def torch_wheel(dest: Path, version: str, requires: Iterable[str] = ()) -> Path:
    return build_wheel(dest, "torch", version, {"torch/__init__.py": FAKE_TORCH.format(version=version)}, requires)


def ipex_wheel(dest: Path, version: str, body: Optional[str] = None, extra_paths=None) -> Path:
    minor = version.rsplit(".", 1)[0]
    body = body if body is not None else FAKE_IPEX.format(version=version, minor=minor)
    return build_wheel(dest, "intel_extension_for_pytorch", version,
                       {"intel_extension_for_pytorch/__init__.py": body}, [f"torch=={minor}.*"], extra_paths)


def oneccl_wheel(dest: Path, version: str) -> Path:
    return build_wheel(dest, "oneccl_bind_pt", version,
                       {"oneccl_bindings_for_pytorch/__init__.py": f'__version__ = "{version}"\n'})


def allocator_wheel(dest: Path, version: str = "3.4.3") -> Path:
    """Like cmeel-mimalloc: a real shared library under cmeel.prefix/lib (built here with cc)."""
    src, lib = dest / "alloc.c", dest / "liballoc.so"
    src.write_text("int cpuperf_test_allocator = 1;\n")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True).returncode:
        pytest.skip("no C compiler to build the test allocator library")
    return build_wheel(dest, "cmeel-mimalloc", version, {"cmeel.prefix/lib/libmimalloc.so": lib.read_bytes()})


def write_index(root: Path, wheels: List[Path]) -> None:
    """A PEP 503 simple index under root/simple, files under root/files."""
    from packaging.utils import canonicalize_name

    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    projects: Dict[str, List[Path]] = {}
    for w in wheels:
        shutil.copy(w, files / w.name)
        projects.setdefault(canonicalize_name(w.name.split("-")[0]), []).append(w)
    simple = root / "simple"
    simple.mkdir(exist_ok=True)
    (simple / "index.html").write_text("<html><body>" + "".join(
        f'<a href="{p}/">{p}</a>' for p in sorted(projects)) + "</body></html>")
    for project, ws in projects.items():
        d = simple / project
        d.mkdir(exist_ok=True)
        links = []
        for w in ws:
            sha = hashlib.sha256(w.read_bytes()).hexdigest()
            href = "../../files/" + w.name.replace("+", "%2B")
            links.append(f'<a href="{href}#sha256={sha}">{w.name}</a><br/>')
        (d / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


def serve(root: Path, handler: Any = None) -> http.server.ThreadingHTTPServer:
    """root over HTTP on a free loopback port, from a daemon thread (shutdown() stops it)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler or functools.partial(_Quiet, directory=str(root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def hermetic_env(home: Path) -> Dict[str, str]:
    """pip sees no machine configuration; cpuperf keeps its logs and stash under a private HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_CACHE_DIR": str(home / "pip-cache"),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "5", "PIP_RETRIES": "0",
                "XDG_CACHE_HOME": str(home / "cache"), "HOME": str(home),
                "CPUPERF_CACHE_DIR": str(home / "cache" / "cpuperf"),  # not the suite's shared one
                "PYTHONPATH": str(REPO), "CPUPERF_OVERRIDE_GPUS": ""})
    return env


def cli(args: List[str], home: Path, extra: Optional[Dict[str, str]] = None, timeout: float = 240,
        process: bool = False):
    """cpuperf in the hermetic environment (stdin is not a terminal): in-process, or a child where `process`
    (tests/cli_util.run_cli); what it starts (pip) is a real process either way."""
    env = cli_env(hermetic_env(home))
    env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    env.update({k: v for k, v in hermetic_env(home).items() if k.startswith("PIP_")})
    env.update(extra or {})
    if not process and os.environ.get("CPUPERF_TEST_CLI") != "process":
        return run_in_process(args, env, input_text="", cwd=str(REPO))
    return subprocess.run([sys.executable, "-m", "cpuperf", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, input="", cwd=str(REPO))


_TEMPLATE: List[Path] = []  # the venv built once per test process


def make_venv(path: Path, home: Optional[Path] = None) -> str:
    """A new venv with pip at `path`: a copy of one `python -m venv` built once per test process (ensurepip
    takes 10-40 s here). A venv is relocatable this way: its interpreter is a link to the base one, and its
    prefix is where its pyvenv.cfg is; only bin/'s scripts name the template (pip is run as `python -m pip`)."""
    if not _TEMPLATE:
        base = Path(tempfile.mkdtemp(prefix="cpuperf-test-venv-"))
        atexit.register(shutil.rmtree, base, True)
        subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=300)
        _TEMPLATE.append(base / "venv")
    shutil.copytree(_TEMPLATE[0], path, symlinks=True)
    return str(path / "bin" / "python")


def pip_freeze(python: str, home: Path) -> str:
    return subprocess.run([python, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True,
                          env=hermetic_env(home), timeout=120).stdout


