"""The ONLY module that touches the OS: files under a sysroot, env vars, subprocesses, libraries.

Every function returns None on failure and never raises (pypa/packaging's probe habit).
With a sysroot, only files under it are read; facts the snapshot cannot tell (this process's
affinity, environment, tools, GPUs, packages) come back as None = unknown.
"""

from __future__ import annotations

import errno
import glob
import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, NoReturn, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import subprocess  # imported where a tool runs: ccl-env in every new shell usually runs none
    from datetime import date  # imported where a date is asked for

# The facts CPUPERF_OVERRIDE_<FACT> may set (docs/commands.md: "CPUPERF_OVERRIDE_<FACT> overrides one fact").
OVERRIDES = ("isa", "microarch", "cpu_quota", "allowed_cpus", "amx_usable", "memory_total", "python", "packages",
             "gpus", "platform", "hypervisor", "today")
_WORD = re.compile(r"^[A-Za-z0-9_.]{1,64}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.+-]{0,63}$")
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def _refuse(fact: str, text: str, expected: str) -> NoReturn:
    from cpuperf.errors import UsageError

    name = f"CPUPERF_OVERRIDE_{fact.upper()}"
    raise UsageError(f"{name}={text[:40]!r} is not {expected}", hint=f"unset {name}, or set it to {expected}")


