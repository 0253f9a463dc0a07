"""`cpuperf install` as a transaction: every stop (SIGINT, SIGTERM, SIGHUP, SIGKILL, a corrupt wheel)
leaves the environment as it was, files included, and pip never outlives cpuperf.

Real pip into a real venv, wheels served over loopback by a server that can stall mid-download.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Tuple

import pytest
from cli_util import cli_env, without_dac_override
from pkgindex import REPO, build_wheel, cli, hermetic_env, ipex_wheel, make_venv, pip_freeze, serve, torch_wheel, write_index

# --------------------------------------------------------------------------- a server that stalls


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files; the second and later GET of a wheel under /stall/ sends half and then waits."""

    stall_began: threading.Event
    release: threading.Event
    seen: Dict[str, int]

    def log_message(self, *args):
        pass

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")  # pip must fetch again, not read its cache
        super().end_headers()

    def do_GET(self):
        path = self.path.split("?")[0]
        if "/stall/files/" in path and path.endswith(".whl"):
            self.seen[path] = self.seen.get(path, 0) + 1
            if self.seen[path] >= 2:
                data = Path(self.translate_path(path)).read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.stall_began.set()
                self.release.wait(120)
                return
        super().do_GET()


def corrupt_torch_wheel(dest: Path, version: str) -> Path:
    """A wheel whose zip directory is fine but one member's deflate data is damaged: pip unpacks the
    members before it (a half torch/ tree and a new functorch/) and then fails."""
    files = {"torch/__init__.py": f'__version__ = "{version}"\n'}
    files.update({f"torch/part_{i:02d}.py": f"# {i}\n" + "x = 1\n" * 200 for i in range(30)})
    files["functorch/__init__.py"] = "\n"
    files["torch/zz_damaged.py"] = "".join(f"value_{i} = {i * 7919 % 104729}\n" for i in range(4000))
    path = build_wheel(dest, "torch", version, files)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("torch/zz_damaged.py")
    data = bytearray(path.read_bytes())
    # local header: 30 bytes + name + extra; damage the middle of the compressed stream
    name_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    for i in range(start + info.compress_size // 3, start + info.compress_size // 3 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def txn_index(tmp_path_factory):
    base = tmp_path_factory.mktemp("txn-index")
    wheels = base / "wheels"
    wheels.mkdir()
    t26, t27 = torch_wheel(wheels, "2.6.0+cpu"), torch_wheel(wheels, "2.7.0+cpu")
    helper = build_wheel(wheels, "helper-pkg", "1.0", {"helper_pkg.py": "X = 1\n"})
    bad = wheels / "bad"
    bad.mkdir()
    broken = corrupt_torch_wheel(bad, "2.7.0+cpu")
    sleepy = wheels / "sleepy"
    sleepy.mkdir()
    slow_ipex = ipex_wheel(sleepy, "2.7.0", body="import time\ntime.sleep(60)\n")
    big = wheels / "big"
    big.mkdir()
    # 6 MB that do not compress: a disk with 2 MB free fills up half-way through the unpack
    huge = build_wheel(big, "torch", "2.7.0+cpu", {"torch/__init__.py": '__version__ = "2.7.0+cpu"\n',
                                                   "torch/lib/libhuge.so": os.urandom(6 << 20).hex()[: 6 << 20]})
    many = wheels / "many"
    many.mkdir()
    # 6000 small files: an unpack long enough to be stopped half-way (SIGINT while pip writes them)
    many_files = {"torch/__init__.py": '__version__ = "2.7.0+cpu"\n'}
    many_files.update({f"torch/m{i // 100:02d}/f{i:04d}.py": f"X = {i}\n" * 20 for i in range(6000)})
    manyw = build_wheel(many, "torch", "2.7.0+cpu", many_files)
    root = base / "www"
    write_index(root / "many", [t26, manyw])
    write_index(root / "good", [t26, t27, helper])
    write_index(root / "corrupt", [t26, broken])
    write_index(root / "stall", [t26, t27])
    write_index(root / "big", [t26, huge])
    write_index(root / "sleepy", [t26, t27, slow_ipex])
    state = dict(stall_began=threading.Event(), release=threading.Event(), seen={})
    server = serve(root, functools.partial(type("H", (_Handler,), state), directory=str(root)))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield SimpleNamespace(good=f"{url}/good/simple", big=f"{url}/big/simple", many=f"{url}/many/simple", corrupt=f"{url}/corrupt/simple", stall=f"{url}/stall/simple",
                          sleepy=f"{url}/sleepy/simple", state=SimpleNamespace(**state))
    state["release"].set()
    server.shutdown()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("txn-home")


@pytest.fixture
def venv(torch26_venv):
    """torch 2.6.0+cpu and helper-pkg installed (conftest.py, shared with test_install.py); each test leaves it as
    it found it (and checks so)."""
    return torch26_venv


def tree(python: str) -> Dict[str, Tuple[int, bytes]]:
    """Every file under the venv's site-packages and bin/: (size, first bytes)."""
    prefix = Path(python).parent.parent
    out = {}
    for top in [prefix / "bin", *prefix.glob("lib/python3*/site-packages")]:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                p = os.path.join(dirpath, name)
                if os.path.islink(p):
                    out[p] = (-1, os.readlink(p).encode())
                else:
                    out[p] = (os.path.getsize(p), Path(p).read_bytes()[:64])
    return out


def assert_as_before(python: str, home: Path, freeze: str, files: Dict[str, Tuple[int, bytes]]) -> None:
    assert pip_freeze(python, home) == freeze
    now = tree(python)
    assert sorted(set(now) - set(files)) == [], "files the failed install added are still there"
    assert sorted(set(files) - set(now)) == [], "files that were there are gone"
    # same sizes and first bytes; byte-code caches are rebuilt by a reinstall (their header holds
    # the source's mtime), so for them presence is what counts
    assert {p: v for p, v in now.items() if v != files[p] and "/__pycache__/" not in p} == {}
    check = subprocess.run([python, "-c", "import torch, helper_pkg; print(torch.__version__)"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and check.stdout.strip() == "2.6.0+cpu", check.stderr


def start(args: List[str], home: Path) -> subprocess.Popen:
    """cpuperf in the background (its own session, as a batch job's), stderr readable line by line."""
    env = cli_env(hermetic_env(home))
    env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    env.update({k: v for k, v in hermetic_env(home).items() if k.startswith("PIP_")})
    return subprocess.Popen([sys.executable, "-m", "cpuperf", *args], cwd=str(REPO), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def pips_of(python: str) -> List[int]:
    """Live processes running pip of this interpreter."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        if argv[:3] == [python.encode(), b"-m", b"pip"]:
            found.append(int(d.name))
    return found


def wait_for_stall(proc: subprocess.Popen, txn_index, lines: List[str], timeout: float = 120) -> None:
    """Until pip (the install, not the dry run) is half-way through downloading the wheel."""
    st = txn_index.state
    deadline = time.monotonic() + timeout
    while not st.stall_began.wait(0.2):
        assert proc.poll() is None, (proc.returncode, "".join(lines), proc.stderr.read())
        assert time.monotonic() < deadline, "".join(lines)


def reset_stall(txn_index) -> None:
    st = txn_index.state
    st.stall_began.clear()
    st.release.clear()
    st.seen.clear()


def _drain(proc: subprocess.Popen, lines: List[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    t.start()
    return t


# --------------------------------------------------------------------------- tests

# One stop signal, SIGTERM (a scheduler's, or `timeout`'s): SIGINT and SIGHUP take the same handler (cpuperf.run.pip's
# STOP_SIGNALS), their exit codes are test_exit_codes.py's unit test of the map, and a real SIGINT stops an unpack
# below and a whole foreground group in test_install.py.
STOPS = [(signal.SIGTERM, 143, "SIGTERM")]


@pytest.mark.full  # real pip, a real SIGTERM
@pytest.mark.parametrize("sig,code,name", STOPS, ids=[s[2] for s in STOPS])
def test_stop_signal_kills_pip_group_and_restores(venv, txn_index, home, sig, code, name):
    """The signal goes to cpuperf alone (as `timeout`, `kill` or a scheduler send it): pip dies with it."""
    freeze, files = pip_freeze(venv, home), tree(venv)
    reset_stall(txn_index)
    proc = start(["install", "--python", venv, "--index-url", txn_index.stall, "--torch", "2.7.0", "--yes"], home)
    lines: List[str] = []
    reader = _drain(proc, lines)
    try:
        wait_for_stall(proc, txn_index, lines)
        assert pips_of(venv), "pip should be downloading now"
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        txn_index.state.release.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    err = "".join(lines)
    assert proc.returncode == code, err
    assert pips_of(venv) == [], "pip outlived cpuperf"
    error_lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == 1 and name in error_lines[0] and "restored" in error_lines[0], err
    assert "Traceback" not in err
    assert took < 30, took
    assert_as_before(venv, home, freeze, files)
    # the journal is closed: the next install goes on without --recover
    assert cli(["install", "--python", venv, "--recover"], home).stdout.startswith("nothing to recover")


@pytest.mark.full  # real pip
def test_corrupt_wheel_leaves_no_half_unpacked_files(venv, txn_index, home):
    """pip fails mid-unpack (a damaged member): the torch/ files and functorch/ it wrote are removed,
    the torch it replaced is back, and the user reads the zlib/CRC cause, not `ERROR: Exception:`."""
    freeze, files = pip_freeze(venv, home), tree(venv)
    proc = cli(["install", "--python", venv, "--index-url", txn_index.corrupt, "--torch", "2.7.0", "--yes",
                "--json"], home)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert "restored" in err["message"] and "Exception:" not in err["message"], err
    assert any(w in err["message"].lower() for w in ("zlib", "crc", "decompress", "invalid")), err
    assert "\n" not in err["message"]
    log = Path(err["hint"].split("full log: ")[1].split(" ")[0]).read_text()
    assert "part_" in log or "removed" in log  # the restore says what it deleted
    assert_as_before(venv, home, freeze, files)
    assert not list(Path(venv).parent.parent.glob("lib/python3*/site-packages/functorch"))


@pytest.mark.full  # real pip, a real SIGINT
def test_sigint_during_the_unpack_restores_every_file(venv, txn_index, home):
    """Ctrl-C while pip is writing the new torch's 6000 files: pip's group is killed, every file it wrote is
    removed, the torch it replaced is back (the site-packages tree compared), exit 130."""
    freeze, files = pip_freeze(venv, home), tree(venv)
    site = next(Path(venv).parent.parent.glob("lib/python3*/site-packages"))
    proc = start(["install", "--python", venv, "--index-url", txn_index.many, "--torch", "2.7.0", "--yes"], home)
    lines: List[str] = []
    _drain(proc, lines)
    deadline = time.monotonic() + 180
    while not (site / "torch" / "m00").exists():  # the unpack has begun
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=180) == 130, "".join(lines)
    text = "".join(lines)
    assert "restored" in text and "Traceback" not in text, text
    assert pips_of(venv) == []
    assert_as_before(venv, home, freeze, files)


@pytest.mark.full  # real pip, a read-only mount
def test_read_only_site_packages_changes_nothing_and_says_so(venv, txn_index, home):
    """site-packages on a read-only mount: one line naming it, a filesystem or pip code, nothing changed."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    freeze, files = pip_freeze(venv, home), tree(venv)
    site = str(next(Path(venv).parent.parent.glob("lib/python3*/site-packages")))
    if subprocess.run(["mount", "--bind", site, site], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", site], check=True, capture_output=True)
        proc = cli(["install", "--python", venv, "--index-url", txn_index.good, "--torch", "2.7.0", "--yes",
                    "--json"], home)
    finally:
        subprocess.run(["umount", site], capture_output=True)
    assert proc.returncode in (4, 10), (proc.returncode, proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert "\n" not in err["message"] and "Traceback" not in proc.stderr, err
    assert "read-only" in err["message"].lower() and site in err["message"], err
    assert_as_before(venv, home, freeze, files)


@pytest.mark.full  # real pip, a real SIGKILL
def test_sigkill_leaves_a_journal_that_recover_restores(venv, txn_index, home):
    """SIGKILL mid-download: pip dies with cpuperf (parent-death signal), the next install refuses
    with exit 11 and names --recover, and --recover leaves the environment as it was."""
    freeze, files = pip_freeze(venv, home), tree(venv)
    reset_stall(txn_index)
    proc = start(["install", "--python", venv, "--index-url", txn_index.stall, "--torch", "2.7.0", "--yes"], home)
    lines: List[str] = []
    _drain(proc, lines)
    try:
        wait_for_stall(proc, txn_index, lines)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        txn_index.state.release.set()
    deadline = time.monotonic() + 10
    while pips_of(venv) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pips_of(venv) == [], "pip outlived a SIGKILLed cpuperf"
    refused = cli(["install", "--python", venv, "--index-url", txn_index.good, "--torch", "2.7.0", "--yes",
                   "--json"], home)
    assert refused.returncode == 11, (refused.stdout, refused.stderr)
    e = json.loads(refused.stdout)["error"]
    assert "did not finish" in e["message"] and e["hint"] == f"cpuperf install --recover --python {venv}"
    # the same environment spelled another way is refused too (the journal keys on site-packages)
    other = cli(["install", "--python", venv + "3", "--index-url", txn_index.good, "--torch", "2.7.0", "--yes"], home)
    assert other.returncode == 11, other.stderr
    # a dry run only warns
    dry = cli(["install", "--python", venv, "--index-url", txn_index.good, "--torch", "2.7.0", "--dry-run"], home)
    assert dry.returncode == 0 and "--recover" in dry.stderr, dry.stderr
    rec = cli(["install", "--python", venv, "--recover"], home)
    assert rec.returncode == 0, (rec.stdout, rec.stderr)
    assert rec.stdout.startswith("restored "), rec.stdout
    assert_as_before(venv, home, freeze, files)
    again = cli(["install", "--python", venv, "--recover", "--json"], home)
    assert json.loads(again.stdout)["status"] == "nothing-to-recover"


@pytest.mark.full  # real pip, a real SIGKILL
def test_sigkill_after_pip_changed_things_is_recovered(venv, txn_index, home):
    """SIGKILL while verifying (torch 2.7 and IPEX are in): --recover removes IPEX and puts torch 2.6 back."""
    freeze, files = pip_freeze(venv, home), tree(venv)
    proc = start(["install", "--python", venv, "--index-url", txn_index.sleepy, "--torch", "2.7.0", "--with", "ipex",
                  "--yes"], home)
    lines: List[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if not line or line.startswith("verifying"):
                break
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "intel-extension-for-pytorch" in pip_freeze(venv, home).replace("_", "-"), "".join(lines)
    rec = cli(["install", "--python", venv, "--recover", "--json"], home)
    assert rec.returncode == 0, (rec.stdout, rec.stderr)
    data = json.loads(rec.stdout)
    assert data["status"] == "restored" and data["restores"][0]["reinstalled"] == ["torch==2.6.0+cpu"]
    assert_as_before(venv, home, freeze, files)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mount (root only) to fill up."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.full  # real pip, a full tmpfs
def test_full_disk_names_the_path_and_restores(small_disk, txn_index, home):
    python = make_venv(small_disk / "v", home)
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--index-url", txn_index.good,
                    "torch==2.6.0+cpu", "helper-pkg==1.0"], check=True, capture_output=True,
                   env=hermetic_env(home), timeout=300)
    freeze, files = pip_freeze(python, home), tree(python)
    used = int(subprocess.run(["df", "--output=used", "-k", str(small_disk)], capture_output=True, text=True,
                              check=True).stdout.split()[-1])
    subprocess.run(["mount", "-o", f"remount,size={used + 2048}k", str(small_disk)], check=True)
    proc = cli(["install", "--python", python, "--index-url", txn_index.big, "--torch", "2.7.0", "--yes", "--json"],
               home)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    # pip says only "[Errno 28] No space left on device": the site-packages it was writing is named
    assert "no space left on device (" + str(small_disk / "v" / "lib") in err["message"], err
    assert "restored" in err["message"] and "\n" not in err["message"], err
    assert_as_before(python, home, freeze, files)


@pytest.mark.full  # real pip
def test_hash_mismatch_is_named_in_one_line(venv, txn_index, home, tmp_path):
    freeze = pip_freeze(venv, home)
    lock = tmp_path / "cluster.lock.txt"
    lock.write_text("torch==2.7.0+cpu --hash=sha256:" + "0" * 64 + "\n")
    proc = cli(["install", "--python", venv, "--index-url", txn_index.good, "--from-lock", str(lock), "--yes"], home)
    line = _err(proc, 4)
    assert "hash mismatch: torch==2.7.0+cpu (expected sha256 000000000000..., got " in line, proc.stderr
    assert pip_freeze(venv, home) == freeze


# --------------------------------------------------------------------------- bad input


def _err(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("content,words", [
    (b"\xff\xfe\x00t\x00o\x00r\x00c\x00h\x00", "not UTF-8"),
    (bytes(range(256)) * 4, "not UTF-8"),
    (b"torch==\x00\x01\n", "not an exact pin"),
    (b'{"schema": "cpuperf.lock/1", "packages": [{"name": 3}]}', "list of"),
    (b'{"schema": "cpuperf.lock/1", "packages": {"torch": "2.7.0"}}', "list of"),
    (b'[1, 2]', "not an exact pin"),
    (b'{"schema": "cpuperf.lock/1", "packages": []}', "pins no packages"),
    (b'{"schema": "cpuperf.lock/1"', "not valid JSON"),
    (b'{"schema": "cpuperf.lock/1", "packages": [{"name": "torch", "version": "2.7.0"}], "index_urls": "x"}',
     "lists of strings"),
    (b'{"schema": "cpuperf.lock/1", "packages": [{"name": "torch", "version": "latest"}]}', "not an exact pin"),
])
def test_bad_lock_files_are_usage_errors(tmp_path, home, content, words):
    lock = tmp_path / "bad.lock"
    lock.write_bytes(content)
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--from-lock", str(lock), "--dry-run"], home, timeout=60)
    assert words in _err(proc, 2)


def test_unreadable_lock_and_directory_lock(tmp_path, home):
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--from-lock", str(tmp_path), "--dry-run"], home, timeout=60)
    err = _err(proc, 2)
    assert "cannot read the lock file" in err or "is a directory, not a file" in err


@pytest.mark.full  # a real install process without CAP_DAC_OVERRIDE
def test_unwritable_cache_is_a_filesystem_error(venv, txn_index, tmp_path, home):
    """A read-only cache directory, with permissions binding (root drops CAP_DAC_OVERRIDE for the child)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    tmp_path.chmod(0o755)
    env = cli_env(hermetic_env(home))
    env.update({k: v for k, v in hermetic_env(home).items() if k.startswith("PIP_")})
    env.update(CPUPERF_CACHE_DIR=str(ro / "cpuperf"), PIP_CACHE_DIR=str(tmp_path / "pipcache"))
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "install", "--python", venv, "--index-url",
                           txn_index.good, "--torch", "2.7.0", "--yes"], capture_output=True, text=True, env=env,
                          timeout=120, cwd=str(REPO), stdin=subprocess.DEVNULL, preexec_fn=without_dac_override())
    assert "CPUPERF_CACHE_DIR" in proc.stderr and "cannot write" in _err(proc, 10)
    assert str(ro) in proc.stderr


@pytest.mark.full  # the shared venv (real pip)
def test_cache_path_that_is_a_file_is_a_filesystem_error(venv, txn_index, tmp_path, home):
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    proc = cli(["install", "--python", venv, "--index-url", txn_index.good, "--torch", "2.7.0", "--yes"], home,
               {"CPUPERF_CACHE_DIR": str(blocker / "cpuperf")})
    assert "cannot write" in _err(proc, 10) and "CPUPERF_CACHE_DIR" in proc.stderr


def test_write_lock_and_download_into_impossible_paths(tmp_path, txn_index, home):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", txn_index.good, "--torch", "2.7.0",
                "--dry-run", "--write-lock", str(blocker / "lock.txt")], home)
    assert "--write-lock" in _err(proc, 10)
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", txn_index.good, "--torch", "2.7.0",
                "--download", str(blocker / "house")], home)
    assert "--download" in _err(proc, 10)


def test_venv_that_is_a_file(tmp_path, home):
    f = tmp_path / "venv-file"
    f.write_text("x")
    proc = cli(["install", "--venv", str(f), "--dry-run"], home, timeout=60)
    assert "is a file" in _err(proc, 2)


def test_recover_takes_no_install_options(tmp_path, home):
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--recover", "--torch", "2.7"], home, timeout=60)
    assert "--recover" in _err(proc, 2)


# --------------------------------------------------------------------------- pure functions


def test_tree_diff_names_new_trees_once_and_ignores_caches():
    from cpuperf.plan import install as ip

    before = {"/sp": {"torch/": (-1, 0), "torch/__init__.py": (10, 1), "torch/same.py": (7, 1), "torch/__pycache__/": (-1, 0),
                      "torch/__pycache__/__init__.cpython-311.pyc": (99, 1),
                      "torch-2.6.0.dist-info/RECORD": (300, 1), "six.py": (5, 1)}}
    now = {"/sp": {"torch/": (-1, 0), "torch/__init__.py": (12, 2), "torch/new.py": (1, 2), "torch/same.py": (7, 5),
                   "torch/__pycache__/": (-1, 0), "torch/__pycache__/__init__.cpython-311.pyc": (120, 2),
                   "torch-2.6.0.dist-info/RECORD": (310, 2), "functorch/": (-1, 0), "functorch/a/": (-1, 0),
                   "functorch/a/b.py": (1, 2)},
           "/elsewhere": {"x": (1, 1)}}
    d = ip.tree_diff(before, now)
    assert d.added == (("/sp", "functorch/"), ("/sp", "torch/new.py"))  # the new tree once, whole
    assert d.missing == (("/sp", "six.py"),)
    assert d.changed == (("/sp", "torch/__init__.py"),)  # not the .pyc, not RECORD
    assert d.touched == (("/sp", "torch/same.py"),) and d.damaged()  # same size, rewritten
    assert ip.tree_diff(before, before) == ip.TreeDiff((), (), ()) and not ip.tree_diff(before, before).damaged()


def test_error_summary_finds_the_cause():
    from cpuperf.plan import install as ip

    zlib_err = ("ERROR: Exception:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                "    raise\nzlib.error: Error -3 while decompressing data: invalid stored block lengths\n")
    assert ip.error_summary(zlib_err) == "zlib.error: Error -3 while decompressing data: invalid stored block lengths"
    enospc = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device: '/sp/torch/x.so'\n"
    assert ip.error_summary(enospc, "/other") == "no space left on device (/sp/torch/x.so)"
    assert ip.error_summary("OSError: [Errno 28] No space left on device\n", "/sp") == "no space left on device (/sp)"
    hashes = ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated...\n"
              "    torch==2.7.0+cpu from http://x/torch.whl:\n        Expected sha256 " + "a" * 64 + "\n"
              "             Got        " + "b" * 64 + "\n")
    assert ip.error_summary(hashes) == "hash mismatch: torch==2.7.0+cpu (expected sha256 aaaaaaaaaaaa..., got bbbbbbbbbbbb...)"
    assert ip.error_summary("Collecting x\nERROR: No matching distribution found for torch==9.9\n") == \
        "No matching distribution found for torch==9.9"
    assert ip.error_summary("") == "pip gave no error message"


def _journal(cache: Path, site: str, python: str, started: float) -> Path:
    d = cache / "installs" / "20260101-000000"
    d.mkdir(parents=True)
    path = d / "journal.json"
    path.write_text(json.dumps({"schema": "cpuperf.install-journal/1", "state": "running", "python": python,
                                "site": site, "pid": 2 ** 22 + 7, "pid_start": "1",
                                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}))
    return path


@pytest.mark.full  # a real install process
@pytest.mark.parametrize("recreated", [True, False], ids=["venv-made-again", "same-venv"])
def test_a_journal_of_a_venv_made_again_is_closed_not_refused(tmp_path, recreated):
    """`rm -rf .venv && python -m venv .venv` after a killed install: nothing is left to recover there."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    cfg = venv / "pyvenv.cfg"
    started = cfg.stat().st_mtime + (-3600 if recreated else 3600)
    journal = _journal(tmp_path / "cache", os.path.realpath(site), python, started)
    env = {**os.environ, "CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "install", "--python", python, "--yes",
                           "--index-url", "http://127.0.0.1:9/simple"], capture_output=True, text=True,
                          env=env, timeout=180)
    state = json.loads(journal.read_text())["state"]
    if recreated:
        assert proc.returncode != 11 and "made again" in proc.stderr, proc.stderr
        assert state == "superseded"
    else:
        assert proc.returncode == 11 and "--recover" in proc.stderr, proc.stderr
        assert state == "running"