def _ipv4_of(ifname: str) -> Optional[str]:
    """The IPv4 address of an interface (ioctl SIOCGIFADDR, linux/sockios.h 0x8915); None if it has none."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ValueError):
        return None


def check_sysroot(sysroot: str) -> None:
    """A --sysroot must be a readable recorded host: missing, empty or unreadable is a UsageError (exit 2),
    never a host with 0 cores. The one check here that raises: it guards input, it is not a probe."""
    from cpuperf.errors import FieldError, verbatim

    hint = "record one with: cpuperf doctor --save-snapshot DIR"
    if not sysroot.strip():
        raise FieldError("sysroot", sysroot, "{flag} is empty: name a directory", hint)
    root = Path(sysroot)
    if not root.is_dir():
        raise FieldError("sysroot", sysroot, f"{{typed}}: {'not a directory' if root.exists() else 'no such directory'}",
                         hint)
    try:
        os.listdir(root)
    except OSError as exc:
        raise FieldError("sysroot", sysroot, f"{{typed}}: cannot read it ({verbatim(exc.strerror)})", hint) from exc
    cpuinfo = root / "proc" / "cpuinfo"
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    readable = os.access(cpuinfo, os.R_OK) and cpuinfo.is_file()
    if not readable and not (cpu_dir.is_dir() and os.access(cpu_dir, os.R_OK | os.X_OK)):
        raise FieldError("sysroot", sysroot, "{typed} holds no readable proc/cpuinfo or sys/devices/system/cpu",
                         hint)


PYTHON_CHECK_TIMEOUT_S = 15.0  # a cold interpreter on a loaded node starts in ~1 s; a hung one never answers
_PYTHON_CHECK = "import sys; print('cpuperf-python', *sys.version_info[:3])"


def check_python(python: str) -> str:
    """A --python must be a Python interpreter: it runs `-I -c` and answers within a timeout; anything else
    (a missing path, a directory, /bin/sleep, a script that hangs, a Python 2) is one UsageError line."""
    from cpuperf.errors import FieldError, verbatim

    hint = "pass the path of a Python 3 interpreter (a venv's bin/python)"
    if not python.strip():
        raise FieldError("python", python, "{flag} is empty", hint)
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return python
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        why = "no such file" if not os.path.exists(python) else "not an executable file"
        raise FieldError("python", python, f"{{flag}} {{value!r}} is not a Python interpreter: {why}", hint)
    import subprocess

    try:
        proc = subprocess.run([python, "-I", "-c", _PYTHON_CHECK], capture_output=True, text=True,
                              timeout=PYTHON_CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        raise FieldError("python", python, "{flag} {value!r} is not a Python interpreter: it did not answer within "
                         f"{PYTHON_CHECK_TIMEOUT_S:g} s", hint) from None
    except OSError as exc:
        raise FieldError("python", python, f"{{flag}} {{value!r}} cannot run: {verbatim(exc.strerror or exc)}", hint) from None
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 4 or words[0] != "cpuperf-python" or words[1] != "3":
        raise FieldError("python", python, "{flag} {value!r} is not a Python 3 interpreter (`-I -c 'import sys'` "
                         f"exited {proc.returncode})", hint)
    return python


class Sources:
    """Access to one host: the live one (sysroot=None) or a recorded tree."""

    def __init__(self, sysroot: Optional[str] = None, environ: Optional[Mapping[str, str]] = None):
        self.sysroot = str(Path(sysroot).resolve()) if sysroot else None
        self.environ: Mapping[str, str] = dict(os.environ if environ is None else environ)
        self._listed: Dict[str, List[str]] = {}  # library directory -> its names (_glob_in)

    @property
    def live(self) -> bool:
        return self.sysroot is None

    # -- files ----------------------------------------------------------------------------
    def path(self, path: str) -> str:
        return path if self.sysroot is None else self.sysroot + path

    def read(self, path: str) -> Optional[str]:
        """A file's text, bounded (fsutil.MAX_INPUT_BYTES; a FIFO or device in a recorded tree is unknown, None)."""
        from cpuperf.fsutil import InputRefused, read_text_capped

        try:
            return read_text_capped(self.path(path), errors="replace")
        except FileNotFoundError:
            return None
        except (OSError, InputRefused) as exc:
            if self.sysroot is None or isinstance(exc, OSError) and exc.errno == errno.ENOTDIR:
                return None  # the live host: a file the kernel will not give is unknown
            # A recorded tree holds what the probe read: a file in it that cannot be read is a broken snapshot,
            # never a host with unknown facts (docs/commands.md: refused, exit 2).
            from cpuperf.errors import FieldError, verbatim

            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).replace(self.path(path), "")
            raise FieldError("sysroot", self.sysroot, f"{{typed}}: {verbatim(path)} cannot be read ({verbatim(why.strip())})",
                             "give a tree cpuperf doctor --save-snapshot wrote, with regular readable files") from None

    def read_first_line(self, path: str) -> Optional[str]:
        text = self.read(path)
        return None if text is None else text.strip()

    def listdir(self, path: str) -> Optional[List[str]]:
        try:
            return sorted(os.listdir(self.path(path)))
        except OSError:
            return None

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.path(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(self.path(path))

    def glob(self, pattern: str) -> List[str]:
        """Glob under the sysroot; results are given as host paths (sysroot prefix removed)."""
        found = glob.glob(self.path(pattern))
        if self.sysroot:
            found = [p[len(self.sysroot):] for p in found]
        return sorted(found)

    # -- this process (live only) ---------------------------------------------------------
    def env(self, name: str) -> Optional[str]:
        """An environment variable of this process; unknown (None) for a snapshot."""
        if not self.live:
            return None
        return self.environ.get(name)

    def override(self, fact: str) -> Optional[str]:
        """CPUPERF_OVERRIDE_<FACT>: applies to snapshots too (that is how tests describe hosts)."""
        return self.environ.get(f"CPUPERF_OVERRIDE_{fact.upper()}")

    def override_words(self, fact: str) -> Optional[Tuple[str, ...]]:
        """A list CPUPERF_OVERRIDE_<FACT> (ISA flags, comma or space separated): None when unset; each word a
        flag name (letters, digits, _ and .), else a UsageError naming the variable."""
        text = self.override(fact)
        if text is None:
            return None
        words = tuple(text.replace(",", " ").split())
        bad = next((w for w in words if not _WORD.match(w)), None)
        if bad is not None:
            _refuse(fact, text, "a list of CPU flag names (e.g. avx2,avx512f)")
        return words

    def override_name(self, fact: str) -> Optional[str]:
        """A name CPUPERF_OVERRIDE_<FACT> (a microarchitecture): None when unset or empty; else a lower-case
        identifier, or a UsageError."""
        text = self.override(fact)
        if text is None or not text.strip():
            return None
        if not _NAME.match(text.strip()):
            _refuse(fact, text, "a name such as icelake or zen4 (letters, digits, _)")
        return text.strip()

    def override_bool(self, fact: str) -> Optional[bool]:
        """A yes/no CPUPERF_OVERRIDE_<FACT>: None when unset or empty; 1/true/yes or 0/false/no, else a UsageError."""
        text = self.override(fact)
        if text is None or not text.strip():
            return None
        value = text.strip().lower()
        if value not in _TRUE + _FALSE:
            _refuse(fact, text, "1 or 0 (true/false, yes/no)")
        return value in _TRUE

    def today(self) -> date:
        """Today's date on this machine's clock; CPUPERF_OVERRIDE_TODAY (YYYY-MM-DD) describes another day, as the
        suite does so that a finding that depends on the date (a Python past its end of life) never depends on the
        day the tests run."""
        from datetime import date

        text = self.override("today")
        if text is None or not text.strip():
            return date.today()
        try:
            return date.fromisoformat(text.strip())
        except ValueError:
            _refuse("today", text, "a date such as 2026-11-28 (YYYY-MM-DD)")

    def check_overrides(self) -> None:
        """Every CPUPERF_OVERRIDE_* set must be one cpuperf knows: a typo is refused, not silently ignored."""
        for key in sorted(self.environ):
            if key.startswith("CPUPERF_OVERRIDE_") and key[len("CPUPERF_OVERRIDE_"):].lower() not in OVERRIDES:
                from cpuperf.errors import UsageError

                raise UsageError(f"{key} is not an override cpuperf knows",
                                 hint="known: " + ", ".join("CPUPERF_OVERRIDE_" + o.upper() for o in OVERRIDES))

    def override_number(self, fact: str, integer: bool = False) -> Optional[float]:
        """A numeric CPUPERF_OVERRIDE_<FACT>: None when unset or empty; else finite and > 0, or a UsageError."""
        text = self.override(fact)
        if text is None or not text.strip():
            return None
        name = f"CPUPERF_OVERRIDE_{fact.upper()}"
        try:
            value = float(int(text.strip())) if integer else float(text.strip())
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value > 0):
            from cpuperf.errors import UsageError

            kind = "a positive whole number" if integer else "a positive number"
            raise UsageError(f"{name}={text[:40]!r} is not {kind}", hint=f"unset {name}, or set it to e.g. 4")
        return value

    def env_count(self, name: str) -> Optional[int]:
        """A whole-number variable of this process (SLURM_CPUS_PER_TASK, ...): None when unset or empty; a
        positive whole number, else a UsageError naming the variable and its value."""
        text = self.env(name)
        if text is None or not text.strip():
            return None
        if not re.fullmatch(r"[0-9]{1,9}", text.strip()) or int(text) < 1:
            from cpuperf.errors import UsageError

            raise UsageError(f"{name}={text[:40]!r} is not a positive whole number",
                             hint=f"unset {name}, or set it to a count such as 4")
        return int(text)

    def env_seconds(self, name: str, default: float) -> float:
        """A duration variable (CPUPERF_LOAD_WINDOW): `default` when unset or empty; a finite number >= 0
        (0 = skip), else a UsageError naming the variable."""
        text = self.environ.get(name)
        if text is None or not text.strip():
            return default
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and 0 <= value <= 3600):
            from cpuperf.errors import UsageError

            raise UsageError(f"{name}={text[:40]!r} is not a number of seconds in 0..3600",
                             hint=f"unset {name}, or set it to e.g. 0.2 (0 skips)")
        return value

    def affinity(self) -> Optional[List[int]]:
        if not self.live or not hasattr(os, "sched_getaffinity"):
            return None
        try:
            return sorted(os.sched_getaffinity(0))
        except OSError:
            return None

    def statvfs_bytes(self, path: str) -> Optional[int]:
        if not self.live:
            return None
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_frsize * st.f_blocks

    # -- tools ----------------------------------------------------------------------------
    def which(self, name: str, extra_dirs: Iterable[str] = ()) -> Optional[str]:
        if not self.live:
            return None
        found = shutil.which(name, path=self.environ.get("PATH"))
        if found:
            return found
        for directory in extra_dirs:
            candidate = os.path.join(directory, name)
            if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
                return candidate
        return None

    def run(self, argv: Sequence[str], timeout: float = 5.0,
            env: Optional[Mapping[str, str]] = None) -> Optional[subprocess.CompletedProcess[str]]:
        """Run a tool (argv list, never a shell) with a timeout; None when it cannot run."""
        if not self.live:
            return None
        import subprocess

        try:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                                  env=dict(env) if env is not None else dict(self.environ),
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None

    def python(self) -> str:
        return sys.executable

    # -- network (live only) --------------------------------------------------------------
    def hostname(self) -> Optional[str]:
        if not self.live:
            return None
        import socket

        try:
            return socket.gethostname()
        except OSError:
            return None

    def interface_addresses(self) -> Optional[Dict[str, List[str]]]:
        """Interface name -> the addresses it holds: IPv4 by SIOCGIFADDR, IPv6 from /proc/net/if_inet6."""
        if not self.live:
            return None
        import socket

        try:
            names = [name for _, name in socket.if_nameindex()]
        except OSError:
            return None
        out: Dict[str, List[str]] = {name: [] for name in names}
        for name in names:
            ip = _ipv4_of(name)
            if ip:
                out[name].append(ip)
        for line in (self.read("/proc/net/if_inet6") or "").splitlines():
            parts = line.split()  # address, index, prefix length, scope, flags, name
            if len(parts) == 6 and len(parts[0]) == 32:
                try:
                    packed = bytes.fromhex(parts[0])
                    out.setdefault(parts[5], []).append(socket.inet_ntop(socket.AF_INET6, packed))
                except (ValueError, OSError):
                    continue
        return out

    def source_address_for(self, ip: str) -> Optional[str]:
        """The local address the kernel's routing picks to reach `ip` (a UDP connect sends nothing)."""
        if not self.live:
            return None
        import socket

        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((ip, 9))  # discard port; connect() on UDP only chooses the route
                return str(sock.getsockname()[0])
        except OSError:
            return None

    def library_dirs(self) -> List[str]:
        """Where shared libraries are looked for: LD_LIBRARY_PATH, the env prefix, the system."""
        dirs: List[str] = []
        for entry in (self.environ.get("LD_LIBRARY_PATH") or "").split(":"):
            if entry:
                dirs.append(entry)
        prefixes = [sys.prefix, self.environ.get("CONDA_PREFIX") or ""]
        for prefix in prefixes:
            if prefix:
                dirs.append(os.path.join(prefix, "lib"))
        dirs += ["/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                 "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64", "/opt/intel/oneapi/compiler/latest/lib"]
        seen, ordered = set(), []
        for d in dirs:
            real = os.path.realpath(d)  # /lib is often a link to /usr/lib
            if real not in seen and os.path.isdir(real):
                seen.add(real)
                ordered.append(d)
        return ordered

    def find_libraries(self, patterns: Sequence[str]) -> List[str]:
        """Shared libraries matching any pattern in the library dirs (live host only)."""
        if not self.live:
            return []
        found: List[str] = []
        for directory in self.library_dirs():
            for pattern in patterns:
                found.extend(self._glob_in(directory, pattern))
        return sorted(dict.fromkeys(found))

    def _glob_in(self, directory: str, pattern: str) -> List[str]:
        """glob.glob(directory/pattern) for a pattern of one path component, each directory listed once for the
        probe: glob lists it again for every pattern, and /usr/lib/x86_64-linux-gnu holds a thousand names or more
        (dozens of patterns, each a listing of it, were ~10 ms of every probe)."""
        import fnmatch

        if glob.has_magic(directory) or not glob.has_magic(pattern) or os.sep in pattern:
            return glob.glob(os.path.join(directory, pattern))
        names = self._listed.get(directory)
        if names is None:
            try:
                with os.scandir(directory) as entries:
                    names = [e.name for e in entries]
            except OSError:
                names = []
            self._listed[directory] = names
        shown = names if pattern.startswith(".") else [n for n in names if not n.startswith(".")]
        return [os.path.join(directory, n) for n in fnmatch.filter(shown, pattern)]
